"""CelebA- and LFW-style local folders for TIVDiff's faces (`datamodules.synthetic_faces.FaceDataModule`).

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
`load_real_faces` returns the images with the roles of the official split (training or held-out identities, LFW's
verification pairs); the datamodule turns them into its splits (see `datamodules.synthetic_faces`).
"""
from __future__ import annotations

import logging
import os
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from datamodules.face_renderer import landmark_heatmap
from lightning_modules.shared.errors import UserInputError

log = logging.getLogger(__name__)

CELEBA_IMAGES, CELEBA_IDENTITIES = "img_align_celeba", "identity_CelebA.txt"
CELEBA_LANDMARKS, CELEBA_PARTITION = "list_landmarks_align_celeba.txt", "list_eval_partition.txt"
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


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


class RealFaces(NamedTuple):
    """What `load_real_faces` read: images and geometry maps [N, 1, S, S], identity ids 0..K-1 [N], per identity
    True if the official split holds it out (None for a drawn split), whether the official split was used, and
    the official verification pairs as rows ``(i, j, same)`` into the images (LFW's pairs file; else None)."""

    images: Tensor
    geometry: Tensor
    ids: Tensor
    heldout: Tensor | None
    official_split: bool
    pair_rows: Tensor | None


def load_real_faces(source: str, data_dir: str, split: str, lfw_pairs: str, image_size: int, real_geometry: str,
                    max_images: int | None, min_images_per_identity: int) -> RealFaces:
    """Read a CelebA or LFW folder (``source``) with the arguments of `FaceDataModule` (see the module docstring)."""
    pairs, landmark_file, pair_rows = None, None, None
    if source == "celeba":
        paths, labels, roles, files = _celeba_files(data_dir, split)
        landmark_file = files[CELEBA_LANDMARKS]
    else:
        paths, labels, roles, pairs = _lfw_files(data_dir, split, lfw_pairs)
    official_split = "pool" not in roles
    kept = []
    for role in ("pool", "train", "test"):   # max_images caps each part of the split separately
        rows = [i for i, r in enumerate(roles) if r == role]
        kept += rows[:max_images] if max_images is not None else rows
    kept.sort()
    paths, roles = [paths[i] for i in kept], [roles[i] for i in kept]
    labels_t = torch.tensor([labels[i] for i in kept])
    unique, inverse, counts = torch.unique(labels_t, return_inverse=True, return_counts=True)
    test_identity = torch.zeros(len(unique), dtype=torch.bool)
    test_identity[inverse[torch.tensor([r == "test" for r in roles], dtype=torch.bool)]] = True
    # an official split's held-out identities are the benchmark's test set: kept whole
    keep_identity = (counts >= min_images_per_identity) | test_identity
    if not keep_identity.all():
        log.warning("%d of %d identities have fewer than %d images and are dropped", int((~keep_identity).sum()),
                    len(unique), min_images_per_identity)
    keep = keep_identity[inverse]
    num_training = int((keep_identity & ~test_identity).sum())
    if num_training < 2 or int(keep_identity.sum()) < 4:
        raise UserInputError(f"only {int(keep_identity.sum())} identities ({num_training} for training) have at "
                             f"least {min_images_per_identity} images in '{data_dir}': at least 4 (2 "
                             "for training) are needed.")
    paths = [p for p, k in zip(paths, keep.tolist()) if k]
    ids = torch.cumsum(keep_identity.long(), 0)[inverse[keep]] - 1
    heldout = test_identity[keep_identity] if official_split else None
    if heldout is not None and not heldout.any():
        raise UserInputError(f"the official split of '{data_dir}' holds out no identity (no image of "
                             "CelebA's test partition 2, or of the LFW pairs, was found): complete the copy, or "
                             "set split: drawn.")
    if pairs is not None:
        row = {p: i for i, p in enumerate(paths)}
        usable = [(row[a], row[b], same) for a, b, same in pairs if a in row and b in row]
        if len(usable) < len(pairs):
            log.warning("%d of %d %s pairs name images that max_images did not read: they are left out, so "
                        "this is not the full official protocol", len(pairs) - len(usable), len(pairs),
                        lfw_pairs)
        pair_rows = torch.tensor(usable, dtype=torch.long).reshape(-1, 3)
    images = torch.stack([_read_image(p, image_size) for p in paths])
    if real_geometry == "none":
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
        geometry = landmark_heatmap(torch.from_numpy(np.stack(points)).float(), image_size)
    return RealFaces(images, geometry, ids, heldout, official_split, pair_rows)
