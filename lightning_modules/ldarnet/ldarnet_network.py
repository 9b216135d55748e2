"""The LDARNet network (arXiv 2606.04552): byte embedding, encoder, bidirectional routing and dynamic chunking,
backbone, fp32 EMA dechunking with a straight-through residual, decoder.

Steps 1-7 of `lightning_modules.ldarnet.ldarnet`'s module docstring, which states the method and its reconstructions;
the LightningModules (MLM pretraining, classification) and the training recipe stay there. The BiMamba-2 blocks
are in `lightning_modules.ldarnet.bimamba2`. Everything follows the official code (github.com/darlednik/ICML-LDARNet, an
H-Net derivative); the paper's text beyond its abstract was not readable.
"""
from __future__ import annotations

import re
from typing import Literal, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_modules.ldarnet.bimamba2 import BiMamba2, SSDImpl, ssd_chunked
from lightning_modules.shared.errors import UserInputError

VOCAB = {"A": 0, "C": 1, "G": 2, "T": 3, "N": 4, "[MASK]": 5, "[PAD]": 6}
VOCAB_SIZE, N_TOKEN, MASK_TOKEN, PAD_TOKEN = 7, 4, 5, 6
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
