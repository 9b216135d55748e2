"""Pure-PyTorch Mamba-2 (SSD) and the bidirectional BiMamba-2 block used by LDARNet (arXiv 2606.04552).

The official LDARNet code builds on ``mamba_ssm`` (Triton/CUDA kernels, GPU only). This file re-writes what it
needs in plain PyTorch so that the model trains on a CPU, and uses ``mamba_ssm``'s fused chunk scan when that
package imports and the tensors live on a CUDA device (``ssd_impl="auto"``).

State-space duality (SSD, Mamba-2 paper, "Transformers are SSMs", arXiv 2405.21060, Listing 1), per head::

    h_t = exp(a_t) h_{t-1} + B_t x_t^T        y_t = C_t^T h_t          (a_t = dt_t * A <= 0, x_t already * dt_t)

* `ssd_sequential`: the recurrence above as a ``for`` loop over time (the reference; O(L) Python steps).
* `ssd_chunked`: the chunked algorithm of Listing 1 (``ssd_minimal_discrete``): exact quadratic attention-like
  form inside chunks of ``chunk_size`` + a recurrence over chunk states (segment sums + 4 einsums). Equal to the
  sequential scan up to float rounding (tested); L is zero-padded to a multiple of the chunk (a = 0, x = 0 on the
  padding: no effect on earlier outputs).
* `ssd_mamba_ssm`: ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`` when available (CUDA only).

Mamba-2 mixer (``mamba2_simple.py`` of mamba_ssm, re-written): ``in_proj: d -> [z, x, B, C, dt]`` (d_inner =
expand * d, heads = d_inner / headdim, one B/C group), depthwise causal Conv1d (kernel d_conv) + SiLU over
``[x, B, C]``, ``dt = softplus(dt + dt_bias)``, ``A = -exp(A_log)``, SSD, ``+ D x``, gated RMSNorm
``norm(y * silu(z))``, ``out_proj: d_inner -> d``. Initialisation as mamba_ssm: ``dt_bias`` = inverse softplus of
log-uniform dt in [1e-3, 1e-1] (floor 1e-4), ``A_log = log U(1, 16)``, ``D = 1``.

BiMamba-2 (LDARNet code): a forward and a backward Mamba-2 whose ``in_proj`` and ``out_proj`` are *tied* (conv,
A_log, dt_bias, D and the gated norm are separate); ``y = 1/2 (fwd(x) + flip(bwd(flip(x))))``. Because the tied
projections are position-wise linear maps, ``in_proj`` is applied once and ``out_proj`` once to the average
(mathematically identical to two calls). Padding (right-padded batches): the input is zeroed at padded positions
as in the official code, and additionally ``dt`` is set to 0 there, which makes padded steps exact identities of
the scan (no decay, no input) - so the backward direction, where the padding comes *first*, is exactly
independent of the padding length (the official code only zeroes the input; the conv bias then leaks a small
signal from padded steps into the backward state). This is a deliberate, tested deviation.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:  # the fused CUDA/Triton kernel; absent on CPU-only installs
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as _mamba_chunk_scan
except Exception:  # noqa: BLE001 - any import failure (no package, no CUDA, ABI mismatch) means "not available"
    _mamba_chunk_scan = None

SSDImpl = Literal["auto", "torch", "sequential", "mamba_ssm"]


def mamba_ssm_available() -> bool:
    return _mamba_chunk_scan is not None


# ============================================================================================ SSD scans
def segsum(x: Tensor) -> Tensor:
    """Stable segment sums: ``out[..., i, j] = x[..., j+1] + ... + x[..., i]`` for j <= i, -inf above the diagonal."""
    length = x.size(-1)
    x = x.unsqueeze(-1).expand(*x.shape, length)
    strict = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~strict, 0.0)
    sums = torch.cumsum(x, dim=-2)
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=0)
    return sums.masked_fill(~lower, -math.inf)


def ssd_sequential(x: Tensor, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Reference recurrence. x (batch, L, heads, p), a (batch, L, heads) log-decays, b/c (batch, L, heads, n)."""
    state = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], b.shape[-1])
    ys = []
    for t in range(x.shape[1]):
        state = torch.exp(a[:, t])[..., None, None] * state + x[:, t, :, :, None] * b[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, c[:, t]))
    return torch.stack(ys, dim=1)


def ssd_chunked(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int = 64) -> Tensor:
    """Chunked SSD (Mamba-2 Listing 1, ``ssd_minimal_discrete``); same shapes and result as `ssd_sequential`."""
    batch, length, heads, _ = x.shape
    pad = (-length) % chunk_size
    if pad:
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        a = F.pad(a, (0, 0, 0, pad))
    n_chunks = (length + pad) // chunk_size
    x, b, c = (t.reshape(batch, n_chunks, chunk_size, heads, t.shape[-1]) for t in (x, b, c))
    a = a.reshape(batch, n_chunks, chunk_size, heads).permute(0, 3, 1, 2)  # b h c l
    a_cumsum = torch.cumsum(a, dim=-1)
    # 1. outputs inside each chunk (quadratic, attention-like form); decay exp(cs_l - cs_s) for s <= l, as the
    #    mamba_ssm kernel computes it (cumsum differences; the exact `segsum` is used across chunks)
    causal = torch.tril(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device))
    diff = (a_cumsum.unsqueeze(-1) - a_cumsum.unsqueeze(-2)).masked_fill(~causal, -math.inf)
    scores = torch.einsum("bclhn,bcshn->bhcls", c, b) * torch.exp(diff)
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, x)
    # 2. state at the end of every chunk from its own inputs
    decay_states = torch.exp(a_cumsum[..., -1:] - a_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_states, x)
    # 3. recurrence over chunks (zero initial state)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(segsum(F.pad(a_cumsum[..., -1], (1, 0))))  # b h z z
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    # 4. contribution of the carried-in state to every output
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, states, torch.exp(a_cumsum))
    return (y_diag + y_off).reshape(batch, n_chunks * chunk_size, heads, -1)[:, :length]


def ssd_mamba_ssm(x: Tensor, dt: Tensor, a_head: Tensor, b: Tensor, c: Tensor, chunk_size: int) -> Tensor:
    """mamba_ssm's fused kernel on raw (x, dt, A) inputs; b/c (batch, L, groups, n). CUDA only."""
    if _mamba_chunk_scan is None:
        raise RuntimeError("ssd_impl='mamba_ssm' needs the mamba-ssm package (CUDA); use ssd_impl='torch'.")
    return _mamba_chunk_scan(x, dt, a_head, b, c, chunk_size=chunk_size)


def ssd_scan(x: Tensor, dt: Tensor, a_head: Tensor, b: Tensor, c: Tensor, chunk_size: int,
             impl: SSDImpl = "auto") -> Tensor:
    """SSD on raw Mamba-2 quantities: x (B, L, H, P), dt (B, L, H) >= 0, A (H,) < 0, b/c (B, L, G, N)."""
    if impl == "mamba_ssm" or (impl == "auto" and _mamba_chunk_scan is not None and x.is_cuda):
        return ssd_mamba_ssm(x, dt, a_head, b, c, chunk_size)
    heads, groups = x.shape[2], b.shape[2]
    if groups != heads:
        b, c = (t.repeat_interleave(heads // groups, dim=2) for t in (b, c))
    xdt, adt = x * dt.unsqueeze(-1), dt * a_head
    if impl == "sequential":
        return ssd_sequential(xdt, adt, b, c)
    return ssd_chunked(xdt, adt, b, c, chunk_size)


# ============================================================================================ modules
class GatedRMSNorm(nn.Module):
    """``RMSNorm(y * silu(z)) * weight`` (mamba_ssm's RMSNormGated with norm_before_gate=False, one group)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        y = y * F.silu(z)
        return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Mamba2Direction(nn.Module):
    """The per-direction part of a Mamba-2 mixer: conv, dt_bias, A_log, D and the gated norm (no projections)."""

    def __init__(self, d_inner: int, headdim: int, d_state: int, d_conv: int, chunk_size: int,
                 ssd_impl: SSDImpl = "auto", dt_min: float = 1e-3, dt_max: float = 1e-1,
                 dt_floor: float = 1e-4) -> None:
        super().__init__()
        self.d_inner, self.headdim, self.d_state = d_inner, headdim, d_state
        self.heads = d_inner // headdim
        self.chunk_size, self.ssd_impl = chunk_size, ssd_impl
        conv_dim = d_inner + 2 * d_state
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1)
        dt = torch.exp(torch.rand(self.heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        dt = dt.clamp(min=dt_floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log = nn.Parameter(torch.log(torch.empty(self.heads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedRMSNorm(d_inner)

    def forward(self, zxbcdt: Tensor, valid: Tensor | None) -> Tensor:
        """zxbcdt: (B, L, 2 d_inner + 2 d_state + heads) projected input; valid (B, L) bool. Returns (B, L, d_inner)."""
        batch, length, _ = zxbcdt.shape
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.d_inner + 2 * self.d_state, self.heads], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :length].transpose(1, 2))
        x, b, c = torch.split(xbc, [self.d_inner, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(dt + self.dt_bias)
        if valid is not None:
            dt = dt * valid.unsqueeze(-1).to(dt.dtype)  # padded steps: identity of the scan
        x = x.reshape(batch, length, self.heads, self.headdim)
        a_head = -torch.exp(self.A_log.float())
        y = ssd_scan(x, dt, a_head, b.unsqueeze(2), c.unsqueeze(2), self.chunk_size, self.ssd_impl)
        y = y + x * self.D.unsqueeze(-1)
        return self.norm(y.reshape(batch, length, self.d_inner), z)


class BiMamba2(nn.Module):
    """Bidirectional Mamba-2 with tied in/out projections: ``1/2 (fwd(x) + flip(bwd(flip(x))))``."""

    def __init__(self, d_model: int, d_state: int = 128, d_conv: int = 4, expand: int = 2, headdim: int = 64,
                 chunk_size: int = 256, ssd_impl: SSDImpl = "auto") -> None:
        super().__init__()
        d_inner = expand * d_model
        if d_inner % headdim:
            raise ValueError(f"expand * d_model = {d_inner} is not a multiple of headdim = {headdim}")
        heads = d_inner // headdim
        self.d_inner = d_inner
        self.in_proj = nn.Linear(d_model, 2 * d_inner + 2 * d_state + heads, bias=False)
        self.fwd = Mamba2Direction(d_inner, headdim, d_state, d_conv, chunk_size, ssd_impl)
        self.bwd = Mamba2Direction(d_inner, headdim, d_state, d_conv, chunk_size, ssd_impl)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, hidden: Tensor, valid: Tensor | None = None) -> Tensor:
        """hidden (B, L, d), valid (B, L) bool (right padding). Padded outputs are meaningless."""
        if valid is not None:
            hidden = hidden * valid.unsqueeze(-1).to(hidden.dtype)
        zxbcdt = self.in_proj(hidden)
        y_fwd = self.fwd(zxbcdt, valid)
        flipped_valid = None if valid is None else valid.flip(1)
        y_bwd = self.bwd(zxbcdt.flip(1), flipped_valid).flip(1)
        return self.out_proj(0.5 * (y_fwd + y_bwd))
