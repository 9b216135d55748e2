"""Readers shared by the image datamodules: the public file formats, their checks, and the stratified split.

Every reader reads a local folder the user provides (nothing is downloaded) and raises `UserInputError` naming
the file and what was expected when a file is missing or malformed.

* `load_digits_images`: scikit-learn's 8x8 digits (shipped inside the package) with a fixed stratified 80/20
  train/test split (seed ``DIGITS_TEST_SEED``), integer pixels 0..16.
* `find_cifar_dir` / `load_cifar` / `read_cifar_file`: the official CIFAR "python version" pickles
  (``cifar-10-batches-py/data_batch_1..5``, ``test_batch``; ``cifar-100-python/train``, ``test``), laid out in
  ``CIFAR_LAYOUT``; `cifar_class_names` reads the class names from the release's ``batches.meta`` / ``meta``.
* `load_release_pickle`: every pickle of a release (CIFAR, the ImageNet-32 pickle release) is read with a
  restricted unpickler that resolves only the globals such files contain (numpy's array reconstruction and
  ``_codecs.encode``), so a tampered file is refused with a message instead of running code.
* `check_rgb32_arrays`: the checks of a 32x32 RGB release stored as (N, 3072) uint8 rows (CIFAR, ImageNet-32).
* `scan_image_folder`: ``train/<class>/*.{png,jpg,jpeg}`` and ``test/<class>/...`` trees (`FileImages`).
* `stratified_split`: per-class held-out fraction; the image datamodules draw their validation split with the
  seed ``mix_seed(seed, VAL_SPLIT_STREAM)``, so the same ``seed`` and ``val_fraction`` give the same split in
  every one of them.

`TensorImages` (in-memory integer pixels) and `FileImages` (lazily decoded files) are the pixel sources the
readers return: ``pixels(i)`` gives a float C x H x W image in [0, 1], ``channel_stats(indices)`` the per-channel
mean and std over some examples.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import torch
from torch import Tensor

from lightning_modules.shared.errors import UserInputError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
DIGITS_TEST_SEED = 0            # the digits train/test split never changes with `seed`
DIGITS_TEST_FRACTION = 0.2
VAL_SPLIT_STREAM = 1            # seed stream of the validation split (`mix_seed(seed, VAL_SPLIT_STREAM)`)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# (folder name, training files, test files, label key, number of classes)
CIFAR_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", 10),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", 100),
}
# the release's class-name file and its key (a list of names, one per label)
CIFAR_META = {"cifar10": ("batches.meta", "label_names"), "cifar100": ("meta", "fine_label_names")}
# Every global a numpy-array pickle refers to, from Python 2's cPickle (the CIFAR release) to numpy 2 with pickle
# protocol 5; nothing else is resolved while loading a release pickle.
RELEASE_PICKLE_GLOBALS = frozenset({
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # bytes pickled by Python 3 with protocol 2
})


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
def load_digits_images() -> tuple[TensorImages, TensorImages]:
    """scikit-learn digits with a fixed stratified 80/20 train/test split (seed DIGITS_TEST_SEED)."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    pixels = torch.from_numpy(x.reshape(-1, 1, 8, 8)).to(torch.uint8)
    labels = torch.from_numpy(y).long()
    train_idx, test_idx = stratified_split(labels, DIGITS_TEST_FRACTION, DIGITS_TEST_SEED)
    return (TensorImages(pixels[train_idx], labels[train_idx], 16.0),
            TensorImages(pixels[test_idx], labels[test_idx], 16.0))


def find_cifar_dir(dataset: str, data_dir: str | None) -> str:
    """The folder holding the CIFAR files: `data_dir` itself or its `cifar-*` subfolder. Checks the files."""
    folder, train_files, test_files, _, _ = CIFAR_LAYOUT[dataset]
    expected = f"{folder}/{', '.join(train_files + test_files)}"
    data_dir = require_data_dir(data_dir, dataset, f"the official python-version pickles ({expected})")
    root = os.path.join(data_dir, folder) if os.path.isdir(os.path.join(data_dir, folder)) else data_dir
    missing = [name for name in train_files + test_files if not os.path.isfile(os.path.join(root, name))]
    if missing:
        raise UserInputError(f"{dataset}: '{root}' lacks {', '.join(missing)}. Expected {expected} (data_dir "
                             f"may be the '{folder}' folder itself or its parent). Download and extract the "
                             "official CIFAR python version there; nothing is downloaded at run time.")
    return root


def load_cifar(dataset: str, root: str) -> tuple[TensorImages, TensorImages]:
    _, train_files, test_files, label_key, num_classes = CIFAR_LAYOUT[dataset]
    parts = [[read_cifar_file(os.path.join(root, name), label_key, num_classes) for name in names]
             for names in (train_files, test_files)]
    return tuple(TensorImages(torch.cat([p for p, _ in files]), torch.cat([y for _, y in files]), 255.0)
                 for files in parts)


def cifar_class_names(dataset: str, root: str) -> list[str]:
    """Class names of label 0, 1, ... from the release's ``batches.meta`` (CIFAR-10, ``label_names``) or ``meta``
    (CIFAR-100, ``fine_label_names``). Without the file: CIFAR-10's published names, CIFAR-100's label numbers."""
    meta_name, key = CIFAR_META[dataset]
    num_classes = CIFAR_LAYOUT[dataset][4]
    path = os.path.join(root, meta_name)
    if not os.path.isfile(path):
        return list(CIFAR10_CLASSES) if dataset == "cifar10" else [str(c) for c in range(num_classes)]
    meta = load_release_pickle(path, "CIFAR meta file")
    names = meta.get(key.encode(), meta.get(key)) if isinstance(meta, dict) else None
    if not isinstance(names, (list, tuple)) or len(names) != num_classes or \
            not all(isinstance(n, (bytes, str)) for n in names):
        raise UserInputError(f"CIFAR meta file '{path}' must be a dict whose b'{key}' lists {num_classes} class "
                             "names (the official release's format); re-extract it, or remove the file to name "
                             "the classes by their numbers.")
    return [n.decode("latin1") if isinstance(n, bytes) else n for n in names]


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


class _ReleaseUnpickler(pickle.Unpickler):
    """Resolves only `RELEASE_PICKLE_GLOBALS`: dicts, lists, str/bytes, numbers and numpy arrays load; a pickle
    that refers to any other callable (``os.system``, ``builtins.eval``, ...) is refused before it is called."""

    def find_class(self, module: str, name: str):
        if (module, name) not in RELEASE_PICKLE_GLOBALS:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


class _RefusedGlobal(pickle.UnpicklingError):
    pass


def load_release_pickle(path: str, what: str, encoding: str = "bytes"):
    """Load one pickle of a public release (`what` names it in errors) with the restricted unpickler."""
    try:
        with open(path, "rb") as f:
            return _ReleaseUnpickler(f, encoding=encoding).load()
    except _RefusedGlobal as err:
        raise UserInputError(f"{what} '{path}' refers to {err}, which the official release never contains: "
                             "refused without loading it (it could run code). Replace it with the file from the "
                             "official archive.") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError,
            IndexError, KeyError, OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"{what} '{path}' is not a readable pickle ({type(err).__name__}: {err}). "
                             "It is truncated or of another format: re-extract the official archive."
                             ) from None


def read_cifar_file(path: str, label_key: str, num_classes: int) -> tuple[Tensor, Tensor]:
    """One CIFAR pickle -> (uint8 pixels N x 3 x 32 x 32, long labels N), validating keys, shapes and ranges.

    Read with the restricted unpickler of `load_release_pickle`: only numpy arrays, dicts, lists, strings and
    numbers load, anything else is refused without being executed.
    """
    batch = load_release_pickle(path, "CIFAR file")
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


def scan_image_folder(root: str, splits: tuple[str, ...] = ("train", "test")
                      ) -> tuple[list[str], list[tuple[list[str], Tensor]]]:
    """Class names (sorted train subfolders) and, for each of `splits` (train first), (file paths, labels)."""
    trees = {}
    for split in splits:
        split_dir = os.path.join(root, split)
        if not os.path.isdir(split_dir):
            expected = " and ".join(f"data_dir/{name}/<class>/*.png|jpg" for name in splits)
            raise UserInputError(f"imagefolder: '{split_dir}' is missing. Expected {expected}.")
        entries = sorted(e for e in os.listdir(split_dir) if not e.startswith("."))
        stray = [e for e in entries if not os.path.isdir(os.path.join(split_dir, e))]
        if stray:
            raise UserInputError(f"imagefolder: '{split_dir}' must hold only class subfolders, but has the "
                                 f"file(s) {', '.join(stray[:5])}. Move them out.")
        trees[split] = entries
    classes = trees["train"]
    if not classes:
        raise UserInputError(f"imagefolder: '{os.path.join(root, 'train')}' has no class subfolders.")
    if "test" in trees and trees["test"] != classes:
        missing = sorted(set(classes) - set(trees["test"]))
        extra = sorted(set(trees["test"]) - set(classes))
        raise UserInputError(f"imagefolder: the test classes do not match the train classes (missing in "
                             f"test/: {missing or 'none'}; only in test/: {extra or 'none'}). Both folders "
                             "need the same class subfolders.")
    files = []
    for split in splits:
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


def require_data_dir(data_dir: str | None, dataset: str, expected: str) -> str:
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
