"""Coupled diffusion's paper configs on the releases they read: downsampled ImageNet 32x32 (the npz release, 100-class
subset of the official code) for the frozen ResNet-50 classifier and the Parallel coupled model, and CIFAR-10's python
release for the CIFAR-10 classifier and coupled model. The coupled configs start from their classifier's checkpoint.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from datamodules.corrupted_images import (IMAGENET32_FOLDERS, IMAGENET32_TRAIN, IMAGENET32_VAL,
                                          imagenet32_subset_classes)
from experiments.paper_steps import Case
from experiments.paper_steps._release import cifar10_python

IMAGENET32_FORMAT = ("Imagenet32_train_npz/train_data_batch_1..10.npz (data N x 3072 uint8 channel-major, labels "
                     "1..1000, mean 3072 float64) + Imagenet32_val_npz/val_data.npz (data, labels)")
CIFAR10_FORMAT = "cifar-10-batches-py: data_batch_1..5, test_batch, batches.meta (python pickles, byte keys)"


def imagenet32_npz(root: Path, per_class: int = 3, val_rows: int = 128, other_rows: int = 2, seed: int = 0) -> Path:
    """Downsampled ImageNet 32x32 as its npz release lays it out (Chrabaszcz et al. 2017, image-net.org):
    ``Imagenet32_train_npz/train_data_batch_{1..10}.npz`` with ``data`` (N x 3072 uint8, the R, G, B planes of a
    32x32 image one after the other), ``labels`` (1-based ImageNet classes 1..1000) and ``mean`` (the 3072 float64
    mean image of the training set), and ``Imagenet32_val_npz/val_data.npz`` with ``data`` and ``labels``.

    ``per_class`` training images of every class of the 100-class subset (``random.Random(42).sample``, as the
    official coupled-diffusion code draws it) are spread over the ten files, plus ``other_rows`` per file of classes
    outside the subset (the reader filters them out, as it must on the full release)."""
    rng = np.random.default_rng(seed)
    keep = np.asarray(imagenet32_subset_classes(100, 42))
    others = np.setdiff1d(np.arange(1000), keep)
    train_dir, val_dir = (Path(root) / name for name in IMAGENET32_FOLDERS)
    train_dir.mkdir(parents=True, exist_ok=True)
    val_dir.mkdir(parents=True, exist_ok=True)
    subset_labels = np.repeat(keep, per_class) + 1                           # 1-based, as released
    chunks = np.array_split(rng.permutation(subset_labels), len(IMAGENET32_TRAIN))
    files = []
    for name, chunk in zip(IMAGENET32_TRAIN, chunks):
        labels = np.concatenate([chunk, rng.choice(others, other_rows, replace=False) + 1]).astype(np.int64)
        files.append((name, rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8), labels))
    mean = np.concatenate([data for _, data, _ in files]).astype(np.float64).mean(0)
    for name, data, labels in files:
        np.savez(train_dir / name, data=data, labels=labels, mean=mean)
    val_labels = np.concatenate([np.resize(keep, val_rows), rng.choice(others, other_rows, replace=False)]) + 1
    np.savez(val_dir / IMAGENET32_VAL, data=rng.integers(0, 256, (len(val_labels), 3072), dtype=np.uint8),
             labels=val_labels.astype(np.int64))
    return Path(root)


def imagenet32(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={imagenet32_npz(folder / 'data' / 'imagenet32')}",
            "--data.init_args.num_workers=0"]


def cifar10(folder: Path) -> list[str]:
    # 64 x 5 training images (288 after the 10% validation split) and 128 test images: one batch of 128 each
    return [f"--data.init_args.data_dir={cifar10_python(folder / 'data', test=128)}", "--data.init_args.num_workers=0"]


SMALL_BATCH = ("--data.init_args.batch_size=8",)
# the coupled model: three networks around a frozen ResNet-50, five coupling iterations per optimizer step
COUPLED_ARGS = ("--data.init_args.batch_size=32", "--model.init_args.sampling_steps=30")
COUPLED_NOTE = ("batch 32 instead of 128 (a step of the five coupling iterations takes ~36 s and 3.3 GB of "
                "activations at 32 on one core, so ~2.5 min and ~13 GB at 128); predict samples with 30 DDIM steps "
                "instead of 150 (the same chain, coarser; 150 steps at batch 32 take ~5 min on one core)")
COUPLED_TEST = ("--data.init_args.batch_size=2", "--model.init_args.sampling_steps=5")
CASES = {
    "configs/coupled_diffusion/classifier_paper.yaml": Case(imagenet32, release_format=IMAGENET32_FORMAT,
                                                            test_args=SMALL_BATCH),
    "configs/coupled_diffusion/classifier_cifar10_paper.yaml": Case(cifar10, release_format=CIFAR10_FORMAT,
                                                                    test_args=SMALL_BATCH),
    "configs/coupled_diffusion/paper.yaml": Case(
        imagenet32, args=COUPLED_ARGS, note=COUPLED_NOTE, test_args=COUPLED_TEST, release_format=IMAGENET32_FORMAT,
        after=("configs/coupled_diffusion/classifier_paper.yaml",)),
    "configs/coupled_diffusion/cifar10_paper.yaml": Case(
        cifar10, args=COUPLED_ARGS, note=COUPLED_NOTE, test_args=COUPLED_TEST, release_format=CIFAR10_FORMAT,
        after=("configs/coupled_diffusion/classifier_cifar10_paper.yaml",)),
}
