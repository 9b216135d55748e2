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
* ``celeba``: ``img_align_celeba/*.jpg`` (or ``.png``) with ``identity_CelebA.txt`` (lines ``<file name>
  <identity id>``, CelebA's format). ``data_dir`` may be the folder holding them (torchvision's
  ``<root>/celeba``), torchvision's ``<root>`` itself, or the release as distributed (``Img/img_align_celeba/``,
  ``Anno/``, ``Eval/``). The 5-point landmark file ``list_landmarks_align_celeba.txt`` (CelebA's format: a count
  line, a header line, then ``<file> lefteye_x lefteye_y righteye_x righteye_y nose_x nose_y leftmouth_x
  leftmouth_y rightmouth_x rightmouth_y`` in pixels of the original image) gives the geometry map when
  ``real_geometry="landmarks"``; ``list_eval_partition.txt`` (``<file> <0|1|2>``) gives the official split.
* ``lfw``: ``<person name>/<person name>_0001.jpg`` (one folder per identity, LFW's layout). ``data_dir`` may be
  that folder, the folder that holds ``lfw/`` (the release, with ``pairs.txt`` next to ``lfw/``) or
  torchvision's root (``lfw-py/lfw/`` and ``lfw-py/pairs.txt``; ``lfw_funneled``/``lfw-deepfunneled`` are taken
  when ``lfw`` is absent). ``pairs.txt`` (or the file ``lfw_pairs`` names, e.g. ``pairsDevTest.txt``) gives the
  official verification pairs. LFW ships no landmarks, so only ``real_geometry="none"`` (an all-zero geometry
  map) is allowed.

Real images are read with PIL, converted to grey and resized (not cropped) to ``image_size`` squared; at most
``max_images`` images (the first ones in file order) are read per part of the split, eagerly. Identities with
fewer than ``min_images_per_identity`` images are dropped and their count is logged. Nothing is downloaded; a missing
folder/file or a malformed line raises `UserInputError` naming the file, the line and the expected format.

Splits (deterministic given ``seed``)
-------------------------------------
The protocol is open-set: the identity encoder's classifier sees the **training identities** (labels
``0 .. num_train_identities - 1``), and the **held-out identities** (the labels after them) are the test set, as
face-recognition benchmarks do. ``train``: all but ``val_fraction`` of each training identity's images; ``val``:
the rest of those images (closed-set accuracy, diffusion loss; always drawn, with ``seed``); ``test`` /
``predict``: the held-out identities' images. Which identities are held out (``split``):

* **official** (``split="auto"`` when the release's file is present, or ``split="official"``, which requires it):
  CelebA's ``list_eval_partition.txt``: the training identities are those of partition 0, the held-out ones those
  of partition 2 (the benchmark's identity-disjoint test set); partition 1 (the benchmark's validation identities)
  is not used, because validation here is closed-set. LFW's pairs file (the verification protocol): every person
  named in a pair is held out and the test split is exactly the images the pairs name; the training identities
  are the other people. `FaceDataModule.verification_pairs` returns the pairs (``(i, j, same)`` rows into
  ``split_tensors("test")``): evaluate verification on them. ``heldout_identity_fraction`` is not used, held-out
  identities are kept even below ``min_images_per_identity``, and ``max_images`` caps the training and the test
  part separately (LFW pairs whose images were not read are left out, with a warning).
* **drawn** (``split="drawn"``, or ``auto`` without the file, and always for the synthetic source): identities are
  shuffled with ``seed`` and the last ``heldout_identity_fraction`` of them are held out; there are no official
  pairs (`verification_pairs` returns None): verification uses every pair of the test split. For the synthetic
  source the identity parameters are i.i.d., so the shuffle is skipped and the last identities are held out.

Length: the embedded face generator, the CelebA/LFW readers and their official splits serve one datamodule and
share its identity bookkeeping, so they stay together.
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
SPLITS = ("auto", "official", "drawn")
CELEBA_IMAGES, CELEBA_IDENTITIES = "img_align_celeba", "identity_CelebA.txt"
CELEBA_LANDMARKS, CELEBA_PARTITION = "list_landmarks_align_celeba.txt", "list_eval_partition.txt"
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


def _first_existing(candidates: list[str], kind: str = "file") -> str | None:
    test = os.path.isfile if kind == "file" else os.path.isdir
    return next((c for c in candidates if test(c)), None)


def celeba_layout(data_dir: str) -> tuple[str, dict[str, str | None]]:
    """(image folder, {annotation file name: path or None}) of a CelebA copy.

    ``data_dir`` may be the folder holding ``img_align_celeba/`` and the annotation files (torchvision's
    ``<root>/celeba``), torchvision's root itself (``<root>/celeba/img_align_celeba``), or the release as
    distributed (``Img/img_align_celeba/``, ``Anno/*.txt``, ``Eval/list_eval_partition.txt``).
    """
    bases = [data_dir, os.path.join(data_dir, "celeba")]
    image_dir = _first_existing([os.path.join(b, sub, CELEBA_IMAGES) for b in bases for sub in ("", "Img")], "dir")
    if image_dir is None:
        raise UserInputError(f"source='celeba' found no image folder {CELEBA_IMAGES}/ in '{data_dir}' (nor in its "
                             f"celeba/ or Img/ subfolders). Point data_dir at the folder holding {CELEBA_IMAGES}/ and "
                             "identity_CelebA.txt (torchvision's root, its celeba/ folder, or the release's root).")
    base = os.path.dirname(image_dir)
    if os.path.basename(base) == "Img":
        base = os.path.dirname(base)
    files = {name: _first_existing([os.path.join(base, sub, name) for sub in ("", "Anno", "Eval")])
             for name in (CELEBA_IDENTITIES, CELEBA_LANDMARKS, CELEBA_PARTITION)}
    return image_dir, files


def read_celeba_partition(path: str) -> dict[str, int]:
    """``list_eval_partition.txt``: one ``<file name> <0 train | 1 validation | 2 test>`` per line."""
    table = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
                raise UserInputError(f"{path}, line {number}: expected '<file name> <0|1|2>' (0 train, 1 validation, "
                                     f"2 test), got {line.strip()[:120]!r}.")
            table[parts[0]] = int(parts[1])
    return table


def _celeba_files(data_dir: str, split: str) -> tuple[list[str], list[int], list[str], dict[str, str | None]]:
    """(image paths, identity ids, roles, annotation files); a role is "pool" (drawn split), "train" or "test"."""
    image_dir, files = celeba_layout(data_dir)
    if files[CELEBA_IDENTITIES] is None:
        raise UserInputError(f"identity labels file {CELEBA_IDENTITIES} is missing next to '{image_dir}' (also looked "
                             "in Anno/): source='celeba' expects CelebA's identity_CelebA.txt with lines "
                             "'<file name> <identity id>'.")
    rows = read_celeba_identities(files[CELEBA_IDENTITIES])
    missing = [name for name, _ in rows if not os.path.isfile(os.path.join(image_dir, name))]
    if missing:
        raise UserInputError(f"{len(missing)} images named in identity_CelebA.txt are missing from {image_dir}, "
                             f"e.g. {missing[:3]}. Copy them or remove their lines.")
    roles = ["pool"] * len(rows)
    if split == "official" and files[CELEBA_PARTITION] is None:
        raise UserInputError(f"split='official' needs CelebA's {CELEBA_PARTITION} (next to {CELEBA_IMAGES}/ or in "
                             "Eval/); add it, or set split: drawn to hold out identities at random.")
    if split != "drawn" and files[CELEBA_PARTITION] is not None:
        partition = read_celeba_partition(files[CELEBA_PARTITION])
        unlisted = [name for name, _ in rows if name not in partition]
        if unlisted:
            raise UserInputError(f"{files[CELEBA_PARTITION]} has no partition for {len(unlisted)} images of "
                                 f"{CELEBA_IDENTITIES}, e.g. {unlisted[:3]}; use the release's file, or set "
                                 "split: drawn.")
        parts = {identity: set() for _, identity in rows}
        for name, identity in rows:
            parts[identity].add(partition[name])
        mixed = [identity for identity, p in parts.items() if 0 in p and 2 in p]
        if mixed:
            raise UserInputError(f"{files[CELEBA_PARTITION]}: identities {mixed[:3]} have images in both the training "
                                 "(0) and the test (2) partition, so the official split is not identity-disjoint; use "
                                 "the release's file, or set split: drawn.")
        # partition 1 (the benchmark's validation identities) is not used: validation is closed-set (see Splits)
        roles = [{0: "train", 1: "unused", 2: "test"}[partition[name]] for name, _ in rows]
    return [os.path.join(image_dir, n) for n, _ in rows], [i for _, i in rows], roles, files


def read_lfw_pairs(path: str) -> list[tuple[str, int, str, int]]:
    """LFW's ``pairs.txt`` (or ``pairsDevTest.txt``/``pairsDevTrain.txt``): a header line (``<folds> <pairs>`` or
    ``<pairs>``), then ``<name> <n1> <n2>`` (same person) and ``<name1> <n1> <name2> <n2>`` (different people) lines;
    ``n`` is the image number in ``<name>/<name>_<n:04d>.jpg``. Returns (name1, n1, name2, n2) tuples."""
    pairs = []
    with open(path) as f:
        lines = f.read().splitlines()
    for number, line in enumerate(lines, 1):
        parts = line.split()
        if not parts or (number == 1 and all(p.isdigit() for p in parts)):
            continue
        try:
            if len(parts) == 3:
                pairs.append((parts[0], int(parts[1]), parts[0], int(parts[2])))
            elif len(parts) == 4:
                pairs.append((parts[0], int(parts[1]), parts[2], int(parts[3])))
            else:
                raise ValueError
        except ValueError:
            raise UserInputError(f"{path}, line {number}: expected '<name> <n1> <n2>' or '<name1> <n1> <name2> <n2>' "
                                 f"(LFW's pairs format), got {line.strip()[:120]!r}.") from None
    if not pairs:
        raise UserInputError(f"LFW pairs file '{path}' lists no pairs.")
    return pairs


def lfw_layout(data_dir: str, pairs_file: str) -> tuple[str, str | None]:
    """(folder of the person folders, pairs file or None). ``data_dir`` may be that folder itself, the folder that
    holds ``lfw/`` (the release: ``lfw/<person>/<person>_0001.jpg`` next to ``pairs.txt``), or torchvision's root
    (``lfw-py/lfw/...`` and ``lfw-py/pairs.txt``); the funneled variants ``lfw_funneled``/``lfw-deepfunneled``
    are taken when ``lfw`` is absent."""
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir '{data_dir}' does not exist: source='lfw' expects one folder per person "
                             "(data_dir/<person name>/*.jpg, or data_dir/lfw/<person name>/*.jpg).")
    candidates = [os.path.join(data_dir, base, images) for base in ("lfw-py", "")
                  for images in ("lfw", "lfw_funneled", "lfw-deepfunneled")]
    image_dir = _first_existing(candidates, "dir") or data_dir
    search = [os.path.dirname(image_dir), image_dir, data_dir]
    return image_dir, _first_existing([os.path.join(d, pairs_file) for d in search])


def _lfw_files(data_dir: str, split: str, pairs_file: str
               ) -> tuple[list[str], list[int], list[str], list[tuple[str, str, bool]] | None]:
    """(image paths, person ids, roles, pairs as (path1, path2, same) or None); roles as in `_celeba_files`."""
    image_dir, pairs_path = lfw_layout(data_dir, pairs_file)
    if split == "official" and pairs_path is None:
        raise UserInputError(f"split='official' needs LFW's {pairs_file} (next to the lfw/ folder or in data_dir); add "
                             "it, or set split: drawn to hold out identities at random.")
    people = sorted(d for d in os.listdir(image_dir) if os.path.isdir(os.path.join(image_dir, d)))
    pairs = None
    pair_people: set[str] = set()
    pair_paths: set[str] = set()
    if split != "drawn" and pairs_path is not None:
        pairs = []
        for name1, n1, name2, n2 in read_lfw_pairs(pairs_path):
            path1, path2 = (os.path.join(image_dir, n, f"{n}_{k:04d}.jpg") for n, k in ((name1, n1), (name2, n2)))
            for path in (path1, path2):
                if not os.path.isfile(path):
                    raise UserInputError(f"{pairs_path} names '{path}', which does not exist: the LFW image folder "
                                         f"'{image_dir}' is incomplete (or a different pairs file); restore it, or set "
                                         "split: drawn.")
            pairs.append((path1, path2, name1 == name2))
            pair_people.update((name1, name2))
            pair_paths.update((path1, path2))
    paths, labels, roles = [], [], []
    for label, person in enumerate(people):
        folder = os.path.join(image_dir, person)
        for name in sorted(os.listdir(folder)):
            if not name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            path = os.path.join(folder, name)
            if pairs is None:
                role = "pool"
            elif person in pair_people:   # held out; only the images the pairs name are read
                role = "test" if path in pair_paths else "unused"
            else:
                role = "train"
            paths.append(path)
            labels.append(label)
            roles.append(role)
    if not paths:
        raise UserInputError(f"no images found under '{image_dir}': source='lfw' expects data_dir/<person name>/"
                             f"*{'/'.join(IMAGE_EXTENSIONS)} (or data_dir/lfw/<person name>/...).")
    return paths, labels, roles, pairs


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
        max_images: read at most this many real images per part of the split (file order); null = all.
        min_images_per_identity: real identities with fewer images are dropped (logged).
        split: "auto" (the release's own split when its file is in data_dir, else drawn), "official" (require
            CelebA's list_eval_partition.txt / LFW's pairs file) or "drawn" (identities held out at random).
        lfw_pairs: file name of the LFW pairs list used by the official split (pairs.txt, or pairsDevTest.txt).
        batch_size / eval_batch_size / num_workers: loaders; seed: data, split and key seed.
    """

    def __init__(self, source: Literal["synthetic", "celeba", "lfw"] = "synthetic", data_dir: str | None = None,
                 image_size: int = 16, num_identities: int = 200, images_per_identity: int = 12,
                 heldout_identity_fraction: float = 0.2, val_fraction: float = 0.2,
                 real_geometry: Literal["landmarks", "none"] = "landmarks", max_images: int | None = None,
                 min_images_per_identity: int = 2, split: Literal["auto", "official", "drawn"] = "auto",
                 lfw_pairs: str = "pairs.txt", batch_size: int = 64, eval_batch_size: int = 256,
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
        if split not in SPLITS:
            raise UserInputError(f"split={split!r} is unknown: choose one of {', '.join(SPLITS)}.")
        if source == "synthetic" and split == "official":
            raise UserInputError("source='synthetic' has no official split: use split: auto or drawn.")
        if not isinstance(lfw_pairs, str) or not lfw_pairs or os.path.basename(lfw_pairs) != lfw_pairs:
            raise UserInputError(f"lfw_pairs={lfw_pairs!r} must be a file name (e.g. pairs.txt or pairsDevTest.txt) "
                                 "looked up next to the LFW image folder.")
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
        self.split, self.lfw_pairs = split, lfw_pairs
        self.official_split = False     # set by setup(): whether the release's own split was used
        self._pair_rows: Tensor | None = None
        self._built = False

    # ------------------------------------------------------------------------------------------- building
    def setup(self, stage: str | None = None) -> None:
        if self._built:
            return
        heldout = None
        if self.source == "synthetic":
            images, geometry, ids, self.identity_params, self.nuisance = synthetic_faces(
                self.num_identities, self.images_per_identity, self.image_size, self.seed)
            order = torch.arange(self.num_identities)  # i.i.d. identities: the last ones are held out
        else:
            images, geometry, ids, heldout = self._load_real()
            gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM_SPLIT))
            order = torch.randperm(int(ids.max()) + 1, generator=gen)
            if heldout is not None:  # official split: its training identities first, its test identities last
                order = torch.cat([order[~heldout[order]], order[heldout[order]]])
        num = len(order)
        if heldout is not None:
            num_train = int((~heldout).sum())
        else:
            num_train = num - max(1, round(self.heldout_identity_fraction * num)) \
                if self.heldout_identity_fraction > 0 else num
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

    def _load_real(self) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(images, geometry, identity ids 0..K-1, per identity True if the official split holds it out, or None)."""
        pairs, landmark_file = None, None
        if self.source == "celeba":
            paths, labels, roles, files = _celeba_files(self.data_dir, self.split)
            landmark_file = files[CELEBA_LANDMARKS]
        else:
            paths, labels, roles, pairs = _lfw_files(self.data_dir, self.split, self.lfw_pairs)
        self.official_split = "pool" not in roles
        kept = []
        for role in ("pool", "train", "test"):   # max_images caps each part of the split separately
            rows = [i for i, r in enumerate(roles) if r == role]
            kept += rows[:self.max_images] if self.max_images is not None else rows
        kept.sort()
        paths, roles = [paths[i] for i in kept], [roles[i] for i in kept]
        labels_t = torch.tensor([labels[i] for i in kept])
        unique, inverse, counts = torch.unique(labels_t, return_inverse=True, return_counts=True)
        test_identity = torch.zeros(len(unique), dtype=torch.bool)
        test_identity[inverse[torch.tensor([r == "test" for r in roles], dtype=torch.bool)]] = True
        # an official split's held-out identities are the benchmark's test set: kept whole
        keep_identity = (counts >= self.min_images_per_identity) | test_identity
        if not keep_identity.all():
            log.warning("%d of %d identities have fewer than %d images and are dropped", int((~keep_identity).sum()),
                        len(unique), self.min_images_per_identity)
        keep = keep_identity[inverse]
        num_training = int((keep_identity & ~test_identity).sum())
        if num_training < 2 or int(keep_identity.sum()) < 4:
            raise UserInputError(f"only {int(keep_identity.sum())} identities ({num_training} for training) have at "
                                 f"least {self.min_images_per_identity} images in '{self.data_dir}': at least 4 (2 "
                                 "for training) are needed.")
        paths = [p for p, k in zip(paths, keep.tolist()) if k]
        ids = torch.cumsum(keep_identity.long(), 0)[inverse[keep]] - 1
        heldout = test_identity[keep_identity] if self.official_split else None
        if heldout is not None and not heldout.any():
            raise UserInputError(f"the official split of '{self.data_dir}' holds out no identity (no image of "
                                 "CelebA's test partition 2, or of the LFW pairs, was found): complete the copy, or "
                                 "set split: drawn.")
        if pairs is not None:
            row = {p: i for i, p in enumerate(paths)}
            usable = [(row[a], row[b], same) for a, b, same in pairs if a in row and b in row]
            if len(usable) < len(pairs):
                log.warning("%d of %d %s pairs name images that max_images did not read: they are left out, so "
                            "this is not the full official protocol", len(pairs) - len(usable), len(pairs),
                            self.lfw_pairs)
            self._pair_rows = torch.tensor(usable, dtype=torch.long).reshape(-1, 3)
        images = torch.stack([_read_image(p, self.image_size) for p in paths])
        if self.real_geometry == "none":
            geometry = torch.zeros_like(images)
        else:
            if landmark_file is None:
                raise UserInputError(f"landmark file {CELEBA_LANDMARKS} is missing (looked next to {CELEBA_IMAGES}/ "
                                     "and in Anno/): real_geometry='landmarks' needs CelebA's "
                                     f"{CELEBA_LANDMARKS} (or set real_geometry: none for an empty geometry map).")
            table = read_celeba_landmarks(landmark_file)
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
        return images, geometry, ids, heldout

    def verification_pairs(self) -> Tensor | None:
        """The official verification pairs (LFW's pairs file) as rows ``(i, j, same)`` indexing
        ``split_tensors("test")``; None when the data has none (then every pair of the test split is a pair)."""
        self.setup()
        if getattr(self, "_pair_rows", None) is None:
            return None
        test_rows = self.rows["test"]
        position = torch.searchsorted(test_rows, self._pair_rows[:, :2].contiguous())
        return torch.cat([position, self._pair_rows[:, 2:]], 1)

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
