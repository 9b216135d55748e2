"""Corrupted-image data for coupled diffusion: (clean, corrupted, label) triples, plus the corruptions themselves.

Corruptions (``corrupt``; they act on images in the diffusion models' [-1, 1] range and return [-1, 1])
------------------------------------------------------------------------------------------------------
* ``pixel_replacement`` (level p in [0, 1]): every element is replaced, independently with probability p, by a
  N(0, 1) draw (then clamped to [-1, 1]). The official code replaces masked pixels by N(0, 1) in the
  classifier-normalised space; here the one pixel convention of the collection is kept ([-1, 1]), whose scale
  is close to that space, and the result is clamped so that a corrupted image is still an image.
* ``gaussian_noise`` (level sigma >= 0): ``x + sigma * N(0, 1)``, clamped to [-1, 1].
* ``gaussian_blur`` (level sigma >= 0, 0 = identity): separable Gaussian kernel of size ``2 * ceil(2 sigma) + 1``
  (covers +-2 sigma; the official code uses a fixed 5x5 kernel with sigma 2.0), replicate padding so that any
  kernel fits even an 8x8 image. Deterministic: the generator is not used.

Every random corruption takes an optional ``torch.Generator``: the same generator state gives the same output.

Datasets and the formats read (``data_dir`` is a local folder; nothing is downloaded)
-----------------------------------------------------------------------------------
* ``digits`` (default, embedded): scikit-learn's 8x8 digits, with the same fixed 80/20 train/test split as
  `datamodules.images` (so a classifier trained by `ImageClassificationDataModule` sees the same pixels).
* ``cifar10`` / ``cifar100``: the official python pickles, read by `datamodules.readers` (same layout and errors
  as `datamodules.images`).
* ``imagenet32``: downsampled ImageNet 32x32 in either official form: the npz release,
  ``Imagenet32_train_npz/train_data_batch_{1..10}.npz`` and ``Imagenet32_val_npz/val_data.npz``, or the pickle
  release, ``Imagenet32_train/train_data_batch_{1..10}`` and ``Imagenet32_val/val_data`` (dicts with ``data``,
  ``labels`` and ``mean``, read with the restricted unpickler of `datamodules.readers`). Each file is taken in
  its npz form when present, else in its pickle form; the subfolders may also be flattened into ``data_dir``.
  Each file holds ``data`` (N x 3072 uint8, channel-major 3x32x32) and ``labels`` (N integers in 1..1000).
  As in the official coupled-diffusion code a ``imagenet_num_classes`` subset (default 100) is drawn with
  ``random.Random(imagenet_subset_seed).sample(range(1000), k)`` over 0-based labels; the chosen classes are
  relabelled 0..k-1 in sorted order [reconstruction: the code's relabelling order was not readable]. Only the
  subset's rows are kept in memory (each file is filtered as it is read).
* ``imagefolder``: your own images, one subfolder per class as in torchvision's ``ImageFolder``:
  ``data_dir/train/<class>/*.{png,jpg,jpeg}`` and ``data_dir/test/<class>/...`` with the same class folders
  (classes are the sorted folder names), read by `datamodules.readers` (`scan_image_folder`, `FileImages`) as
  for `ImageClassificationDataModule`: lazily with PIL, converted to RGB and resized (not cropped) to
  ``resize_to`` x ``resize_to`` (default 32). The test split is ``test/``; validation is held out of ``train/``.

Outputs and pixel convention
----------------------------
``output="coupled"`` (default): batches ``(clean, corrupted, label, index)`` with both images as [0, 1] pixels
(C x H x W floats; models map them to [-1, 1] with `lightning_modules.shared.denoisers.to_model_range`) and each
example's index in its split's source (what seeds the example's sampling noise in evaluation, so it does not
depend on batching or on the number of processes); a single item ``dataset[i]`` is the triple without the index.
Training images are corrupted afresh on every visit (torch's global RNG, seeded by ``seed_everything``);
validation and test images carry a FIXED corruption per example (a generator seeded from the split and the
example's index, independent of ``seed``), so every run is evaluated on the same corrupted test set.
``output="classification"``: batches ``(normalised clean image, label)`` exactly like
`ImageClassificationDataModule`, so the frozen classifier of coupled diffusion can be trained on the same split
(and on ImageNet-32, which that module does not read).

``mean``/``std`` (per channel, of [0, 1] pixels) come from the training part of the split only, computed exactly
as in `datamodules.images` (same stratified validation split for the same ``seed`` and ``val_fraction``; for
``imagefolder`` at most ``IMAGEFOLDER_STATS_MAX`` seeded training images, as there): they are the classifier's
fixed input normalisation, which the coupled model copies into its buffers.
"""
from __future__ import annotations

import math
import os
import random
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.images import _STREAM_STATS, AUGMENT_PAD, IMAGEFOLDER_STATS_MAX, random_crop_flip
from datamodules.readers import (CIFAR_LAYOUT, VAL_SPLIT_STREAM, FileImages, TensorImages, check_rgb32_arrays,
                                 find_cifar_dir, load_cifar, load_digits_images, load_release_pickle,
                                 require_data_dir, scan_image_folder, stratified_split)
from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

CORRUPTIONS = ("pixel_replacement", "gaussian_noise", "gaussian_blur")
DATASETS = ("digits", "cifar10", "cifar100", "imagenet32", "imagefolder")
IMAGENET32_TRAIN = tuple(f"train_data_batch_{i}.npz" for i in range(1, 11))
IMAGENET32_VAL = "val_data.npz"
IMAGENET32_FOLDERS = ("Imagenet32_train_npz", "Imagenet32_val_npz")
IMAGENET32_PICKLE_FOLDERS = ("Imagenet32_train", "Imagenet32_val")   # the pickle release: same names, no ".npz"
_STREAM_EVAL_CORRUPTION = 11  # fixed corruptions of validation/test examples (independent of `seed`)


# ====================================================================================== corruptions
def _check_level(kind: str, level: float) -> None:
    if kind not in CORRUPTIONS:
        raise UserInputError(f"corruption={kind!r} is unknown: choose one of {', '.join(CORRUPTIONS)}.")
    if not isinstance(level, (int, float)) or isinstance(level, bool) or not math.isfinite(level):
        raise UserInputError(f"corruption_level={level!r} must be a finite number.")
    if kind == "pixel_replacement":
        check_range("corruption_level (pixel_replacement probability)", level, 0.0, 1.0)
    else:
        check_range(f"corruption_level ({kind} sigma)", level, 0.0)


def _draw(kind: str, shape: torch.Size, like: Tensor, generator: torch.Generator | None) -> Tensor:
    device = like.device if generator is None else generator.device
    sampler = torch.rand if kind == "rand" else torch.randn
    return sampler(shape, generator=generator, device=device, dtype=like.dtype).to(like.device)


def pixel_replacement(images: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """Replace each element with probability ``p`` by a N(0, 1) draw; clamp to [-1, 1]."""
    _check_level("pixel_replacement", p)
    mask = _draw("rand", images.shape, images, generator) < p
    noise = _draw("randn", images.shape, images, generator)
    return torch.where(mask, noise, images).clamp(-1.0, 1.0)


def gaussian_noise(images: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
    """``images + sigma * N(0, 1)``, clamped to [-1, 1]."""
    _check_level("gaussian_noise", sigma)
    return (images + sigma * _draw("randn", images.shape, images, generator)).clamp(-1.0, 1.0)


def gaussian_kernel1d(sigma: float) -> Tensor:
    """Normalised 1-D Gaussian of size ``2 * ceil(2 sigma) + 1`` (a single 1 for sigma = 0)."""
    radius = math.ceil(2.0 * sigma)
    if radius == 0:
        return torch.ones(1)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    return (kernel / kernel.sum()).float()


def gaussian_blur(images: Tensor, sigma: float, generator: torch.Generator | None = None) -> Tensor:
    """Separable Gaussian blur of [B, C, H, W] images with replicate padding (``generator`` is unused)."""
    _check_level("gaussian_blur", sigma)
    kernel = gaussian_kernel1d(sigma).to(images)
    radius = (len(kernel) - 1) // 2
    if radius == 0:
        return images.clone()
    channels = images.shape[1]
    out = F.pad(images, (radius, radius, radius, radius), mode="replicate")
    out = F.conv2d(out, kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)
    out = F.conv2d(out, kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)
    return out.clamp(-1.0, 1.0)


_CORRUPTION_FUNCTIONS = {"pixel_replacement": pixel_replacement, "gaussian_noise": gaussian_noise,
                         "gaussian_blur": gaussian_blur}


def corrupt(images: Tensor, kind: str, level: float, generator: torch.Generator | None = None) -> Tensor:
    """Apply corruption ``kind`` at ``level`` to [B, C, H, W] images in [-1, 1] (see the module docstring)."""
    _check_level(kind, level)
    if images.dim() != 4:
        raise UserInputError(f"corrupt expects [B, C, H, W] images, got shape {tuple(images.shape)}.")
    return _CORRUPTION_FUNCTIONS[kind](images, level, generator)


# ======================================================================================== ImageNet-32
def imagenet32_subset_classes(num_classes: int, subset_seed: int) -> list[int]:
    """The 0-based ImageNet classes kept: ``random.Random(seed).sample(range(1000), k)``, sorted."""
    if num_classes == 1000:
        return list(range(1000))
    return sorted(random.Random(subset_seed).sample(range(1000), num_classes))


def _find_imagenet32_files(data_dir: str | None) -> tuple[list[str], str]:
    expected = (f"the npz release ({IMAGENET32_FOLDERS[0]}/train_data_batch_{{1..10}}.npz, {IMAGENET32_FOLDERS[1]}/"
                f"{IMAGENET32_VAL}) or the pickle release ({IMAGENET32_PICKLE_FOLDERS[0]}/train_data_batch_{{1..10}}, "
                f"{IMAGENET32_PICKLE_FOLDERS[1]}/val_data), the files possibly directly in data_dir")
    root = require_data_dir(data_dir, "imagenet32", expected)

    def locate(name: str, i: int) -> str | None:
        # each file in its npz form first, then in its pickle form (the same name without ".npz")
        for stem, folder in ((name, IMAGENET32_FOLDERS[i]), (name[:-len(".npz")], IMAGENET32_PICKLE_FOLDERS[i])):
            for candidate in (os.path.join(root, folder, stem), os.path.join(root, stem)):
                if os.path.isfile(candidate):
                    return candidate
        return None

    train = [locate(name, 0) for name in IMAGENET32_TRAIN]
    val = locate(IMAGENET32_VAL, 1)
    missing = [name for name, path in zip(IMAGENET32_TRAIN + (IMAGENET32_VAL,), train + [val]) if path is None]
    if missing:
        raise UserInputError(f"imagenet32: '{root}' lacks {', '.join(missing)} (in either form). Expected "
                             f"{expected}: downsampled ImageNet 32x32 (image-net.org). Nothing is downloaded at "
                             "run time.")
    return train, val


def _load_imagenet32_arrays(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(data, labels) of one file: an ``.npz`` archive, otherwise the pickle release's dict (restricted unpickler)."""
    if not path.endswith(".npz"):
        batch = load_release_pickle(path, "imagenet32 file")
        found = {}
        if isinstance(batch, dict):
            found = {key: batch.get(key, batch.get(key.encode())) for key in ("data", "labels")}
        if not isinstance(batch, dict) or any(v is None for v in found.values()):
            keys = f"keys {sorted(map(repr, batch))}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
            raise UserInputError(f"imagenet32 file '{path}' must be a dict with 'data' (N x 3072 uint8) and 'labels' "
                                 f"(N integers in 1..1000), as in the pickle release; found {keys}.")
        return np.asarray(found["data"]), np.asarray(found["labels"])
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys = set(npz.files)
            if not {"data", "labels"} <= keys:
                raise UserInputError(f"imagenet32 file '{path}' lacks key(s) "
                                     f"{sorted({'data', 'labels'} - keys)} (keys present: {sorted(keys)}); "
                                     "expected 'data' (N x 3072 uint8) and 'labels' (N integers in 1..1000).")
            return npz["data"], np.asarray(npz["labels"])
    except UserInputError:
        raise
    except (ValueError, OSError, EOFError) as err:
        raise UserInputError(f"imagenet32 file '{path}' is not a readable npz archive ({type(err).__name__}: "
                             f"{err}). It is truncated or of another format: re-extract the official release."
                             ) from None


def _read_imagenet32_file(path: str, keep: np.ndarray) -> tuple[Tensor, Tensor]:
    """One ImageNet-32 file -> (uint8 N x 3 x 32 x 32, 0-based labels remapped by `keep`), rows of kept classes."""
    data, labels = _load_imagenet32_arrays(path)
    # the release's labels are 1-based
    check_rgb32_arrays(f"imagenet32 file '{path}'", data, labels, "'data'", "'labels' (1-based)", 1, 1000)
    remap = np.full(1000, -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    new_labels = remap[labels.astype(np.int64) - 1]
    rows = new_labels >= 0
    pixels = torch.from_numpy(data[rows].astype(np.uint8).reshape(-1, 3, 32, 32))
    return pixels, torch.from_numpy(new_labels[rows])


def load_imagenet32(data_dir: str | None, num_classes: int = 100,
                    subset_seed: int = 42) -> tuple[TensorImages, TensorImages]:
    """(train, test=official val) pixel sources of the ImageNet-32 class subset."""
    train_files, val_file = _find_imagenet32_files(data_dir)
    keep = np.asarray(imagenet32_subset_classes(num_classes, subset_seed))
    parts = [_read_imagenet32_file(path, keep) for path in train_files]
    train = TensorImages(torch.cat([p for p, _ in parts]), torch.cat([y for _, y in parts]), 255.0)
    test = TensorImages(*_read_imagenet32_file(val_file, keep), 255.0)
    for name, source in (("training", train), ("validation", test)):
        if len(source.labels) == 0:
            raise UserInputError(f"imagenet32: the {name} files hold no image of the {num_classes} chosen classes.")
    return train, test


# ========================================================================================== datasets
class CorruptedImageDataset(Dataset):
    """``(clean [0,1], corrupted [0,1], label)`` (or ``(normalised clean, label)``) for `indices` of a source.

    ``fixed_stream`` None: a fresh corruption per visit (global RNG); otherwise the example's corruption is drawn
    from a generator seeded with ``(fixed_stream, source index)``, the same on every visit.
    """

    def __init__(self, source: TensorImages | FileImages, indices: Tensor, corruption: str, level: float,
                 fixed_stream: int | None, mean: Tensor, std: Tensor, output: str = "coupled",
                 augment: bool = False) -> None:
        self.source, self.indices, self.labels = source, indices, source.labels[indices]
        self.corruption, self.level, self.fixed_stream = corruption, level, fixed_stream
        self.mean, self.std, self.output, self.augment = mean.view(-1, 1, 1), std.view(-1, 1, 1), output, augment

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, keys: list[int]) -> list:
        """The items of a loader's batch; ``coupled`` items gain their source index (a fourth entry)."""
        if self.output == "classification":
            return [self[i] for i in keys]
        return [(*self[i], int(self.indices[i])) for i in keys]

    def __getitem__(self, i: int):
        index = int(self.indices[i])
        pixels = self.source.pixels(index)
        if self.augment:
            pixels = random_crop_flip(pixels, AUGMENT_PAD)
        if self.output == "classification":
            return (pixels - self.mean) / self.std, self.labels[i]
        generator = None
        if self.fixed_stream is not None:
            generator = torch.Generator().manual_seed(mix_seed(_STREAM_EVAL_CORRUPTION, self.fixed_stream, index))
        corrupted = corrupt(pixels[None] * 2.0 - 1.0, self.corruption, self.level, generator)[0]
        return pixels, (corrupted + 1.0) / 2.0, self.labels[i]


class CorruptedImageDataModule(LightningDataModule):
    """Clean/corrupted image pairs for coupled diffusion (see the module docstring).

    Args:
        dataset: "digits" (embedded), "cifar10", "cifar100", "imagenet32" or "imagefolder" (your own images).
        data_dir: local folder with the dataset files (required except for digits, where it must be None).
        corruption: "pixel_replacement", "gaussian_noise" or "gaussian_blur".
        corruption_level: replacement probability in [0, 1], or the noise/blur sigma (>= 0, in [-1, 1] units
            for noise, pixels for blur).
        output: "coupled" for (clean, corrupted, label), "classification" for (normalised clean, label).
        val_fraction: share of the training split held out for validation, in (0, 0.5].
        batch_size / num_workers / seed: as in `ImageClassificationDataModule` (same split for the same seed).
        augment: random crop (pad 4) + flip of training images before corruption (not for digits).
        imagenet_num_classes / imagenet_subset_seed: the ImageNet-32 class subset (official code: 100 / 42).
        resize_to: imagefolder only, square side the images are resized to (default 32); named apart from the
            model's ``image_size`` (which must equal it) so that Lightning can merge both hparams.
    """

    def __init__(
        self,
        dataset: Literal["digits", "cifar10", "cifar100", "imagenet32", "imagefolder"] = "digits",
        data_dir: str | None = None,
        corruption: Literal["pixel_replacement", "gaussian_noise", "gaussian_blur"] = "pixel_replacement",
        corruption_level: float = 0.3,
        output: Literal["coupled", "classification"] = "coupled",
        val_fraction: float = 0.1,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        augment: bool = False,
        imagenet_num_classes: int = 100,
        imagenet_subset_seed: int = 42,
        resize_to: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataset not in DATASETS:
            raise UserInputError(f"dataset={dataset!r} is unknown: choose one of {', '.join(DATASETS)}.")
        if output not in ("coupled", "classification"):
            raise UserInputError(f"output={output!r} is unknown: choose 'coupled' or 'classification'.")
        _check_level(corruption, corruption_level)
        integers = (("batch_size", batch_size, 1), ("num_workers", num_workers, 0), ("seed", seed, 0),
                    ("imagenet_subset_seed", imagenet_subset_seed, 0))
        for name, value, low in integers + (("imagenet_num_classes", imagenet_num_classes, 2),):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserInputError(f"{name}={value!r} must be an integer.")
            check_range(name, value, low)
        check_range("imagenet_num_classes", imagenet_num_classes, 2, 1000)
        check_range("val_fraction", val_fraction, 0.0, 0.5, low_inclusive=False)
        self.dataset_name, self.corruption, self.corruption_level = dataset, corruption, float(corruption_level)
        self.output, self.val_fraction, self.augment = output, float(val_fraction), augment
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.data_dir: str | None = None
        if resize_to is not None and (isinstance(resize_to, bool) or not isinstance(resize_to, int)):
            raise UserInputError(f"resize_to={resize_to!r} must be an integer (pixels per side) or null.")
        native = 8 if dataset == "digits" else 32
        if dataset != "imagefolder" and resize_to is not None and resize_to != native:
            raise UserInputError(f"resize_to={resize_to} does not match dataset {dataset!r}, whose images are "
                                 f"{native}x{native}; resizing applies to imagefolder only. Remove resize_to.")
        if dataset == "digits":
            if data_dir is not None:
                raise UserInputError(f"dataset='digits' is embedded (scikit-learn) and reads no files, but "
                                     f"data_dir={data_dir!r} was given. Remove data_dir, or choose cifar10, "
                                     "cifar100, imagenet32 or imagefolder.")
            if augment:
                raise UserInputError("augment=True is not allowed for dataset='digits' (a flipped 2 is no 2, and an "
                                     "8x8 image has no room to crop). Set augment: false.")
            self.num_classes, self.in_channels, self.image_size = 10, 1, 8
        elif dataset in CIFAR_LAYOUT:
            self.data_dir = find_cifar_dir(dataset, data_dir)
            self.num_classes, self.in_channels, self.image_size = CIFAR_LAYOUT[dataset][4], 3, 32
        elif dataset == "imagefolder":
            size = 32 if resize_to is None else resize_to
            check_range("resize_to", size, 1)
            self.data_dir = require_data_dir(data_dir, "imagefolder", "a folder with train/<class>/*.png|jpg "
                                                                  "and test/<class>/... subfolders")
            self.class_names, self._files = scan_image_folder(self.data_dir)
            if len(self.class_names) < 2:
                raise UserInputError(f"imagefolder: '{self.data_dir}/train' has one class folder "
                                     f"({self.class_names[0]}); classification needs at least 2 classes.")
            self.num_classes, self.in_channels, self.image_size = len(self.class_names), 3, size
        else:
            _find_imagenet32_files(data_dir)  # fail at construction, not after a model was built
            self.data_dir = data_dir
            self.num_classes, self.in_channels, self.image_size = imagenet_num_classes, 3, 32
        self.mean: Tensor | None = None
        self.std: Tensor | None = None
        self._built = False

    def setup(self, stage: str | None = None) -> None:
        """Read the data, draw the validation split and compute the training statistics (once)."""
        if self._built:
            return
        if self.dataset_name == "digits":
            pool, test = load_digits_images()
        elif self.dataset_name in CIFAR_LAYOUT:
            pool, test = load_cifar(self.dataset_name, self.data_dir)
        elif self.dataset_name == "imagefolder":
            pool, test = (FileImages(paths, labels, self.image_size) for paths, labels in self._files)
        else:
            pool, test = load_imagenet32(self.data_dir, self.hparams.imagenet_num_classes,
                                         self.hparams.imagenet_subset_seed)
        train_idx, val_idx = stratified_split(pool.labels, self.val_fraction, mix_seed(self.seed, VAL_SPLIT_STREAM))
        if len(val_idx) == 0:
            raise UserInputError(f"{self.dataset_name}: no class of the training images has 2 or more images, so no "
                                 "validation image can be held out: give every class at least 2 training images.")
        stats_idx = train_idx
        if isinstance(pool, FileImages) and len(train_idx) > IMAGEFOLDER_STATS_MAX:  # as datamodules.images does
            gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM_STATS))
            stats_idx = train_idx[torch.randperm(len(train_idx), generator=gen)[:IMAGEFOLDER_STATS_MAX]].sort()[0]
        self.mean, self.std = pool.channel_stats(stats_idx)
        common = dict(corruption=self.corruption, level=self.corruption_level, mean=self.mean, std=self.std,
                      output=self.output)
        self.train_set = CorruptedImageDataset(pool, train_idx, fixed_stream=None, augment=self.augment, **common)
        self.val_set = CorruptedImageDataset(pool, val_idx, fixed_stream=1, **common)
        self.test_set = CorruptedImageDataset(test, torch.arange(len(test.labels)), fixed_stream=2, **common)
        self._built = True

    def normalize(self, pixels: Tensor) -> Tensor:
        """[0, 1] pixels (..., C, H, W) -> classifier inputs, with the training-split mean/std."""
        if self.mean is None:
            raise RuntimeError("normalize needs the training statistics: call setup() first.")
        return (pixels - self.mean.to(pixels).view(-1, 1, 1)) / self.std.to(pixels).view(-1, 1, 1)

    def _loader(self, dataset: Dataset, sampler=None) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, shuffle=False,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, training_sampler(len(self.train_set), self.seed, self.trainer))

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, evaluation_sampler(self.val_set, self.trainer))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, evaluation_sampler(self.test_set, self.trainer))

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()
