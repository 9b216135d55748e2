"""Slide-level bulk RNA-seq prediction data: per-slide cluster features -> genome-wide expression (RNA-FM family).

One example is one whole-slide image (WSI): its ``cluster_features`` [C, D] (k-means cluster means of patch
features, C = 100 in SEQUOIA / RNA-FM) and its expression vector [G]. Targets are handed to models
**standardised** with per-gene mean/std computed on the **training split only**; `gene_mean`/`gene_std` map
model outputs back to log space. Splits are train / validation / test (the validation split is what model
selection sees; the official RNA-FM code validates on its test fold, which this module never does).

Sources
-------
``source="synthetic"`` (default, no files): a seeded generator with the structure RNA-FM exploits (a
reconstruction for CPU tests, not the paper's data):

* a latent slide state z ~ N(0, I_latent) and a hidden binary subtype s ~ Bernoulli(0.5);
* C cluster features in R^D per slide: every cluster has a random tissue type k, feature = A_k z + mu_k +
  N(0, feature_noise^2); on a random ``subtype_cluster_fraction`` of the clusters the subtype adds
  ``subtype_signal * (2 s - 1) * o`` (unit direction o), so the image shows the subtype only weakly; the
  cluster order is shuffled per slide (k-means labels are arbitrary);
* genes in P overlapping pathways (every pathway gene has a primary pathway, and a second one with probability
  ``second_pathway_prob``) plus ``num_background_genes`` genes in no pathway;
* log-expression = mu_g + sum_{p containing g} B_gp . tanh(W_p z + b_p) + s * delta_g + N(0, noise_std^2), with
  delta_g = +-U(1.5, 2.5) on a random ``bimodal_fraction`` of the genes (bimodal given the image) and 0
  elsewhere; background genes follow one weak shared program.
  `bimodal_genes` (bool [G]) marks the genes with delta_g != 0 for group-wise metrics.

``source="files"``: the public SEQUOIA / RNA-FM formats under ``data_dir``:

* ``reference_csv`` (default ``reference.csv``): one row per slide with ``wsi_file_name`` (the slide's path or
  name; as in the official reader the folder and a ``.svs`` suffix are dropped to name its features), optional
  ``patient_id`` (splits are by patient when present, so no patient is in two splits) and ``rna_<GENE>`` columns
  of raw FPKM-UQ values (``target_transform="log2p1"``: y = log2(x + 1); ``"none"``: used as given; a
  ``rna_file_name`` column is not a gene);
* per-slide HDF5 ``{features_dir}/{slide}/{slide}.h5`` (the official layout) or ``{features_dir}/{slide}.h5``
  holding dataset ``feature_key`` (default ``cluster_features``) of shape [C, D], equal for all slides;
* optional ``pathway_json``: ``{pathway_name: [gene index or gene symbol, ...], "UNMAPPED": [...],
  "UNCLASSIFIED": [...]}``; the two special keys form the background set. Indices refer to the order of the
  ``rna_`` columns.

Deviations: normalisation statistics come from the training split (the official code uses cohort-wide ones,
test slides included); a gene whose training std is < 1e-8 is divided by 1 (the official code divides by
std + 1e-10, which blows up constant genes).
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.sampling import LoaderGeneratorReplaySampler, evaluation_sampler, training_sampler
from lightning_modules.shared.errors import UserInputError, check_range

BACKGROUND_KEYS = ("UNMAPPED", "UNCLASSIFIED")


@dataclass
class SlideData:
    """Everything loaded, before splitting: features [N, C, D] float32, log-expression [N, G] float32."""
    features: np.ndarray
    expression: np.ndarray
    gene_names: list[str]
    slide_ids: list[str]
    groups: np.ndarray  # split unit per slide (patient), [N]
    pathways: list[list[int]] | None
    background: list[int] | None
    bimodal_genes: np.ndarray | None  # bool [G], synthetic only
    subtype: np.ndarray | None  # int [N], synthetic only


# ============================================================================================ synthetic
def synthetic_slides(num_slides: int = 600, num_pathway_genes: int = 400, num_pathways: int = 20,
                     num_background_genes: int = 40, num_clusters: int = 100, feature_dim: int = 32,
                     latent_dim: int = 8, num_tissue_types: int = 5, feature_noise: float = 1.0,
                     subtype_signal: float = 1.0, subtype_cluster_fraction: float = 0.1,
                     second_pathway_prob: float = 0.3, bimodal_fraction: float = 0.25, noise_std: float = 0.3,
                     seed: int = 0) -> SlideData:
    """The embedded generator (see the module docstring). Deterministic given ``seed``."""
    rng = np.random.default_rng(seed)
    n, c, d, k, p = num_slides, num_clusters, feature_dim, latent_dim, num_pathways
    genes = num_pathway_genes + num_background_genes
    z = rng.standard_normal((n, k))
    subtype = rng.integers(0, 2, n)
    # image: tissue-type-specific views of z, weak subtype offset on a few clusters, shuffled cluster order
    mixing = rng.standard_normal((num_tissue_types, k, d)) / np.sqrt(k)
    type_mean = rng.standard_normal((num_tissue_types, d)) * 0.5
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    tissue = rng.integers(0, num_tissue_types, (n, c))
    feats = np.einsum("nk,nckd->ncd", z, mixing[tissue]) + type_mean[tissue]
    feats += feature_noise * rng.standard_normal((n, c, d))
    shows = rng.random((n, c)) < subtype_cluster_fraction
    feats += (subtype_signal * (2 * subtype - 1))[:, None, None] * shows[..., None] * direction
    order = np.argsort(rng.random((n, c)), axis=1)
    feats = np.take_along_axis(feats, order[..., None], axis=1)
    # genes: overlapping pathways + background
    primary = rng.permutation(num_pathway_genes) % p
    second = np.where(rng.random(num_pathway_genes) < second_pathway_prob,
                      (primary + rng.integers(1, p, num_pathway_genes)) % p, -1)
    pathways = [sorted(set(np.flatnonzero(primary == q).tolist()) | set(np.flatnonzero(second == q).tolist()))
                for q in range(p)]
    background = list(range(num_pathway_genes, genes))
    programs = np.tanh(np.einsum("nk,pkj->npj", z, rng.standard_normal((p, k, 2)) / np.sqrt(k) * 1.5)
                       + rng.standard_normal((p, 2)) * 0.3)  # [N, P, 2]
    expr = np.tile(rng.normal(5.0, 1.0, genes), (n, 1))
    loadings = rng.standard_normal((genes, p, 2))
    member = np.zeros((genes, p))
    member[np.arange(num_pathway_genes), primary] = 1.0
    has_second = second >= 0
    member[np.flatnonzero(has_second), second[has_second]] = 1.0
    expr += np.einsum("npj,gpj,gp->ng", programs, loadings, member)
    shared = np.tanh(z @ rng.standard_normal(k) / np.sqrt(k))
    expr[:, num_pathway_genes:] += 0.5 * shared[:, None] * rng.standard_normal(num_background_genes)
    bimodal = rng.random(genes) < bimodal_fraction
    delta = bimodal * rng.choice([-1.0, 1.0], genes) * rng.uniform(1.5, 2.5, genes)
    expr += subtype[:, None] * delta + noise_std * rng.standard_normal((n, genes))
    return SlideData(features=feats.astype(np.float32), expression=expr.astype(np.float32),
                     gene_names=[f"G{g}" for g in range(genes)], slide_ids=[f"slide{i}" for i in range(n)],
                     groups=np.arange(n), pathways=pathways, background=background, bimodal_genes=bimodal,
                     subtype=subtype)


# ============================================================================================ files
def slide_id(wsi_file_name: str) -> str:
    """The feature-folder name of a ``wsi_file_name`` entry: the official reference files hold the slide's path
    (``.../TCGA-XX-XXXX-01Z-00-DX1.<uuid>.svs``) and the official reader keeps its base name without ``.svs``
    (RNA-FM ``src/read_data_log.py``); a bare slide name is kept as it is."""
    return wsi_file_name.strip().replace("\\", "/").split("/")[-1].replace(".svs", "")


def read_reference_csv(path: str, transform: str = "log2p1") -> tuple[list[str], list[str], list[str], np.ndarray]:
    """(slide ids, patient ids, gene names, expression [N, G]) of a SEQUOIA/RNA-FM reference CSV."""
    if not os.path.isfile(path):
        raise UserInputError(f"reference CSV '{path}' not found: expected one row per slide with columns "
                             "wsi_file_name, patient_id (optional) and rna_<GENE> expression columns.")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise UserInputError(f"reference CSV '{path}' is empty.")
        if "wsi_file_name" not in header:
            raise UserInputError(f"reference CSV '{path}' has no 'wsi_file_name' column (header starts "
                                 f"{header[:5]}).")
        # ``rna_file_name`` (the RNA-seq file path of SEQUOIA's reference files) is not a gene, as in the official
        # reader (RNA-FM ``src/read_data_log.py``)
        gene_cols = [i for i, name in enumerate(header) if name.startswith("rna_") and name != "rna_file_name"]
        if not gene_cols:
            raise UserInputError(f"reference CSV '{path}' has no rna_<GENE> columns.")
        slide_col = header.index("wsi_file_name")
        patient_col = header.index("patient_id") if "patient_id" in header else None
        slides, patients, rows = [], [], []
        for line, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise UserInputError(f"{path}, line {line}: {len(row)} fields, the header has {len(header)}.")
            slide = slide_id(row[slide_col])
            if not slide:
                raise UserInputError(f"{path}, line {line}: empty wsi_file_name.")
            values = []
            for i in gene_cols:
                try:
                    value = float(row[i])
                except ValueError:
                    raise UserInputError(f"{path}, line {line}, column {header[i]}: {row[i]!r} is not a number."
                                         ) from None
                if not np.isfinite(value) or (transform == "log2p1" and value < 0):
                    raise UserInputError(f"{path}, line {line}, column {header[i]}: {row[i]!r} is not a finite "
                                         "non-negative expression value (raw FPKM-UQ expected for log2(x+1)).")
                values.append(value)
            slides.append(slide)
            patients.append(row[patient_col].strip() if patient_col is not None else slide)
            rows.append(values)
    if not rows:
        raise UserInputError(f"reference CSV '{path}' has a header but no slides.")
    if len(set(slides)) != len(slides):
        dup = next(s for s in slides if slides.count(s) > 1)
        raise UserInputError(f"reference CSV '{path}': slide '{dup}' appears more than once.")
    expr = np.asarray(rows, dtype=np.float64)
    if transform == "log2p1":
        expr = np.log2(expr + 1.0)
    return slides, patients, [header[i][4:] for i in gene_cols], expr.astype(np.float32)


def read_cluster_features(features_dir: str, slides: list[str], key: str = "cluster_features") -> np.ndarray:
    """[N, C, D] from ``{features_dir}/{slide}/{slide}.h5`` (or ``{features_dir}/{slide}.h5``), dataset ``key``."""
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is in the 'formats' extra
        raise UserInputError("reading HDF5 cluster features needs h5py: pip install 'icml26-lightning[formats]'"
                             ) from None
    if not os.path.isdir(features_dir):
        raise UserInputError(f"features directory '{features_dir}' not found: expected "
                             "<features_dir>/<slide>/<slide>.h5 files with a 'cluster_features' dataset.")
    out, shape = [], None
    for slide in slides:
        candidates = [os.path.join(features_dir, slide, f"{slide}.h5"), os.path.join(features_dir, f"{slide}.h5")]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            raise UserInputError(f"no HDF5 features for slide '{slide}': expected {candidates[0]} or {candidates[1]}.")
        try:
            with h5py.File(path, "r") as f:
                if key not in f:
                    raise UserInputError(f"{path} has no dataset '{key}' (it has {sorted(f.keys())}); set "
                                         "feature_key to the cluster-feature dataset.")
                array = np.asarray(f[key], dtype=np.float32)
        except OSError as err:
            raise UserInputError(f"{path} is not a readable HDF5 file ({err}).") from None
        if array.ndim != 2:
            raise UserInputError(f"{path}:{key} has shape {array.shape}; expected [clusters, feature_dim].")
        if shape is not None and array.shape != shape:
            raise UserInputError(f"{path}:{key} has shape {array.shape} but earlier slides have {shape}: every slide "
                                 "needs the same number of clusters and feature dimension.")
        if not np.isfinite(array).all():
            raise UserInputError(f"{path}:{key} contains NaN or inf.")
        shape = array.shape
        out.append(array)
    return np.stack(out)


def read_pathway_json(path: str, gene_names: list[str]) -> tuple[list[list[int]], list[int]]:
    """(pathways as sorted gene-index lists, background gene indices) from a PANTHER-style pathway JSON.

    Background = the UNMAPPED/UNCLASSIFIED entries plus every gene in no pathway. Entries are gene indices
    (into the ``rna_`` column order) or gene symbols. Empty pathways are dropped.
    """
    if not os.path.isfile(path):
        raise UserInputError(f"pathway JSON '{path}' not found: expected {{pathway_name: [gene indices or "
                             "symbols], 'UNMAPPED': [...]}}. Set pathway_json: null to train without pathways.")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as err:
        raise UserInputError(f"pathway JSON '{path}' is not valid JSON ({err}).") from None
    if not isinstance(raw, dict):
        raise UserInputError(f"pathway JSON '{path}' must be an object {{pathway_name: [genes]}}.")
    index = {name: i for i, name in enumerate(gene_names)}
    num_genes = len(gene_names)

    def resolve(name: str, entries) -> list[int]:
        if not isinstance(entries, list):
            raise UserInputError(f"pathway JSON '{path}': entry '{name}' must be a list of genes.")
        out = []
        for entry in entries:
            if isinstance(entry, bool) or not isinstance(entry, (int, str)):
                raise UserInputError(f"pathway JSON '{path}': '{name}' holds {entry!r}; expected gene indices or "
                                     "symbols.")
            if isinstance(entry, str):
                if entry not in index:
                    raise UserInputError(f"pathway JSON '{path}': gene '{entry}' of '{name}' is not an rna_ column.")
                entry = index[entry]
            if not 0 <= entry < num_genes:
                raise UserInputError(f"pathway JSON '{path}': gene index {entry} of '{name}' is outside "
                                     f"[0, {num_genes}).")
            out.append(int(entry))
        return sorted(set(out))

    pathways, background = [], set()
    for name, entries in raw.items():
        genes = resolve(name, entries)
        if name in BACKGROUND_KEYS:
            background.update(genes)
        elif genes:
            pathways.append(genes)
    if not pathways:
        raise UserInputError(f"pathway JSON '{path}' defines no non-empty pathway.")
    covered = set().union(*map(set, pathways))
    background.update(set(range(num_genes)) - covered)
    return pathways, sorted(background)


# ============================================================================================ datamodule
class SlideSet(Dataset):
    """Slides of one split; batches are dicts of tensors (features, standardised expression, index)."""

    def __init__(self, features: np.ndarray, expression: np.ndarray, indices: np.ndarray) -> None:
        self.features = torch.from_numpy(features)
        self.expression = torch.from_numpy(expression)
        self.indices = torch.from_numpy(indices.astype(np.int64))

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.__getitems__([i])

    def __getitems__(self, keys: list[int]) -> dict[str, Tensor]:
        keys = torch.as_tensor(keys, dtype=torch.long)
        return {"features": self.features[keys], "expression": self.expression[keys], "index": self.indices[keys]}


def _collate(batch):
    return batch  # __getitems__ already returns the batch


class SlideExpressionDataModule(LightningDataModule):
    """Cluster features -> standardised expression, with train/val/test splits (by patient for files).

    Args:
        source: ``synthetic`` (embedded generator) or ``files`` (reference CSV + HDF5 + pathway JSON).
        data_dir, reference_csv, features_dir, feature_key, pathway_json, target_transform: the file layout
            (relative paths are resolved against ``data_dir``; ``pathway_json: null`` = no pathways).
        num_slides, num_pathway_genes, num_pathways, num_background_genes, num_clusters, feature_dim,
            subtype_signal, bimodal_fraction, noise_std: synthetic generator sizes (see `synthetic_slides`).
        val_fraction, test_fraction: split fractions (of patients for files).
        batch_size, eval_batch_size, num_workers: loaders. seed: generator and split seed.
    """

    def __init__(self, source: Literal["synthetic", "files"] = "synthetic", data_dir: str | None = None,
                 reference_csv: str = "reference.csv", features_dir: str = "features",
                 feature_key: str = "cluster_features", pathway_json: str | None = "pathways.json",
                 target_transform: Literal["log2p1", "none"] = "log2p1",
                 num_slides: int = 600, num_pathway_genes: int = 400, num_pathways: int = 20,
                 num_background_genes: int = 40, num_clusters: int = 100, feature_dim: int = 32,
                 subtype_signal: float = 1.0, bimodal_fraction: float = 0.25, noise_std: float = 0.3,
                 val_fraction: float = 0.2, test_fraction: float = 0.2, batch_size: int = 32,
                 eval_batch_size: int = 128, num_workers: int = 0, seed: int = 0) -> None:
        super().__init__()
        if source not in ("synthetic", "files"):
            raise UserInputError(f"source={source!r} is unknown: choose 'synthetic' or 'files'.")
        if target_transform not in ("log2p1", "none"):
            raise UserInputError(f"target_transform={target_transform!r}: choose 'log2p1' or 'none'.")
        if source == "files" and not data_dir:
            raise UserInputError("source='files' needs data_dir (holding reference.csv, features/, pathways.json).")
        for name, value in (("num_slides", num_slides), ("num_pathways", num_pathways),
                            ("num_clusters", num_clusters), ("feature_dim", feature_dim),
                            ("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            check_range(name, value, 1)
        check_range("num_pathway_genes", num_pathway_genes, num_pathways)
        check_range("num_background_genes", num_background_genes, 0)
        check_range("num_workers", num_workers, 0)
        check_range("noise_std", noise_std, 0.0)
        check_range("bimodal_fraction", bimodal_fraction, 0.0, 1.0)
        check_range("val_fraction", val_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        check_range("test_fraction", test_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        if val_fraction + test_fraction >= 1.0:
            raise UserInputError(f"val_fraction + test_fraction = {val_fraction + test_fraction} leaves no training "
                                 "data: keep the sum below 1.")
        self.save_hyperparameters()
        self._data: SlideData | None = None
        self.splits: dict[str, np.ndarray] = {}
        self.gene_mean: np.ndarray | None = None
        self.gene_std: np.ndarray | None = None
        self._standardised: np.ndarray | None = None

    # ------------------------------------------------------------------------------------------ loading
    def _path(self, name: str) -> str:
        return name if os.path.isabs(name) else os.path.join(self.hparams.data_dir, name)

    def _load(self) -> SlideData:
        hp = self.hparams
        if hp.source == "synthetic":
            return synthetic_slides(num_slides=hp.num_slides, num_pathway_genes=hp.num_pathway_genes,
                                    num_pathways=hp.num_pathways, num_background_genes=hp.num_background_genes,
                                    num_clusters=hp.num_clusters, feature_dim=hp.feature_dim,
                                    subtype_signal=hp.subtype_signal, bimodal_fraction=hp.bimodal_fraction,
                                    noise_std=hp.noise_std, seed=hp.seed)
        if not os.path.isdir(hp.data_dir):
            raise UserInputError(f"data_dir '{hp.data_dir}' does not exist.")
        slides, patients, genes, expr = read_reference_csv(self._path(hp.reference_csv), hp.target_transform)
        feats = read_cluster_features(self._path(hp.features_dir), slides, hp.feature_key)
        pathways = background = None
        if hp.pathway_json is not None:
            pathways, background = read_pathway_json(self._path(hp.pathway_json), genes)
        _, groups = np.unique(np.asarray(patients), return_inverse=True)
        return SlideData(features=feats, expression=expr, gene_names=genes, slide_ids=slides, groups=groups,
                         pathways=pathways, background=background, bimodal_genes=None, subtype=None)

    @property
    def data(self) -> SlideData:
        if self._data is None:
            self._data = self._load()
            self._split()
        return self._data

    def _split(self) -> None:
        """Deterministic group-level (patient) split, then training-split statistics."""
        data = self._data
        groups = np.unique(data.groups)
        if len(groups) < 3:
            raise UserInputError(f"only {len(groups)} patients/slides: need at least 3 for train/val/test splits.")
        order = np.random.default_rng(self.hparams.seed + 1).permutation(groups)
        n_val = max(1, int(round(self.hparams.val_fraction * len(groups))))
        n_test = max(1, int(round(self.hparams.test_fraction * len(groups))))
        if n_val + n_test >= len(groups):
            raise UserInputError(f"{len(groups)} patients are too few for val_fraction/test_fraction "
                                 f"({n_val} + {n_test} patients held out).")
        parts = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
        self.splits = {name: np.flatnonzero(np.isin(data.groups, part)) for name, part in parts.items()}
        train = data.expression[self.splits["train"]].astype(np.float64)
        self.gene_mean = train.mean(0).astype(np.float32)
        std = train.std(0)
        self.gene_std = np.where(std < 1e-8, 1.0, std).astype(np.float32)
        self._standardised = ((data.expression - self.gene_mean) / self.gene_std).astype(np.float32)

    # ------------------------------------------------------------------------------------------ facts for models
    @property
    def num_genes(self) -> int:
        return self.data.expression.shape[1]

    @property
    def num_clusters(self) -> int:
        return self.data.features.shape[1]

    @property
    def feature_dim(self) -> int:
        return self.data.features.shape[2]

    @property
    def pathways(self) -> list[list[int]] | None:
        return self.data.pathways

    @property
    def background(self) -> list[int] | None:
        return self.data.background

    @property
    def bimodal_genes(self) -> np.ndarray | None:
        return self.data.bimodal_genes

    @property
    def gene_names(self) -> list[str]:
        return self.data.gene_names

    @property
    def slide_ids(self) -> list[str]:
        return self.data.slide_ids

    def split_arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(features [n, C, D], log-expression [n, G]) of a split, e.g. for sklearn-style baselines."""
        idx = self.splits_of(split)
        return self.data.features[idx], self.data.expression[idx]

    def splits_of(self, split: str) -> np.ndarray:
        self.data  # noqa: B018 - loads and splits
        if split not in self.splits:
            raise UserInputError(f"split={split!r} is unknown: choose train, val or test.")
        return self.splits[split]

    # ------------------------------------------------------------------------------------------ loaders
    def setup(self, stage: str | None = None) -> None:
        self.data  # noqa: B018

    def _dataset(self, split: str) -> SlideSet:
        idx = self.splits_of(split)
        return SlideSet(self.data.features[idx], self._standardised[idx], idx)

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        # training: an order that is a pure function of (seed, epoch), so a resumed run continues it; evaluation
        # under DDP: unpadded shards, so that summed metrics equal the single-process values (datamodules.sampling)
        dataset = self._dataset(split)
        if shuffle:
            sampler = training_sampler(len(dataset), self.hparams.seed, self.trainer, LoaderGeneratorReplaySampler,
                                       batch_size=batch_size)
        else:
            sampler = evaluation_sampler(dataset, self.trainer)
        generator = torch.Generator().manual_seed(self.hparams.seed) if shuffle else None
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator,
                          collate_fn=_collate, num_workers=self.hparams.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.hparams.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.hparams.eval_batch_size, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test", self.hparams.eval_batch_size, shuffle=False)
