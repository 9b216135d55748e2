"""Spectral Guidance: training-free control of a diffusion model through the spectrum of its noising operator.

Paper: "Spectral Guidance for Flexible and Efficient Control of Diffusion Models", Gabriel Moreira, Manuel Marques,
Joao Paulo Costeira, Chenyan Xiong, ICML 2026, arXiv 2605.28900. Official code: github.com/gabmoreira/spectralguidance
(MIT). The paper's method section was not readable here; everything below follows the official code (train_utils.py,
spectral.py, encode.py, guidance.py, the two example notebooks); details the code does not settle are listed under
"Deviations and reconstructions".

Files: this module holds the encoders, the spectral math and `SpectralGuidanceEncoder`; the guided samplers
(`SpectralGuide`, the DPS-style baseline, guided DDIM) are in `lightning_modules.spectral_guidance.guided_sampling`, the
DDPM prior `DiffusionDenoiser` and the noise schedules in `lightning_modules.spectral_guidance.diffusion_denoiser`.

Method
------
**Operator.** P_t maps a function of the clean sample to a function of the noisy one: (P_t h)(x_t) = E[h(x0) | x_t].
A guidance target h(x0) = p(y | x0) gives p(y | x_t) = P_t h, so its best rank-K approximation lives in the span of
the top-K left singular functions phi_k of P_t (plus the constant), with coefficients c_k = E[h(x0) phi_k(x_t)]: a
regression of h(x0) on features of x_t, which needs no denoiser.

**Two-view objective** (`two_view_correlations`, `SpectralGuidanceEncoder.training_step`). One t for the whole
batch (the whitening is per t), two independent noisings of the same x0: x_a, x_b = add_noise(x0, eps_a/b, t).
phi_a = f(x_a, t) without gradient, phi_b = f(x_b, t) with gradient; (mu, W) = `whitening`(phi_a) with
W = V diag(1 / sqrt(s^2 / (N - 1) + ridge)) from the SVD of the centred phi_a; a = (phi_a - mu) W / (std(a) + eps),
b = (phi_b - mu) W / (std(b) + eps) (b's std carries gradient); lambda_hat_k = mean_n a_nk b_nk and the loss is
1 - mean_k lambda_hat_k (the notebooks' form). E[phi(x_a) phi(x_b)^T] = E[(P_t^* phi)(P_t^* phi)^T], so the
maximiser spans the top-K eigenspace of P_t P_t^* and the lambda_hat estimate sigma_k^2 (a span, not ordered
functions). Closed form on Gaussian data: lambda_k(t) = a_t L_k / (a_t L_k + 1 - a_t) (tested).

**Encoding** (`SpectralGuidanceEncoder.encode`): on the grid t = encode_t_min, +encode_t_step, ... < T, the
training set is noised once per t, encoded, whitened (mu_t, W_t) and divided by the column RMS (norm_t); a
constant column is added: Phi~_t (N x (K + 1)). For a target h over the training samples (one-hot classes,
attributes, ...) the coefficients are c_t = Phi~_t^T h / N (`spectral_coefficients`). The **energy ratio**
sum_{k >= 1} c_k^2 / Var(h) (`energy_ratio`) is the fraction of h's variance the K features recover at t; plotted
against t it shows the phase transition (high at small t, collapsing where classes merge under noise).

**Guided DDIM** (`SpectralGuide`, `guided_ddim_step`, `guided_ddim_sample`): at every DDIM step eps_hat = denoiser(x, t)
under no_grad (the denoiser is **never** backpropagated); at guided steps (t on the encode grid and inside
[guidance_t_min, guidance_t_max]) p = Phi~(x, t) . c_t / ||Phi~(x, t)|| from one forward/backward pass of the small
encoder, g = grad_x p / p, rescaled per sample to norm clamp(||g||, grad_clip_min, grad_clip_max), and
x <- x + s sqrt(1 - a_t) g; then x <- DDIM.step(eps_hat, t, x, eta) with the eps_hat computed before the shift (as
the official code does).

**The sign fix** (``sign_fix=True``, default). p is an unconstrained linear projection and can be <= 0. The official
g = grad p / p then points *down* the estimated likelihood (p < 0) or blows up (p ~ 0), and the norm clamp hides the
magnitude but not the sign. Here g = grad p / max(p, p_floor): where p > p_floor this is the official grad log p,
elsewhere the direction is grad p, i.e. always ascent on the estimated p(y | x_t) (tested on a p < 0 case).
``sign_fix=False`` restores the official behaviour (kept as an ablation).

Modules: `DiffusionDenoiser` (the DDPM eps-prediction model, MLP for vectors / UNet for images, or a pretrained
diffusers ``UNet2DModel`` read from a local folder) and `SpectralGuidanceEncoder` (the encoder f_theta, trained with
the forward noising only: it needs no denoiser; a frozen denoiser can be attached for guided sampling).

Evaluation protocol (experiments/spectral_guidance.py): (S1) Gaussian data with a known spectrum: recovered
eigenvalues vs the closed form and principal angles of the learned span; (S2) labelled 2-D GMM: conditional
accuracy, GMM log-likelihood, denoiser backprops and wall time of unguided / spectral / DPS-style sampling; class
guidance on sklearn digits.

Deviations and reconstructions
------------------------------
* Basis ordering: ``encode`` (``order_by_correlation=True``) draws a second noisy view at each t and rotates the
  whitened basis by the eigenvectors of the symmetrised two-view cross-correlation, so the columns are ordered by
  lambda_hat (descending) and carry those eigenvalues (``encode_correlations``). The official code keeps the SVD
  order (single GPU: descending raw variance; DDP: ascending), which makes ``top_k`` truncation path-dependent. The
  constant column is the **first** column here (official: last); ``top_k`` keeps the constant and the k leading
  features. Without truncation this changes nothing (a rotation of a whitened basis leaves p unchanged).
* Energy ratio (a documented choice): ||c||^2 / Var(h) over all K + 1 coefficients would count the constant
  coefficient mean(h), which is not variance, so it is excluded here: sum_{k>=1} c_k^2 / Var(h) in [0, 1] up to the
  ridge (Bessel's inequality in the sample).
* Guidance needs t on the encode grid; off-grid DDIM timesteps are not guided (as official), and a sampler that
  would guide at no step at all raises an error. With T = 1000 and the default grid (10..990 step 10) DDIM with
  100 or 50 leading-spaced steps lands on the grid.
* Training t is drawn uniformly from {train_t_min, + train_t_step, ... < T} (default the encode grid), one per batch.
  ``num_chunks`` (memory splitting), DDP all-reduce of the scatter matrix and bf16 autocast are not implemented: the
  whitening uses the batch of the process (under DDP, each rank whitens its own shard: a documented difference).
  Validation is the exception: each example's two noisy views come from generators seeded by its index in the
  validation split (`lightning_modules.spectral_guidance.diffusion_denoiser.evaluation_generators`), the features
  of all ranks are gathered at the end of the epoch and the objective is computed over consecutive blocks of the
  validation loader's batch size in index order, i.e. over one process's batches: ``val/*`` are the same with any
  number of processes.
* The paper's LR schedule (ExponentialLR 0.995 per *epoch*) is expressed per optimiser step in paper.yaml (the
  collection steps schedulers per step).
* The time embedding of the encoders follows the official examples (sinusoid of the raw integer t, MLP d -> 4d -> d
  for the conv encoder, d -> hidden -> hidden for the MLP encoder).
* DPS-style baseline (`DPSStyleGuide`, used by the experiments): the same shift rule (norm clamp, s sqrt(1 - a_t))
  with g = grad_{x_t} log p(y | x0_hat(x_t)) backpropagated through the denoiser, so that the two methods differ only
  in how g is estimated (DPS proper scales by 1 / ||residual||; FreeDoM/TFG add recurrence; not reproduced).
* ``p_floor`` (default 1e-3) is a reconstruction: p is divided by ||Phi~|| ~ sqrt(K + 1), so for a class indicator
  typical values are ~ prior / sqrt(K + 1) (0.02 for 8 classes and K = 30); below the floor only the direction of
  grad p matters because the norm clamp sets the magnitude.
* A pretrained ``denoiser_path`` model is used with the schedule given by this module's arguments; the folder's
  scheduler_config.json is not read (set the same betas: google/ddpm-cifar10-32 is linear 1e-4..0.02, T = 1000).
  paper.yaml's channel_mults (1, 2, 2), max_channels and training t range {1, ..., 999} are guesses.
"""
from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.spectral_guidance.diffusion_denoiser import (STREAM_FEATURES, STREAM_LOSS, DiffusionDenoiser,
                                                                    check_schedule, evaluation_generators,
                                                                    load_diffusers_unet, make_scheduler)
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.shared.example_rng import ExampleGenerators, distributed, draw_normal, gather_examples
from lightning_modules.spectral_guidance.guided_sampling import SpectralGuide, guided_ddim_sample

log = logging.getLogger(__name__)


# ============================================================================================ encoders
def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal features of the raw integer timestep (the official ``TimeEmbedding``): [B] -> [B, dim]."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=t.device, dtype=torch.float32) / dim))
    angles = t.reshape(-1, 1).float() * inv_freq
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class FiLMResidualBlock(nn.Module):
    """Linear -> LayerNorm -> FiLM(t) -> SiLU -> Linear, residual, SiLU (the official toy encoder block)."""

    def __init__(self, dim: int, cond_dim: int) -> None:
        super().__init__()
        self.film = nn.Linear(cond_dim, 2 * dim)
        self.block1, self.norm, self.block2 = nn.Linear(dim, dim), nn.LayerNorm(dim), nn.Linear(dim, dim)

    def forward(self, x: Tensor, cond: Tensor, inverse: Tensor | None = None) -> Tensor:
        film = self.film(cond)  # one row per distinct t; `inverse` maps samples to rows
        gamma, beta = (film if inverse is None else film[inverse]).chunk(2, dim=-1)
        h = F.silu(self.norm(self.block1(x)) * (1 + gamma) + beta)
        return F.silu(x + self.block2(h))


def _distinct_timesteps(t: Tensor, batch: int) -> tuple[Tensor, Tensor | None]:
    """(distinct timesteps, index of each sample's row or None when all share one t): the time path runs once
    per distinct t (the two-view objective uses one t per batch, so the FiLM parameters are computed once)."""
    t = t.reshape(-1)
    if t.numel() == 1 or bool((t == t[0]).all()):
        return t[:1], None  # [1, ...] rows broadcast over the batch
    return torch.unique(t, return_inverse=True)


class TimeConditionedMLPEncoder(nn.Module):
    """f_theta(x, t) -> [B, num_features] for vectors (images are flattened): FiLM residual MLP."""

    def __init__(self, data_dim: int, num_features: int, hidden_dim: int = 128, time_dim: int = 128,
                 num_layers: int = 6) -> None:
        super().__init__()
        for name, value in (("data_dim", data_dim), ("num_features", num_features), ("hidden_dim", hidden_dim),
                            ("num_layers", num_layers)):
            check_range(name, value, 1)
        if time_dim < 2 or time_dim % 2:
            raise UserInputError(f"time_dim={time_dim} must be an even number >= 2 (sin and cos halves).")
        self.data_dim, self.num_features, self.time_dim = data_dim, num_features, time_dim
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim))
        self.input_proj = nn.Linear(data_dim, hidden_dim)
        self.layers = nn.ModuleList(FiLMResidualBlock(hidden_dim, hidden_dim) for _ in range(num_layers))
        self.final_proj = nn.Linear(hidden_dim, num_features)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        x = x.flatten(1)
        if x.shape[1] != self.data_dim:
            raise ValueError(f"encoder built for data_dim={self.data_dim} got inputs with {x.shape[1]} values")
        unique_t, inverse = _distinct_timesteps(t, len(x))
        cond = self.time_mlp(timestep_embedding(unique_t, self.time_dim))
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cond, inverse)
        return self.final_proj(h)


class _ConvResBlock(nn.Module):
    """GroupNorm-SiLU-conv, FiLM scale/shift from t, GroupNorm-SiLU-dropout-conv, 1x1 shortcut."""

    def __init__(self, in_ch: int, out_ch: int, cond_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(math.gcd(32, in_ch), in_ch), nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.film = nn.Linear(cond_dim, 2 * out_ch)
        self.norm2, self.conv2 = nn.GroupNorm(math.gcd(32, out_ch), out_ch), nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        self.skip = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else nn.Identity()

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.film(F.silu(cond))[:, :, None, None].chunk(2, dim=1)
        h = self.norm2(h) * (1 + scale) + shift
        h = self.conv2(self.dropout(F.silu(h)))
        return h + self.skip(x)


class TimeConditionedConvEncoder(nn.Module):
    """The official image encoder: conv3x3, [ResBlock + stride-2 conv] down to ``min_resolution``, GroupNorm-SiLU,
    global average pool, Linear -> num_features. Channels base * mult (capped at ``max_channels``)."""

    def __init__(self, in_channels: int, image_size: int, num_features: int, base_channels: int = 64,
                 channel_mults: list[int] = (1, 2, 2), max_channels: int = 1024, min_resolution: int = 8,
                 time_dim: int = 128, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("image_size", image_size), ("num_features", num_features),
                            ("base_channels", base_channels), ("max_channels", max_channels),
                            ("min_resolution", min_resolution)):
            check_range(name, value, 1)
        check_range("dropout", dropout, 0.0, 1.0, high_inclusive=False)
        if not channel_mults or any(m < 1 for m in channel_mults):
            raise UserInputError(f"channel_mults={list(channel_mults)} must be a non-empty list of positive integers.")
        self.time_dim, self.num_features, self.in_channels = time_dim, num_features, in_channels
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, 4 * time_dim), nn.SiLU(), nn.Linear(4 * time_dim, time_dim))
        self.stem = nn.Conv2d(in_channels, base_channels, 3, padding=1)
        blocks, downs, ch, res = nn.ModuleList(), nn.ModuleList(), base_channels, image_size
        for level, mult in enumerate(channel_mults):
            out = min(base_channels * mult, max_channels)
            blocks.append(_ConvResBlock(ch, out, time_dim, dropout))
            ch = out
            can_halve = res // 2 >= min_resolution and level < len(channel_mults) - 1
            downs.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1) if can_halve else nn.Identity())
            res = res // 2 if can_halve else res
        self.blocks, self.downs = blocks, downs
        self.head_norm, self.head = nn.GroupNorm(math.gcd(32, ch), ch), nn.Linear(ch, num_features)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise UserInputError(f"the encoder takes [B, {self.in_channels}, H, W] images but got a batch of shape "
                                 f"{tuple(x.shape)}: set model.init_args.encoder.init_args.in_channels to the data's "
                                 "channels (1 for digits, 3 for cifar10 and imagefolder).")
        cond = self.time_mlp(timestep_embedding(t.expand(len(x)) if t.numel() == 1 else t, self.time_dim))
        h = self.stem(x)
        for block, down in zip(self.blocks, self.downs):
            h = down(block(h, cond))
        return self.head(F.silu(self.head_norm(h)).mean(dim=(2, 3)))


# ============================================================================================ the math
def whitening(phi: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """(mu [1, K], W [K, K]) with W = V diag(1 / sqrt(s^2 / (N - 1) + ridge)) from the SVD of phi - mu.

    (phi - mu) W has covariance diag(s_k^2 / (s_k^2 + ridge (N - 1))): the identity for ridge = 0 (official SVD path).
    """
    n = len(phi)
    if n < 2:
        raise UserInputError(f"whitening needs at least 2 samples, got {n}.")
    mu = phi.mean(dim=0, keepdim=True)
    centred = phi - mu
    try:
        _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    except RuntimeError:  # ill-conditioned float32 input: retry in float64 (official fallback)
        _, s, vh = torch.linalg.svd(centred.double(), full_matrices=False)
        s, vh = s.to(phi.dtype), vh.to(phi.dtype)
    scale = 1.0 / torch.sqrt(s.square() / (n - 1) + ridge)
    w = vh.transpose(-2, -1) * scale[None]
    if w.shape[1] < phi.shape[1]:  # fewer samples than features: pad with zero directions (no information)
        w = F.pad(w, (0, phi.shape[1] - w.shape[1]))
    return mu, w


def two_view_correlations(phi_a: Tensor, phi_b: Tensor, mu: Tensor, w: Tensor, eps: float = 1e-6) -> Tensor:
    """lambda_hat_k = mean_n a_nk b_nk with a = (phi_a - mu) W / (std(a) + eps), b likewise with b's own std."""
    a = (phi_a - mu) @ w
    b = (phi_b - mu) @ w
    a = a / (a.std(dim=0, keepdim=True) + eps)
    b = b / (b.std(dim=0, keepdim=True) + eps)
    return (a * b).mean(dim=0)


def two_view_loss(phi_a: Tensor, phi_b: Tensor, ridge: float, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """(1 - mean_k lambda_hat_k, lambda_hat): whitening from phi_a (treated as constant), gradient through phi_b."""
    phi_a = phi_a.detach()
    mu, w = whitening(phi_a, ridge)
    lam = two_view_correlations(phi_a, phi_b, mu, w, eps)
    return 1.0 - lam.mean(), lam


def correlation_basis(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Eigen-decomposition of the symmetrised two-view cross-correlation C = (a^T b + b^T a) / 2N of whitened
    views: (eigenvalues descending [K], rotation R [K, K]). Rotating a whitened basis by R orders it by lambda_hat;
    the eigenvalues estimate sigma_k^2 independently of the (arbitrary) basis within the learned span."""
    c = (a.T @ b + b.T @ a) / (2 * len(a))
    values, vectors = torch.linalg.eigh(c.double())
    order = torch.argsort(values, descending=True)
    return values[order].to(a.dtype), vectors[:, order].to(a.dtype)


def spectral_coefficients(phi_tilde: Tensor, h: Tensor) -> Tensor:
    """c = Phi~^T h / N for features [N, K+1] (or [G, N, K+1]) and targets [N] or [N, M]."""
    if h.shape[0] != phi_tilde.shape[-2]:
        raise UserInputError(f"the guidance target has {h.shape[0]} values but the encoding holds "
                             f"{phi_tilde.shape[-2]} training samples: give one target value per encoded sample.")
    h = h.to(phi_tilde.dtype)
    return phi_tilde.transpose(-2, -1) @ h / phi_tilde.shape[-2]


def energy_ratio(coefficients: Tensor, h: Tensor, constant_first: bool = True) -> Tensor:
    """sum_{k >= 1} c_k^2 / Var(h): share of the target's variance recovered by the non-constant features.

    coefficients [..., K+1] or [..., K+1, M] (feature axis with the constant first), h [N] or [N, M]."""
    h = h.to(coefficients.dtype)
    if h.dim() == 1:
        features = coefficients[..., 1:] if constant_first else coefficients[..., :-1]
        return features.square().sum(-1) / h.var(unbiased=False).clamp_min(1e-12)
    features = coefficients[..., 1:, :] if constant_first else coefficients[..., :-1, :]
    return features.square().sum(-2) / h.var(dim=0, unbiased=False).clamp_min(1e-12)


# ============================================================================================ the module


NO_TEST_STAGE = ("SpectralGuidanceEncoder has no test stage: its held-out two-view loss and eigenvalues are "
                 "measured on the validation samples, and guided sampling is evaluated by the experiment "
                 "(`icml26 experiment spectral_guidance`); use `validate` (or `predict` for the features).")


class SpectralGuidanceEncoder(PaperModule):
    """The time-conditioned encoder f_theta(x, t) trained with the two-view whitened-correlation objective.

    Training needs the forward noising only (no denoiser). After training, ``encode`` stores the per-t whitening
    (buffers, saved in checkpoints) and returns spectral coefficients for given targets; ``guided_sample`` runs
    guided DDIM with an attached frozen denoiser (``denoiser`` / ``denoiser_path`` / ``attach_denoiser``).

    Args:
        encoder: f_theta (``TimeConditionedMLPEncoder`` / ``TimeConditionedConvEncoder``), with ``num_features`` = K.
        num_train_timesteps, beta_start, beta_end, beta_schedule: the DDPM schedule (must be the denoiser's).
        ridge, eps: whitening ridge and the std epsilon of the objective (official 1e-3, 1e-6).
        train_t_min, train_t_step: one t per batch from {train_t_min, +train_t_step, ... < T}.
        encode_t_min, encode_t_step: the encode grid {encode_t_min, +encode_t_step, ... < T} (official 10, 10).
        order_by_correlation: order the encoded basis by two-view correlation (see deviations).
        val_timesteps: the t at which validation measures the objective (None: 4 points of the encode grid).
        denoiser: optional frozen network for guided sampling; denoiser_path: or a local diffusers UNet2DModel
            folder (e.g. a copy of google/ddpm-cifar10-32); clip_sample: the DDIM sampler's x0 clamp.
    """

    no_test_stage = NO_TEST_STAGE

    def __init__(self, encoder: nn.Module, num_train_timesteps: int = 1000, beta_start: float = 1e-4,
                 beta_end: float = 0.02, beta_schedule: str = "linear", ridge: float = 1e-3, eps: float = 1e-6,
                 train_t_min: int = 10, train_t_step: int = 10, encode_t_min: int = 10, encode_t_step: int = 10,
                 order_by_correlation: bool = True, val_timesteps: list[int] | None = None,
                 denoiser: nn.Module | None = None, denoiser_path: str | None = None, clip_sample: bool = False,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer, lr_scheduler, init_from, init_from_trusted)
        self.save_hyperparameters()
        check_schedule(num_train_timesteps, beta_start, beta_end, beta_schedule)
        check_range("ridge", ridge, 0.0)
        check_range("eps", eps, 0.0)
        for name, value in (("train_t_min", train_t_min), ("encode_t_min", encode_t_min)):
            check_range(name, value, 0, num_train_timesteps - 1)
        for name, value in (("train_t_step", train_t_step), ("encode_t_step", encode_t_step)):
            check_range(name, value, 1)
        k = getattr(encoder, "num_features", None)
        if not isinstance(k, int) or k < 1:
            raise UserInputError("encoder must expose `num_features` (K, the number of learned features): use "
                                 "TimeConditionedMLPEncoder or TimeConditionedConvEncoder.")
        if denoiser is not None and denoiser_path is not None:
            raise UserInputError("give at most one of `denoiser` and `denoiser_path`.")
        self.encoder, self.num_features = encoder, k
        self.ridge, self.eps, self.order_by_correlation = ridge, eps, order_by_correlation
        self.schedule = dict(num_train_timesteps=num_train_timesteps, beta_start=beta_start, beta_end=beta_end,
                             beta_schedule=beta_schedule, clip_sample=clip_sample)
        self.noise_scheduler = make_scheduler("ddpm", **self.schedule)
        self.register_buffer("alphas_cumprod", self.noise_scheduler.alphas_cumprod.clone(), persistent=False)
        self.train_timesteps = list(range(train_t_min, num_train_timesteps, train_t_step))
        grid = torch.arange(encode_t_min, num_train_timesteps, encode_t_step)
        g = len(grid)
        if val_timesteps is None:
            val_timesteps = sorted({int(grid[int(i)]) for i in torch.linspace(0, g - 1, 4).round().long()})
        for t in val_timesteps:
            check_range("val_timesteps entry", t, 0, num_train_timesteps - 1)
        self.val_timesteps = list(val_timesteps)
        self._val_features: list[tuple[Tensor, Tensor, Tensor]] = []
        self._val_batch_size = 0
        self.encode_t_min, self.encode_t_step = encode_t_min, encode_t_step
        self.register_buffer("encode_timesteps", grid)
        self.register_buffer("encoded", torch.tensor(False))
        self.register_buffer("whiten_mean", torch.zeros(g, k))
        self.register_buffer("whiten_matrix", torch.zeros(g, k, k))
        self.register_buffer("whiten_norm", torch.ones(g, k))
        self.register_buffer("encode_correlations", torch.zeros(g, k))
        self.denoiser = denoiser if denoiser is not None else (
            load_diffusers_unet(denoiser_path) if denoiser_path is not None else None)
        if self.denoiser is not None:
            self.denoiser.requires_grad_(False)

    # ------------------------------------------------------------------------------------ training
    def forward(self, x: Tensor, t: Tensor | int) -> Tensor:
        t = torch.as_tensor(t, device=x.device).reshape(-1).expand(len(x)).long()
        return self.encoder(x, t)

    def _noisy_views(self, x0: Tensor, t: int, generator: torch.Generator | ExampleGenerators | None = None
                     ) -> tuple[Tensor, Tensor]:
        t_batch = torch.full((len(x0),), t, device=x0.device, dtype=torch.long)
        views = []
        for _ in range(2):
            noise = draw_normal(x0.shape, generator, "cpu" if generator is not None else x0.device)
            views.append(self.noise_scheduler.add_noise(x0, noise.to(x0), t_batch))
        return views[0], views[1]

    def _check_whitening_batch(self, n: int) -> None:
        if n <= self.num_features:
            raise UserInputError(f"a batch of {n} samples cannot whiten K={self.num_features} features: use "
                                 f"batch_size > K (the paper uses batches of 1024-2048).")

    def objective(self, x0: Tensor, t: int, generator: torch.Generator | ExampleGenerators | None = None
                  ) -> tuple[Tensor, Tensor]:
        """(loss, lambda_hat) of the two-view objective on a batch at one shared t."""
        self._check_whitening_batch(len(x0))
        x_a, x_b = self._noisy_views(x0, t, generator)
        with torch.no_grad():
            phi_a = self(x_a, t)
        return two_view_loss(phi_a.float(), self(x_b, t).float(), self.ridge, self.eps)

    def training_step(self, batch, batch_idx):
        index = int(torch.randint(len(self.train_timesteps), ()))
        loss, lam = self.objective(batch[0], self.train_timesteps[index])
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/eigenvalue_mean", lam.mean())
        return loss

    def validation_step(self, batch, batch_idx):
        """Batches with an index (``DiffusionToyDataModule``): keep both views' features at every validation t; the
        objective is computed in `on_validation_epoch_end`. Other batches: the objective of this batch."""
        generator = evaluation_generators(batch, batch_idx, STREAM_LOSS)
        if not isinstance(generator, ExampleGenerators):
            losses = []
            for t in self.val_timesteps:
                loss, lam = self.objective(batch[0], t, generator)
                losses.append(loss)
                self.log(f"val/eigenvalue_mean_t{t}", lam.mean(), sync_dist=True)
            self.log("val/loss", torch.stack(losses).mean(), prog_bar=True, sync_dist=True)
            return
        x0, views_a, views_b = batch[0], [], []
        for t in self.val_timesteps:
            x_a, x_b = self._noisy_views(x0, t, generator)
            views_a.append(self(x_a, t).float())
            views_b.append(self(x_b, t).float())
        self._val_features.append((batch[2].to(x0.device), torch.stack(views_a, 1), torch.stack(views_b, 1)))
        self._val_batch_size = max(self._val_batch_size, len(x0))

    def _validation_batch_size(self) -> int:
        """The validation loader's batch size (one process's batches), else the largest batch any rank saw."""
        loader = self.trainer.val_dataloaders if self._trainer is not None else None
        size = getattr(loader, "batch_size", None)
        if size:
            return int(size)
        seen = torch.tensor(float(self._val_batch_size), device=self.device)
        if distributed():
            torch.distributed.all_reduce(seen, op=torch.distributed.ReduceOp.MAX)
        return int(seen)

    def on_validation_epoch_end(self) -> None:
        """The two-view objective over all ranks' validation features, in index order and in blocks of the loader's
        batch size (one process's batches); epoch values are means over blocks weighted by block size."""
        rows, self._val_features = self._val_features, []
        if not rows and not distributed():  # nothing validated (or batches without an index, logged per batch)
            return
        index = torch.cat([r[0] for r in rows]) if rows else torch.zeros(0, dtype=torch.long, device=self.device)
        k, width = self.num_features, len(self.val_timesteps)
        empty = torch.zeros(0, width, k, device=self.device)
        phi_a = torch.cat([r[1] for r in rows]) if rows else empty
        phi_b = torch.cat([r[2] for r in rows]) if rows else empty
        size = self._validation_batch_size()
        self._val_batch_size = 0
        _, phi_a, phi_b = gather_examples(index, phi_a, phi_b)
        if len(phi_a) == 0:
            return
        losses, eigenvalues, weights = [], [], []
        for start in range(0, len(phi_a), size):
            a, b = phi_a[start:start + size], phi_b[start:start + size]
            self._check_whitening_batch(len(a))
            per_t = [two_view_loss(a[:, j], b[:, j], self.ridge, self.eps) for j in range(width)]
            losses.append(torch.stack([loss for loss, _ in per_t]).mean())
            eigenvalues.append(torch.stack([lam.mean() for _, lam in per_t]))
            weights.append(float(len(a)))
        w = torch.tensor(weights, device=phi_a.device)
        self.log("val/loss", (torch.stack(losses) * w).sum() / w.sum(), prog_bar=True, sync_dist=True)
        mean_eigenvalues = (torch.stack(eigenvalues) * w[:, None]).sum(0) / w.sum()
        for j, t in enumerate(self.val_timesteps):
            self.log(f"val/eigenvalue_mean_t{t}", mean_eigenvalues[j], sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """Features of the batch noised at the middle validation t (seeded noise): whitened (with the constant
        column) once encoded, raw f_theta before."""
        x0 = batch[0]
        t = self.val_timesteps[len(self.val_timesteps) // 2]
        x_t, _ = self._noisy_views(x0, t, evaluation_generators(batch, batch_idx, STREAM_FEATURES))
        if bool(self.encoded) and self.grid_index(t) is not None:
            return self.forward_whitened(x_t, t)
        return self(x_t, t)

    def prediction_fields(self, outputs, batch) -> dict:
        """The features of each example (one CSV row each)."""
        return {"features": outputs}

    # ------------------------------------------------------------------------------------ encoding
    def grid_index(self, t: int) -> int | None:
        """Position of t on the encode grid, None when t is off the grid."""
        offset = int(t) - self.encode_t_min
        if offset < 0 or offset % self.encode_t_step or offset // self.encode_t_step >= len(self.encode_timesteps):
            return None
        return offset // self.encode_t_step

    def forward_whitened(self, x: Tensor, t: int) -> Tensor:
        """Phi~(x, t) = [1, ((f(x, t) - mu_t) W_t) / norm_t]: [B, K+1], constant column first."""
        index = self.grid_index(t)
        if index is None:
            raise UserInputError(f"t={t} is not on the encode grid ({self.encode_t_min}, "
                                 f"{self.encode_t_min + self.encode_t_step}, ..., {int(self.encode_timesteps[-1])}).")
        phi = (self(x, t) - self.whiten_mean[index]) @ self.whiten_matrix[index] / self.whiten_norm[index]
        return torch.cat([torch.ones_like(phi[:, :1]), phi], dim=1)

    @torch.no_grad()
    def encode(self, x0: Tensor, targets: Tensor | None = None, generator: torch.Generator | None = None,
               batch_size: int = 4096, return_features: bool = False) -> dict[str, Tensor]:
        """Encode the training set on the grid: sets the whitening buffers; returns {"timesteps", "correlations"}
        plus, for ``targets`` [N] or [N, M], "coefficients" [G, K+1, M] and "energy_ratio" [G, M], and with
        ``return_features`` the features "phi" [G, N, K+1] (large for big N)."""
        if len(x0) <= self.num_features:
            raise UserInputError(f"encoding needs more samples ({len(x0)}) than features (K={self.num_features}).")
        if targets is not None:
            targets = targets.reshape(len(targets), -1).to(self.device, torch.float32)
            if len(targets) != len(x0):
                raise UserInputError(f"targets has {len(targets)} rows but x0 has {len(x0)} samples.")
        was_training = self.training
        self.eval()
        coefficients, ratios, features = [], [], []
        for index, t in enumerate(self.encode_timesteps.tolist()):
            phis = [[], []]
            for start in range(0, len(x0), batch_size):
                chunk = x0[start:start + batch_size].to(self.device)
                views = self._noisy_views(chunk, t, generator)
                for v in range(2 if self.order_by_correlation else 1):
                    phis[v].append(self(views[v], t).float())
            phi_a = torch.cat(phis[0])
            mu, w = whitening(phi_a, self.ridge)
            a = (phi_a - mu) @ w
            if self.order_by_correlation:
                b = (torch.cat(phis[1]) - mu) @ w
                values, rotation = correlation_basis(a, b)
                w, a = w @ rotation, a @ rotation
                self.encode_correlations[index] = values
            else:
                b = (torch.cat(phis[1]) - mu) @ w if phis[1] else None
                self.encode_correlations[index] = 0.0 if b is None else (a * b).mean(0)
            norm = a.square().mean(0).sqrt().clamp_min(1e-12)
            self.whiten_mean[index], self.whiten_matrix[index], self.whiten_norm[index] = mu[0], w, norm
            phi_tilde = torch.cat([torch.ones_like(a[:, :1]), a / norm], dim=1)
            if targets is not None:
                c = spectral_coefficients(phi_tilde, targets)
                coefficients.append(c)
                ratios.append(energy_ratio(c, targets))
            if return_features:
                features.append(phi_tilde)
        self.encoded.fill_(True)
        self.train(was_training)
        out = {"timesteps": self.encode_timesteps.clone(), "correlations": self.encode_correlations.clone()}
        if targets is not None:
            out["coefficients"], out["energy_ratio"] = torch.stack(coefficients), torch.stack(ratios)
        if return_features:
            out["phi"] = torch.stack(features)
        return out

    # ------------------------------------------------------------------------------------ sampling
    def attach_denoiser(self, denoiser: nn.Module) -> None:
        """Use a trained (frozen) denoiser for ``guided_sample``: a network or a `DiffusionDenoiser`. The denoiser
        becomes a submodule (its weights join this module's state_dict)."""
        self.denoiser = denoiser.denoiser if isinstance(denoiser, DiffusionDenoiser) else denoiser
        self.denoiser.requires_grad_(False)

    def guided_sample(self, coefficients: Tensor, targets: Tensor, data_shape: tuple[int, ...],
                      num_inference_steps: int = 100, eta: float = 1.0, generator: torch.Generator | None = None,
                      **guide_kwargs) -> tuple[Tensor, SpectralGuide]:
        """Spectral-guided DDIM samples (one per entry of ``targets``); returns (samples, the guide with stats)."""
        if self.denoiser is None:
            raise UserInputError("guided sampling needs a denoiser: set `denoiser`/`denoiser_path` or call "
                                 "attach_denoiser(...) with a trained DiffusionDenoiser.")
        self.denoiser.eval()
        self.eval()
        guide = SpectralGuide(self, coefficients, targets, **guide_kwargs)
        scheduler = make_scheduler("ddim", **self.schedule)
        samples = guided_ddim_sample(self.denoiser, scheduler, (len(targets), *data_shape), num_inference_steps, guide,
                                     eta, generator, self.device)
        return samples, guide
