"""Face data for TIVDiff: an embedded parametric face generator, plus CelebA- and LFW-style local folders.

Every example is a dict ``{"image": [1, S, S] grey pixels in [0, 1], "geometry": [1, S, S] landmark heat map in
[0, 1], "identity": int, "key": int}``. ``identity`` is the person's index (training identities first, then the
held-out ones, see Splits); ``key`` is the person's user key for the virtual identity projection (a pure function
of ``seed`` and the identity, drawn in [0, 2^31)).

Sources
-------
* ``synthetic`` (default, needs no files): a seeded parametric face renderer (`render_faces`). Every identity
  draws **identity parameters** once (face width/height, skin tone, hair tone and length, eye spacing/height/size,
  brow gap, nose length, mouth width/height); every image draws **nuisance parameters** (yaw, roll, smile, mouth
  opening, eye opening, lighting gradient, background level) plus pixel noise. Faces are rendered analytically
  with soft edges, so any ``image_size`` (8..128) works. The geometry map is a heat map of 8 landmarks (eyes,
  nose tip, mouth corners, upper/lower lip, chin) computed from the nuisance parameters with the **mean**
  identity shape: it carries pose and expression but no identity (like a 3DMM render with the mean shape),
  so the generator must take the identity from its identity condition (a documented reconstruction choice).
* ``celeba``: ``data_dir/img_align_celeba/*.jpg`` (or ``.png``) with ``data_dir/identity_CelebA.txt``
  (lines ``<file name> <identity id>``, CelebA's format). The 5-point landmark file
  ``data_dir/list_landmarks_align_celeba.txt`` (CelebA's format: a count line, a header line, then
  ``<file> lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x leftmouth_y rightmouth_x
  rightmouth_y`` in pixels of the original image) gives the geometry map when ``real_geometry="landmarks"``.
* ``lfw``: ``data_dir/<person name>/*.jpg`` (one folder per identity, LFW's layout). LFW ships no landmarks, so
  only ``real_geometry="none"`` (an all-zero geometry map) is allowed.

Real images are read with PIL, converted to grey and resized (not cropped) to ``image_size`` squared; at most
``max_images`` images (the first ones in sorted file order) are read, eagerly. Identities with fewer than
``min_images_per_identity`` images are dropped and their count is logged. Nothing is downloaded; a missing
folder/file or a malformed line raises `UserInputError` naming the file, the line and the expected format.

Splits (deterministic given ``seed``)
-------------------------------------
Identities are shuffled with ``seed`` and renumbered: the first ``1 - heldout_identity_fraction`` of them are the
**training identities** (labels ``0 .. num_train_identities - 1``, what the identity encoder's classifier sees),
the rest are **held-out identities** (open-set verification, as face-recognition benchmarks do).
``train``: all but ``val_fraction`` of each training identity's images; ``val``: the rest of those images
(closed-set accuracy, diffusion loss); ``test`` / ``predict``: every image of the held-out identities. For the
synthetic source the identity parameters are i.i.d., so renumbering is a no-op and the last identities are held out.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.errors import UserInputError, check_range

log = logging.getLogger(__name__)

SOURCES = ("synthetic", "celeba", "lfw")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# seed streams (2 is the training shuffle of datamodules.sampling)
_STREAM_IDENTITY, _STREAM_NUISANCE, _STREAM_PIXEL_NOISE, _STREAM_SPLIT, _STREAM_KEYS = 11, 12, 13, 14, 15

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


def key_for_identities(identities: Tensor, seed: int) -> Tensor:
    """Each identity's user key in [0, 2^31), a pure function of (seed, identity)."""
    rng = np.random.default_rng(mix_seed(seed, _STREAM_KEYS))
    table = rng.integers(0, 2 ** 31 - 1, size=int(identities.max()) + 1 if len(identities) else 0)
    return torch.from_numpy(table).long()[identities]


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


# ============================================================================================== real folders
def _read_image(path: str, size: int) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            grey = im.convert("L").resize((size, size), Image.BILINEAR)
    except (OSError, UnidentifiedImageError) as err:
        raise UserInputError(f"image '{path}' could not be read ({err}); remove or replace the file.") from None
    return torch.from_numpy(np.asarray(grey, dtype=np.float32) / 255.0)[None]


def read_celeba_identities(path: str) -> list[tuple[str, int]]:
    """``identity_CelebA.txt``: one ``<file name> <integer identity>`` per line."""
    if not os.path.isfile(path):
        raise UserInputError(f"identity labels file '{path}' is missing: source='celeba' expects CelebA's "
                             "identity_CelebA.txt with lines '<file name> <identity id>' next to img_align_celeba/.")
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise UserInputError(f"{path}, line {number}: expected '<file name> <integer identity>', got "
                                     f"{line.strip()!r}.")
            rows.append((parts[0], int(parts[1])))
    if not rows:
        raise UserInputError(f"identity labels file '{path}' has no '<file name> <identity id>' lines.")
    return rows


def read_celeba_landmarks(path: str) -> dict[str, np.ndarray]:
    """``list_landmarks_align_celeba.txt``: a count line, a header line, then ``<file> x1 y1 ... x5 y5``."""
    if not os.path.isfile(path):
        raise UserInputError(f"landmark file '{path}' is missing: real_geometry='landmarks' needs CelebA's "
                             "list_landmarks_align_celeba.txt (or set real_geometry: none for an empty geometry map).")
    table = {}
    with open(path) as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines[2:], 3):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 11:
                raise ValueError
            table[parts[0]] = np.asarray([float(p) for p in parts[1:]], dtype=np.float32).reshape(5, 2)
        except ValueError:
            raise UserInputError(f"{path}, line {number}: expected '<file> lefteye_x lefteye_y righteye_x righteye_y "
                                 f"nose_x nose_y leftmouth_x leftmouth_y rightmouth_x rightmouth_y', got "
                                 f"{line.strip()[:120]!r}.") from None
    return table


def _celeba_files(data_dir: str) -> tuple[list[str], list[int], str]:
    image_dir = os.path.join(data_dir, "img_align_celeba")
    if not os.path.isdir(image_dir):
        raise UserInputError(f"source='celeba' expects the image folder '{image_dir}' (CelebA's img_align_celeba/) "
                             "and the labels file identity_CelebA.txt in data_dir.")
    rows = read_celeba_identities(os.path.join(data_dir, "identity_CelebA.txt"))
    missing = [name for name, _ in rows if not os.path.isfile(os.path.join(image_dir, name))]
    if missing:
        raise UserInputError(f"{len(missing)} images named in identity_CelebA.txt are missing from {image_dir}, "
                             f"e.g. {missing[:3]}. Copy them or remove their lines.")
    return [os.path.join(image_dir, n) for n, _ in rows], [i for _, i in rows], image_dir


def _lfw_files(data_dir: str) -> tuple[list[str], list[int], list[str]]:
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir '{data_dir}' does not exist: source='lfw' expects one folder per person "
                             "(data_dir/<person name>/*.jpg).")
    people = sorted(d for d in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, d)))
    paths, labels = [], []
    for label, person in enumerate(people):
        folder = os.path.join(data_dir, person)
        for name in sorted(os.listdir(folder)):
            if name.lower().endswith(IMAGE_EXTENSIONS):
                paths.append(os.path.join(folder, name))
                labels.append(label)
    if not paths:
        raise UserInputError(f"no images found under '{data_dir}': source='lfw' expects data_dir/<person name>/"
                             f"*{'/'.join(IMAGE_EXTENSIONS)}.")
    return paths, labels, people


# ============================================================================================== datamodule
class FaceDataset(Dataset):
    """Rows of the face tensors: dicts with image, geometry, identity and key."""

    def __init__(self, images: Tensor, geometry: Tensor, identity: Tensor, key: Tensor, rows: Tensor) -> None:
        self.images, self.geometry, self.identity, self.key, self.rows = images, geometry, identity, key, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        r = self.rows[i]
        return {"image": self.images[r], "geometry": self.geometry[r], "identity": self.identity[r], "key": self.key[r]}


class FaceDataModule(LightningDataModule):
    """Faces with identity labels and geometry maps (see the module docstring).

    Args:
        source: "synthetic" (embedded), "celeba" or "lfw" (local folders in ``data_dir``).
        data_dir: folder of the real data set (ignored, and must be null, for "synthetic").
        image_size: side of the square grey images (8..128).
        num_identities / images_per_identity: size of the synthetic data set.
        heldout_identity_fraction: fraction of identities kept out of training (open-set test).
        val_fraction: fraction of each training identity's images used for validation.
        real_geometry: "landmarks" (CelebA's 5-point file) or "none" (zero geometry map) for real data.
        max_images: read at most this many real images (sorted order); null = all.
        min_images_per_identity: real identities with fewer images are dropped (logged).
        batch_size / eval_batch_size / num_workers: loaders; seed: data, split and key seed.
    """

    def __init__(self, source: Literal["synthetic", "celeba", "lfw"] = "synthetic", data_dir: str | None = None,
                 image_size: int = 16, num_identities: int = 200, images_per_identity: int = 12,
                 heldout_identity_fraction: float = 0.2, val_fraction: float = 0.2,
                 real_geometry: Literal["landmarks", "none"] = "landmarks", max_images: int | None = None,
                 min_images_per_identity: int = 2, batch_size: int = 64, eval_batch_size: int = 256,
                 num_workers: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        if source not in SOURCES:
            raise UserInputError(f"source={source!r} is unknown: choose one of {', '.join(SOURCES)}.")
        if source == "synthetic" and data_dir is not None:
            raise UserInputError("source='synthetic' is generated in memory and reads no files, but data_dir is set; "
                                 "remove data_dir or choose source 'celeba' / 'lfw'.")
        if source != "synthetic" and not data_dir:
            raise UserInputError(f"source={source!r} needs data_dir (the folder holding the data set).")
        if real_geometry not in ("landmarks", "none"):
            raise UserInputError(f"real_geometry={real_geometry!r} is unknown: choose 'landmarks' or 'none'.")
        if source == "lfw" and real_geometry == "landmarks":
            raise UserInputError("LFW ships no landmark file: set real_geometry: none (zero geometry maps) for "
                                 "source='lfw'.")
        check_range("image_size", image_size, 8, 128)
        check_range("num_identities", num_identities, 4)
        check_range("images_per_identity", images_per_identity, 2)
        check_range("heldout_identity_fraction", heldout_identity_fraction, 0, 1, high_inclusive=False)
        check_range("val_fraction", val_fraction, 0, 1, high_inclusive=False)
        check_range("min_images_per_identity", min_images_per_identity, 1)
        check_range("batch_size", batch_size, 1)
        check_range("eval_batch_size", eval_batch_size, 1)
        if max_images is not None:
            check_range("max_images", max_images, 2)
        self.source, self.data_dir, self.image_size = source, data_dir, int(image_size)
        self.num_identities, self.images_per_identity = int(num_identities), int(images_per_identity)
        self.heldout_identity_fraction, self.val_fraction = heldout_identity_fraction, val_fraction
        self.real_geometry, self.max_images, self.min_images_per_identity = real_geometry, max_images, \
            min_images_per_identity
        self.batch_size, self.eval_batch_size, self.num_workers, self.seed = batch_size, eval_batch_size, \
            num_workers, seed
        self._built = False

    # ------------------------------------------------------------------------------------------- building
    def setup(self, stage: str | None = None) -> None:
        if self._built:
            return
        if self.source == "synthetic":
            images, geometry, ids, self.identity_params, self.nuisance = synthetic_faces(
                self.num_identities, self.images_per_identity, self.image_size, self.seed)
            order = torch.arange(self.num_identities)  # i.i.d. identities: the last ones are held out
        else:
            images, geometry, ids = self._load_real()
            gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM_SPLIT))
            order = torch.randperm(int(ids.max()) + 1, generator=gen)
        num = len(order)
        num_train = num - max(1, round(self.heldout_identity_fraction * num)) if self.heldout_identity_fraction > 0 \
            else num
        if num_train < 2:
            raise UserInputError(f"only {num} identities: too few to hold out {self.heldout_identity_fraction:.0%} "
                                 "and still train on at least 2. Use more identities or a smaller fraction.")
        relabel = torch.empty_like(order)
        relabel[order] = torch.arange(num)
        self.identity = relabel[ids]
        self.images, self.geometry = images, geometry
        self.key = key_for_identities(self.identity, self.seed)
        self.num_train_identities = int(num_train)
        train_rows, val_rows = self._split_training_images(num_train)
        self.rows = {"train": train_rows, "val": val_rows,
                     "test": torch.nonzero(self.identity >= num_train).flatten()}
        self._built = True

    def _split_training_images(self, num_train: int) -> tuple[Tensor, Tensor]:
        """Per training identity, the last round(val_fraction * n) images (at least 1 if n >= 2) go to val."""
        gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM_SPLIT, 1))
        rows = torch.nonzero(self.identity < num_train).flatten()
        rows = rows[torch.randperm(len(rows), generator=gen)]
        rows = rows[torch.argsort(self.identity[rows], stable=True)]
        ident = self.identity[rows]
        counts = torch.bincount(ident, minlength=num_train)
        n_val = torch.round(counts.float() * self.val_fraction).long()
        if self.val_fraction > 0:
            n_val = torch.where(counts >= 2, n_val.clamp(1, None), n_val).minimum((counts - 1).clamp(min=0))
        start = torch.cumsum(counts, 0) - counts
        position = torch.arange(len(rows)) - start[ident]
        is_val = position >= (counts - n_val)[ident]
        return rows[~is_val].sort().values, rows[is_val].sort().values

    def _load_real(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.source == "celeba":
            paths, labels, image_dir = _celeba_files(self.data_dir)
        else:
            paths, labels, _ = _lfw_files(self.data_dir)
        if self.max_images is not None:
            paths, labels = paths[:self.max_images], labels[:self.max_images]
        labels_t = torch.tensor(labels)
        unique, inverse, counts = torch.unique(labels_t, return_inverse=True, return_counts=True)
        keep_identity = counts >= self.min_images_per_identity
        if not keep_identity.all():
            log.warning("%d of %d identities have fewer than %d images and are dropped", int((~keep_identity).sum()),
                        len(unique), self.min_images_per_identity)
        keep = keep_identity[inverse]
        if int(keep_identity.sum()) < 4:
            raise UserInputError(f"only {int(keep_identity.sum())} identities have at least "
                                 f"{self.min_images_per_identity} images in '{self.data_dir}': at least 4 are needed.")
        paths = [p for p, k in zip(paths, keep.tolist()) if k]
        ids = torch.cumsum(keep_identity.long(), 0)[inverse[keep]] - 1
        images = torch.stack([_read_image(p, self.image_size) for p in paths])
        if self.real_geometry == "none":
            geometry = torch.zeros_like(images)
        else:
            table = read_celeba_landmarks(os.path.join(self.data_dir, "list_landmarks_align_celeba.txt"))
            missing = [os.path.basename(p) for p in paths if os.path.basename(p) not in table]
            if missing:
                raise UserInputError(f"list_landmarks_align_celeba.txt has no landmarks for {len(missing)} images, "
                                     f"e.g. {missing[:3]}.")
            from PIL import Image

            points = []
            for p in paths:  # landmark pixels -> [-1, 1] with each image's own original size
                with Image.open(p) as im:
                    w, h = im.size
                xy = table[os.path.basename(p)]
                points.append(np.stack([(xy[:, 0] + 0.5) / w * 2 - 1, (xy[:, 1] + 0.5) / h * 2 - 1], -1))
            geometry = landmark_heatmap(torch.from_numpy(np.stack(points)).float(), self.image_size)
        return images, geometry, ids

    # ------------------------------------------------------------------------------------------- loaders
    def dataset(self, split: str) -> FaceDataset:
        self.setup()
        if split == "predict":
            split = "test"
        if split not in self.rows:
            raise UserInputError(f"split={split!r} is unknown: choose train, val, test or predict.")
        return FaceDataset(self.images, self.geometry, self.identity, self.key, self.rows[split])

    def split_tensors(self, split: str) -> dict[str, Tensor]:
        """All rows of a split as tensors (experiments and tests)."""
        rows = self.dataset(split).rows
        return {"image": self.images[rows], "geometry": self.geometry[rows], "identity": self.identity[rows],
                "key": self.key[rows]}

    def train_dataloader(self) -> DataLoader:
        data = self.dataset("train")
        sampler = training_sampler(len(data), self.seed, self.trainer)
        return DataLoader(data, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          drop_last=len(data) >= self.batch_size)

    def _eval_loader(self, split: str) -> DataLoader:
        data = self.dataset(split)
        return DataLoader(data, batch_size=self.eval_batch_size, sampler=evaluation_sampler(data, self.trainer),
                          shuffle=False, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


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
