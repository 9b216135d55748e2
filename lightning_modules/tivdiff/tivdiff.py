"""TIVDiff: trustworthy and identifiable virtual face generation — a RECONSTRUCTION (no paper text or code exists).

Paper: "Towards Trustworthy and Identifiable Virtual Face Generation" (TIVDiff), ICML 2026 poster
(icml.cc/virtual/2026/poster/60956). **No arXiv id, no paper text and no code could be found.** Everything below
except the three component names and their one-line roles (from the abstract) is a **reconstruction** (each one a
documented choice of this collection), in the lineage of IVFG (arXiv 2110.07986: key-conditioned
projection of the face latent trained with multi-task/triplet losses) and Gaussian Shading (distribution-preserving
watermark in the initial noise). Every reconstructed choice is a configurable, documented init arg.

Method (reconstruction)
-----------------------
Three parts in one LightningModule; ``train_parts`` selects which are trained (the others are frozen, so a
two-stage run trains the encoder first and ``init_from`` its checkpoint for the VIP + generator stage).

1. **Identity encoder** (stand-in for ArcFace): a small CNN, e = FR(x) on the unit sphere S^{d-1},
   trained on the training identities with a CosFace loss ``CE(s (cos(e, w_y) - m 1[y]), y)``.
2. **Virtual Identity Projection (VIP)**: for a user key k (an integer), ``v = normalize(R_k e + g_theta(R_k e))``
   with R_k a key-seeded random orthogonal matrix (QR of a hash-seeded Gaussian) and g_theta an MLP (residual).
   Per batch two random keys A, B give v_A, v_B; the VIP loss is (all on detached e)

   * separation/consistency (triplet-like pair margins on v within a key, labels = identities):
     ``mean_{y_i != y_j} relu(cos(v_i, v_j) - m_neg) + mean_{y_i = y_j, i != j} relu(m_pos - cos(v_i, v_j))``;
   * unlinkability across keys: ``(mean_{y_i = y_j} cos(v_A,i, v_B,j) - mean_{y_i != y_j} cos(v_A,i, v_B,j))^2``
     (same-person pairs across keys must look like different-person pairs: AUC -> 0.5);
   * privacy (far from the original): ``mean_i cos(e_i, v_i)^2``;
   * realism: RBF-MMD^2 between {v_A, v_B} and {e} (bandwidth ``realism_bandwidth``), so virtual identities lie
     where real embeddings lie and the generator (trained on real embeddings) renders them as faces.
3. **Generator**: a pixel-space DDPM (diffusers ``DDPMScheduler``, linear betas, **v-prediction** by default,
   ``prediction_type`` configurable) with the collection's `UNet`; input = noisy image concatenated with the
   **geometry map** (landmark heat map, the stand-in for the 3DMM render), condition vector = identity embedding.
   Trained on real faces with their own embedding ``normalize(e + cond_noise * n)``; at generation time it receives
   the virtual identity v. (Measured here: with epsilon prediction a small, briefly trained UNet's DDIM samples
   diverge from the first steps, because x0 = (x - sqrt(1 - a) eps) / sqrt(a) amplifies its errors near t = T;
   v-prediction does not, and even an untrained v-model's DDIM map is near-invertible.)
4. **Identity-Guarded Generative Watermark (IGGW)**, Gaussian-Shading style: the message m (``watermark_bits``
   bits) = signs of L key-seeded random projections of v (an LSH of the VID, so it is bound to VID and key);
   element j of the initial noise carries bit ``m[j mod L] XOR s_k[j]`` (s_k: the key stream, hash bits) as
   ``z_j = Phi^-1((u_j + b_j) / 2)``, u_j ~ U(0, 1) (so z ~ N(0, I) exactly when the stream is uniform). Faces are
   sampled with deterministic DDIM (eta 0, ``DDIMScheduler``, trailing spacing). Verification recomputes v from
   the source embedding and key, DDIM-inverts the face (``DDIMInverseScheduler``, same steps, conditioned on v and
   the geometry map), reads ``z_j * (1 - 2 s_k[j])`` and soft-votes the replicas of each bit; the bit accuracy
   against m(v, k) decides legitimacy. A wrong key changes both v and the stream: accuracy ~ 0.5. No x0 clipping
   (``clip_sample=False``) so that sampling and inversion are the same deterministic ODE discretisation.
   Consequence (measured in ``experiments/tivdiff.py``): all faces of one (VID, key) share the sign pattern of their
   initial noise (only the magnitudes are fresh), so they are less diverse and more alike than faces from i.i.d.
   noise (Gaussian Shading's known trade-off; here it raises face-level identifiability). Bit accuracy needs
   enough DDIM steps: with a trained 16x16 model 50 steps give > 0.95, 20 steps ~0.67.

Evaluation protocol (``experiments/tivdiff.py``): verification AUC of virtual identities under one key,
cross-key linkability AUC (target 0.5), cos(e, v) and e-to-v re-identification AUC, watermark bit accuracy with
the right/wrong key and under noise/blur, and sample quality with/without the watermark (identity accuracy of the
encoder on generated faces and a Frechet distance in encoder feature space).

Deviations / reconstructions (all of them, since no paper text exists)
-----------------------------------------------------------------------
* Data: parametric synthetic faces (``datamodules/face_renderer.py``) at 16x16 grey instead of CelebA-HQ/FFHQ;
  geometry = landmarks of the *mean* face in the image's pose/expression instead of a DECA/3DDFA render.
* FR model: a CNN trained here (CosFace) instead of a pretrained ArcFace; embedding size 32 (not 512).
* VIP losses, the orthogonal key mixing, the realism MMD term: reconstructions of "consistent, separable,
  unlinkable, far from the original" (reconstructed choices), not the paper's equations.
* Keys are 31-bit integers hashed with a 32-bit integer mixer (lowbias32), not a cryptographic PRNG (such as
  ChaCha); fine for experiments, not for deployment.
* Message = LSH(v, k) instead of H(quantised VID || key): a cryptographic hash of a quantised VID fails on any FR
  noise; LSH bits degrade gracefully. No error-correcting code beyond replica soft voting.
* The inversion evaluates the denoiser at the target timestep (the usual diffusers inversion loop).
* The verifier is given the geometry map used for generation.
* v-prediction instead of the (unknown) paper parameterisation: a measured necessity at this CPU scale (above).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from diffusers import DDIMInverseScheduler, DDIMScheduler, DDPMScheduler
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import FaceIdentityData
from lightning_modules.shared.denoisers import UNet, from_model_range, to_model_range
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import (ExampleGenerators, ExactMeans, draw_integers, draw_normal,
                                                  draw_uniform)

log = logging.getLogger(__name__)

PARTS = ("encoder", "vip", "generator")
M32 = 0xFFFFFFFF
STREAM_ROTATION, STREAM_KEYSTREAM, STREAM_LSH = 1, 2, 3
STREAM_VALIDATION, STREAM_PREDICT = 0, 1  # per-example evaluation draws (`ExampleGenerators` streams)
MAX_KEY = 2 ** 31 - 1


# ============================================================================================ keyed randomness
def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2^32 for int64 tensors holding uint32 values, without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & M32


def mix32(x: Tensor) -> Tensor:
    """The lowbias32 integer hash (C. Wellons) on int64 tensors: a bijection of [0, 2^32)."""
    x = x & M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_hash(keys: Tensor, num: int, stream: int) -> Tensor:
    """[B] integer keys -> [B, num] 32-bit hashes, a pure function of (key, index, stream) on every device."""
    keys = keys.long().reshape(-1)
    seeded = mix32(keys ^ mix32(torch.full_like(keys, stream * 0x9E3779B9 + 1)))
    index = mix32(torch.arange(num, device=keys.device, dtype=torch.long) + 0x632BE5AB)
    return mix32(seeded[:, None] ^ index[None, :])


def keyed_uniform(keys: Tensor, num: int, stream: int) -> Tensor:
    """[B, num] uniforms in (0, 1) from the keys (float32)."""
    return ((keyed_hash(keys, num, stream).double() + 0.5) / 2.0 ** 32).float()


def keyed_gaussian(keys: Tensor, num: int, stream: int) -> Tensor:
    """[B, num] standard normals from the keys (Box-Muller on two independent hash streams)."""
    u1 = keyed_uniform(keys, num, 2 * stream)
    u2 = keyed_uniform(keys, num, 2 * stream + 1)
    return torch.sqrt(-2 * torch.log(u1)) * torch.cos(2 * torch.pi * u2)


def keyed_bits(keys: Tensor, num: int, stream: int) -> Tensor:
    """[B, num] key-stream bits (bool), one hash bit per element."""
    return ((keyed_hash(keys, num, stream) >> 11) & 1).bool()


def key_rotation(keys: Tensor, dim: int) -> Tensor:
    """[B, dim, dim] key-seeded random orthogonal matrices (Haar: QR with the sign fix), computed once per key."""
    unique, inverse = torch.unique(keys.long().reshape(-1), return_inverse=True)
    gauss = keyed_gaussian(unique, dim * dim, STREAM_ROTATION).view(-1, dim, dim)
    q, r = torch.linalg.qr(gauss)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q[inverse]


def check_keys(keys: Tensor) -> None:
    if keys.dtype.is_floating_point or (keys.numel() and (int(keys.min()) < 0 or int(keys.max()) > MAX_KEY)):
        raise UserInputError(f"user keys must be integers in [0, {MAX_KEY}] (got dtype {keys.dtype}, range "
                             f"[{keys.min().item() if keys.numel() else '-'}, "
                             f"{keys.max().item() if keys.numel() else '-'}]).")


# ============================================================================================ networks
class IdentityEncoder(nn.Module):
    """Face-recognition stand-in: strided conv stages (GroupNorm, SiLU) down to <= 4x4, then a linear map to the
    unit sphere. Input: [B, 1, S, S] pixels in [0, 1]."""

    def __init__(self, image_size: int, embedding_dim: int, channels: int = 32, in_channels: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, padding=1), nn.GroupNorm(8, channels),
                                   nn.SiLU()]
        size, width = image_size, channels
        while size > 4:
            out = min(width * 2, channels * 4)
            layers += [nn.Conv2d(width, out, 3, stride=2, padding=1), nn.GroupNorm(8, out), nn.SiLU(),
                       nn.Conv2d(out, out, 3, padding=1), nn.GroupNorm(8, out), nn.SiLU()]
            size, width = (size + 1) // 2, out
        self.features = nn.Sequential(*layers, nn.Flatten())
        self.project = nn.Linear(width * size * size, embedding_dim)

    def forward(self, images: Tensor) -> Tensor:
        return F.normalize(self.project(self.features(to_model_range(images))), dim=-1)


class VirtualIdentityProjection(nn.Module):
    """v = normalize(R_k e + g(R_k e)) (reconstruction; see the module docstring). ``trained=False`` drops g
    (the pure keyed orthogonal projection, an ablation)."""

    def __init__(self, dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.dim = dim
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, dim))

    def forward(self, e: Tensor, keys: Tensor, trained: bool = True) -> Tensor:
        rotated = torch.bmm(key_rotation(keys.to(e.device), self.dim).to(e.dtype), e.unsqueeze(-1)).squeeze(-1)
        return F.normalize(rotated + self.mlp(rotated) if trained else rotated, dim=-1)


# ============================================================================================ losses
def cosface_loss(embeddings: Tensor, class_weights: Tensor, labels: Tensor, scale: float, margin: float) -> Tensor:
    """CosFace: CE(scale * (cos(e, w_c) - margin * 1[c = y]), y) with unit e and unit class weights."""
    cos = embeddings @ F.normalize(class_weights, dim=-1).T
    return F.cross_entropy(scale * (cos - margin * F.one_hot(labels, cos.shape[1]).to(cos)), labels)


def pair_margin_loss(v: Tensor, labels: Tensor, pos_margin: float, neg_margin: float) -> Tensor:
    """Separation + consistency within one key: mean over different-identity pairs of relu(cos - m_neg) plus mean
    over same-identity pairs (i != j) of relu(m_pos - cos); a term without pairs counts 0."""
    cos = v @ v.T
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(v), dtype=torch.bool, device=v.device)
    neg = F.relu(cos - neg_margin)[~same]
    pos = F.relu(pos_margin - cos)[same & ~eye]
    zero = cos.sum() * 0
    return (neg.mean() if neg.numel() else zero) + (pos.mean() if pos.numel() else zero)


def cross_key_linkability(v_a: Tensor, v_b: Tensor, labels: Tensor) -> Tensor:
    """(mean cos over same-identity cross-key pairs - mean cos over different-identity cross-key pairs)^2."""
    cos = v_a @ v_b.T
    same = labels[:, None] == labels[None, :]
    if same.all():
        return cos.sum() * 0
    return (cos[same].mean() - cos[~same].mean()) ** 2


def privacy_loss(e: Tensor, v: Tensor) -> Tensor:
    """mean_i cos(e_i, v_i)^2 (unit vectors): the virtual identity carries no direction of the original one."""
    return ((e * v).sum(-1) ** 2).mean()


def rbf_mmd2(x: Tensor, y: Tensor, bandwidth: float) -> Tensor:
    """Biased MMD^2 with k(a, b) = exp(-|a - b|^2 / (2 bandwidth^2))."""
    def kernel(a: Tensor, b: Tensor) -> Tensor:
        return torch.exp(-torch.cdist(a, b).pow(2) / (2 * bandwidth ** 2)).mean()

    return kernel(x, x) + kernel(y, y) - 2 * kernel(x, y)


# ============================================================================================ watermark (IGGW)
def message_bits(v: Tensor, keys: Tensor, num_bits: int) -> Tensor:
    """[B, L] message bound to (VID, key): signs of L key-seeded Gaussian projections of v (an LSH)."""
    planes = keyed_gaussian(keys.to(v.device), num_bits * v.shape[-1], STREAM_LSH).view(len(v), num_bits, -1)
    return torch.einsum("bld,bd->bl", planes.to(v.dtype), v) > 0


def watermark_latents(message: Tensor, keys: Tensor, shape: Sequence[int],
                      generator: torch.Generator | ExampleGenerators | None = None) -> Tensor:
    """Gaussian-Shading initial noise [B, *shape]: element j carries b = m[j mod L] XOR s_k[j] as
    z_j = Phi^-1((u_j + b) / 2), u_j ~ U(0, 1); elements beyond the last full replica are plain N(0, 1)."""
    batch, num_bits = message.shape
    n = 1
    for s in shape:
        n *= int(s)
    if num_bits > n:
        raise UserInputError(f"watermark_bits={num_bits} exceeds the {n} elements of the initial noise.")
    device = message.device
    index = torch.arange(n, device=device)
    carried = index < (n // num_bits) * num_bits
    bits = message[:, index % num_bits] ^ keyed_bits(keys.to(device), n, STREAM_KEYSTREAM)
    u = draw_uniform((batch, n), generator, device).clamp(1e-7, 1 - 1e-7)
    z = torch.where(carried, torch.special.ndtri((u + bits.float()) / 2), torch.special.ndtri(u))
    return z.view(batch, *shape)


def bit_scores(z: Tensor, keys: Tensor, num_bits: int) -> Tensor:
    """[B, L] soft votes: sum over replicas of z_j (1 - 2 s_k[j]); bit = score > 0."""
    flat = z.flatten(1).float()
    n = flat.shape[1]
    reps = n // num_bits
    stream = keyed_bits(keys.to(z.device), n, STREAM_KEYSTREAM)
    signed = flat * (1 - 2 * stream.float())
    return signed[:, :reps * num_bits].view(len(flat), reps, num_bits).sum(1)


def extract_message(z: Tensor, keys: Tensor, num_bits: int) -> Tensor:
    return bit_scores(z, keys, num_bits) > 0


def bit_accuracy(predicted: Tensor, message: Tensor) -> Tensor:
    """[B] fraction of message bits recovered."""
    return (predicted == message).float().mean(-1)


# ============================================================================================ DDIM
def scheduler_config(num_train_timesteps: int, beta_schedule: str, beta_start: float, beta_end: float,
                     prediction_type: str = "epsilon") -> dict:
    """Shared diffusers config: no clipping (set per sampler), eta-0 DDIM with trailing spacing."""
    return dict(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule, beta_start=beta_start,
                beta_end=beta_end, clip_sample=False, set_alpha_to_one=True, prediction_type=prediction_type,
                timestep_spacing="trailing")


def _model_output(denoiser: nn.Module, x: Tensor, t: Tensor | int, cond: Tensor, geometry: Tensor) -> Tensor:
    t = torch.as_tensor(t, device=x.device).reshape(1).expand(len(x))
    return denoiser(torch.cat([x, geometry], 1), t, cond)


def to_epsilon(output: Tensor, x: Tensor, t: int, alphas_cumprod: Tensor, prediction_type: str) -> Tensor:
    """The noise estimate implied by a model output at (x, t): eps itself, or from v / x0 predictions."""
    a = alphas_cumprod[t].to(x)
    if prediction_type == "epsilon":
        return output
    if prediction_type == "v_prediction":
        return a.sqrt() * output + (1 - a).sqrt() * x
    return (x - a.sqrt() * output) / (1 - a).sqrt()


def ddim_sample(denoiser: nn.Module, z: Tensor, cond: Tensor, geometry: Tensor, config: dict, steps: int,
                clip_sample: bool = False) -> Tensor:
    """Deterministic DDIM (eta 0, diffusers ``DDIMScheduler``) from z = x_T to x_0 (model range), conditioned on
    (cond, geometry map); ``clip_sample`` clamps each step's x0 estimate to [-1, 1] (still deterministic)."""
    scheduler = DDIMScheduler(**dict(config, clip_sample=clip_sample))
    scheduler.set_timesteps(steps)
    x = z
    for t in scheduler.timesteps:
        x = scheduler.step(_model_output(denoiser, x, t, cond, geometry), int(t), x, eta=0.0).prev_sample
    return x


def ddim_invert(denoiser: nn.Module, x0: Tensor, cond: Tensor, geometry: Tensor, config: dict, steps: int,
                refinements: int = 0) -> Tensor:
    """DDIM inversion x_0 -> x_T with diffusers' ``DDIMInverseScheduler`` (same schedule and step count).

    Each step t_c -> t_n uses the noise estimate at the current point, eps(x_{t_c}, t_c) (t_c = 0 for the first
    step), converted from the model's parameterisation; ``refinements`` fixed-point iterations then re-evaluate it
    at the new point, eps(x_{t_n}, t_n), which is what DDIM sampling uses, so the inversion becomes exact at the
    fixed point (one more model call per step and iteration).
    """
    kind = config["prediction_type"]
    scheduler = DDIMInverseScheduler(**dict(config, prediction_type="epsilon"))
    scheduler.set_timesteps(steps)
    ratio = config["num_train_timesteps"] // steps
    alphas = scheduler.alphas_cumprod
    x = x0
    for t in scheduler.timesteps:
        t_next = int(t)
        t_cur = max(t_next - ratio, 0)
        eps = to_epsilon(_model_output(denoiser, x, t_cur, cond, geometry), x, t_cur, alphas, kind)
        x_next = scheduler.step(eps, t_next, x).prev_sample
        for _ in range(refinements):
            eps = to_epsilon(_model_output(denoiser, x_next, t_next, cond, geometry), x_next, t_next, alphas, kind)
            x_next = scheduler.step(eps, t_next, x).prev_sample
        x = x_next
    return x


# ============================================================================================ module
NO_TEST_STAGE = ("TIVDiff has no test stage: its losses and identity accuracy are measured on the validation faces; "
                 "use `validate` (or `predict` for virtual faces and their watermark bit accuracy).")


class TIVDiff(PaperModule):
    """Identity encoder + Virtual Identity Projection + geometry-conditioned diffusion + IGGW (reconstruction).

    Args:
        num_train_identities: classes of the encoder's CosFace head (>= the datamodule's training identities).
        image_resolution: side of the square grey faces (divisible by 2^(len(unet_channel_mults) - 1)).
        embedding_dim: size of identity embeddings and virtual identities.
        encoder_channels / vip_hidden: widths of the encoder CNN and the VIP MLP.
        train_parts: subset of ("encoder", "vip", "generator") trained; the rest is frozen.
        cosface_scale / cosface_margin: encoder loss.
        separation_weight / pos_margin / neg_margin / unlink_weight / privacy_weight / realism_weight /
            realism_bandwidth: VIP loss (module docstring).
        unet_base_channels / unet_channel_mults: the generator `UNet`; num_train_timesteps / beta_*: DDPM schedule.
        cond_noise: std of the noise added to the training condition (then re-normalised).
        generator_weight: weight of the epsilon MSE.
        num_inference_steps: DDIM steps for sampling and inversion; clip_sample: clamp x0 while sampling;
        inversion_refinements: fixed-point iterations per inversion step (`ddim_invert`).
        watermark_bits: message length L.
        sample_seed: seed of the evaluation draws: each example's Gaussian-Shading uniforms in predict_step and
            its diffusion-loss noise in validation come from a generator seeded by (sample_seed, the example's
            ``index`` in the data), so they do not depend on batching or on the number of processes.
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, num_train_identities: int = 160, image_resolution: int = 16, embedding_dim: int = 32,
                 encoder_channels: int = 32, vip_hidden: int = 128, train_parts: Sequence[str] = PARTS,
                 cosface_scale: float = 16.0, cosface_margin: float = 0.2, separation_weight: float = 1.0,
                 pos_margin: float = 0.6, neg_margin: float = 0.2, unlink_weight: float = 1.0,
                 privacy_weight: float = 1.0, realism_weight: float = 1.0, realism_bandwidth: float = 0.5,
                 unet_base_channels: int = 32, unet_channel_mults: Sequence[int] = (1, 2),
                 num_train_timesteps: int = 1000, beta_schedule: str = "linear", beta_start: float = 1e-4,
                 beta_end: float = 0.02, prediction_type: str = "v_prediction", cond_noise: float = 0.05,
                 generator_weight: float = 1.0, num_inference_steps: int = 50, clip_sample: bool = False,
                 inversion_refinements: int = 0,
                 watermark_bits: int = 32, sample_seed: int = 0,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        train_parts = tuple(train_parts)
        unknown = [p for p in train_parts if p not in PARTS]
        if unknown or not train_parts:
            raise UserInputError(f"train_parts={list(train_parts)} must be a non-empty subset of {list(PARTS)}.")
        check_range("num_train_identities", num_train_identities, 2)
        check_range("image_resolution", image_resolution, 8, 256)
        check_range("embedding_dim", embedding_dim, 2)
        check_range("cosface_scale", cosface_scale, 0, low_inclusive=False)
        check_range("cosface_margin", cosface_margin, 0, 1)
        for name in ("separation_weight", "unlink_weight", "privacy_weight", "realism_weight", "generator_weight",
                     "cond_noise"):
            check_range(name, locals()[name], 0)
        check_range("pos_margin", pos_margin, -1, 1)
        check_range("neg_margin", neg_margin, -1, 1)
        check_range("realism_bandwidth", realism_bandwidth, 0, low_inclusive=False)
        check_range("num_train_timesteps", num_train_timesteps, 2)
        check_range("num_inference_steps", num_inference_steps, 1, num_train_timesteps)
        if num_train_timesteps % num_inference_steps:
            raise UserInputError(f"num_inference_steps={num_inference_steps} must divide num_train_timesteps="
                                 f"{num_train_timesteps} (DDIM inversion steps by num_train_timesteps // steps).")
        check_range("watermark_bits", watermark_bits, 1, image_resolution ** 2)
        factor = 2 ** (len(unet_channel_mults) - 1)
        if image_resolution % factor:
            raise UserInputError(f"image_resolution={image_resolution} must be divisible by {factor} for "
                                 f"unet_channel_mults={list(unet_channel_mults)}.")
        if beta_schedule not in ("linear", "scaled_linear", "squaredcos_cap_v2"):
            raise UserInputError(f"beta_schedule={beta_schedule!r}: choose linear, scaled_linear or squaredcos_cap_v2.")
        self.train_parts = train_parts
        self.resolution, self.embedding_dim, self.watermark_bits = image_resolution, embedding_dim, watermark_bits
        self.num_inference_steps, self.sample_seed = num_inference_steps, sample_seed
        self._val_means = ExactMeans()
        self.encoder = IdentityEncoder(image_resolution, embedding_dim, encoder_channels)
        self.identity_head = nn.Parameter(torch.randn(num_train_identities, embedding_dim) / embedding_dim ** 0.5)
        self.vip = VirtualIdentityProjection(embedding_dim, vip_hidden)
        self.generator = UNet(2, 1, unet_base_channels, tuple(unet_channel_mults), cond_dim=embedding_dim)
        if prediction_type not in ("epsilon", "v_prediction", "sample"):
            raise UserInputError(f"prediction_type={prediction_type!r}: choose epsilon, v_prediction or sample.")
        check_range("inversion_refinements", inversion_refinements, 0)
        self.clip_sample, self.inversion_refinements = clip_sample, inversion_refinements
        self.ddim_config = scheduler_config(num_train_timesteps, beta_schedule, beta_start, beta_end, prediction_type)
        self.noise_scheduler = DDPMScheduler(**{k: v for k, v in self.ddim_config.items()
                                                if k not in ("set_alpha_to_one",)})
        if "encoder" not in train_parts:
            self.encoder.requires_grad_(False)
            self.identity_head.requires_grad_(False)
        if "vip" not in train_parts:
            self.vip.requires_grad_(False)
        if "generator" not in train_parts:
            self.generator.requires_grad_(False)

    # ------------------------------------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        super().setup(stage)
        wanted = self.data(FaceIdentityData).num_train_identities
        if stage == "fit" and wanted is not None and wanted > self.hparams.num_train_identities:
            raise UserInputError(f"the data has {wanted} training identities but num_train_identities="
                                 f"{self.hparams.num_train_identities}: set model.init_args.num_train_identities "
                                 f"to at least {wanted}.")
        if stage == "fit" and "encoder" not in self.train_parts and self.init_from is None:
            log.warning("TIVDiff trains %s with a FROZEN identity encoder but no init_from: the encoder is random. "
                        "Train it first (configs/tivdiff/encoder_quick.yaml) and pass its checkpoint as init_from.",
                        list(self.train_parts))

    # ------------------------------------------------------------------------------------------- pieces
    def _unpack(self, batch: dict) -> tuple[Tensor, Tensor, Tensor]:
        images, geometry = batch["image"], batch["geometry"]
        if images.dim() != 4 or images.shape[1:] != (1, self.resolution, self.resolution):
            raise UserInputError(f"TIVDiff expects images [B, 1, {self.resolution}, {self.resolution}], got "
                                 f"{tuple(images.shape)}: set data.init_args.image_size = model image_resolution.")
        if geometry.shape != images.shape:
            raise UserInputError(f"geometry maps {tuple(geometry.shape)} must match the images {tuple(images.shape)}.")
        return images, geometry, batch["identity"]

    def embed(self, images: Tensor) -> Tensor:
        """Identity embeddings e = FR(x) (unit vectors)."""
        return self.encoder(images)

    def virtual_identity(self, e: Tensor, keys: Tensor, trained: bool = True) -> Tensor:
        check_keys(keys)
        return self.vip(e, keys, trained)

    def encoder_loss(self, e: Tensor, labels: Tensor) -> Tensor:
        if int(labels.max()) >= self.identity_head.shape[0] or int(labels.min()) < 0:
            raise UserInputError(f"identity label {int(labels.max())} outside the encoder head's "
                                 f"{self.identity_head.shape[0]} classes: raise num_train_identities.")
        return cosface_loss(e, self.identity_head, labels, self.hparams.cosface_scale, self.hparams.cosface_margin)

    def vip_losses(self, e: Tensor, labels: Tensor, keys_a: Tensor, keys_b: Tensor) -> dict[str, Tensor]:
        h = self.hparams
        v_a, v_b = self.vip(e, keys_a), self.vip(e, keys_b)
        parts = {
            "separation": (pair_margin_loss(v_a, labels, h.pos_margin, h.neg_margin)
                           + pair_margin_loss(v_b, labels, h.pos_margin, h.neg_margin)) / 2,
            "unlinkability": cross_key_linkability(v_a, v_b, labels),
            "privacy": (privacy_loss(e, v_a) + privacy_loss(e, v_b)) / 2,
            "realism": rbf_mmd2(torch.cat([v_a, v_b]), e, h.realism_bandwidth),
        }
        parts["total"] = (h.separation_weight * parts["separation"] + h.unlink_weight * parts["unlinkability"]
                          + h.privacy_weight * parts["privacy"] + h.realism_weight * parts["realism"])
        return parts

    def diffusion_loss(self, images: Tensor, geometry: Tensor, e: Tensor,
                       generator: torch.Generator | ExampleGenerators | None = None) -> Tensor:
        x0 = to_model_range(images)
        n = len(x0)
        t = draw_integers(0, self.noise_scheduler.config.num_train_timesteps, (n,), generator, x0.device)
        noise = draw_normal(x0.shape, generator, x0.device)
        cond_noise = draw_normal(e.shape, generator, e.device)
        cond = F.normalize(e + self.hparams.cond_noise * cond_noise, dim=-1)
        x_t = self.noise_scheduler.add_noise(x0, noise, t)
        pred = self.generator(torch.cat([x_t, to_model_range(geometry)], 1), t, cond)
        kind = self.hparams.prediction_type
        target = noise if kind == "epsilon" else x0 if kind == "sample" else \
            self.noise_scheduler.get_velocity(x0, noise, t)
        return F.mse_loss(pred, target)

    def _losses(self, batch: dict, generator: torch.Generator | None, keys_a: Tensor, keys_b: Tensor
                ) -> dict[str, Tensor]:
        images, geometry, labels = self._unpack(batch)
        losses: dict[str, Tensor] = {}
        if "encoder" in self.train_parts and self.training:
            e = self.embed(images)
        else:
            with torch.no_grad():
                e = self.embed(images)
        in_head = labels < self.identity_head.shape[0]
        if "encoder" in self.train_parts and bool(in_head.any()):
            losses["encoder"] = self.encoder_loss(e[in_head], labels[in_head])
        e = e.detach()
        if "vip" in self.train_parts:
            vip = self.vip_losses(e, labels, keys_a, keys_b)
            losses.update({f"vip_{k}": v for k, v in vip.items()})
        if "generator" in self.train_parts:
            losses["diffusion"] = self.diffusion_loss(images, geometry, e, generator)
        total = losses.get("encoder", 0) + losses.get("vip_total", 0) + \
            self.hparams.generator_weight * losses.get("diffusion", 0)
        losses["loss"] = total
        return losses

    # ------------------------------------------------------------------------------------------- steps
    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        keys = torch.randint(0, MAX_KEY, (2,), device=self.device)
        n = len(batch["image"])
        losses = self._losses(batch, None, keys[0].expand(n), keys[1].expand(n))
        self.log_dict({f"train/{k}": v.detach() for k, v in losses.items()}, prog_bar=False, batch_size=n)
        return losses["loss"]


    def validation_step(self, batch: dict, batch_idx: int) -> None:
        n = len(batch["image"])
        generator = self._example_generators(batch, batch_idx, STREAM_VALIDATION)
        keys = batch["key"]
        losses = self._losses(batch, generator, keys, (keys + 7919) % MAX_KEY)
        for k, v in losses.items():  # batch means, weighted by batch size over the epoch
            self._val_means.add(f"val/{k}", v, n)
        e = self.embed(batch["image"])
        labels = batch["identity"]
        in_head = labels < self.identity_head.shape[0]
        if bool(in_head.any()):
            predicted = (e[in_head] @ F.normalize(self.identity_head, dim=-1).T).argmax(-1)
            self._val_means.add("val/id_accuracy", (predicted == labels[in_head]).float().mean(), int(in_head.sum()))

    def on_validation_epoch_end(self) -> None:
        """The epoch's means, summed exactly over ranks (`ExactMeans`); the same value on every rank."""
        for name, value in self._val_means.compute(self.device).items():
            self.log(name, value, sync_dist=True)

    def _example_generators(self, batch: dict, batch_idx: int, stream: int) -> ExampleGenerators | torch.Generator:
        """One generator per example seeded by (``sample_seed``, stream, its ``index``); a batch without an index
        (a hand-made one) gets one generator seeded by (``sample_seed``, stream, batch index)."""
        if "index" in batch:
            return ExampleGenerators(self.sample_seed, batch["index"], stream)
        return torch.Generator(device=self.device).manual_seed(self.sample_seed * 1_000_003 + stream * 7_919
                                                               + batch_idx)

    @torch.no_grad()
    def generate(self, cond: Tensor, geometry: Tensor, z: Tensor, steps: int | None = None) -> Tensor:
        """Faces in [0, 1] from initial noise z (model space), condition vectors and geometry maps ([0, 1])."""
        x = ddim_sample(self.generator, z, cond, to_model_range(geometry), self.ddim_config,
                        steps or self.num_inference_steps, self.clip_sample)
        return from_model_range(x)

    @torch.no_grad()
    def invert(self, faces: Tensor, cond: Tensor, geometry: Tensor, steps: int | None = None) -> Tensor:
        """DDIM inversion of faces ([0, 1]) to the initial noise, conditioned as in generation."""
        return ddim_invert(self.generator, to_model_range(faces), cond, to_model_range(geometry), self.ddim_config,
                           steps or self.num_inference_steps, self.inversion_refinements)

    @torch.no_grad()
    def watermarked_noise(self, v: Tensor, keys: Tensor, generator: torch.Generator | ExampleGenerators | None = None
                          ) -> tuple[Tensor, Tensor]:
        """(message [B, L], IGGW initial noise [B, 1, S, S]) for virtual identities v and user keys."""
        message = message_bits(v, keys, self.watermark_bits)
        return message, watermark_latents(message, keys, (1, self.resolution, self.resolution), generator)

    @torch.no_grad()
    def verify(self, faces: Tensor, v: Tensor, keys: Tensor, geometry: Tensor, steps: int | None = None) -> Tensor:
        """[B] watermark bit accuracy of faces against the message of (v, key): invert, de-stream, vote."""
        check_keys(keys)
        z = self.invert(faces, v, geometry, steps)
        return bit_accuracy(extract_message(z, keys, self.watermark_bits), message_bits(v, keys, self.watermark_bits))

    @torch.no_grad()
    def predict_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Virtual identity, watermarked virtual face and its verification bit accuracy (deterministic)."""
        images, geometry, _ = self._unpack(batch)
        keys = batch["key"]
        v = self.virtual_identity(self.embed(images), keys)
        message, z = self.watermarked_noise(v, keys, self._example_generators(batch, batch_idx, STREAM_PREDICT))
        faces = self.generate(v, geometry, z)
        accuracy = bit_accuracy(extract_message(self.invert(faces, v, geometry), keys, self.watermark_bits), message)
        return {"virtual_id": v, "virtual_face": faces, "watermark_bit_accuracy": accuracy}

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]
