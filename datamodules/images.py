"""Image classification data for the image papers: digits (embedded), CIFAR-10/100 and ImageFolder trees.

Datasets and the formats read
-----------------------------
* ``digits`` (default, needs no files): scikit-learn's ``load_digits``, 1797 grey 8x8 images of the
  digits 0-9 with integer pixels 0..16, shipped inside the scikit-learn package.
* ``cifar10``: the official "python version" pickles, ``cifar-10-batches-py/data_batch_1..5`` and
  ``test_batch``, each a dict with ``b'data'`` (N x 3072 uint8, channel-major 3x32x32) and ``b'labels'``.
* ``cifar100``: ``cifar-100-python/train`` and ``test`` with ``b'data'`` and ``b'fine_labels'`` (100 classes).
  For both CIFARs ``data_dir`` may be the ``cifar-*`` folder itself or the folder that contains it.
* ``imagefolder``: ``data_dir/train/<class_name>/*.{png,jpg,jpeg}`` and ``data_dir/test/<class_name>/...``.
  Classes are the sorted names of the ``train`` subfolders, and ``test`` must have exactly the same ones.
  Images are read lazily with PIL, converted to RGB and resized (not cropped) to ``resize_to`` squared.

Nothing is ever downloaded: CIFAR and ImageFolder data are read from a local ``data_dir`` that the user
provides, and every missing or malformed file raises `UserInputError` naming the file and what was expected.
The CIFAR files are Python pickles, which can execute code when loaded: they are only read from that
user-provided local folder, which is therefore trusted. Point it only at files from the official source.

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

import os
import pickle
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.sampling import evaluation_sampler, mix_seed, training_sampler
from lightning_modules.errors import UserInputError, check_range

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder")
SPLITS = ("train", "val", "test")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
DIGITS_TEST_SEED = 0            # the digits train/test split never changes with `seed`
DIGITS_TEST_FRACTION = 0.2
IMAGEFOLDER_STATS_MAX = 10_000  # most training images read to compute ImageFolder mean/std
AUGMENT_PAD = 4

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# (folder name, training files, test files, label key, number of classes)
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", 10),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", 100),
}
# seed streams, so that the validation split and the shuffle draw independent random numbers
_STREAM_VAL, _STREAM_STATS = 1, 3  # 2 is the training shuffle (datamodules.sampling)


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
            self.data_dir = _find_cifar_dir(dataset, data_dir)
            self.num_classes, self.in_channels, self.image_size = CIFAR_LAYOUT[dataset][4], 3, 32
            self.class_names = list(CIFAR10_CLASSES) if dataset == "cifar10" else [str(c) for c in range(100)]
        else:
            size = 32 if resize_to is None else resize_to
            if isinstance(size, bool) or not isinstance(size, int):
                raise UserInputError(f"resize_to={resize_to!r} must be an integer (pixels per side).")
            check_range("resize_to", size, 1)
            self.data_dir = _require_dir(data_dir, "imagefolder", "a folder with train/<class>/*.png|jpg "
                                                                  "and test/<class>/... subfolders")
            self.class_names, self._files = _scan_image_folder(self.data_dir)
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
            pool, test = _load_digits()
        elif self.dataset_name in CIFAR_LAYOUT:
            pool, test = _load_cifar(self.dataset_name, self.data_dir)
        else:
            pool, test = (FileImages(paths, labels, self.image_size) for paths, labels in self._files)
        val_seed = mix_seed(self.seed, _STREAM_VAL)
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


# ==================================================================================== pixel sources
class TensorImages:
    """Images held in memory as integer pixels (N, C, H, W) with values in [0, `scale`]."""

    def __init__(self, pixels: Tensor, labels: Tensor, scale: float) -> None:
        self.data, self.labels, self.scale = pixels, labels, scale

    def pixels(self, i: int) -> Tensor:
        return self.data[i].float() / self.scale

    def channel_stats(self, indices: Tensor, chunk: int = 4096) -> tuple[Tensor, Tensor]:
        """Per-channel mean and std of the [0, 1] pixels of `indices` (chunked, float64 accumulation)."""
        total = torch.zeros(self.data.shape[1], dtype=torch.float64)
        squares = torch.zeros_like(total)
        for start in range(0, len(indices), chunk):
            x = self.data[indices[start:start + chunk]].double() / self.scale
            total += x.sum(dim=(0, 2, 3))
            squares += x.square().sum(dim=(0, 2, 3))
        return _mean_std(total, squares, len(indices) * self.data.shape[2] * self.data.shape[3])


class FileImages:
    """Image files read lazily with PIL, converted to RGB and resized to `size` x `size`."""

    def __init__(self, paths: list[str], labels: Tensor, size: int) -> None:
        self.paths, self.labels, self.size = paths, labels, size

    def pixels(self, i: int) -> Tensor:
        from PIL import Image  # Pillow ships with matplotlib; only ImageFolder needs it
        path = self.paths[i]
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
                array = np.asarray(rgb, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise UserInputError(f"image '{path}' could not be read ({type(err).__name__}: {err}). "
                                 "Replace or remove the file (it is truncated or not a PNG/JPEG).") from None
        return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0

    def channel_stats(self, indices: Tensor) -> tuple[Tensor, Tensor]:
        total = torch.zeros(3, dtype=torch.float64)
        squares = torch.zeros_like(total)
        for i in indices.tolist():  # one decode per file is inherent to reading images from disk
            x = self.pixels(i).double()
            total += x.sum(dim=(1, 2))
            squares += x.square().sum(dim=(1, 2))
        return _mean_std(total, squares, len(indices) * self.size * self.size)


def _mean_std(total: Tensor, squares: Tensor, count: int) -> tuple[Tensor, Tensor]:
    mean = total / count
    var = (squares / count - mean.square()).clamp_min(0.0)
    # a constant channel has std 0: clamp so that normalising maps it to 0 instead of inf
    return mean.float(), var.sqrt().clamp_min(1e-6).float()


# ========================================================================================== readers
def _load_digits() -> tuple[TensorImages, TensorImages]:
    """scikit-learn digits with a fixed stratified 80/20 train/test split (seed DIGITS_TEST_SEED)."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    pixels = torch.from_numpy(x.reshape(-1, 1, 8, 8)).to(torch.uint8)
    labels = torch.from_numpy(y).long()
    train_idx, test_idx = stratified_split(labels, DIGITS_TEST_FRACTION, DIGITS_TEST_SEED)
    return (TensorImages(pixels[train_idx], labels[train_idx], 16.0),
            TensorImages(pixels[test_idx], labels[test_idx], 16.0))


def _find_cifar_dir(dataset: str, data_dir: str | None) -> str:
    """The folder holding the CIFAR files: `data_dir` itself or its `cifar-*` subfolder. Checks the files."""
    folder, train_files, test_files, _, _ = CIFAR_LAYOUT[dataset]
    expected = f"{folder}/{', '.join(train_files + test_files)}"
    data_dir = _require_dir(data_dir, dataset, f"the official python-version pickles ({expected})")
    root = os.path.join(data_dir, folder) if os.path.isdir(os.path.join(data_dir, folder)) else data_dir
    missing = [name for name in train_files + test_files if not os.path.isfile(os.path.join(root, name))]
    if missing:
        raise UserInputError(f"{dataset}: '{root}' lacks {', '.join(missing)}. Expected {expected} (data_dir "
                             f"may be the '{folder}' folder itself or its parent). Download and extract the "
                             "official CIFAR python version there; nothing is downloaded at run time.")
    return root


def _load_cifar(dataset: str, root: str) -> tuple[TensorImages, TensorImages]:
    _, train_files, test_files, label_key, num_classes = CIFAR_LAYOUT[dataset]
    parts = [[_read_cifar_file(os.path.join(root, name), label_key, num_classes) for name in names]
             for names in (train_files, test_files)]
    return tuple(TensorImages(torch.cat([p for p, _ in files]), torch.cat([y for _, y in files]), 255.0)
                 for files in parts)


def check_rgb32_arrays(source: str, data: np.ndarray, labels: np.ndarray, data_name: str, labels_name: str,
                       label_min: int, label_max: int) -> None:
    """Validate the (N, 3072) uint8 pixel rows and N integer labels of a 32x32 RGB release (CIFAR, ImageNet-32)."""
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserInputError(f"{source}: {data_name} has shape {data.shape}, expected (N, 3072) = "
                             "N images of 3x32x32 uint8 pixels (channel-major).")
    if not np.issubdtype(data.dtype, np.integer) or data.min(initial=0) < 0 or data.max(initial=0) > 255:
        raise UserInputError(f"{source}: {data_name} must hold integer pixels in [0, 255] (got dtype {data.dtype}).")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise UserInputError(f"{source}: {labels_name} must be {len(data)} integer labels (one per image), "
                             f"got shape {labels.shape} and dtype {labels.dtype}.")
    if len(labels) and (labels.min() < label_min or labels.max() > label_max):
        raise UserInputError(f"{source}: {labels_name} has labels outside [{label_min}, {label_max}] "
                             f"(min {labels.min()}, max {labels.max()}).")


def _read_cifar_file(path: str, label_key: str, num_classes: int) -> tuple[Tensor, Tensor]:
    """One CIFAR pickle -> (uint8 pixels N x 3 x 32 x 32, long labels N), validating keys, shapes and ranges.

    SECURITY: pickle can run code while loading. This only reads files from the user-provided local
    `data_dir`, which is trusted like any code the user runs; never point it at files of unknown origin.
    """
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
            IndexError, KeyError, OSError) as err:
        raise UserInputError(f"CIFAR file '{path}' is not a readable pickle ({type(err).__name__}: {err}). "
                             "It is truncated or of another format: re-extract the official archive."
                             ) from None
    if not isinstance(batch, dict):
        raise UserInputError(f"CIFAR file '{path}' holds a {type(batch).__name__}, expected a dict with keys "
                             f"b'data' and b'{label_key}'.")
    found = {}
    for key in ("data", label_key):
        value = batch.get(key.encode(), batch.get(key))
        if value is None:
            raise UserInputError(f"CIFAR file '{path}' has no key b'{key}' (keys present: "
                                 f"{sorted(map(repr, batch))}). Is it the right dataset (cifar10 uses "
                                 "b'labels', cifar100 b'fine_labels')?")
        found[key] = np.asarray(value)
    data, labels = found["data"], found[label_key]
    check_rgb32_arrays(f"CIFAR file '{path}'", data, labels, "b'data'", f"b'{label_key}'", 0, num_classes - 1)
    pixels = torch.from_numpy(data.astype(np.uint8).reshape(-1, 3, 32, 32))
    return pixels, torch.from_numpy(labels.astype(np.int64))


def _scan_image_folder(root: str) -> tuple[list[str], list[tuple[list[str], Tensor]]]:
    """Class names (sorted train subfolders) and, for train and test, (file paths, labels)."""
    trees = {}
    for split in ("train", "test"):
        split_dir = os.path.join(root, split)
        if not os.path.isdir(split_dir):
            raise UserInputError(f"imagefolder: '{split_dir}' is missing. Expected "
                                 "data_dir/train/<class>/*.png|jpg and data_dir/test/<class>/*.png|jpg.")
        entries = sorted(e for e in os.listdir(split_dir) if not e.startswith("."))
        stray = [e for e in entries if not os.path.isdir(os.path.join(split_dir, e))]
        if stray:
            raise UserInputError(f"imagefolder: '{split_dir}' must hold only class subfolders, but has the "
                                 f"file(s) {', '.join(stray[:5])}. Move them out.")
        trees[split] = entries
    classes = trees["train"]
    if not classes:
        raise UserInputError(f"imagefolder: '{os.path.join(root, 'train')}' has no class subfolders.")
    if trees["test"] != classes:
        missing = sorted(set(classes) - set(trees["test"]))
        extra = sorted(set(trees["test"]) - set(classes))
        raise UserInputError(f"imagefolder: the test classes do not match the train classes (missing in "
                             f"test/: {missing or 'none'}; only in test/: {extra or 'none'}). Both folders "
                             "need the same class subfolders.")
    files = []
    for split in ("train", "test"):
        paths, labels = [], []
        for label, name in enumerate(classes):
            class_dir = os.path.join(root, split, name)
            names = sorted(n for n in os.listdir(class_dir) if not n.startswith("."))
            bad = [n for n in names if os.path.splitext(n)[1].lower() not in IMAGE_EXTENSIONS]
            if bad:
                raise UserInputError(f"imagefolder: '{os.path.join(class_dir, bad[0])}' is not a "
                                     f".png/.jpg/.jpeg image ({len(bad)} such file(s) in this folder). "
                                     "Convert or remove them.")
            if not names:
                raise UserInputError(f"imagefolder: class folder '{class_dir}' has no images.")
            paths += [os.path.join(class_dir, n) for n in names]
            labels += [label] * len(names)
        files.append((paths, torch.tensor(labels, dtype=torch.long)))
    return classes, files


def _require_dir(data_dir: str | None, dataset: str, expected: str) -> str:
    if data_dir is None:
        raise UserInputError(f"dataset={dataset!r} needs data_dir: a local folder with {expected}. "
                             "Nothing is downloaded at run time.")
    path = os.path.expanduser(str(data_dir))
    if not os.path.isdir(path):
        raise UserInputError(f"data_dir '{data_dir}' does not exist or is not a folder; dataset={dataset!r} "
                             f"expects {expected} there.")
    return path


# ================================================================================= splits and seeds
def stratified_split(labels: Tensor, fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Split indices into (kept, held out), holding out `fraction` of every class (vectorised).

    Per class with n_c >= 2 examples, round(fraction * n_c) are held out, clamped to [1, n_c - 1]; a class
    with one example stays in the kept part. Both index sets are returned sorted.
    """
    n = len(labels)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)
    order = perm[torch.argsort(labels[perm], stable=True)]   # grouped by class, random within a class
    sorted_labels = labels[order]
    counts = torch.bincount(labels, minlength=int(labels.max()) + 1 if n else 0)
    held_per_class = torch.floor(fraction * counts.double() + 0.5).long()
    held_per_class = torch.where(counts >= 2, held_per_class.clamp(1).minimum(counts - 1),
                                 torch.zeros_like(counts))
    class_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - class_start[sorted_labels]       # position within its class
    held = rank < held_per_class[sorted_labels]
    return order[~held].sort()[0], order[held].sort()[0]
