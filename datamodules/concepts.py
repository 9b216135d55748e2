"""Concept bottleneck data (CEM, evi-CEM, EC-CEM): batches ``(x, y, c)`` = inputs, task label, binary concepts.

Datasets
--------
* ``xor`` / ``trig`` / ``dot`` (embedded): the generators of the CEM repository (``cem/data/synthetic_loaders.py``):
  XOR ``x ~ U(0, 1)^2``, ``c = [x_1 > .5, x_2 > .5]``, ``y = c_1 xor c_2``; Trig ``(a, b, z) ~ N(0, 2^2)``,
  ``x = [sin a + a, cos a + a, sin b + b, cos b + b, sin z + z, cos z + z, a^2 + b^2 + z^2]``,
  ``c = [a > 0, b > 0, z > 0]``, ``y = a + b + z > 1``; Dot ``v1, v3 ~ 2 N(0, I_2)``, ``v2 = (1, 1)``,
  ``v4 = (-1, -1)``, ``x = [v1 + v3, v1 - v3]``, ``c = [v1.v2 > 0, v3.v4 > 0]``, ``y = v1.v3 > 0``.
  ``dataset_size`` examples (3000 in the code), split 70 / 10 / 20 % into train / val / test as the code does.
* ``correlated`` (embedded; the EC-CEM experiment's generator): ``pairs`` pairs of latent Gaussians with
  correlation ``rho`` (pair p = concepts 2p and 2p + 1; independent across pairs), ``c_i = 1[z_i > 0]``,
  ``x = tanh(W z) + noise * eps`` with a fixed random ``W`` (``feature_dim`` x 2 ``pairs``, N(0, 1) entries, drawn
  from the seed) and ``y = c_0 xor c_2``. Conditionally on ``x`` the concepts stay correlated when ``noise`` hides
  part of z: that is what a concept copula can exploit at intervention time.
* ``cub``: CUB-200-2011 with the concept split of Koh et al. (Concept Bottleneck Models): the split pickles
  ``{train,val,test}.pkl`` (lists of dicts with ``id``, ``img_path``, ``class_label``, ``attribute_label`` = 112
  binary attributes, ``attribute_certainty``, ``uncertain_attribute_label``) in either released layout,
  ``data_dir/class_attr_data_10/`` (the CEM repository's, ``cem/data/CUB200/cub_loader.py``) or
  ``data_dir/CUB_processed/class_attr_data_10/`` (Koh et al.'s, github.com/yewsiang/ConceptBottleneck), with the
  images in ``data_dir/CUB_200_2011/images/<class>/<file>.jpg``. The pickles' ``img_path`` is an absolute path on
  the authors' machine; as the official ``CUBDataset.__getitem__`` keeps its part from ``CUB_200_2011`` on, it is
  read from its part after ``images/``. 200 tasks, 112 concepts in 28 attribute groups (the CEM code's
  ``SELECTED_CONCEPTS`` of the 312 CUB attributes, grouped by the name before ``::``).
* ``celeba``: torchvision's folder layout ``data_dir/celeba/{list_attr_celeba.txt, img_align_celeba/*.jpg}``
  (``data_dir`` may be the ``celeba`` folder itself). The CEM paper's construction: the ``celeba_concepts`` most
  balanced attributes are the concepts, the next ``celeba_hidden`` are hidden, the task is the integer whose bits
  are the selected + hidden attributes (re-indexed to the values present), the data is subsampled by
  ``celeba_subsample`` (seeded) and split 70 / 10 / 20 %.

Images are resized (shorter side) and centre-cropped to ``image_size``, scaled to [0, 1] and normalised with mean
0.5 and std 2 (the CEM code's CUB transform); training images are flipped at random when ``augment``. Nothing is
downloaded; every missing or malformed file is one `UserInputError` naming it.
"""
from __future__ import annotations

import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from datamodules.readers import load_release_pickle, require_data_dir
from datamodules.sampling import evaluation_sampler, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

DATASETS = ("xor", "trig", "dot", "correlated", "cub", "celeba")
SYNTHETIC_INPUT_DIM = {"xor": 2, "trig": 7, "dot": 4}
SPLIT_FRACTIONS = (0.7, 0.1)   # train, val; the rest (20 %) is test, as in the CEM code

# CUB: the 112 attributes of Koh et al. as indices into the 312 CUB attributes (the CEM code's SELECTED_CONCEPTS)
CUB_SELECTED = [1, 4, 6, 7, 10, 14, 15, 20, 21, 23, 25, 29, 30, 35, 36, 38, 40, 44, 45, 50, 51, 53, 54, 56, 57, 59,
                63, 64, 69, 70, 72, 75, 80, 84, 90, 91, 93, 99, 101, 106, 110, 111, 116, 117, 119, 125, 126, 131,
                132, 134, 145, 149, 151, 152, 153, 157, 158, 163, 164, 168, 172, 178, 179, 181, 183, 187, 188, 193,
                194, 196, 198, 202, 203, 208, 209, 211, 212, 213, 218, 220, 221, 225, 235, 236, 238, 239, 240, 242,
                243, 244, 249, 253, 254, 259, 260, 262, 268, 274, 277, 283, 289, 292, 293, 294, 298, 299, 304, 305,
                308, 309, 310, 311]
# the 312 CUB attributes are consecutive runs of one group each (attributes.txt): (group, number of attributes)
CUB_GROUP_SIZES = [("bill_shape", 9), ("wing_color", 15), ("upperparts_color", 15), ("underparts_color", 15),
                   ("breast_pattern", 4), ("back_color", 15), ("tail_shape", 6), ("upper_tail_color", 15),
                   ("head_pattern", 11), ("breast_color", 15), ("throat_color", 15), ("eye_color", 14),
                   ("bill_length", 3), ("forehead_color", 15), ("under_tail_color", 15), ("nape_color", 15),
                   ("belly_color", 15), ("wing_shape", 5), ("size", 5), ("shape", 14), ("back_pattern", 4),
                   ("tail_pattern", 4), ("belly_pattern", 4), ("primary_color", 15), ("leg_color", 15),
                   ("bill_color", 15), ("crown_color", 15), ("wing_pattern", 4)]


def cub_concept_groups() -> tuple[list[str], list[list[int]]]:
    """Group names and, per group, the indices (0..111) of its selected attributes: 28 groups."""
    owner = np.repeat(np.arange(len(CUB_GROUP_SIZES)), [n for _, n in CUB_GROUP_SIZES])
    selected_owner = owner[CUB_SELECTED]
    present = sorted(set(selected_owner.tolist()))
    return ([CUB_GROUP_SIZES[g][0] for g in present],
            [np.flatnonzero(selected_owner == g).tolist() for g in present])


# ============================================================================================ generators
def synthetic_data(name: str, size: int, gen: torch.Generator, pairs: int = 3, rho: float = 0.8,
                   noise: float = 1.0, input_dim: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, c, y)`` of a synthetic dataset (module docstring), drawn from ``gen``."""
    if name == "xor":
        x = torch.rand(size, 2, generator=gen)
        c = x > 0.5
        y = c[:, 0] ^ c[:, 1]
    elif name == "trig":
        h = 2 * torch.randn(size, 3, generator=gen)
        a, b, z = h.T
        x = torch.stack([a.sin() + a, a.cos() + a, b.sin() + b, b.cos() + b, z.sin() + z, z.cos() + z,
                         a ** 2 + b ** 2 + z ** 2], 1)
        c = h > 0
        y = h.sum(1) > 1
    elif name == "dot":
        v1, v3 = 2 * torch.randn(size, 2, generator=gen), 2 * torch.randn(size, 2, generator=gen)
        x = torch.cat([v1 + v3, v1 - v3], 1)
        c = torch.stack([v1.sum(1) > 0, -v3.sum(1) > 0], 1)   # v1.(1, 1), v3.(-1, -1)
        y = (v1 * v3).sum(1) > 0
    elif name == "correlated":
        k = 2 * pairs
        mixing = torch.randn(input_dim, k, generator=gen)
        cov = torch.eye(k)
        idx = torch.arange(pairs)
        cov[2 * idx, 2 * idx + 1] = cov[2 * idx + 1, 2 * idx] = rho
        z = torch.randn(size, k, generator=gen) @ torch.linalg.cholesky(cov).T
        x = torch.tanh(z @ mixing.T) + noise * torch.randn(size, input_dim, generator=gen)
        c = z > 0
        y = c[:, 0] ^ c[:, 2]
    else:
        raise UserInputError(f"no synthetic dataset {name!r}: choose xor, trig, dot or correlated.")
    return x.float(), c.float(), y.long()


# ============================================================================================ file datasets
CUB_LAYOUTS = (("class_attr_data_10",), ("CUB_processed", "class_attr_data_10"))   # the CEM repository's, Koh et al.'s


def cub_split_dir(root: str) -> str:
    """The folder of the ``{train,val,test}.pkl`` split pickles under ``root``, in either released layout.

    The CEM repository (``cem/data/CUB200/cub_loader.py::generate_data``) reads ``<root>/class_attr_data_10``;
    Koh et al.'s (github.com/yewsiang/ConceptBottleneck, ``CUB/README.md``: ``-data_dir
    CUB_processed/class_attr_data_10``) keeps the pickles in ``<root>/CUB_processed/class_attr_data_10``. Both put
    the images in ``<root>/CUB_200_2011/images``.
    """
    found = [os.path.join(root, *parts) for parts in CUB_LAYOUTS
             if os.path.isfile(os.path.join(root, *parts, "train.pkl"))]
    if not found:
        raise UserInputError(f"cub: data_dir '{root}' holds neither class_attr_data_10/train.pkl (the CEM "
                             "repository's layout) nor CUB_processed/class_attr_data_10/train.pkl (Koh et al.'s "
                             "layout); extract Koh et al.'s CUB_processed (with train/val/test.pkl) and CUB_200_2011 "
                             "(with its images/ folder) into data_dir.")
    if len(found) > 1:
        raise UserInputError(f"cub: data_dir '{root}' holds both class_attr_data_10/ and "
                             "CUB_processed/class_attr_data_10/; keep one of the two copies of the split pickles.")
    return found[0]


def cub_image_path(images: str, img_path: str) -> str | None:
    """The local file of a pickle's ``img_path``: its part after the last ``images`` folder, under ``images``.

    The pickles store absolute paths from the authors' machine (``/juice/.../CUB_200_2011/images/<class>/<file>``);
    the official ``CUBDataset.__getitem__`` (``CUB/dataset.py`` of Koh et al., ``cub_loader.py`` of the CEM code)
    keeps the part from ``CUB_200_2011`` on, which is the same file. None when the path has no ``images`` folder.
    """
    parts = str(img_path).replace("\\", "/").split("/")
    if "images" not in parts:
        return None
    rest = parts[len(parts) - parts[::-1].index("images"):]
    if not rest or any(p in ("", ".", "..") for p in rest):
        return None
    return os.path.join(images, *rest)


def read_cub_split(root: str, split: str) -> tuple[list[str], Tensor, Tensor]:
    """Image paths, class labels [N] and 112 attributes [N, 112] of one Koh et al. split pickle (either layout)."""
    path = os.path.join(cub_split_dir(root), f"{split}.pkl")
    if not os.path.isfile(path):
        raise UserInputError(f"cub: '{path}' is missing; the split folder must hold train.pkl, val.pkl and test.pkl "
                             "(Koh et al.'s CUB concept split).")
    records = load_release_pickle(path, "CUB split file", encoding="latin1")
    keys = ("img_path", "class_label", "attribute_label")
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and all(k in r for k in keys)
                                                               for r in records):
        raise UserInputError(f"cub: '{path}' must be a non-empty list of dicts with keys {', '.join(keys)} "
                             "(the layout of Koh et al.'s class_attr_data_10 pickles).")
    try:
        attrs = np.asarray([r["attribute_label"] for r in records], dtype=float)
    except (TypeError, ValueError):
        attrs = np.zeros((0,))
    if attrs.ndim != 2 or attrs.shape[1] != len(CUB_SELECTED) or not np.isin(attrs, (0, 1)).all():
        raise UserInputError(f"cub: '{path}': attribute_label must be {len(CUB_SELECTED)} binary values per "
                             f"record (got shape {attrs.shape}): class_attr_data_10 holds the 112 selected "
                             "attributes; the raw 312-attribute pickles of Koh et al.'s data_processing.py are not "
                             "the concept split.")
    labels = np.asarray([r["class_label"] for r in records])
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= 200:
        raise UserInputError(f"cub: '{path}': class_label must be an integer in [0, 199].")
    images = os.path.join(root, "CUB_200_2011", "images")
    paths = [cub_image_path(images, r["img_path"]) for r in records]
    bad = next((i for i, p in enumerate(paths) if p is None), None)
    if bad is not None:
        raise UserInputError(f"cub: '{path}', record {bad}: img_path {str(records[bad]['img_path'])!r} has no "
                             "'images/<class>/<file>' part to find the image under CUB_200_2011/images.")
    missing = [(i, p) for i, p in enumerate(paths) if not os.path.isfile(p)]
    if missing:
        i, p = missing[0]
        raise UserInputError(f"cub: {len(missing)} image(s) of '{path}' are missing, e.g. record {i} "
                             f"(img_path {str(records[i]['img_path'])!r}) read as '{p}'. Extract CUB_200_2011 "
                             "(with its images/ folder) into data_dir, next to the split pickles' folder.")
    return paths, torch.from_numpy(labels.astype(np.int64)), torch.from_numpy(attrs).float()


def read_celeba(root: str) -> tuple[list[str], Tensor, list[str]]:
    """Image paths, the 40 attributes as {0, 1} [N, 40] and the attribute names (torchvision's layout)."""
    folder = os.path.join(root, "celeba") if os.path.isdir(os.path.join(root, "celeba")) else root
    attr_file = os.path.join(folder, "list_attr_celeba.txt")
    if not os.path.isfile(attr_file):
        raise UserInputError(f"celeba: '{attr_file}' is missing. Expected torchvision's layout: "
                             "celeba/list_attr_celeba.txt and celeba/img_align_celeba/*.jpg.")
    with open(attr_file) as f:
        lines = [line.split() for line in f if line.strip()]
    names = lines[1] if len(lines) > 1 else []
    rows = lines[2:]
    bad = next((n + 3 for n, row in enumerate(rows) if len(row) != len(names) + 1
                or any(v not in ("1", "-1") for v in row[1:])), None)
    if not names or not rows or bad is not None:
        raise UserInputError(f"celeba: '{attr_file}' line {bad or 2}: expected a count line, a line of attribute "
                             "names, then '<file> ±1 ...' with one value per attribute.")
    attrs = (torch.tensor([[int(v) for v in row[1:]] for row in rows]) > 0).float()
    paths = [os.path.join(folder, "img_align_celeba", row[0]) for row in rows]
    return paths, attrs, names


class ConceptImages(Dataset):
    """(image, y, c) from files, read lazily with PIL: resize + centre crop to ``size``, normalised (x - .5) / 2."""

    def __init__(self, paths: list[str], labels: Tensor, concepts: Tensor, size: int, augment: bool) -> None:
        self.paths, self.labels, self.concepts, self.size, self.augment = paths, labels, concepts, size, augment

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        from PIL import Image
        try:
            with Image.open(self.paths[i]) as img:
                img = img.convert("RGB")
                scale = self.size / min(img.size)
                img = img.resize((max(self.size, round(img.width * scale)), max(self.size, round(img.height * scale))),
                                 Image.BILINEAR)
                left, top = (img.width - self.size) // 2, (img.height - self.size) // 2
                array = np.asarray(img.crop((left, top, left + self.size, top + self.size)), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as err:
            raise UserInputError(f"image '{self.paths[i]}' could not be read ({type(err).__name__}: {err}). "
                                 "Replace the file (it is truncated or not an image).") from None
        x = torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255.0
        if self.augment and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x - 0.5) / 2.0, self.labels[i], self.concepts[i]


# ============================================================================================ datamodule
class ConceptDataModule(LightningDataModule):
    """Concept data (see the module docstring).

    Args:
        dataset: xor, trig, dot, correlated (embedded) or cub, celeba (local ``data_dir``).
        data_dir: the dataset folder (cub, celeba only).
        dataset_size: examples of a synthetic dataset.
        pairs / rho / noise / feature_dim: the correlated generator (pairs of concepts with latent correlation rho).
        image_size / augment: image datasets (side after resize + centre crop; random flips of training images).
        celeba_concepts / celeba_hidden / celeba_subsample: the CEM paper's CelebA task construction.
        batch_size / num_workers / seed: loaders; ``seed`` also draws the synthetic data and the splits.
    """

    def __init__(self, dataset: Literal["xor", "trig", "dot", "correlated", "cub", "celeba"] = "xor",
                 data_dir: str | None = None, dataset_size: int = 3000, pairs: int = 3, rho: float = 0.8,
                 noise: float = 1.0, feature_dim: int = 16, image_size: int = 64, augment: bool = False,
                 celeba_concepts: int = 6, celeba_hidden: int = 2, celeba_subsample: int = 12,
                 batch_size: int = 256, num_workers: int = 0, seed: int = 42) -> None:
        super().__init__()
        self.save_hyperparameters()
        if dataset not in DATASETS:
            raise UserInputError(f"dataset={dataset!r} is unknown: choose one of {', '.join(DATASETS)}.")
        for name, value, low in (("dataset_size", dataset_size, 10), ("pairs", pairs, 1),
                                 ("feature_dim", feature_dim, 1),
                                 ("image_size", image_size, 8), ("celeba_concepts", celeba_concepts, 1),
                                 ("celeba_hidden", celeba_hidden, 0), ("celeba_subsample", celeba_subsample, 1),
                                 ("batch_size", batch_size, 1), ("num_workers", num_workers, 0), ("seed", seed, 0)):
            check_range(name, value, low)
        check_range("rho", rho, -0.99, 0.99)
        check_range("noise", noise, 0.0)
        self.dataset, self.batch_size, self.num_workers, self.seed = dataset, batch_size, num_workers, seed
        self.concept_imbalance: Tensor | None = None
        self.in_channels = 3
        if dataset in ("cub", "celeba"):
            expected = ("class_attr_data_10/{train,val,test}.pkl (or CUB_processed/class_attr_data_10/) and "
                        "CUB_200_2011/images/" if dataset == "cub" else
                        "celeba/list_attr_celeba.txt and celeba/img_align_celeba/")
            self.data_dir = require_data_dir(data_dir, dataset, expected)
            self.input_dim = None
        elif data_dir is not None:
            raise UserInputError(f"dataset={dataset!r} is generated and reads no files; remove data_dir={data_dir!r}.")
        if dataset == "cub":
            self.num_concepts, self.num_tasks = len(CUB_SELECTED), 200
            self.group_names, self.concept_groups = cub_concept_groups()
            cub_split_dir(self.data_dir)   # raises the missing-pickle error now
        elif dataset == "celeba":
            self.num_concepts, self.num_tasks = celeba_concepts, None   # tasks: the values present (setup)
            self.concept_groups = [[i] for i in range(celeba_concepts)]
        else:
            self.num_concepts = 2 * pairs if dataset == "correlated" else (3 if dataset == "trig" else 2)
            self.num_tasks = 2
            self.input_dim = feature_dim if dataset == "correlated" else SYNTHETIC_INPUT_DIM[dataset]
            self.concept_groups = [[i] for i in range(self.num_concepts)]
        self._built = False

    def setup(self, stage: str | None = None) -> None:
        if self._built:
            return
        hp = self.hparams
        if self.dataset == "cub":
            splits = [read_cub_split(self.data_dir, s) for s in ("train", "val", "test")]
            self.train_set, self.val_set, self.test_set = (ConceptImages(p, y, c, hp.image_size, hp.augment and i == 0)
                                                           for i, (p, y, c) in enumerate(splits))
            train_concepts = splits[0][2]
        else:
            gen = torch.Generator().manual_seed(self.seed)
            if self.dataset == "celeba":
                paths, y, c = self._celeba(gen)
            else:
                x, c, y = synthetic_data(self.dataset, hp.dataset_size, gen, hp.pairs, hp.rho, hp.noise, hp.feature_dim)
            order = torch.randperm(len(c), generator=gen)
            n_train, n_val = (int(f * len(c)) for f in SPLIT_FRACTIONS)
            parts = (order[:n_train], order[n_train:n_train + n_val], order[n_train + n_val:])
            if self.dataset == "celeba":
                self.train_set, self.val_set, self.test_set = (
                    ConceptImages([paths[j] for j in idx.tolist()], y[idx], c[idx], hp.image_size,
                                  augment=hp.augment and i == 0) for i, idx in enumerate(parts))
            else:
                self.train_set, self.val_set, self.test_set = (TensorDataset(x[idx], y[idx], c[idx]) for idx in parts)
            train_concepts = c[parts[0]]
        positives = train_concepts.sum(0).clamp_min(1.0)
        self.concept_imbalance = len(train_concepts) / positives - 1   # the code's n / n_pos - 1 = n_neg / n_pos
        self._built = True

    def _celeba(self, gen: torch.Generator) -> tuple[list[str], Tensor, Tensor]:
        hp = self.hparams
        paths, attrs, names = read_celeba(self.data_dir)
        if hp.celeba_concepts + hp.celeba_hidden > attrs.shape[1]:
            raise UserInputError(f"celeba_concepts + celeba_hidden = {hp.celeba_concepts + hp.celeba_hidden} exceeds "
                                 f"the {attrs.shape[1]} attributes of list_attr_celeba.txt.")
        balance = (attrs.mean(0) - 0.5).abs()
        ranked = torch.argsort(balance, stable=True)
        concepts = ranked[:hp.celeba_concepts].sort().values
        hidden = ranked[hp.celeba_concepts:hp.celeba_concepts + hp.celeba_hidden].sort().values
        bits = attrs[:, torch.cat([concepts, hidden])].long()
        code = (bits * 2 ** torch.arange(bits.shape[1] - 1, -1, -1)).sum(1)     # first attribute = highest bit
        values, y = torch.unique(code, return_inverse=True)
        keep = torch.randperm(len(paths), generator=gen)[:len(paths) // hp.celeba_subsample].sort().values
        self.num_tasks = len(values)
        self.concept_names = [names[i] for i in concepts.tolist()]
        return [paths[i] for i in keep.tolist()], y[keep], attrs[keep][:, concepts]

    # ------------------------------------------------------------------------------------------ loaders
    def _loader(self, dataset, sampler=None) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, training_sampler(len(self.train_set), self.seed, self.trainer))

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, evaluation_sampler(self.val_set, self.trainer))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, evaluation_sampler(self.test_set, self.trainer))

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()
