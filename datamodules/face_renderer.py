"""The parametric face renderer behind TIVDiff's embedded data (`datamodules.synthetic_faces.FaceDataModule`).

Every identity draws **identity parameters** once (face width/height, skin tone, hair tone and length, eye
spacing/height/size, brow gap, nose length, mouth width/height); every image draws **nuisance parameters** (yaw,
roll, smile, mouth opening, eye opening, lighting gradient, background level) plus pixel noise. Faces are rendered
analytically with soft edges, so any image size (8..128) works. The geometry map is a heat map of 8 landmarks (eyes,
nose tip, mouth corners, upper/lower lip, chin) computed from the nuisance parameters with the **mean** identity
shape: it carries pose and expression but no identity (like a 3DMM render with the mean shape), so the generator
must take the identity from its identity condition (a documented reconstruction choice).

Also here: the landmark heat map shared with CelebA's 5-point landmarks (`landmark_heatmap`) and the Gaussian blur
of the watermark-robustness check (`gaussian_blur`). Everything is a pure function of its arguments.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.sampling import mix_seed

# seed streams (2 is the training shuffle of datamodules.sampling; 14 and 15 are the datamodule's split and keys)
_STREAM_IDENTITY, _STREAM_NUISANCE, _STREAM_PIXEL_NOISE = 11, 12, 13

# identity parameters: name -> (low, high), drawn once per identity (coordinates: x right, y down, face in [-1, 1])
IDENTITY_RANGES = {
    "face_w": (0.50, 0.80), "face_h": (0.70, 0.95), "skin": (0.45, 0.90), "hair": (0.00, 0.35),
    "hair_len": (0.15, 0.55), "eye_sep": (0.28, 0.50), "eye_y": (-0.30, -0.08), "eye_size": (0.07, 0.14),
    "brow_gap": (0.08, 0.20), "nose_len": (0.12, 0.30), "mouth_w": (0.18, 0.45), "mouth_y": (0.30, 0.55),
}
# nuisance (pose / expression / lighting) parameters: drawn per image
NUISANCE_RANGES = {
    "yaw": (-0.5, 0.5), "roll": (-0.25, 0.25), "smile": (-1.0, 1.0), "mouth_open": (0.0, 1.0),
    "eye_open": (0.35, 1.0), "light": (-0.35, 0.35), "background": (0.05, 0.30),
}
PIXEL_NOISE_STD = 0.02
LANDMARK_SIGMA_PX = 0.9  # heat-map blob width in pixels


def identity_parameters(num_identities: int, seed: int) -> dict[str, Tensor]:
    """i.i.d. uniform identity parameters, [num_identities] each, a pure function of ``seed``."""
    rng = np.random.default_rng(mix_seed(seed, _STREAM_IDENTITY))
    return {k: torch.from_numpy(rng.uniform(lo, hi, num_identities)).float() for k, (lo, hi) in IDENTITY_RANGES.items()}


def nuisance_parameters(num_images: int, seed: int) -> dict[str, Tensor]:
    """i.i.d. uniform pose/expression/lighting parameters, [num_images] each, a pure function of ``seed``."""
    rng = np.random.default_rng(mix_seed(seed, _STREAM_NUISANCE))
    return {k: torch.from_numpy(rng.uniform(lo, hi, num_images)).float() for k, (lo, hi) in NUISANCE_RANGES.items()}


def mean_identity(num: int) -> dict[str, Tensor]:
    """The identity parameters of the average face (the centres of the ranges), repeated ``num`` times."""
    return {k: torch.full((num,), (lo + hi) / 2) for k, (lo, hi) in IDENTITY_RANGES.items()}


def _grid(size: int) -> tuple[Tensor, Tensor]:
    """Pixel-centre coordinates in [-1, 1] (x right, y down), [1, S, S] each."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1
    y, x = torch.meshgrid(c, c, indexing="ij")
    return x[None], y[None]


def _soft_ellipse(x: Tensor, y: Tensor, cx: Tensor, cy: Tensor, a: Tensor, b: Tensor, sharp: float) -> Tensor:
    """Soft indicator of an axis-aligned ellipse (1 inside, 0 outside, ~1 pixel edge); params are [N]."""
    a, b = a[:, None, None], b[:, None, None]
    r = torch.sqrt(((x - cx[:, None, None]) / a) ** 2 + ((y - cy[:, None, None]) / b) ** 2 + 1e-12)
    return torch.sigmoid((1 - r) * torch.minimum(a, b) * sharp)


def _local_coords(x: Tensor, y: Tensor, nuisance: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Image coordinates rotated by minus the roll angle (so the face is drawn upright in them)."""
    roll = nuisance["roll"][:, None, None]
    cos, sin = torch.cos(roll), torch.sin(roll)
    return cos * x + sin * y, -sin * x + cos * y


def landmarks(identity: dict[str, Tensor], nuisance: dict[str, Tensor]) -> Tensor:
    """8 landmarks [N, 8, 2] (x, y in [-1, 1] image coordinates): eyes, nose tip, mouth corners, lips, chin."""
    yaw, smile, opening = nuisance["yaw"], nuisance["smile"], nuisance["mouth_open"]
    shift = 0.3 * yaw
    mouth_x = 0.3 * yaw
    lip = 0.02 + 0.05 * opening
    corner_y = identity["mouth_y"] - 0.1 * smile
    pts = torch.stack([
        torch.stack([-identity["eye_sep"] / 2 + shift, identity["eye_y"]], -1),
        torch.stack([identity["eye_sep"] / 2 + shift, identity["eye_y"]], -1),
        torch.stack([0.35 * yaw, identity["eye_y"] + identity["nose_len"] + 0.05], -1),
        torch.stack([mouth_x - identity["mouth_w"] / 2, corner_y], -1),
        torch.stack([mouth_x + identity["mouth_w"] / 2, corner_y], -1),
        torch.stack([mouth_x, identity["mouth_y"] - lip], -1),
        torch.stack([mouth_x, identity["mouth_y"] + lip], -1),
        torch.stack([0.15 * yaw, identity["face_h"] * 0.95], -1),
    ], 1)
    roll = nuisance["roll"][:, None]
    cos, sin = torch.cos(roll), torch.sin(roll)  # local -> image: rotate by +roll
    x, y = pts[..., 0], pts[..., 1]
    return torch.stack([cos * x - sin * y, sin * x + cos * y], -1)


def landmark_heatmap(points: Tensor, size: int, weights: Tensor | None = None) -> Tensor:
    """Sum of Gaussian blobs at ``points`` [N, P, 2] (coordinates in [-1, 1]), clipped to [0, 1]: [N, 1, S, S]."""
    x, y = _grid(size)
    sigma = LANDMARK_SIGMA_PX * 2 / size
    d2 = (x[:, None] - points[..., 0, None, None]) ** 2 + (y[:, None] - points[..., 1, None, None]) ** 2
    blobs = torch.exp(-d2 / (2 * sigma ** 2))
    if weights is not None:
        blobs = blobs * weights[..., None, None]
    return blobs.sum(1, keepdim=True).clamp(0, 1)


def geometry_map(nuisance: dict[str, Tensor], size: int) -> Tensor:
    """Identity-free geometry map [N, 1, S, S]: landmarks of the mean face in the images' pose and expression."""
    n = len(nuisance["yaw"])
    points = landmarks(mean_identity(n), nuisance)
    weights = torch.ones(n, points.shape[1])
    weights[:, :2] = nuisance["eye_open"][:, None]  # eye blobs fade as the eyes close
    return landmark_heatmap(points, size, weights)


def render_faces(identity: dict[str, Tensor], nuisance: dict[str, Tensor], size: int,
                 noise: Tensor | None = None) -> Tensor:
    """Render grey faces [N, 1, S, S] in [0, 1] from per-image identity and nuisance parameters ([N] each)."""
    x, y = _grid(size)
    u, v = _local_coords(x, y, nuisance)
    sharp = float(size)
    yaw = nuisance["yaw"]
    face_cx = 0.12 * yaw
    face_w = identity["face_w"] * (1 - 0.2 * yaw.abs())
    face = _soft_ellipse(u, v, face_cx, torch.zeros_like(yaw), face_w, identity["face_h"], sharp)
    shade = identity["skin"][:, None, None] * (1 + nuisance["light"][:, None, None] * u)
    img = nuisance["background"][:, None, None] * (1 - face) + face * shade
    hairline = -identity["face_h"] + identity["hair_len"]
    hair = face * torch.sigmoid((hairline[:, None, None] - v) * sharp)
    img = img * (1 - hair) + hair * identity["hair"][:, None, None]

    def paint(mask: Tensor, value: Tensor | float) -> None:
        nonlocal img
        img = img * (1 - mask) + mask * value

    shift = 0.3 * yaw
    for side in (-1.0, 1.0):
        ex = side * identity["eye_sep"] / 2 + shift
        eye_b = identity["eye_size"] * (0.15 + 0.45 * nuisance["eye_open"])
        paint(_soft_ellipse(u, v, ex, identity["eye_y"], identity["eye_size"], eye_b, sharp), 0.05)
        paint(_soft_ellipse(u, v, ex, identity["eye_y"] - identity["brow_gap"], identity["eye_size"] * 1.3,
                            torch.full_like(ex, 0.03), sharp), 0.15)
    nose_cy = identity["eye_y"] + identity["nose_len"] / 2 + 0.05
    paint(_soft_ellipse(u, v, 0.35 * yaw, nose_cy, torch.full_like(yaw, 0.05), identity["nose_len"] / 2, sharp),
          0.7 * shade)
    # mouth: a band around the parabola y = mouth_y - 0.1 smile dx^2 (corners rise when smiling)
    mx = (0.3 * yaw)[:, None, None]
    half = (identity["mouth_w"] / 2)[:, None, None]
    dx = (u - mx) / half
    curve = identity["mouth_y"][:, None, None] - 0.1 * nuisance["smile"][:, None, None] * dx ** 2
    thickness = (0.02 + 0.05 * nuisance["mouth_open"])[:, None, None]
    band = torch.sigmoid((thickness - (v - curve).abs()) * sharp) * torch.sigmoid((1 - dx.abs()) * half * sharp)
    paint(band, 0.12)
    if noise is not None:
        img = img + noise
    return img.clamp(0, 1).unsqueeze(1)


def synthetic_faces(num_identities: int, images_per_identity: int, size: int, seed: int
                    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """The embedded data set: (images [N,1,S,S], geometry [N,1,S,S], identity [N], identity params, nuisance).

    Images are ordered identity-major (identity i owns rows i*K .. i*K+K-1). Pure function of the arguments.
    """
    ids = torch.arange(num_identities).repeat_interleave(images_per_identity)
    params = identity_parameters(num_identities, seed)
    nuisance = nuisance_parameters(len(ids), seed)
    gen = torch.Generator().manual_seed(mix_seed(seed, _STREAM_PIXEL_NOISE))
    noise = torch.randn(len(ids), size, size, generator=gen) * PIXEL_NOISE_STD
    per_image = {k: v[ids] for k, v in params.items()}
    images = torch.cat([render_faces({k: v[s] for k, v in per_image.items()}, {k: v[s] for k, v in nuisance.items()},
                                     size, noise[s]) for s in _chunks(len(ids), 2048)])
    geometry = torch.cat([geometry_map({k: v[s] for k, v in nuisance.items()}, size) for s in _chunks(len(ids), 2048)])
    return images, geometry, ids, params, nuisance


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


# ============================================================================================== image operations
def make_blur_kernel(sigma: float) -> Tensor:
    """A normalised 2-D Gaussian kernel [1, 1, k, k] (k = 2 * ceil(2 sigma) + 1), for the blur attack."""
    radius = max(1, math.ceil(2 * sigma))
    r = torch.arange(-radius, radius + 1, dtype=torch.float32)
    g = torch.exp(-r ** 2 / (2 * sigma ** 2))
    k = torch.outer(g, g)
    return (k / k.sum())[None, None]


def gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """Blur [N, C, H, W] images channel-wise with reflect padding."""
    kernel = make_blur_kernel(sigma).to(images)
    pad = kernel.shape[-1] // 2
    c = images.shape[1]
    return F.conv2d(F.pad(images, (pad,) * 4, mode="reflect"), kernel.expand(c, 1, -1, -1), groups=c)
