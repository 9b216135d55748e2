"""Small denoising networks shared by the diffusion papers (coupled diffusion, Spectral Guidance, TIVDiff).

Two networks, both predicting a tensor of the input's shape from a noisy input, a timestep and an optional
condition vector:

* `MLPDenoiser` for vectors (2-D toy data, logits, expression profiles);
* `UNet` for small images (8x8 to 32x32): two resolutions per channel multiplier, residual blocks with
  GroupNorm and a time/condition embedding added to every block, no attention (at these sizes it buys little).
  Conditioning *images* (a corrupted input, a geometry map) are concatenated to ``x`` by the caller, so
  ``in_channels`` counts them.

Timesteps are the scheduler's integer (or float) steps, embedded with the sinusoidal features of the DDPM/
Transformer papers. Noise schedules and samplers are not here: the modules use diffusers' schedulers.

Pixel convention (one range everywhere): diffusion models see images in [-1, 1] (`to_model_range`); data
modules deliver [0, 1]; classifiers receive [0, 1] images through their own fixed normalisation.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from lightning_modules.shared.errors import UserInputError, check_range


def to_model_range(images01: torch.Tensor) -> torch.Tensor:
    """[0, 1] pixels -> the [-1, 1] range every diffusion model in the collection works in."""
    return images01 * 2.0 - 1.0


def from_model_range(images: torch.Tensor) -> torch.Tensor:
    """[-1, 1] model-range images -> [0, 1] pixels (clamped: samples can overshoot)."""
    return ((images + 1.0) / 2.0).clamp(0.0, 1.0)


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[B] timesteps -> [B, dim] features: cos/sin of t at geometrically spaced frequencies."""
    if dim % 2:
        raise UserInputError(f"time embedding size must be even, got {dim}")
    half = dim // 2
    frequencies = torch.exp(-math.log(max_period) * torch.arange(half, device=timesteps.device,
                                                                   dtype=torch.float32) / half)
    angles = timesteps.reshape(-1).float()[:, None] * frequencies[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimeConditionEmbedding(nn.Module):
    """Sinusoidal time features -> MLP, plus a linear projection of the condition vector (if any)."""

    def __init__(self, time_dim: int, out_dim: int, cond_dim: int = 0):
        super().__init__()
        self.time_dim, self.cond_dim = time_dim, cond_dim
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, out_dim), nn.SiLU(), nn.Linear(out_dim, out_dim))
        self.cond_proj = nn.Linear(cond_dim, out_dim) if cond_dim > 0 else None

    def forward(self, t: torch.Tensor, cond: torch.Tensor | None, batch: int) -> torch.Tensor:
        if t.dim() == 0 or t.numel() == 1:
            t = t.reshape(1).expand(batch)
        embedding = self.time_mlp(sinusoidal_embedding(t, self.time_dim))
        if self.cond_proj is not None:
            if cond is None:
                raise ValueError(f"this denoiser was built with cond_dim={self.cond_dim} and needs a condition")
            embedding = embedding + self.cond_proj(cond.reshape(batch, -1).to(embedding.dtype))
        elif cond is not None:
            raise ValueError("this denoiser was built with cond_dim=0 but received a condition")
        return embedding


class MLPDenoiser(nn.Module):
    """eps(x_t, t, cond) for vectors: residual MLP blocks, each shifted by the time/condition embedding."""

    def __init__(self, data_dim: int, hidden_dim: int = 256, depth: int = 3, cond_dim: int = 0,
                 time_dim: int = 64):
        super().__init__()
        check_range("data_dim", data_dim, low=1)
        check_range("hidden_dim", hidden_dim, low=1)
        check_range("depth", depth, low=1)
        check_range("cond_dim", cond_dim, low=0)
        self.embed = TimeConditionEmbedding(time_dim, hidden_dim, cond_dim)
        self.input = nn.Linear(data_dim, hidden_dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, hidden_dim))
            for _ in range(depth))
        self.output = nn.Sequential(nn.LayerNorm(hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, data_dim))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        embedding = self.embed(t, cond, x.shape[0])
        h = self.input(x)
        for block in self.blocks:
            h = h + block(h + embedding)
        return self.output(h)


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(math.gcd(8, channels), channels)


class ResidualBlock(nn.Module):
    """GroupNorm-SiLU-conv twice, with the embedding added between the convolutions (DDPM's block)."""

    def __init__(self, in_channels: int, out_channels: int, embed_dim: int):
        super().__init__()
        self.norm1, self.conv1 = _group_norm(in_channels), nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.embed = nn.Linear(embed_dim, out_channels)
        self.norm2, self.conv2 = _group_norm(out_channels), nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.act(self.norm1(x)))
        h = h + self.embed(self.act(embedding))[:, :, None, None]
        h = self.conv2(self.act(self.norm2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    """A compact UNet for 8x8..32x32 images: one residual block per level down, a middle block, one up.

    Each entry of ``channel_mults`` is a resolution level; every level but the last halves the resolution, so
    the image side must be divisible by ``2 ** (len(channel_mults) - 1)``.
    """

    def __init__(self, in_channels: int, out_channels: int, base_channels: int = 32,
                 channel_mults: tuple[int, ...] = (1, 2), cond_dim: int = 0, time_dim: int = 128):
        super().__init__()
        check_range("in_channels", in_channels, low=1)
        check_range("out_channels", out_channels, low=1)
        check_range("base_channels", base_channels, low=1)
        if not channel_mults or any(m < 1 for m in channel_mults):
            raise UserInputError(f"channel_mults must be a non-empty list of positive integers, got {channel_mults}")
        self.levels = len(channel_mults)
        embed_dim = 4 * base_channels
        self.embed = TimeConditionEmbedding(time_dim, embed_dim, cond_dim)
        self.stem = nn.Conv2d(in_channels, base_channels, 3, padding=1)
        widths = [base_channels * m for m in channel_mults]
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        previous = base_channels
        for level, width in enumerate(widths):
            self.down.append(ResidualBlock(previous, width, embed_dim))
            last = level == len(widths) - 1
            self.downsample.append(nn.Identity() if last else nn.Conv2d(width, width, 3, stride=2, padding=1))
            previous = width
        self.middle = ResidualBlock(previous, previous, embed_dim)
        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        for level, width in reversed(list(enumerate(widths))):
            self.up.append(ResidualBlock(previous + width, width, embed_dim))
            first = level == 0
            self.upsample.append(nn.Identity() if first else nn.Upsample(scale_factor=2, mode="nearest"))
            previous = width
        self.head = nn.Sequential(_group_norm(previous), nn.SiLU(), nn.Conv2d(previous, out_channels, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        factor = 2 ** (self.levels - 1)
        if x.shape[-1] % factor or x.shape[-2] % factor:
            raise ValueError(f"UNet with {self.levels} levels needs image sides divisible by {factor}, "
                             f"got {tuple(x.shape[-2:])}")
        embedding = self.embed(t, cond, x.shape[0])
        h = self.stem(x)
        skips = []
        for block, downsample in zip(self.down, self.downsample):
            h = block(h, embedding)
            skips.append(h)
            h = downsample(h)
        h = self.middle(h, embedding)
        for block, upsample in zip(self.up, self.upsample):
            h = block(torch.cat([h, skips.pop()], dim=1), embedding)
            h = upsample(h)
        return self.head(h)
