"""Image classification data for the image papers: digits (embedded), CIFAR-10/100 and ImageFolder trees.

Datasets and the formats read
-----------------------------
* ``digits`` (default, needs no files): scikit-learn's ``load_digits``, 1797 grey 8x8 images of the
  digits 0-9 with integer pixels 0..16, shipped inside the scikit-learn package.
* ``cifar10``: the official "python version" pickles, ``cifar-10-batches-py/data_batch_1..5`` and
  ``test_batch``, each a dict with ``b'data'`` (N x 3072 uint8, channel-major 3x32x32) and ``b'labels'``.
* ``cifar100``: ``cifar-100-python/train`` and ``test`` with ``b'data'`` and ``b'fine_labels'`` (100 classes).
  ``class_names`` come from the release's ``meta`` (``fine_label_names``; CIFAR-10: ``batches.meta``,
  ``label_names``); without that file CIFAR-10 uses its published names and CIFAR-100 the label numbers.
  For both CIFARs ``data_dir`` may be the ``cifar-*`` folder itself or the folder that contains it.
* ``imagefolder``: ``data_dir/train/<class_name>/*.{png,jpg,jpeg}`` and ``data_dir/test/<class_name>/...``.
  Classes are the sorted names of the ``train`` subfolders, and ``test`` must have exactly the same ones.
  Images are read lazily with PIL, converted to RGB and resized (not cropped) to ``resize_to`` squared.

Nothing is ever downloaded: CIFAR and ImageFolder data are read from a local ``data_dir`` that the user
provides, and every missing or malformed file raises `UserInputError` naming the file and what was expected.
The readers (shared with the other image datamodules) are in `datamodules.readers`.
The CIFAR files are Python pickles: they are read with a restricted unpickler that loads only what the release
holds (dicts, lists, strings, numbers and numpy arrays) and refuses any other object without running it.

Pixel convention
----------------
Raw pixels are scaled to [0, 1] (digits: /16, CIFAR and ImageFolder: /255) and then normalised per channel
with ``mean``/``std`` computed from the training part of the split only (never validation or test). The
statistics include the forget class even when ``train_on="retain"``, so that the original model and the
retrain-from-scratch reference see identical pixels for identical images. ``normalize``/``denormalize``
map between [0, 1] pixels and model inputs. ImageFolder statistics use at most ``IMAGEFOLDER_STATS_MAX``
training images (a seeded subset) so that a large tree costs one bounded pass.

Splits (deterministic given ``seed``)
-------------------------------------
* test: the dataset's own test split (CIFAR ``test_batch``/``test``, ImageFolder ``test/``). Digits has none,
  so a stratified 80/20 train/test split is drawn with the FIXED seed ``DIGITS_TEST_SEED``: the digits test
  set is the same for every run, like a real benchmark's.
* validation: ``val_fraction`` of the training split, stratified by class and drawn with ``seed``.
  Per class, round(val_fraction * n_c) examples, clamped to [1, n_c - 1] when the class has 2+ examples.
* training shuffle: epoch e visits a permutation that is a pure function of (seed, e) (`EpochShuffleSampler`),
  so resuming from a checkpoint reproduces the data order. Under DDP Lightning wraps the sampler in its
  ``DistributedSamplerWrapper``, which forwards ``set_epoch`` and shards (and re-shuffles with the trainer's
  global seed) the same permutation on every rank: still a function of (seeds, epoch).

Class unlearning
----------------
``forget_class`` names the class to unlearn. ``train_on="retain"`` drops it from the training and validation
loaders (the retrain-from-scratch reference); ``forget_dataloader(split)``/``retain_dataloader(split)`` always
return the forget-class / other-class examples of the full split, un-augmented and unshuffled.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.readers import (CIFAR_LAYOUT, VAL_SPLIT_STREAM, FileImages, TensorImages, cifar_class_names,
                                find_cifar_dir, load_cifar, load_digits_images, require_data_dir, scan_image_folder,
                                stratified_split)
from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")
SPLITS = ("train", "val", "test")
IMAGEFOLDER_STATS_MAX = 10_000  # most training images read to compute ImageFolder mean/std
AUGMENT_PAD = 4
# seed stream of the ImageFolder statistics subset; the validation split draws from VAL_SPLIT_STREAM (readers)
# and the training shuffle from stream 2 (datamodules.sampling), so the three are independent
_STREAM_STATS = 3


class ImageClassificationDataModule(LightningDataModule):
    """Image classification with an optional forget class (see the module docstring).

    Args:
        dataset: "digits" (embedded), "cifar10", "cifar100" or "imagefolder".
        data_dir: local folder with the dataset files (required except for digits, where it must be None).
        forget_class: class to unlearn, in [0, num_classes); None for plain classification.
        train_on: "all", or "retain" to drop forget_class from the training and validation loaders.
        val_fraction: share of the training split held out for validation, in (0, 0.5].
        batch_size: examples per batch, >= 1.
        num_workers: DataLoader worker processes, >= 0.
        seed: seeds the validation split and the per-epoch shuffle, >= 0.
        augment: random crop (pad 4) + horizontal flip of training images (not for digits).
        resize_to: imagefolder only, square side the images are resized to (default 32); named apart
            from the model's ``image_size`` so that Lightning can merge both hparams.

    Attributes set by ``__init__``: ``num_classes``, ``in_channels``, ``image_size``, ``class_names``.
    Set by ``setup``: ``train_set``, ``val_set``, ``test_set``, ``mean``, ``std`` (per-channel tensors).
    """

    def __init__(
        self,
        dataset: Literal["digits", "cifar10", "cifar100", "imagefolder"] = "digits",
        data_dir: str | None = None,
        forget_class: int | None = None,
        train_on: Literal["all", "retain"] = "all",
        val_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        augment: bool = False,
        resize_to: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataset not in DATASETS:
            raise UserInputError(f"dataset={dataset!r} is unknown: choose one of {', '.join(DATASETS)}.")
        if train_on not in ("all", "retain"):
            raise UserInputError(f"train_on={train_on!r} is unknown: choose 'all' or 'retain'.")
        integers = (("batch_size", batch_size, 1), ("num_workers", num_workers, 0), ("seed", seed, 0))
        for name, value, low in integers:
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserInputError(f"{name}={value!r} must be an integer.")
            check_range(name, value, low)
        check_range("val_fraction", val_fraction, 0.0, 0.5, low_inclusive=False)
        self.dataset_name, self.train_on, self.val_fraction = dataset, train_on, float(val_fraction)
        self.batch_size, self.num_workers, self.seed, self.augment = batch_size, num_workers, seed, augment
        self.data_dir: str | None = None

        if dataset == "digits":
            if data_dir is not None:
                raise UserInputError(f"dataset='digits' is embedded (scikit-learn) and reads no files, but "
                                     f"data_dir={data_dir!r} was given. Remove data_dir, or choose dataset "
                                     "cifar10, cifar100 or imagefolder.")
            if augment:
                raise UserInputError("augment=True is not allowed for dataset='digits': flips and crops "
                                     "change what a digit is (a flipped 2 is no 2) and an 8x8 image has no "
                                     "room to crop. Set augment: false.")
            self._check_native_size(resize_to, 8)
            self.num_classes, self.in_channels, self.image_size = 10, 1, 8
            self.class_names = [str(d) for d in range(10)]
        elif dataset in CIFAR_LAYOUT:
            self._check_native_size(resize_to, 32)
            self.data_dir = find_cifar_dir(dataset, data_dir)
            self.num_classes, self.in_channels, self.image_size = CIFAR_LAYOUT[dataset][4], 3, 32
            self.class_names = cifar_class_names(dataset, self.data_dir)
        else:
            size = 32 if resize_to is None else resize_to
            if isinstance(size, bool) or not isinstance(size, int):
                raise UserInputError(f"resize_to={resize_to!r} must be an integer (pixels per side).")
            check_range("resize_to", size, 1)
            self.data_dir = require_data_dir(data_dir, "imagefolder", "a folder with train/<class>/*.png|jpg "
                                                                  "and test/<class>/... subfolders")
            self.class_names, self._files = scan_image_folder(self.data_dir)
            self.num_classes, self.in_channels, self.image_size = len(self.class_names), 3, size

        if forget_class is not None:
            if isinstance(forget_class, bool) or not isinstance(forget_class, int):
                raise UserInputError(f"forget_class={forget_class!r} must be an integer class index or null.")
            if not 0 <= forget_class < self.num_classes:
                raise UserInputError(f"forget_class={forget_class} is out of range: dataset {dataset!r} has "
                                     f"{self.num_classes} classes, so it must lie in "
                                     f"[0, {self.num_classes - 1}].")
        elif train_on == "retain":
            raise UserInputError("train_on='retain' drops the forget class from training, but forget_class "
                                 "is null. Set forget_class, or use train_on: all.")
        self.forget_class = forget_class
        self.mean: Tensor | None = None
        self.std: Tensor | None = None
        self._built = False

    def _check_native_size(self, resize_to: int | None, native: int) -> None:
        if resize_to is not None and resize_to != native:
            raise UserInputError(f"resize_to={resize_to} does not match dataset {self.dataset_name!r}, "
                                 f"whose images are {native}x{native}; resizing applies to imagefolder only. "
                                 "Remove resize_to (or set it to the native size).")

    # ----------------------------------------------------------------------------------------------- setup
    def setup(self, stage: str | None = None) -> None:
        """Read the data, draw the validation split and compute the training statistics (once)."""
        if self._built:
            return
        if self.dataset_name == "digits":
            pool, test = load_digits_images()
        elif self.dataset_name in CIFAR_LAYOUT:
            pool, test = load_cifar(self.dataset_name, self.data_dir)
        else:
            pool, test = (FileImages(paths, labels, self.image_size) for paths, labels in self._files)
        val_seed = mix_seed(self.seed, VAL_SPLIT_STREAM)
        train_idx, val_idx = stratified_split(pool.labels, self.val_fraction, val_seed)
        # full splits (forget class included): the unlearning loaders and the statistics use these
        self._split = {"train": (pool, train_idx), "val": (pool, val_idx),
                       "test": (test, torch.arange(len(test.labels)))}
        stats_idx = train_idx
        if isinstance(pool, FileImages) and len(train_idx) > IMAGEFOLDER_STATS_MAX:
            gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM_STATS))
            chosen = torch.randperm(len(train_idx), generator=gen)[:IMAGEFOLDER_STATS_MAX]
            stats_idx = train_idx[chosen].sort()[0]
        self.mean, self.std = pool.channel_stats(stats_idx)

        dropped = self.forget_class if self.train_on == "retain" else None
        self.train_set = self._dataset("train", drop=dropped, augment=self.augment)
        self.val_set = self._dataset("val", drop=dropped)
        self.test_set = self._dataset("test")
        self._built = True

    def _dataset(self, split: str, drop: int | None = None, only: int | None = None,
                 augment: bool = False) -> ImageDataset:
        source, idx = self._split[split]
        labels = source.labels[idx]
        if drop is not None:
            idx = idx[labels != drop]
        if only is not None:
            idx = idx[labels == only]
        return ImageDataset(source, idx, self.mean, self.std, augment)

    # ------------------------------------------------------------------------------------- normalisation
    def normalize(self, pixels: Tensor) -> Tensor:
        """[0, 1] pixels (..., C, H, W) -> model inputs, with the training-split mean/std."""
        mean, std = self._stats_like(pixels)
        return (pixels - mean) / std

    def denormalize(self, inputs: Tensor) -> Tensor:
        """Model inputs (..., C, H, W) -> [0, 1] pixels (the inverse of `normalize`)."""
        mean, std = self._stats_like(inputs)
        return inputs * std + mean

    def _stats_like(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.mean is None:
            raise RuntimeError("normalize/denormalize need the training statistics: call setup() first.")
        shape = (-1, 1, 1)
        return (self.mean.to(x).view(shape), self.std.to(x).view(shape))

    # -------------------------------------------------------------------------------------- dataloaders
    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, sampler=training_sampler(len(self.train_set), self.seed, self.trainer))

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, sampler=evaluation_sampler(self.val_set, self.trainer))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, sampler=evaluation_sampler(self.test_set, self.trainer))

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, sampler=evaluation_sampler(self.test_set, self.trainer))

    def forget_dataloader(self, split: str) -> DataLoader:
        """Unshuffled, un-augmented examples of `forget_class` in `split` (also when train_on='retain')."""
        return self._loader(self._class_subset(split, forget=True))

    def retain_dataloader(self, split: str) -> DataLoader:
        """Unshuffled, un-augmented examples of every class except `forget_class` in `split`."""
        return self._loader(self._class_subset(split, forget=False))

    def _class_subset(self, split: str, forget: bool) -> ImageDataset:
        if split not in SPLITS:
            raise UserInputError(f"split={split!r} is unknown: choose one of {', '.join(SPLITS)}.")
        if self.forget_class is None:
            raise UserInputError("forget/retain loaders need a forget class, but forget_class is null. "
                                 "Set data.init_args.forget_class.")
        self.setup()
        if forget:
            return self._dataset(split, only=self.forget_class)
        return self._dataset(split, drop=self.forget_class)

    def _loader(self, dataset: Dataset, sampler: Sampler | None = None) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, shuffle=False,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)


# ============================================================================ datasets and the sampler
class ImageDataset(Dataset):
    """`(normalised float C x H x W image, long label)` for the examples `indices` of a pixel source.

    ``labels`` holds the labels of this dataset in order (read it instead of iterating), ``indices`` the
    positions in the source (train and val share one source, so their indices are comparable).
    """

    def __init__(self, source: TensorImages | FileImages, indices: Tensor, mean: Tensor, std: Tensor,
                 augment: bool = False) -> None:
        self.source, self.indices, self.augment = source, indices, augment
        self.labels = source.labels[indices]
        self.mean, self.std = mean.view(-1, 1, 1), std.view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        pixels = self.source.pixels(int(self.indices[i]))
        if self.augment:
            pixels = random_crop_flip(pixels, AUGMENT_PAD)
        return (pixels - self.mean) / self.std, self.labels[i]


def random_crop_flip(pixels: Tensor, pad: int) -> Tensor:
    """Zero-pad (black) by `pad`, crop back to the original size at a random offset, flip w.p. 1/2."""
    _, h, w = pixels.shape
    padded = F.pad(pixels, (pad, pad, pad, pad))
    top, left = torch.randint(0, 2 * pad + 1, (2,)).tolist()
    out = padded[:, top:top + h, left:left + w]
    return out.flip(-1) if torch.rand(()) < 0.5 else out
