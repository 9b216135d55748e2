"""InfoGeo: object-centric slots, CACS, CSRR and FiLM fusion for cross-view (drone -> satellite) geo-localisation.

Paper: "InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization"
(Zhang, Wang, Wang, Yin, Pun; ICML 2026, arXiv 2605.07099). Official code: github.com/HRT00/Official_InfoGeo
(``cvgl_base/model_slot_dias.py``; built on DIAS and CVCities). The release ships the model but not its loss or
trainer files (``cvgl_base/loss/*``, ``cvgl_base/trainer_slot.py``), and its evaluation forward refers to an
undefined name, so the loss composition and the evaluation path below are reconstructions (marked [inference]).
One file: slots, CACS, CSRR and the FiLM fusion are the steps of one forward pass, in the paper's order.

Pipeline (one shared network for both views; ``q`` = drone query, ``g`` = satellite gallery):

1. **Frozen encoder** ``Z^v`` (B x C x H x W): a timm model (DINOv2 ViT-B/14 at 448 px, 32 x 32 patches in the
   paper; weights from a local file only), or ``small_cnn`` (4 conv blocks, stride 8) for CPU runs. A ViT's
   prefix tokens are dropped; a timm CNN gives the feature map of ``encoder_stage`` (``features_only``).
2. **DIAS slot attention** (release ``slot_attention/``): one learned Gaussian shared by all K slots, T iterations of
   slot attention (softmax over slots, then re-normalised over positions, eps 1e-5), GRU + residual MLP update; an
   input MLP with pre-LayerNorm. **Random-order autoregressive transformer decoder**: positions are visited in a
   random order in training, each query token is its position embedding plus the projected feature of the
   previous position in that order (BOS first), causal self-attention, cross-attention to the slots; with
   probability 1/2 only a random prefix keeps its features (the rest get a learned mask token). It reconstructs
   ``Z`` (``L_rec``, MSE to the detached features) and the last layer's cross-attention, averaged over heads and
   put back in spatial order, gives the per-slot maps ``A^v`` (B x K x HW). Evaluation uses the natural order.
3. **CACS** (poster; release ``SlotCrossMoE``): ``f^q = A^q + MHA(A^q, A^g, A^g)``, ``f^g = A^g + MHA(A^g, A^q, A^q)``
   (tokens = slots, width = HW), a shared concept router ``W = sigmoid(Linear(ReLU(Linear(LN(f)))))`` per slot,
   gated maps ``Â^v = A^v * W^v``; gate loss ``L_cacs = E[W (1 - W)] - E[Var_K W]`` (poster) with W of both views,
   Var over the K slots of one image (population variance) and E over images and views [inference].
4. **CSRR** (poster): ``L_struct = min_{Q in O(r)} ||U^q - U^g Q||_F^2`` with ``U^v`` (HW x r) the top-r right
   singular vectors of ``Â^v`` [inference: the poster does not say what U is]. Closed form (orthogonal Procrustes):
   ``||U^q||^2 + ||U^g||^2 - 2 ||U^g^T U^q||_*`` (= 2r - 2 ||U^g^T U^q||_* for orthonormal bases), computed through
   the eigen-decomposition of the K x K Gram matrix ``Â Â^T`` (`top_right_singular_vectors`), so it does not depend
   on the slot order. ``r`` = 4 in the paper.
5. **OCVA fusion** (release ``SlotMixFusion``): with slot maps S and features Z, ``slot_vec = softmax_HW(S) Z``,
   ``P = Linear(slot_vec)``, ``channel = sum_k softmax_K(sum_HW S)_k P_k``, ``gamma = sigmoid(MLP(channel))``,
   ``Z_enh = Z (1 + gamma) + sum_k softmax_K(S)_k P_k`` per pixel, ``Z~ = alpha Z_enh + (1 - alpha) Z``, alpha = 0.8.
6. **MixVPR aggregator** (release ``SlotMixVPR``): feature mixers over the HW positions (x + MLP(LN(x))), channel
   projection C -> ``agg_channels``, row projection HW -> ``agg_rows``, flattened and L2-normalised.
7. **L_align**: symmetric InfoNCE between drone and satellite descriptors of the batch with a learnable logit scale
   (initialised to 1/0.07) and label smoothing 0.1 (Sample4Geo-style, the release config's values).

Total loss [inference: only ``rec`` = 0.05 is visible in the release configs]:
``L = L_align + rec_weight L_rec + cacs_weight L_cacs + struct_weight L_struct``. The baseline (``object_centric:
false``) is encoder + aggregator + InfoNCE; ``use_cacs`` / ``use_csrr`` / ``use_fusion`` switch the parts off one by
one (without CACS the maps are not gated and ``L_cacs`` is dropped).

Evaluation: drone queries and satellite gallery images are encoded **independently** (no cross-view module runs);
with fusion on, the fused descriptor uses the single-view, ungated slot maps ``A^v`` [inference: the release's
evaluation branch is broken, and the gate needs the other view]. Descriptors, location ids and the query flag are
gathered over processes once (`GeoRetrieval`, torchmetrics cat states) and ranked once by cosine similarity:
Recall@1/5/10, Recall@top-1% (recall within the first max(1, round(G / 100)) gallery images) and AP (University-1652
protocol: trapezoidal precision over all true matches, gallery ids -1 = junk removed), in percent.

Deviations: the relational distillation of "InfoGeo*" (appendix) is not implemented; the loss weights of CACS and
CSRR are configurable guesses; the CPU configs train a small encoder (``freeze_encoder: false``) because no small
pretrained encoder is available offline.

Length: one paper's model read top to bottom (slot attention, decoder, CACS, CSRR, fusion, aggregator and the
exact retrieval metric each depend on the previous); the data lives in `datamodules/geo_localization.py`.

Predictions (``train.py predict``): the datamodule's satellite gallery (`GeoRetrievalData.gallery_dataloader`) is
encoded once at the start of the run, then every drone query of the predict loader is ranked against it by cosine
similarity, as in evaluation. Per query: its location id, the location ids and scores of its ``predict_top_k`` best
gallery images (``top_locations_0`` is the best), their gallery indices, and ``match_rank``, the 0-based rank of the
first gallery image of its own location (-1 when the gallery has none; gallery ids -1, junk, are never ranked).

Length: one paper's method read top to bottom (the encoder, slot attention, the concept selection and layout
alignment terms of the InfoGeo objective, the retrieval evaluation and predictions); each piece is used only here.
"""
from __future__ import annotations

import math
import os

import timm
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import GeoRetrievalData
from lightning_modules.shared.errors import UserInputError, check_range

__all__ = ["InfoGeo", "GeoRetrieval", "SlotAttention", "RandomOrderDecoder", "ConceptSelection", "SlotFusion",
           "MixVPRAggregator", "retrieval_metrics", "gate_loss", "procrustes_distance", "structural_loss",
           "top_right_singular_vectors", "symmetric_info_nce"]


# ============================================================================================ losses (pure math)
def gate_loss(*gates: Tensor) -> Tensor:
    """``E[W (1 - W)] - E[Var_K W]`` over the given gate tensors (each B x K): pushes every gate to 0 or 1 and
    spreads them over the slots of an image (population variance over K, mean over images and views)."""
    w = torch.cat(gates, 0)
    return (w * (1 - w)).mean() - w.var(dim=-1, unbiased=False).mean()


class _TopEigenvectors(torch.autograd.Function):
    """Top-r eigenvectors (columns, eigenvalues descending) of symmetric matrices [..., K, K] with the eigenvalues.

    The backward is the standard eigenvector gradient ``V (diag(g_lambda) + F o (V^T g_V)) V^T`` with
    ``F_ij = 1 / (lambda_j - lambda_i)``, except that gaps smaller than ``eps * lambda_max`` are clamped to that size
    (torch's own backward turns such near-degenerate gaps into inf/NaN); it is exact wherever the eigenvalues
    involved are separated by more than that."""

    @staticmethod
    def forward(ctx, gram: Tensor, r: int, eps: float):
        values, vectors = torch.linalg.eigh(gram)
        values, vectors = values.flip(-1), vectors.flip(-1)
        ctx.save_for_backward(values, vectors)
        ctx.r, ctx.eps = r, eps
        return vectors[..., :r], values[..., :r]

    @staticmethod
    def backward(ctx, grad_vectors: Tensor, grad_values: Tensor):
        values, vectors = ctx.saved_tensors
        r, k = ctx.r, values.shape[-1]
        gap = values[..., None, :] - values[..., :, None]          # gap[i, j] = lambda_j - lambda_i
        floor = ctx.eps * values[..., :1, None].abs().clamp_min(1e-12)
        gap = torch.where(gap.abs() < floor, torch.where(gap < 0, -floor, floor).expand_as(gap), gap)
        keep = ~torch.eye(k, dtype=torch.bool, device=values.device)
        keep[:, r:] = False                                        # g_V is zero beyond the r kept columns
        inv = torch.where(keep, 1.0 / gap, torch.zeros_like(gap))
        full_grad = torch.zeros_like(vectors)
        full_grad[..., :r] = grad_vectors
        inner = inv * (vectors.transpose(-1, -2) @ full_grad)
        diag = torch.zeros_like(values)
        diag[..., :r] = grad_values
        middle = inner + torch.diag_embed(diag)
        grad = vectors @ middle @ vectors.transpose(-1, -2)
        return 0.5 * (grad + grad.transpose(-1, -2)), None, None


def top_right_singular_vectors(maps: Tensor, r: int, eps: float = 1e-4) -> Tensor:
    """Orthonormal basis (B x HW x r) of the top-r right singular subspace of slot maps ``maps`` (B x K x HW), from
    the K x K Gram matrix: ``v_i = maps^T e_i / sigma_i``. Invariant (up to a rotation of the basis) to the slot
    order; the eigen-problem is solved in float64."""
    x = maps.double()
    gram = x @ x.transpose(-1, -2)
    vectors, values = _TopEigenvectors.apply(gram, r, eps)
    sigma = values.clamp_min(eps * values[..., :1].clamp_min(1e-12)).sqrt()
    return ((x.transpose(-1, -2) @ vectors) / sigma[..., None, :]).to(maps.dtype)


def procrustes_distance(u_q: Tensor, u_g: Tensor) -> Tensor:
    """``min_{Q orthogonal} ||u_q - u_g Q||_F^2 = ||u_q||^2 + ||u_g||^2 - 2 ||u_g^T u_q||_*`` per batch element."""
    cross = u_g.transpose(-1, -2) @ u_q
    nuclear = torch.linalg.svdvals(cross).sum(-1)
    return u_q.square().sum((-1, -2)) + u_g.square().sum((-1, -2)) - 2 * nuclear


def structural_loss(maps_q: Tensor, maps_g: Tensor, r: int) -> Tensor:
    """CSRR: mean over the batch of the Procrustes distance between the two views' top-r concept subspaces."""
    return procrustes_distance(top_right_singular_vectors(maps_q, r), top_right_singular_vectors(maps_g, r)).mean()


def symmetric_info_nce(desc_q: Tensor, desc_g: Tensor, logit_scale: Tensor, label_smoothing: float) -> Tensor:
    """Symmetric InfoNCE over the batch (pair i of the batch is the positive of row/column i)."""
    logits = logit_scale.exp() * desc_q @ desc_g.T
    target = torch.arange(len(logits), device=logits.device)
    return 0.5 * (F.cross_entropy(logits, target, label_smoothing=label_smoothing)
                  + F.cross_entropy(logits.T, target, label_smoothing=label_smoothing))


# ============================================================================================ retrieval metrics
def retrieval_metrics(query: Tensor, query_ids: Tensor, gallery: Tensor, gallery_ids: Tensor,
                      ks: tuple[int, ...] = (1, 5, 10), strict: bool = True) -> dict[str, float]:
    """Recall@k, Recall@top-1% and AP (in %) of cosine-similarity ranking; gallery ids -1 (junk) are dropped.

    AP is the University-1652 form: for the true matches at 0-based ranks ``p_1 < ... < p_n`` (junk removed),
    ``AP = sum_i (1/n) ((i - 1) / p_i + i / (p_i + 1)) / 2`` with ``(i - 1) / p_i := 1`` when ``p_i = 0``.
    Every query needs at least one gallery image of its location (`UserInputError` otherwise); ``strict=False``
    (a partial pass: the sanity check, ``limit_*_batches``) scores only the queries whose location it saw, and
    returns ``{}`` when none is left."""
    keep = gallery_ids != -1
    gallery, gallery_ids = gallery[keep], gallery_ids[keep]
    missing = ~torch.isin(query_ids, gallery_ids)
    if not strict:
        query, query_ids = query[~missing], query_ids[~missing]
        if not len(query_ids):
            return {}
    elif missing.any():
        absent = sorted(set(query_ids[missing].tolist()))
        raise UserInputError(f"{int(missing.sum())} queries have no gallery image of their location (ids "
                             f"{absent[:8]}{' ...' if len(absent) > 8 else ''}): every query location must appear in "
                             "the gallery. Check the query/gallery folders (or the synthetic split sizes).")
    sims = F.normalize(query.float(), dim=-1) @ F.normalize(gallery.float(), dim=-1).T
    order = sims.argsort(dim=1, descending=True, stable=True)
    good = gallery_ids[order] == query_ids[:, None]                # Q x G, in ranked order
    first = good.float().argmax(1)
    num_gallery = len(gallery_ids)
    top_percent = max(1, round(num_gallery / 100))
    out = {f"r{k}": float((first < k).float().mean() * 100) for k in ks}
    out["r_top1pct"] = float((first < top_percent).float().mean() * 100)
    ranks = torch.arange(num_gallery, dtype=torch.float64, device=sims.device).expand_as(good)
    hits = good.double().cumsum(1)                                 # i (1-based) at each true match
    n_good = good.sum(1, keepdim=True).double()
    old = torch.where(ranks > 0, (hits - 1) / ranks.clamp_min(1), torch.ones_like(ranks))
    new = hits / (ranks + 1)
    ap = ((old + new) / 2 * good.double()).sum(1) / n_good.squeeze(1)
    out["ap"] = float(ap.mean() * 100)
    return out


class GeoRetrieval(Metric):
    """Drone -> satellite retrieval over the whole evaluation set: descriptors, location ids and the query flag are
    cat states (gathered over processes once, uneven shards allowed), ranked once in `compute`."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.strict = True   # False for a partial pass (see `retrieval_metrics`)
        self.add_state("descriptors", default=[], dist_reduce_fx="cat")
        self.add_state("ids", default=[], dist_reduce_fx="cat")
        self.add_state("is_query", default=[], dist_reduce_fx="cat")

    def update(self, descriptors: Tensor, ids: Tensor, is_query: Tensor) -> None:
        self.descriptors.append(descriptors.detach().float())
        self.ids.append(ids.long())
        self.is_query.append(is_query.bool())

    def compute(self) -> dict[str, Tensor]:
        desc, ids, query = (torch.cat(s) if isinstance(s, list) else s
                            for s in (self.descriptors, self.ids, self.is_query))
        if self.strict and (not query.any() or query.all()):
            raise UserInputError("the evaluation set needs both drone queries and satellite gallery images.")
        values = retrieval_metrics(desc[query], ids[query], desc[~query], ids[~query], strict=self.strict)
        return {k: torch.tensor(v) for k, v in values.items()}


# ============================================================================================ networks
class SmallCNN(nn.Module):
    """Four 3x3 conv blocks (GroupNorm, GELU), stride 2 in the first three: a C x H/8 x W/8 map."""

    def __init__(self, channels: int = 32, in_channels: int = 3) -> None:
        super().__init__()
        layers, width = [], in_channels
        for stride in (2, 2, 2, 1):
            layers += [nn.Conv2d(width, channels, 3, stride, 1), nn.GroupNorm(4, channels), nn.GELU()]
            width = channels
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Encoder(nn.Module):
    """The shared visual encoder: images B x 3 x S x S -> feature map B x C x H x W (see the module docstring)."""

    def __init__(self, name: str, image_size: int, weights: str | None, stage: int, cnn_channels: int) -> None:
        super().__init__()
        self.name, self.image_size, self.kind = name, image_size, "cnn"
        if name == "small_cnn":
            if weights:
                raise UserInputError("encoder_weights is for timm encoders; small_cnn starts from scratch.")
            if image_size % 8:
                raise UserInputError(f"image_size={image_size} is not a multiple of 8, small_cnn's stride: "
                                     f"use {max(8, image_size // 8 * 8)} or {image_size // 8 * 8 + 8}.")
            self.net = SmallCNN(cnn_channels)
            return
        if not timm.is_model(name):
            raise UserInputError(f"encoder '{name}' is neither 'small_cnn' nor a timm model name "
                                 f"(similar: {timm.list_models(f'*{name[:5]}*')[:6]}).")
        kwargs: dict = {"pretrained": False}
        if weights:
            if not os.path.isfile(weights):
                raise UserInputError(f"encoder_weights '{weights}' does not exist: put the {name} weights (timm "
                                     "state_dict, .pth/.bin/.safetensors) there; nothing is downloaded.")
            # "source" other than hf-hub: timm then loads the file and never reaches for the hub
            kwargs = {"pretrained": True,
                      "pretrained_cfg_overlay": {"file": os.path.abspath(weights), "source": "file"}}
        probe = timm.create_model(name, pretrained=False, num_classes=0) if "vit" in name or "dinov2" in name \
            else None
        if probe is not None and hasattr(probe, "patch_embed"):
            patch = probe.patch_embed.patch_size[0]
            if image_size % patch:
                raise UserInputError(f"image_size={image_size} is not a multiple of {name}'s patch size {patch}: "
                                     f"the patch grid needs e.g. {image_size // patch * patch} or "
                                     f"{(image_size // patch + 1) * patch} (448 for DINOv2 ViT-B/14).")
            self.kind = "vit"
            self.net = timm.create_model(name, num_classes=0, img_size=image_size, **kwargs)
        else:
            self.net = timm.create_model(name, features_only=True, out_indices=(stage,), **kwargs)
            reduction = self.net.feature_info.reduction()[-1]
            if image_size % reduction:
                raise UserInputError(f"image_size={image_size} is not a multiple of {name}'s stride {reduction} at "
                                     f"encoder_stage={stage}.")

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            raise UserInputError(f"images are {tuple(x.shape[-2:])} but the model was built for image_size="
                                 f"{self.image_size}: set the same image_size for model and data.")
        if self.kind == "vit":
            tokens = self.net.forward_features(x)[:, self.net.num_prefix_tokens:]
            side = int(math.isqrt(tokens.shape[1]))
            return tokens.transpose(1, 2).reshape(len(x), -1, side, side)
        out = self.net(x)
        return out[-1] if isinstance(out, (list, tuple)) else out


class SlotAttention(nn.Module):
    """DIAS-style slot attention: shared Gaussian init, ``iters`` rounds, GRU + residual MLP update."""

    def __init__(self, in_dim: int, slot_dim: int, num_slots: int, iters: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.num_slots, self.iters, self.eps, self.scale = num_slots, iters, eps, slot_dim ** -0.5
        self.mu = nn.Parameter(torch.randn(1, 1, slot_dim) * slot_dim ** -0.5)
        self.log_sigma = nn.Parameter(torch.full((1, 1, slot_dim), -1.0))
        self.project_in = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                        nn.Linear(in_dim, in_dim))
        self.norm_inputs, self.norm_slots, self.norm_mlp = nn.LayerNorm(in_dim), nn.LayerNorm(slot_dim), \
            nn.LayerNorm(slot_dim)
        self.to_q = nn.Linear(slot_dim, slot_dim, bias=False)
        self.to_k = nn.Linear(in_dim, slot_dim, bias=False)
        self.to_v = nn.Linear(in_dim, slot_dim, bias=False)
        self.gru = nn.GRUCell(slot_dim, slot_dim)
        # evaluation draws no fresh noise: one fixed draw (part of the state) keeps descriptors deterministic
        self.register_buffer("eval_noise", torch.randn(1, num_slots, slot_dim))
        self.mlp = nn.Sequential(nn.Linear(slot_dim, 4 * slot_dim), nn.GELU(), nn.Linear(4 * slot_dim, slot_dim))

    def forward(self, tokens: Tensor) -> Tensor:
        b, _, _ = tokens.shape
        x = self.norm_inputs(self.project_in(tokens))
        k, v = self.to_k(x), self.to_v(x)
        if self.training:
            noise = torch.randn(b, self.num_slots, self.mu.shape[-1], device=tokens.device, dtype=tokens.dtype)
        else:
            noise = self.eval_noise.expand(b, -1, -1).to(tokens.dtype)
        slots = self.mu + self.log_sigma.exp() * noise
        for _ in range(self.iters):
            previous = slots
            q = self.to_q(self.norm_slots(slots))
            attn = torch.softmax(torch.einsum("bkd,bnd->bkn", q, k) * self.scale, dim=1) + self.eps
            attn = attn / attn.sum(-1, keepdim=True)
            updates = attn @ v
            slots = self.gru(updates.reshape(-1, updates.shape[-1]), previous.reshape(-1, previous.shape[-1]))
            slots = slots.reshape(b, self.num_slots, -1)
            slots = slots + self.mlp(self.norm_mlp(slots))
        return slots


class _DecoderLayer(nn.Module):
    """Pre-LN transformer decoder layer whose cross-attention also returns its head-averaged weights."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: Tensor, memory: Tensor, causal: Tensor) -> tuple[Tensor, Tensor]:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        out, weights = self.cross_attn(self.norm2(x), memory, memory, need_weights=True, average_attn_weights=True)
        x = x + out
        return x + self.ffn(self.norm3(x)), weights


class RandomOrderDecoder(nn.Module):
    """The random-order autoregressive feature decoder (module docstring, step 2).

    ``forward(features [B, N, C], slots [B, K, D])`` -> (reconstruction [B, N, C], maps [B, K, N]) in spatial order."""

    def __init__(self, feat_dim: int, slot_dim: int, positions: int, dim: int, layers: int, heads: int,
                 prefix_prob: float = 0.5) -> None:
        super().__init__()
        self.positions, self.prefix_prob = positions, prefix_prob
        self.input_proj = nn.Sequential(nn.LayerNorm(feat_dim), nn.Linear(feat_dim, dim))
        self.slot_proj = nn.Sequential(nn.LayerNorm(slot_dim), nn.Linear(slot_dim, dim))
        self.pos = nn.Parameter(torch.randn(1, positions, dim) * 0.02)
        self.bos = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.mask_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.layers = nn.ModuleList(_DecoderLayer(dim, heads, 2 * dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, feat_dim)

    def forward(self, features: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        b, n, _ = features.shape
        if n != self.positions:
            raise UserInputError(f"the encoder gives {n} positions but the decoder was built for {self.positions}: "
                                 "image_size must match the model's.")
        device = features.device
        if self.training:
            order = torch.stack([torch.randperm(n, device=device) for _ in range(b)])
        else:
            order = torch.arange(n, device=device).expand(b, n)
        gathered = torch.gather(features, 1, order[..., None].expand(-1, -1, features.shape[-1]))
        content = torch.cat([self.bos.expand(b, 1, -1), self.input_proj(gathered[:, :-1])], 1)
        if self.training:
            prefix = torch.randint(0, n, (b, 1), device=device)
            use = torch.rand(b, 1, device=device) < self.prefix_prob
            masked = use & (torch.arange(n, device=device)[None] > prefix)
            content = torch.where(masked[..., None], self.mask_token.expand(b, n, -1), content)
        x = content + torch.gather(self.pos.expand(b, -1, -1), 1, order[..., None].expand(-1, -1, self.pos.shape[-1]))
        causal = torch.triu(torch.full((n, n), float("-inf"), device=device), diagonal=1)
        memory = self.slot_proj(slots)
        weights = None
        for layer in self.layers:
            x, weights = layer(x, memory, causal)
        recon_ordered = self.head(self.norm(x))
        inverse = order.argsort(1)
        recon = torch.gather(recon_ordered, 1, inverse[..., None].expand(-1, -1, recon_ordered.shape[-1]))
        maps = torch.gather(weights, 1, inverse[..., None].expand(-1, -1, weights.shape[-1]))   # B x N x K
        return recon, maps.transpose(1, 2)


class ConceptSelection(nn.Module):
    """CACS: cross-view attention over the two views' slot maps and the shared sigmoid concept router."""

    def __init__(self, positions: int, heads: int) -> None:
        super().__init__()
        self.q2g = nn.MultiheadAttention(positions, heads, batch_first=True)
        self.g2q = nn.MultiheadAttention(positions, heads, batch_first=True)
        self.router = nn.Sequential(nn.LayerNorm(positions), nn.Linear(positions, positions), nn.ReLU(),
                                    nn.Linear(positions, 1), nn.Sigmoid())

    def forward(self, maps_q: Tensor, maps_g: Tensor) -> tuple[Tensor, Tensor]:
        f_q = maps_q + self.q2g(maps_q, maps_g, maps_g, need_weights=False)[0]
        f_g = maps_g + self.g2q(maps_g, maps_q, maps_q, need_weights=False)[0]
        return self.router(f_q).squeeze(-1), self.router(f_g).squeeze(-1)


class SlotFusion(nn.Module):
    """OCVA FiLM fusion of the slot maps into the feature map (module docstring, step 5)."""

    def __init__(self, channels: int, alpha: float) -> None:
        super().__init__()
        self.alpha = alpha
        self.slot_proj = nn.Linear(channels, channels)
        self.film = nn.Sequential(nn.Linear(channels, max(1, channels // 2)), nn.GELU(),
                                  nn.Linear(max(1, channels // 2), channels))

    def forward(self, features: Tensor, maps: Tensor) -> Tensor:
        b, c, h, w = features.shape
        z = features.flatten(2).transpose(1, 2)                       # B x N x C
        slot_vec = torch.softmax(maps, dim=-1) @ z                      # B x K x C
        proj = self.slot_proj(slot_vec)
        slot_alpha = torch.softmax(maps.sum(-1), dim=-1)                # B x K
        gamma = torch.sigmoid(self.film((slot_alpha[..., None] * proj).sum(1)))   # B x C
        per_pixel = torch.softmax(maps, dim=1).transpose(1, 2) @ proj   # B x N x C
        enhanced = z * (1 + gamma[:, None]) + per_pixel
        fused = self.alpha * enhanced + (1 - self.alpha) * z
        return fused.transpose(1, 2).reshape(b, c, h, w)


class MixVPRAggregator(nn.Module):
    """MixVPR: feature mixers over the spatial positions, channel and row projections, L2-normalised output."""

    def __init__(self, channels: int, positions: int, out_channels: int, out_rows: int, depth: int = 2,
                 ratio: float = 1.0) -> None:
        super().__init__()
        hidden = max(1, int(positions * ratio))
        self.mixers = nn.ModuleList(nn.Sequential(nn.LayerNorm(positions), nn.Linear(positions, hidden), nn.ReLU(),
                                                  nn.Linear(hidden, positions)) for _ in range(depth))
        self.channel_proj = nn.Linear(channels, out_channels)
        self.row_proj = nn.Linear(positions, out_rows)

    def forward(self, features: Tensor) -> Tensor:
        x = features.flatten(2)                                          # B x C x N
        for mixer in self.mixers:
            x = x + mixer(x)
        x = self.channel_proj(x.transpose(1, 2))                         # B x N x C'
        x = self.row_proj(x.transpose(1, 2))                             # B x C' x R
        return F.normalize(x.flatten(1), dim=-1)


# ============================================================================================ the module
class InfoGeo(PaperModule):
    """InfoGeo and its MixVPR + InfoNCE baseline (module docstring). Training batches are ``(drone, satellite,
    location)``; evaluation batches ``(image, location, is_query)``.

    Args:
        encoder: ``small_cnn`` or a timm model name (``vit_base_patch14_dinov2``); never downloaded.
        encoder_weights: local weights file of a timm encoder (checked at construction).
        freeze_encoder: keep the encoder frozen (paper) or train it (the CPU configs' small CNN).
        image_size: input side; must fit the encoder's patch grid / stride.
        encoder_stage: feature stage of a timm CNN (``features_only`` index).
        cnn_channels: width of ``small_cnn``.
        object_centric: false = the baseline (encoder + aggregator + InfoNCE).
        use_cacs / use_csrr / use_fusion: the ablation switches.
        num_slots / slot_iters / slot_dim: K, T and the slot width.
        decoder_dim / decoder_layers / decoder_heads: the feature decoder (4 layers, width 768, 4 heads in DIAS).
        cacs_heads: heads of the cross-view attention (must divide the number of positions).
        csrr_rank: r (at most num_slots). fusion_alpha: alpha of the FiLM fusion.
        agg_channels / agg_rows / agg_depth: MixVPR sizes (descriptor = agg_channels * agg_rows).
        rec_weight / cacs_weight / struct_weight: loss weights. label_smoothing / logit_scale_init: InfoNCE.
        predict_top_k: gallery matches written per query by ``predict`` (10: the paper's largest Recall@k).
    """

    def __init__(self, encoder: str = "small_cnn", encoder_weights: str | None = None, freeze_encoder: bool = True,
                 image_size: int = 32, encoder_stage: int = 2, cnn_channels: int = 32,
                 object_centric: bool = True, use_cacs: bool = True, use_csrr: bool = True, use_fusion: bool = True,
                 num_slots: int = 8, slot_iters: int = 3, slot_dim: int = 64,
                 decoder_dim: int = 64, decoder_layers: int = 1, decoder_heads: int = 4, cacs_heads: int = 4,
                 csrr_rank: int = 4, fusion_alpha: float = 0.8,
                 agg_channels: int = 64, agg_rows: int = 4, agg_depth: int = 2,
                 rec_weight: float = 0.05, cacs_weight: float = 0.1, struct_weight: float = 0.1,
                 label_smoothing: float = 0.1, logit_scale_init: float = 1 / 0.07, predict_top_k: int = 10,
                 optimizer: OptimizerCallable = torch.optim.AdamW, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        for name, value in (("num_slots", num_slots), ("slot_iters", slot_iters), ("slot_dim", slot_dim),
                            ("decoder_dim", decoder_dim), ("decoder_layers", decoder_layers),
                            ("decoder_heads", decoder_heads), ("cacs_heads", cacs_heads), ("csrr_rank", csrr_rank),
                            ("agg_channels", agg_channels), ("agg_rows", agg_rows), ("image_size", image_size),
                            ("cnn_channels", cnn_channels), ("predict_top_k", predict_top_k)):
            check_range(name, value, 1)
        check_range("agg_depth", agg_depth, 0)
        check_range("fusion_alpha", fusion_alpha, 0.0, 1.0)
        check_range("label_smoothing", label_smoothing, 0.0, 1.0, high_inclusive=False)
        check_range("logit_scale_init", logit_scale_init, 0.0, low_inclusive=False)
        for name, value in (("rec_weight", rec_weight), ("cacs_weight", cacs_weight),
                            ("struct_weight", struct_weight)):
            check_range(name, value, 0.0)
        if object_centric and use_csrr and csrr_rank > num_slots:
            raise UserInputError(f"csrr_rank={csrr_rank} exceeds num_slots={num_slots}: the gated slot maps have "
                                 f"at most {num_slots} singular directions. Use csrr_rank <= num_slots "
                                 "(the paper: K = 16, r = 4).")
        if decoder_dim % decoder_heads:
            raise UserInputError(f"decoder_dim={decoder_dim} is not divisible by decoder_heads={decoder_heads}.")
        self.save_hyperparameters()
        self.encoder = Encoder(encoder, image_size, encoder_weights, encoder_stage, cnn_channels)
        if freeze_encoder:
            self.encoder.requires_grad_(False)
        with torch.no_grad():
            was_training = self.encoder.training
            probe = self.encoder.eval()(torch.zeros(1, 3, image_size, image_size))
            self.encoder.train(was_training)
        channels, height, width = probe.shape[1:]
        positions = height * width
        self.feature_shape = (channels, height, width)
        if object_centric:
            if use_cacs and positions % cacs_heads:
                raise UserInputError(f"cacs_heads={cacs_heads} must divide the {positions} feature positions "
                                     f"({height} x {width} at image_size={image_size}).")
            self.slots = SlotAttention(channels, slot_dim, num_slots, slot_iters)
            self.decoder = RandomOrderDecoder(channels, slot_dim, positions, decoder_dim, decoder_layers,
                                              decoder_heads)
            self.cacs = ConceptSelection(positions, cacs_heads) if use_cacs else None
            self.fusion = SlotFusion(channels, fusion_alpha) if use_fusion else None
        self.aggregator = MixVPRAggregator(channels, positions, agg_channels, agg_rows, agg_depth)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(logit_scale_init)))
        self.val_retrieval, self.test_retrieval = GeoRetrieval(), GeoRetrieval()
        self.gallery: tuple[Tensor, Tensor] | None = None  # (descriptors, location ids), during a predict run

    # ------------------------------------------------------------------------------------------ pieces
    def train(self, mode: bool = True):
        super().train(mode)
        if self.hparams.freeze_encoder:
            self.encoder.eval()   # a frozen encoder keeps its normalisation statistics
        return self

    def features(self, images: Tensor) -> Tensor:
        if self.hparams.freeze_encoder:
            with torch.no_grad():
                return self.encoder(images)
        return self.encoder(images)

    def slot_maps(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """(reconstruction loss, slot maps B x K x HW) of one view."""
        tokens = features.flatten(2).transpose(1, 2)
        recon, maps = self.decoder(tokens, self.slots(tokens))
        return F.mse_loss(recon, tokens.detach()), maps

    def describe(self, features: Tensor, maps: Tensor | None) -> Tensor:
        if maps is not None and self.hparams.object_centric and self.hparams.use_fusion:
            features = self.fusion(features, maps)
        return self.aggregator(features)

    def encode(self, images: Tensor) -> Tensor:
        """Single-view descriptor (evaluation): no cross-view module runs; fusion uses the ungated maps."""
        z = self.features(images)
        maps = None
        if self.hparams.object_centric and self.hparams.use_fusion:
            maps = self.slot_maps(z)[1]
        return self.describe(z, maps)

    def forward(self, images: Tensor) -> Tensor:
        return self.encode(images)

    def training_losses(self, drone: Tensor, satellite: Tensor) -> dict[str, Tensor]:
        hp = self.hparams
        z_q, z_g = self.features(drone), self.features(satellite)
        losses: dict[str, Tensor] = {}
        maps_q = maps_g = None
        if hp.object_centric:
            rec_q, maps_q = self.slot_maps(z_q)
            rec_g, maps_g = self.slot_maps(z_g)
            losses["rec"] = 0.5 * (rec_q + rec_g)
            if hp.use_cacs:
                w_q, w_g = self.cacs(maps_q, maps_g)
                losses["cacs"] = gate_loss(w_q, w_g)
                maps_q, maps_g = maps_q * w_q[..., None], maps_g * w_g[..., None]
            if hp.use_csrr:
                losses["struct"] = structural_loss(maps_q, maps_g, hp.csrr_rank)
        desc_q, desc_g = self.describe(z_q, maps_q), self.describe(z_g, maps_g)
        losses["align"] = symmetric_info_nce(desc_q, desc_g, self.logit_scale, hp.label_smoothing)
        weights = {"align": 1.0, "rec": hp.rec_weight, "cacs": hp.cacs_weight, "struct": hp.struct_weight}
        losses["loss"] = sum(weights[k] * v for k, v in losses.items())
        return losses

    # ------------------------------------------------------------------------------------------ steps
    def training_step(self, batch, batch_idx):
        drone, satellite, _ = batch
        losses = self.training_losses(drone, satellite)
        self.log_dict({f"train/{k}": v for k, v in losses.items()}, prog_bar=False, batch_size=len(drone))
        self.log("train/logit_scale", self.logit_scale.exp(), batch_size=len(drone))
        return losses["loss"]

    def _evaluate(self, batch, metric: GeoRetrieval) -> None:
        images, ids, is_query = batch
        metric.update(self.encode(images), ids, is_query)

    def _log_retrieval(self, metric: GeoRetrieval, prefix: str) -> None:
        trainer = self.trainer
        limit = trainer.limit_val_batches if prefix == "val" else trainer.limit_test_batches
        # a partial pass (sanity check, limit_*_batches < all) scores only the queries whose location it saw
        metric.strict = not trainer.sanity_checking and isinstance(limit, float) and limit >= 1.0
        values = metric.compute()
        metric.reset()
        self.log_dict({f"{prefix}/{k}": v.float() for k, v in values.items()}, prog_bar=prefix == "val")

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, self.val_retrieval)

    def on_validation_epoch_end(self) -> None:
        self._log_retrieval(self.val_retrieval, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, self.test_retrieval)

    def on_test_epoch_end(self) -> None:
        self._log_retrieval(self.test_retrieval, "test")

    def on_predict_start(self) -> None:
        """Encode the whole gallery once (every process encodes all of it; queries are sharded)."""
        data = self.attached_data(GeoRetrievalData)
        if data is None:
            raise UserInputError("InfoGeo predict ranks drone queries against a satellite gallery: attach a datamodule "
                                 "with a gallery_dataloader (GeoLocalizationDataModule).")
        descriptors, ids = [], []
        with torch.no_grad():
            for images, locations, _ in data.gallery_dataloader():
                descriptors.append(self.encode(images.to(self.device)))
                ids.append(locations.to(self.device))
        if not descriptors:
            raise UserInputError("InfoGeo predict: the gallery is empty; the test source needs satellite images.")
        descriptors, ids = torch.cat(descriptors), torch.cat(ids).long()
        keep = ids != -1  # junk gallery images are never ranked (as in `retrieval_metrics`)
        self.gallery = (descriptors[keep], ids[keep])

    def on_predict_end(self) -> None:
        self.gallery = None

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """Query descriptors and, in a predict run (gallery encoded by `on_predict_start`), each query's
        ``predict_top_k`` gallery matches: location ids, cosine scores, gallery indices and ``match_rank``."""
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        descriptors = self.encode(images)
        out = {"descriptor": descriptors}
        if isinstance(batch, (list, tuple)) and len(batch) == 3:
            out["location"] = batch[1]
        if self.gallery is None:
            return out
        gallery, gallery_ids = self.gallery
        sims = F.normalize(descriptors.float(), dim=-1) @ F.normalize(gallery.float(), dim=-1).T
        k = min(self.hparams.predict_top_k, len(gallery_ids))
        scores, index = sims.topk(k, dim=1)
        out.update(top_locations=gallery_ids[index], top_scores=scores, top_gallery=index)
        if "location" in out:
            order = sims.argsort(dim=1, descending=True, stable=True)
            good = gallery_ids[order] == out["location"][:, None].long()
            out["match_rank"] = torch.where(good.any(1), good.float().argmax(1), -1)
        return out

    def prediction_fields(self, outputs, batch):
        """Per query: location, top-k gallery locations / scores / indices and ``match_rank``; the descriptor
        only in ``predictions.pt`` (``--model.init_args.predict_top_k`` sets k)."""
        return dict(outputs)
