"""LDARNet: a hierarchical byte-level DNA model with learned (dynamic) chunking, MLM pretraining and fine-tuning.

Paper: "LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling",
Daria Ledneva, Denis Kuznetsov, ICML 2026 (arXiv 2606.04552). Official code: github.com/darlednik/ICML-LDARNet
(Apache-2.0), an H-Net derivative. Only the abstract of the paper was readable; every formula below follows the
official code as read for this collection (the method card).

Method
------
Bytes of DNA (vocabulary A=0, C=1, G=2, T=3, N=4, [MASK]=5, [PAD]=6) are embedded (d_outer) and processed by a
single-stage hierarchy given by an architecture layout like the authors' ``arch_layout = ["m3t1", ["M10"], "m4"]``
(`parse_layout`: ``m``/``M`` = BiMamba-2 block without/with a SwiGLU MLP, ``t``/``T`` = local bidirectional
attention block without/with MLP, each letter followed by a count):

1. **Encoder** (``m3t1``) at width ``d_model[0]``: pre-norm RMSNorm residual blocks of BiMamba-2
   (`lightning_modules.bimamba2`) and local attention (window ``attn_window`` on both sides, rotary on the first
   ``rotary_dim`` dims of every head), final RMSNorm.
2. **Bidirectional routing** (`BidirectionalRouter`): ``q = normalize(W_q x)``, ``k = normalize(W_k x)`` (identity
   initialised); ``cos_t = 1/2 (q_{t-1}.k_t + q_t.k_{t-1})`` (symmetrised adjacent similarity), ``p_t =
   clamp((1 - cos_t)/2, 0, 1)``, ``p_0 = 1``; boundary ``b_t = [p_t > 0.5]`` (masked by padding), selected
   probability ``c_t = max(p_t, 1 - p_t)``.
3. **Chunking** (`chunk`): keep the boundary positions (stable order), right-pad to the longest compressed
   sequence of the batch; compressed padding mask.
4. **Backbone** (``M10``) at width ``d_model[1]`` on the compressed sequence; the encoder output is widened with a
   learned vector (``d_model[1] - d_model[0]`` dims) and the backbone output is cut back to ``d_model[0]``.
5. **Dechunking** (`dechunk_ema`, always in fp32 - the authors' post-camera-ready fix): a bidirectional EMA over
   the M chunk vectors, ``zbar_j = p_j z_j + (1 - p_j) zbar_{j-1}`` forwards and the same on the reversed chunk
   sequence, averaged (p clamped to [1e-4, 1 - 1e-4]); computed with the chunked SSD scan (scalar state,
   log-decay ``log(1 - p)``, input weight ``p``), which equals the EMA loop (tested). Upsampling: position t takes
   chunk ``cumsum(b)_t - 1``.
6. **Straight-through residual**: ``out = upsampled * STE(c_t) + W_res enc_out`` (STE forward 1, gradient to
   c_t; W_res zero-initialised, fp32), then the **decoder** (``m4``) and its final RMSNorm.
7. **Ratio loss** (H-Net's load balancing, `ratio_loss`): ``F = mean(b)``, ``G = mean(p)`` over valid tokens,
   ``L_ratio = N/(N-1) ((N-1) F G + (1-F)(1-G))`` with target compression N; total loss
   ``L_MLM + ratio_loss_weight * L_ratio`` (paper: N = 4, weight 0.03). L_ratio = 1 at F = G = 1/N.

Pretraining (`LDARNetPretraining`): MLM on 15 % of the A/C/G/T positions (80 % [MASK], 10 % a random base, 10 %
unchanged; N and PAD are never selected), reverse-complement augmentation with probability 0.5 on training
batches, untied LM head Linear(d_outer, 7). Validation masks with a generator seeded by the batch index (the
same positions every epoch). Fine-tuning (`LDARNetClassifier`): the same network loaded with ``init_from`` (weights
matched by name and shape), mean pooling over non-pad positions of the final full-resolution hidden states, a
linear head; metrics MCC (the paper's metric) and accuracy (torchmetrics). Optimiser groups (both modules): no
weight decay for biases, norms, ``A_log``, ``D``, ``dt_bias`` (and the embedding / pad vector); the outer stage
(embedding, encoder, router, residual, decoder, LM head) gets ``outer_lr_multiplier`` x the LR (paper:
``sqrt(N) * d_back/d_outer = 3``), the classifier head ``head_lr_multiplier``.

**Fixed-boundary control** (``boundaries: fixed``): boundaries every N bases (``t mod N == 0``; the same
compressed length as the target of the learned router), hard ``p = b`` (the EMA then copies each chunk vector,
up to the 1e-4 clamp), ``c = 1``, no ratio loss, router frozen. Everything else is identical.

Evaluation protocol (paper): NT downstream tasks (18) and Genomic Benchmarks, full fine-tuning from the
pretrained checkpoint, 10-fold CV on train, best epoch by val MCC, test MCC x 100 (see configs/ldarnet/paper.yaml).

Deviations / reconstructions
----------------------------
* Pure PyTorch SSD instead of mamba_ssm kernels (mamba_ssm's fused scan is used when it imports and the input is
  on CUDA); padded steps get ``dt = 0`` in BiMamba-2 (exact padding invariance; see `lightning_modules.bimamba2`).
* Only single-stage hierarchies (``[enc, [main], dec]``); deeper nesting raises. Attention heads / window /
  rotary dim are one value for every attention block. The residual stream stays in the dtype of the embedding
  (fp32 under autocast, like the official fp32 residual).
* Fixed-boundary control: hard p and no router (the card does not say what p the authors' control uses).
* ``WSDSchedule``: warm-up (linear), stable, and a ``1 - sqrt`` decay to ``final_ratio`` over the last
  ``decay_fraction`` of steps (the card's "inverse-sqrt decay to 5 %", reconstructed). The fine-tuning
  ``reduce_lr_on_plateau`` of the authors' eval script is not wired (the collection steps schedulers per step).
* Classification head lr multiplier default 1.0 (the authors' eval script); the outer-stage multiplier defaults to
  1.0 when fine-tuning (the card documents it for pretraining only); 10-fold CV is left to the user
  (``data.init_args.fold``/seeds), a single seeded validation hold-out is used.
"""
from __future__ import annotations

import math
import re
from typing import Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy, MulticlassMatthewsCorrCoef

from lightning_modules.base import PaperModule
from lightning_modules.bimamba2 import BiMamba2, SSDImpl, ssd_chunked
from lightning_modules.errors import UserInputError, check_range

VOCAB = {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4, "[MASK]": 5, "[PAD]": 6}
VOCAB_SIZE, N_TOKEN, MASK_TOKEN, PAD_TOKEN = 7, 4, 5, 6
COMPLEMENT = torch.tensor([3, 2, 1, 0, 4, 5, 6])  # A<->T, C<->G; N, MASK, PAD unchanged
IGNORE_INDEX = -100
Boundaries = Literal["learned", "fixed"]
Layout = list[Union[str, list[str]]]
_LAYOUT_RE = re.compile(r"([mMtT])(\d+)")


# ============================================================================================ layout
def parse_layout(layout: str) -> list[tuple[str, bool]]:
    """``"m3t1"`` -> [("mamba", False)] * 3 + [("attention", False)]; upper case = block with a SwiGLU MLP."""
    if not isinstance(layout, str) or not layout:
        raise UserInputError(f"layout {layout!r} is empty: write blocks as letter+count, e.g. 'm3t1' or 'M10'.")
    pos, blocks = 0, []
    for match in _LAYOUT_RE.finditer(layout):
        if match.start() != pos:
            break
        count = int(match.group(2))
        if count == 0:
            raise UserInputError(f"layout {layout!r}: block count 0 in '{match.group(0)}'; counts must be >= 1.")
        kind = "mamba" if match.group(1).lower() == "m" else "attention"
        blocks += [(kind, match.group(1).isupper())] * count
        pos = match.end()
    if pos != len(layout):
        raise UserInputError(
            f"layout {layout!r} is malformed at '{layout[pos:]}': use letters m/M (BiMamba-2 without/with MLP) and "
            "t/T (local attention without/with MLP), each followed by a count, e.g. 'm3t1', 'M10', 'm4'.")
    return blocks


def check_arch_layout(arch_layout: Layout) -> tuple[str, str, str]:
    """``["m3t1", ["M10"], "m4"]`` -> ("m3t1", "M10", "m4"); errors for anything else."""
    ok = (isinstance(arch_layout, (list, tuple)) and len(arch_layout) == 3 and isinstance(arch_layout[0], str)
          and isinstance(arch_layout[2], str) and isinstance(arch_layout[1], (list, tuple)))
    if not ok:
        raise UserInputError(f"arch_layout={arch_layout!r} must be [encoder, [backbone], decoder], e.g. "
                             "['m3t1', ['M10'], 'm4'] (a single-stage hierarchy).")
    if len(arch_layout[1]) != 1 or not isinstance(arch_layout[1][0], str):
        raise UserInputError(f"arch_layout={arch_layout!r}: the backbone must be one layout string like ['M10']; "
                             "multi-stage (nested) hierarchies are not implemented here.")
    for part in (arch_layout[0], arch_layout[1][0], arch_layout[2]):
        parse_layout(part)
    return arch_layout[0], arch_layout[1][0], arch_layout[2]


# ============================================================================================ blocks
def rotary(x: Tensor, rotary_dim: int) -> Tensor:
    """Rotary position embedding (rotate-half) on the first `rotary_dim` dims of x (B, H, L, Dh)."""
    if rotary_dim == 0:
        return x
    length = x.shape[-2]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.float32) / rotary_dim))
    angles = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # L, rd/2
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half1, half2 = rot.chunk(2, dim=-1)
    rot = rot * cos + torch.cat([-half2, half1], -1) * sin
    return torch.cat([rot, rest], -1)


class LocalAttention(nn.Module):
    """Non-causal multi-head attention restricted to ``|i - j| <= window`` (and valid keys), with rotary."""

    def __init__(self, d_model: int, heads: int, window: int, rotary_dim: int) -> None:
        super().__init__()
        self.heads, self.window, self.rotary_dim = heads, window, rotary_dim
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, hidden: Tensor, valid: Tensor | None = None) -> Tensor:
        batch, length, d = hidden.shape
        q, k, v = self.qkv(hidden).view(batch, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotary(q, self.rotary_dim), rotary(k, self.rotary_dim)
        pos = torch.arange(length, device=hidden.device)
        allowed = (pos[:, None] - pos[None, :]).abs() <= self.window
        allowed = allowed.expand(batch, 1, length, length)
        if valid is not None:  # keys must be valid; every query may see itself (no empty rows on padding)
            allowed = (allowed & valid[:, None, None, :]) | torch.eye(length, dtype=torch.bool, device=pos.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * value)


class Block(nn.Module):
    """Pre-norm residual block: ``h + mixer(norm(h))`` then optionally ``h + mlp(norm(h))``."""

    def __init__(self, mixer: nn.Module, d_model: int, mlp_hidden: int) -> None:
        super().__init__()
        self.norm1, self.mixer = nn.RMSNorm(d_model, eps=1e-5), mixer
        self.norm2 = nn.RMSNorm(d_model, eps=1e-5) if mlp_hidden else None
        self.mlp = SwiGLU(d_model, mlp_hidden) if mlp_hidden else None

    def forward(self, hidden: Tensor, valid: Tensor | None) -> Tensor:
        hidden = hidden + self.mixer(self.norm1(hidden), valid)
        if self.mlp is not None:
            hidden = hidden + self.mlp(self.norm2(hidden))
        return hidden


class Isotropic(nn.Module):
    """A stack of blocks described by a layout string, with a final RMSNorm."""

    def __init__(self, layout: str, d_model: int, d_intermediate: int, mamba: dict, attention: dict) -> None:
        super().__init__()
        blocks = []
        for kind, with_mlp in parse_layout(layout):
            if with_mlp and d_intermediate <= 0:
                raise UserInputError(f"layout {layout!r} asks for MLP blocks (upper case) but this stage's "
                                     "d_intermediate is 0: set d_intermediate or use lower-case letters.")
            if kind == "mamba":
                mixer = BiMamba2(d_model, **mamba)
            else:
                if d_model % attention["heads"] or d_model // attention["heads"] < attention["rotary_dim"]:
                    raise UserInputError(f"attention: d_model {d_model} must be a multiple of attn_heads "
                                         f"{attention['heads']} with head dim >= rotary_dim {attention['rotary_dim']}.")
                mixer = LocalAttention(d_model, **attention)
            blocks.append(Block(mixer, d_model, d_intermediate if with_mlp else 0))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.RMSNorm(d_model, eps=1e-5)

    def forward(self, hidden: Tensor, valid: Tensor | None) -> Tensor:
        for block in self.blocks:
            hidden = block(hidden, valid)
        return self.norm(hidden)


# ============================================================================================ routing
class BidirectionalRouter(nn.Module):
    """Boundary probabilities from the symmetrised cosine of adjacent positions (p_0 = 1)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.eye(d_model))
            self.k_proj.weight.copy_(torch.eye(d_model))

    def forward(self, hidden: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Returns p (B, L) float32 and boundaries b (B, L) bool (False on padding)."""
        hidden = hidden.float()
        q = F.normalize(F.linear(hidden, self.q_proj.weight.float()), dim=-1)
        k = F.normalize(F.linear(hidden, self.k_proj.weight.float()), dim=-1)
        cos = 0.5 * ((q[:, :-1] * k[:, 1:]).sum(-1) + (q[:, 1:] * k[:, :-1]).sum(-1))
        p = torch.cat([torch.ones_like(hidden[:, :1, 0]), ((1 - cos) / 2).clamp(0.0, 1.0)], dim=1)
        return p, (p > 0.5) & valid


def fixed_boundaries(valid: Tensor, every: int) -> Tensor:
    """Boundaries at t = 0, N, 2N, ... (the fixed-grid control)."""
    pos = torch.arange(valid.shape[1], device=valid.device)
    return (pos % every == 0).unsqueeze(0) & valid


def ratio_loss(boundaries: Tensor, p: Tensor, valid: Tensor, target: float) -> tuple[Tensor, Tensor, Tensor]:
    """H-Net load-balancing loss ``N/(N-1) ((N-1) F G + (1-F)(1-G))``; returns (loss, F, G)."""
    count = valid.sum().clamp(min=1)
    frac_selected = (boundaries & valid).sum() / count
    mean_prob = (p * valid).sum() / count
    loss = target / (target - 1) * ((target - 1) * frac_selected * mean_prob + (1 - frac_selected) * (1 - mean_prob))
    return loss, frac_selected, mean_prob


def chunk(hidden: Tensor, boundaries: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Keep boundary positions in order, right-padded. Returns (chunks (B, M, d), chunk mask (B, M), indices)."""
    counts = boundaries.sum(1)
    m = int(counts.max().clamp(min=1))
    order = torch.argsort((~boundaries).to(torch.int8), dim=1, stable=True)[:, :m]
    chunks = hidden.gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    mask = torch.arange(m, device=hidden.device).unsqueeze(0) < counts.unsqueeze(1)
    return chunks, mask, order


def ema_scan(z: Tensor, p: Tensor, mask: Tensor, chunk_size: int = 64) -> Tensor:
    """Forward EMA ``zbar_j = p_j z_j + (1 - p_j) zbar_{j-1}`` as an SSD scan (padded steps: identity)."""
    decay = torch.log1p(-p) * mask
    weight = (p * mask).unsqueeze(-1).unsqueeze(-1)  # B, M, 1, 1
    out = ssd_chunked(z.unsqueeze(2), decay.unsqueeze(-1), weight, torch.ones_like(weight), chunk_size)
    return out.squeeze(2)


def dechunk_ema(chunks: Tensor, p_chunks: Tensor, mask: Tensor, chunk_size: int = 64) -> Tensor:
    """Bidirectional EMA over chunk vectors, in fp32 whatever the autocast (the authors' bf16 bug fix)."""
    with torch.autocast(device_type=chunks.device.type, enabled=False):
        z, p = chunks.float(), p_chunks.float().clamp(1e-4, 1 - 1e-4)
        forward = ema_scan(z, p, mask, chunk_size)
        backward = ema_scan(z.flip(1), p.flip(1), mask.flip(1), chunk_size).flip(1)
        return 0.5 * (forward + backward)


def upsample(chunks: Tensor, boundaries: Tensor) -> Tensor:
    """Position t takes chunk ``cumsum(b)_t - 1``."""
    index = (boundaries.long().cumsum(1) - 1).clamp(min=0)
    return chunks.gather(1, index.unsqueeze(-1).expand(-1, -1, chunks.shape[-1]))


class STE(torch.autograd.Function):
    """Forward: ones; backward: the incoming gradient passes to the input unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return torch.ones_like(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


# ============================================================================================ network
class LDARNetNetwork(nn.Module):
    """Embedding -> encoder -> routing/chunking -> backbone -> dechunking + residual -> decoder."""

    def __init__(self, arch_layout: Layout, d_model: list[int], d_intermediate: list[int], d_state: int,
                 d_conv: int, expand: int, headdim: int, ssd_chunk_size: int, ssd_impl: SSDImpl, attn_heads: int,
                 attn_window: int, rotary_dim: int, target_compression: float, boundaries: Boundaries) -> None:
        super().__init__()
        enc, main, dec = check_arch_layout(arch_layout)
        d_outer, d_inner = d_model
        mamba = dict(d_state=d_state, d_conv=d_conv, expand=expand, headdim=headdim, chunk_size=ssd_chunk_size,
                     ssd_impl=ssd_impl)
        attention = dict(heads=attn_heads, window=attn_window, rotary_dim=rotary_dim)
        self.embedding = nn.Embedding(VOCAB_SIZE, d_outer)
        self.encoder = Isotropic(enc, d_outer, d_intermediate[0], mamba, attention)
        self.router = BidirectionalRouter(d_outer)
        self.pad_dimension = nn.Parameter(torch.zeros(d_inner - d_outer)) if d_inner > d_outer else None
        self.main = Isotropic(main, d_inner, d_intermediate[1], mamba, attention)
        self.residual_proj = nn.Linear(d_outer, d_outer, bias=False)
        nn.init.zeros_(self.residual_proj.weight)
        self.decoder = Isotropic(dec, d_outer, d_intermediate[0], mamba, attention)
        self.d_outer, self.target, self.boundary_mode = d_outer, float(target_compression), boundaries
        self.ema_chunk = ssd_chunk_size
        if boundaries == "fixed":
            self.router.requires_grad_(False)

    def forward(self, tokens: Tensor, valid: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        hidden = self.embedding(tokens)
        enc = self.encoder(hidden, valid)
        if self.boundary_mode == "fixed":
            b = fixed_boundaries(valid, int(round(self.target)))
            p = b.float()
        else:
            p, b = self.router(enc, valid)
        loss, frac, mean_p = ratio_loss(b, p, valid, self.target)
        chunks, cmask, order = chunk(enc, b)
        if self.pad_dimension is not None:
            chunks = torch.cat([chunks, self.pad_dimension.to(chunks.dtype).expand(*chunks.shape[:2], -1)], -1)
        main = self.main(chunks, cmask)[..., : self.d_outer]
        smoothed = dechunk_ema(main, p.gather(1, order), cmask, self.ema_chunk)
        if self.boundary_mode == "fixed":
            selected = torch.ones_like(p)
        else:
            selected = STE.apply(torch.where(b, p, 1 - p))
        with torch.autocast(device_type=enc.device.type, enabled=False):
            residual = self.residual_proj(enc.float())
        out = upsample(smoothed, b) * selected.unsqueeze(-1) + residual
        out = self.decoder(out.to(hidden.dtype), valid)
        aux = {"ratio_loss": loss if self.boundary_mode == "learned" else loss.detach() * 0,
               "compression": frac.detach(), "mean_prob": mean_p.detach(), "boundaries": b, "p": p.detach()}
        return out, aux

    def lr_groups(self) -> dict[str, list[str]]:
        """Parameter names of the outer stage and of the backbone (for the LR multiplier)."""
        names = [n for n, p in self.named_parameters() if p.requires_grad]
        return {"main": [n for n in names if n.startswith("main.") or n == "pad_dimension"],
                "outer": [n for n in names if not (n.startswith("main.") or n == "pad_dimension")]}


def no_weight_decay(name: str, param: Tensor) -> bool:
    """Biases, norm weights, SSM A_log/D/dt_bias, embeddings and the pad vector get no weight decay."""
    last = name.rsplit(".", 1)[-1]
    return (param.ndim < 2 or last in ("A_log", "D", "dt_bias", "bias") or "norm" in name
            or "embedding" in name or name.endswith("pad_dimension"))


def param_groups(module: nn.Module, multipliers: dict[str, float]) -> list[dict]:
    """AdamW groups: (decay / no decay) x (LR multiplier by name prefix; first matching prefix wins, '' = rest)."""
    groups: dict[tuple[float, bool], list[Tensor]] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        mult = next(m for prefix, m in multipliers.items() if name.startswith(prefix))
        groups.setdefault((mult, no_weight_decay(name, param)), []).append(param)
    out = []
    for (mult, no_wd), params in groups.items():
        group = {"params": params, "lr_multiplier": mult}
        if no_wd:
            group["weight_decay"] = 0.0
        out.append(group)
    return out


class WSDSchedule(torch.optim.lr_scheduler.LambdaLR):
    """Warm-up (linear) / stable / decay (``1 - sqrt``) to ``final_ratio`` of the LR, by optimiser step."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float = 0.1,
                 decay_fraction: float = 0.2, final_ratio: float = 0.05) -> None:
        if total_steps < 1:
            raise UserInputError(f"WSDSchedule total_steps={total_steps} must be >= 1 (the run's optimiser steps).")
        check_range("warmup_fraction", warmup_fraction, 0, 1)
        check_range("decay_fraction", decay_fraction, 0, 1)
        check_range("final_ratio", final_ratio, 0, 1)
        self.total, self.warmup, self.decay, self.final = total_steps, warmup_fraction, decay_fraction, final_ratio
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        warm, decay_start = self.warmup * self.total, (1 - self.decay) * self.total
        if step < warm:
            return (step + 1) / warm
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start) / max(self.total - decay_start, 1))
        return self.final + (1 - self.final) * (1 - math.sqrt(progress))


# ============================================================================================ MLM data ops
def reverse_complement(tokens: Tensor, valid: Tensor) -> Tensor:
    """Reverse complement of every right-padded sequence (padding stays at the end)."""
    lengths = valid.sum(1, keepdim=True)
    pos = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
    index = torch.where(pos < lengths, lengths - 1 - pos, pos)
    return COMPLEMENT.to(tokens.device)[tokens.gather(1, index)]


def random_reverse_complement(tokens: Tensor, valid: Tensor, prob: float, generator=None) -> Tensor:
    flip = torch.rand(tokens.shape[0], generator=generator).to(tokens.device) < prob
    return torch.where(flip.unsqueeze(1), reverse_complement(tokens, valid), tokens)


def mlm_mask(tokens: Tensor, valid: Tensor, mask_prob: float = 0.15, generator=None) -> tuple[Tensor, Tensor]:
    """BERT masking of A/C/G/T only: select ``mask_prob``; of those 80 % -> [MASK], 10 % random base, 10 % kept.

    Returns (inputs, targets) with targets = IGNORE_INDEX at unselected positions.
    """
    shape = tokens.shape
    draws = torch.rand((3, *shape), generator=generator).to(tokens.device)
    random_base = torch.randint(0, 4, shape, generator=generator).to(tokens.device)
    selected = (draws[0] < mask_prob) & (tokens < N_TOKEN) & valid
    inputs = torch.where(selected & (draws[1] < 0.8), torch.full_like(tokens, MASK_TOKEN), tokens)
    inputs = torch.where(selected & (draws[1] >= 0.8) & (draws[1] < 0.9), random_base, inputs)
    targets = torch.where(selected, tokens, torch.full_like(tokens, IGNORE_INDEX))
    return inputs, targets


# ============================================================================================ LightningModules
def _check_network_args(arch_layout, d_model, d_intermediate, target_compression, expand, headdim, boundaries,
                        ssd_chunk_size, attn_heads, attn_window, rotary_dim) -> None:
    check_arch_layout(arch_layout)
    if len(d_model) != 2 or d_model[1] < d_model[0] or min(d_model) < 1:
        raise UserInputError(f"d_model={d_model} must be [d_outer, d_backbone] with d_backbone >= d_outer >= 1.")
    if len(d_intermediate) != 2 or min(d_intermediate) < 0:
        raise UserInputError(f"d_intermediate={d_intermediate} must be two SwiGLU widths >= 0 (outer, backbone).")
    for d in d_model:
        if (expand * d) % headdim:
            raise UserInputError(f"expand * d_model = {expand} * {d} is not a multiple of headdim={headdim}.")
    check_range("target_compression", target_compression, 1, None, low_inclusive=False)
    if boundaries == "fixed" and float(target_compression) != int(target_compression):
        raise UserInputError(f"boundaries='fixed' needs an integer target_compression, got {target_compression}.")
    if boundaries not in ("learned", "fixed"):
        raise UserInputError(f"boundaries={boundaries!r}: use 'learned' or 'fixed'.")
    check_range("ssd_chunk_size", ssd_chunk_size, 1)
    check_range("attn_heads", attn_heads, 1)
    check_range("attn_window", attn_window, 0)
    if rotary_dim % 2 or rotary_dim < 0:
        raise UserInputError(f"rotary_dim={rotary_dim} must be even and >= 0.")


class _LDARNetBase(PaperModule):
    """Shared network construction, optimiser groups and checks of the two LDARNet modules."""

    def _build_network(self) -> None:
        hp = self.hparams
        _check_network_args(hp.arch_layout, hp.d_model, hp.d_intermediate, hp.target_compression, hp.expand,
                            hp.headdim, hp.boundaries, hp.ssd_chunk_size, hp.attn_heads, hp.attn_window,
                            hp.rotary_dim)
        check_range("ratio_loss_weight", hp.ratio_loss_weight, 0)
        check_range("outer_lr_multiplier", hp.outer_lr_multiplier, 0, low_inclusive=False)
        self.net = LDARNetNetwork(hp.arch_layout, list(hp.d_model), list(hp.d_intermediate), hp.d_state, hp.d_conv,
                                  hp.expand, hp.headdim, hp.ssd_chunk_size, hp.ssd_impl, hp.attn_heads,
                                  hp.attn_window, hp.rotary_dim, hp.target_compression, hp.boundaries)

    def _lr_multipliers(self) -> dict[str, float]:
        return {"net.main.": 1.0, "net.pad_dimension": 1.0, "": self.hparams.outer_lr_multiplier}

    def trainable_parameters(self):
        return param_groups(self, self._lr_multipliers())

    def configure_optimizers(self):
        """The injected optimiser over `param_groups`, each group's LR scaled by its multiplier *before* the
        scheduler is built (so the scheduler's base LRs are the scaled ones)."""
        optimizer = self.optimizer_factory(self.trainable_parameters())
        for group in optimizer.param_groups:
            group["lr"] *= group.get("lr_multiplier", 1.0)
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @staticmethod
    def _check_batch(batch: dict) -> tuple[Tensor, Tensor]:
        tokens, valid = batch["tokens"], batch["mask"]
        if tokens.min() < 0 or tokens.max() >= VOCAB_SIZE:
            raise UserInputError(f"token ids must lie in [0, {VOCAB_SIZE}) (A C G T N [MASK] [PAD]); got "
                                 f"[{int(tokens.min())}, {int(tokens.max())}].")
        if not bool(valid[:, 0].all()):
            raise UserInputError("every sequence needs at least one base (and right padding): empty sequence found.")
        return tokens, valid


NETWORK_DOC = """arch_layout: [encoder, [backbone], decoder] layout strings (letters m/M/t/T + counts).
        d_model: [d_outer, d_backbone]. d_intermediate: SwiGLU widths [outer, backbone] (0 = no MLP).
        d_state, d_conv, expand, headdim, ssd_chunk_size, ssd_impl: Mamba-2 settings ('auto' uses mamba_ssm on CUDA).
        attn_heads, attn_window, rotary_dim: local attention (window on each side).
        target_compression: N of the ratio loss (and the grid of the fixed control).
        boundaries: 'learned' (router) or 'fixed' (every N bases). ratio_loss_weight: alpha (paper 0.03).
        outer_lr_multiplier: LR factor of everything outside the backbone (paper 3.0)."""


class LDARNetPretraining(_LDARNetBase):
    __doc__ = f"""Masked-language-model pretraining of LDARNet (see the module docstring).

    Args:
        {NETWORK_DOC}
        mask_prob: fraction of A/C/G/T positions selected (0.15). rc_prob: reverse-complement probability (0.5).
        val_mask_seed: seed of the fixed validation/predict masking.
    """

    def __init__(self, arch_layout: Layout = ("m3t1", ["M10"], "m4"), d_model: list[int] = (512, 768),
                 d_intermediate: list[int] = (0, 2560), d_state: int = 128, d_conv: int = 4, expand: int = 2,
                 headdim: int = 64, ssd_chunk_size: int = 256, ssd_impl: SSDImpl = "auto", attn_heads: int = 16,
                 attn_window: int = 1023, rotary_dim: int = 32, target_compression: float = 4.0,
                 boundaries: Boundaries = "learned", ratio_loss_weight: float = 0.03,
                 outer_lr_multiplier: float = 3.0, mask_prob: float = 0.15, rc_prob: float = 0.5,
                 val_mask_seed: int = 1234, **base) -> None:
        super().__init__(**base)
        self.save_hyperparameters()
        check_range("mask_prob", mask_prob, 0, 1, low_inclusive=False)
        check_range("rc_prob", rc_prob, 0, 1)
        self._build_network()
        self.lm_head = nn.Linear(d_model[0], VOCAB_SIZE)

    def forward(self, tokens: Tensor, valid: Tensor) -> tuple[Tensor, dict]:
        hidden, aux = self.net(tokens, valid)
        return self.lm_head(hidden), aux

    def _step(self, batch: dict, stage: str, generator=None) -> Tensor:
        tokens, valid = self._check_batch(batch)
        if stage == "train" and self.hparams.rc_prob > 0:
            tokens = random_reverse_complement(tokens, valid, self.hparams.rc_prob, generator)
        inputs, targets = mlm_mask(tokens, valid, self.hparams.mask_prob, generator)
        logits, aux = self(inputs, valid)
        selected = targets != IGNORE_INDEX
        if selected.any():
            mlm = F.cross_entropy(logits[selected].float(), targets[selected])
            accuracy = (logits[selected].argmax(-1) == targets[selected]).float().mean()
        else:  # no base drawn (tiny batch): a zero loss that still touches every parameter
            mlm, accuracy = logits.sum() * 0.0, logits.new_zeros(())
        loss = mlm + self.hparams.ratio_loss_weight * aux["ratio_loss"]
        size = tokens.shape[0]
        self.log_dict({f"{stage}/loss": loss, f"{stage}/mlm_loss": mlm, f"{stage}/mlm_accuracy": accuracy,
                       f"{stage}/ratio_loss": aux["ratio_loss"], f"{stage}/compression": aux["compression"],
                       f"{stage}/mean_prob": aux["mean_prob"]}, prog_bar=stage != "train", batch_size=size,
                      sync_dist=stage != "train")
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val", torch.Generator().manual_seed(self.hparams.val_mask_seed + batch_idx))

    def test_step(self, batch, batch_idx):
        self._step(batch, "test", torch.Generator().manual_seed(self.hparams.val_mask_seed + batch_idx))

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """LM logits (B, L, 7) of the unmasked input (deterministic)."""
        tokens, valid = self._check_batch(batch)
        return self(tokens, valid)[0]


class LDARNetClassifier(_LDARNetBase):
    __doc__ = f"""Sequence classification with LDARNet: mean pooling over valid positions -> Linear.

    Args:
        num_classes: classes of the task (checked against the datamodule).
        {NETWORK_DOC}
        head_lr_multiplier: LR factor of the classification head (authors' eval script: 1.0).
        ratio_loss_weight: the ratio loss stays on during fine-tuning (the official code keeps it; 0 disables).
    """

    def __init__(self, num_classes: int = 2, arch_layout: Layout = ("m3t1", ["M10"], "m4"),
                 d_model: list[int] = (512, 768), d_intermediate: list[int] = (0, 2560), d_state: int = 128,
                 d_conv: int = 4, expand: int = 2, headdim: int = 64, ssd_chunk_size: int = 256,
                 ssd_impl: SSDImpl = "auto", attn_heads: int = 16, attn_window: int = 1023, rotary_dim: int = 32,
                 target_compression: float = 4.0, boundaries: Boundaries = "learned",
                 ratio_loss_weight: float = 0.03, outer_lr_multiplier: float = 1.0, head_lr_multiplier: float = 1.0,
                 **base) -> None:
        super().__init__(**base)
        self.save_hyperparameters()
        check_range("num_classes", num_classes, 2)
        check_range("head_lr_multiplier", head_lr_multiplier, 0, low_inclusive=False)
        self._build_network()
        self.head = nn.Linear(d_model[0], num_classes)
        self.metrics = nn.ModuleDict()
        for stage in ("val", "test"):
            self.metrics[f"{stage}_mcc"] = MulticlassMatthewsCorrCoef(num_classes=num_classes)
            self.metrics[f"{stage}_acc"] = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def _lr_multipliers(self) -> dict[str, float]:
        return {"head.": self.hparams.head_lr_multiplier, **super()._lr_multipliers()}

    def setup(self, stage: str) -> None:
        dm = self.attached_datamodule
        classes = getattr(dm, "num_classes", None)
        if classes is not None and classes != self.hparams.num_classes:
            raise UserInputError(f"model num_classes={self.hparams.num_classes} but the data has {classes} classes: "
                                 f"set --model.init_args.num_classes={classes}.")
        super().setup(stage)

    def forward(self, tokens: Tensor, valid: Tensor) -> tuple[Tensor, dict]:
        hidden, aux = self.net(tokens, valid)
        weights = valid.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1)
        return self.head(pooled), aux

    def _step(self, batch: dict, stage: str) -> Tensor:
        tokens, valid = self._check_batch(batch)
        labels = batch["label"]
        logits, aux = self(tokens, valid)
        ce = F.cross_entropy(logits.float(), labels)
        loss = ce + self.hparams.ratio_loss_weight * aux["ratio_loss"]
        size = tokens.shape[0]
        logs = {f"{stage}/loss": loss, f"{stage}/ce": ce, f"{stage}/compression": aux["compression"]}
        self.log_dict(logs, prog_bar=stage != "train", batch_size=size, sync_dist=stage != "train")
        if stage != "train":
            for name in ("mcc", "acc"):
                metric = self.metrics[f"{stage}_{name}"]
                metric.update(logits.argmax(-1), labels)
                self.log(f"{stage}/{name}", metric, prog_bar=True, batch_size=size)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx: int = 0) -> Tensor:
        """Class probabilities (B, num_classes)."""
        tokens, valid = self._check_batch(batch)
        return self(tokens, valid)[0].softmax(-1)
