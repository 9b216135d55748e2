"""Face data for TIVDiff: `FaceDataModule` over an embedded parametric face generator or CelebA/LFW folders.

Every example is a dict ``{"image": [1, S, S] grey pixels in [0, 1], "geometry": [1, S, S] landmark heat map in
[0, 1], "identity": int, "key": int, "index": int}``. ``identity`` is the person's index (training identities
first, then the held-out ones, see Splits); ``key`` is the person's user key for the virtual identity projection (a
pure function of ``seed`` and the identity, drawn in [0, 2^31)); ``index`` is the image's row in the data (it seeds
the image's evaluation noise, so that does not depend on batching or on the number of processes).

Sources
-------
* ``synthetic`` (default, needs no files): the seeded parametric face renderer of `datamodules.face_renderer`
  (identity parameters drawn once per person, pose/expression/lighting per image, pixel noise; any ``image_size``
  in 8..128). Its geometry map carries pose and expression with the mean identity shape, so no identity.
* ``celeba`` and ``lfw``: local copies of the releases (or torchvision's folders), read by
  `datamodules.face_datasets`, whose docstring lists the files each expects.

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
"""
from __future__ import annotations

import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.face_datasets import load_real_faces
from datamodules.face_renderer import synthetic_faces
from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

SOURCES = ("synthetic", "celeba", "lfw")
SPLITS = ("auto", "official", "drawn")
# seed streams (2 is the training shuffle of datamodules.sampling; 11-13 are the renderer's)
_STREAM_SPLIT, _STREAM_KEYS = 14, 15


def key_for_identities(identities: Tensor, seed: int) -> Tensor:
    """Each identity's user key in [0, 2^31), a pure function of (seed, identity)."""
    rng = np.random.default_rng(mix_seed(seed, _STREAM_KEYS))
    table = rng.integers(0, 2 ** 31 - 1, size=int(identities.max()) + 1 if len(identities) else 0)
    return torch.from_numpy(table).long()[identities]


class FaceDataset(Dataset):
    """Rows of the face tensors: dicts with image, geometry, identity, key and index (the row)."""

    def __init__(self, images: Tensor, geometry: Tensor, identity: Tensor, key: Tensor, rows: Tensor) -> None:
        self.images, self.geometry, self.identity, self.key, self.rows = images, geometry, identity, key, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        r = self.rows[i]
        return {"image": self.images[r], "geometry": self.geometry[r], "identity": self.identity[r], "key": self.key[r],
                "index": torch.as_tensor(r, dtype=torch.long)}


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
        real = load_real_faces(self.source, self.data_dir, self.split, self.lfw_pairs, self.image_size,
                               self.real_geometry, self.max_images, self.min_images_per_identity)
        self.official_split = real.official_split
        if real.pair_rows is not None:
            self._pair_rows = real.pair_rows
        return real.images, real.geometry, real.ids, real.heldout

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
