"""Implicit-feedback user-item graphs for graph collaborative filtering (LightGCN / NT-SSM).

Sources (``source``)
--------------------
* ``synthetic`` (default, needs no files): a seeded clustered bipartite graph with popularity. Users and
  items get uniform random cluster ids (``synthetic_clusters``); item popularity is Zipf(``synthetic_
  popularity_exponent``) over a random permutation of the items; each user draws a degree uniformly in
  [``synthetic_min_degree``, ``synthetic_max_degree``], then ``round(synthetic_in_cluster * degree)`` distinct
  items of its own cluster and the rest among all items, both popularity-weighted, without replacement.
  Defaults: 1000 users, 1500 items, 10 clusters, degrees 5-24, 60 % in-cluster (about 10k train edges).
* ``lightgcn_txt``: ``data_dir/train.txt`` and ``data_dir/test.txt`` in the LightGCN/NGCF format, one line per
  user ``user item1 item2 ...`` (integers, whitespace-separated; a line with a user and no item is allowed).
  There is no validation file: ``lightgcn_valid_fraction`` of each user's train items is held out (seeded).
  The file's ids are kept and the sizes are the official LightGCN loader's (largest user / item id in either
  file + 1); every test edge is kept, also one whose item's only train edge is held out for validation.
* ``ntssm_triplets``: ``data_dir/train.txt``, ``valid.txt``, ``test.txt`` of the NT-SSM release, one
  ``user item 1`` (or ``user item``) line per interaction, integer ids shared by the three files.
* ``recbole``: a RecBole atomic ``.inter`` file (``data_dir`` is the file, or a folder holding exactly one).
* ``movielens100k``: ``ml-100k.inter`` inside an installed ``recbole`` package (never downloaded; every rating
  counts as an interaction).

Splits (deterministic given ``seed``)
-------------------------------------
Sources that are not pre-split (synthetic, recbole, movielens100k) are de-duplicated and split per user at
random into train/valid/test with ``split`` (default 70/10/20): a user with n interactions gets
``round(0.2 n)`` test and ``round(0.1 n)`` valid items, but always keeps at least one train item
(``split_rounding="floor"``: RecBole's counts, rounded down). For these
and ``ntssm_triplets``, as in the official NT-SSM code (SELFRec), ids are then re-indexed from the **train**
split only (sorted raw ids, so files whose train ids are already 0..n-1 keep their numbering), and valid/test
interactions whose user or item never occurs in train are **dropped**, with a logged count (``dropped``
attribute). ``lightgcn_txt`` keeps the file's ids and drops nothing (above). Train pairs are de-duplicated;
valid/test pairs are de-duplicated within each file.

Batches
-------
* training: dicts of ``users``, ``items`` (a train edge each) and ``negatives`` (one item the user has not
  consumed in train, uniform by rejection, 20 tries, for the L2 term and BPR). The edge order of epoch e is a
  pure function of (seed, e) (`EpochShuffleSampler`), and the negative of edge k in epoch e a pure function
  of (seed, e, k), so resuming reproduces the data exactly, also under DDP sharding.
* validation / test / predict: dicts of ``users`` and padded item lists (``-1`` = padding): ``train_items``
  (to mask), ``valid_items``, and ``target_items`` (valid items for validation, test items for test and
  predict). Validation covers users with a valid item, test and predict users with a test item. The
  official protocol masks only train items at test (validation items compete); the model decides.

``num_users``, ``num_items`` (and ``dropped``) load the data on first access. ``train_edge_index()`` is the
(2, E) train edge tensor; the model builds its propagation graph D^-1/2 A D^-1/2 from it (train edges only,
`lightning_modules.nt_ssm.nt_ssm.normalized_adjacency`).
"""
from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.sampling import EpochShuffleSampler, evaluation_sampler, training_sampler
from datamodules.recsys_files import iter_fields, movielens_100k_path, read_recbole_inter
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)

SOURCES = ("synthetic", "lightgcn_txt", "ntssm_triplets", "recbole", "movielens100k")
NEGATIVE_TRIES = 20
_STREAM_GRAPH, _STREAM_SPLIT, _STREAM_NEGATIVE = 11, 12, 13


@dataclass
class GraphSplit:
    """Train/valid/test (user, item) arrays, ids in [0, num_users) x [0, num_items) (see the module docstring)."""

    train: tuple[np.ndarray, np.ndarray]
    valid: tuple[np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray]
    num_users: int
    num_items: int
    dropped: dict[str, int]


class GraphRecDataModule(LightningDataModule):
    """User-item graph data for graph CF (see the module docstring).

    Args:
        source: "synthetic" (embedded), "lightgcn_txt", "ntssm_triplets", "recbole" or "movielens100k".
        data_dir: folder (or ``.inter`` file for recbole) with the files; None for synthetic/movielens100k.
        split: train/valid/test fractions per user for sources that are not pre-split (sum 1).
        split_rounding: held-out counts per user: "nearest" (round(f n), the default) or "floor" (RecBole's
            ``split_by_ratio``: rounded down, a part with 0 < f n < 1 gets one row); see `per_user_split`.
        lightgcn_valid_fraction: share of each user's train items held out for validation (lightgcn_txt).
        batch_size: (user, item) training pairs per batch (official 2048). eval_batch_size: users per
            evaluation batch (memory eval_batch_size x num_items floats).
        num_workers: DataLoader workers. seed: graph, split, shuffle and negatives.
        synthetic_*: the generator's sizes and structure (module docstring).
    """

    def __init__(self, source: Literal["synthetic", "lightgcn_txt", "ntssm_triplets", "recbole",
                                       "movielens100k"] = "synthetic",
                 data_dir: str | None = None, split: tuple[float, float, float] = (0.7, 0.1, 0.2),
                 split_rounding: Literal["nearest", "floor"] = "nearest",
                 lightgcn_valid_fraction: float = 0.125, batch_size: int = 2048, eval_batch_size: int = 256,
                 num_workers: int = 0, seed: int = 0,
                 synthetic_users: int = 1000, synthetic_items: int = 1500, synthetic_clusters: int = 10,
                 synthetic_min_degree: int = 5, synthetic_max_degree: int = 24, synthetic_in_cluster: float = 0.6,
                 synthetic_popularity_exponent: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        if source not in SOURCES:
            raise UserInputError(f"source={source!r} is unknown: choose one of {', '.join(SOURCES)}.")
        needs_dir = source in ("lightgcn_txt", "ntssm_triplets", "recbole")
        if needs_dir and not data_dir:
            raise UserInputError(f"source={source!r} reads local files: set data.init_args.data_dir.")
        if not needs_dir and data_dir:
            raise UserInputError(f"source={source!r} reads no data_dir (got {data_dir!r}): remove it or choose "
                                 "a file source.")
        if len(split) != 3 or min(split) < 0 or abs(sum(split) - 1.0) > 1e-6 or split[0] <= 0:
            raise UserInputError(f"split={list(split)} must be three non-negative train/valid/test fractions "
                                 "summing to 1 with train > 0, e.g. [0.7, 0.1, 0.2].")
        if split_rounding not in ("nearest", "floor"):
            raise UserInputError(f"split_rounding={split_rounding!r} is unknown: choose 'nearest' (round f n) or "
                                 "'floor' (RecBole's split counts).")
        check_range("lightgcn_valid_fraction", lightgcn_valid_fraction, 0.0, 1.0, high_inclusive=False)
        check_range("batch_size", batch_size, 1)
        check_range("eval_batch_size", eval_batch_size, 1)
        check_range("num_workers", num_workers, 0)
        check_range("seed", seed, 0)
        check_range("synthetic_users", synthetic_users, 1)
        check_range("synthetic_items", synthetic_items, 2)
        check_range("synthetic_clusters", synthetic_clusters, 1, synthetic_items)
        check_range("synthetic_min_degree", synthetic_min_degree, 1)
        check_range("synthetic_max_degree", synthetic_max_degree, synthetic_min_degree, synthetic_items)
        check_range("synthetic_in_cluster", synthetic_in_cluster, 0.0, 1.0)
        check_range("synthetic_popularity_exponent", synthetic_popularity_exponent, 0.0)
        self.source, self.data_dir, self.seed = source, data_dir, seed
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self._data: GraphSplit | None = None

    # ----------------------------------------------------------------------------------------- loading
    @property
    def data(self) -> GraphSplit:
        if self._data is None:
            self._data = self._load()
            d = self._data
            log.info("%s graph: %d users, %d items; %d train / %d valid / %d test interactions; dropped "
                     "(user or item unseen in train): %s", self.source, d.num_users, d.num_items, len(d.train[0]),
                     len(d.valid[0]), len(d.test[0]), d.dropped)
            if d.dropped["valid"] or d.dropped["test"]:
                log.warning("dropped %d valid and %d test interactions whose user or item is not in train "
                            "(ids are re-indexed from the train split, as SELFRec, the NT-SSM code base, does)",
                            d.dropped["valid"], d.dropped["test"])
        return self._data

    @property
    def num_users(self) -> int:
        return self.data.num_users

    @property
    def num_items(self) -> int:
        return self.data.num_items

    @property
    def dropped(self) -> dict[str, int]:
        return self.data.dropped

    def _load(self) -> GraphSplit:
        hp = self.hparams
        if self.source == "synthetic":
            users, items = clustered_popularity_graph(
                hp.synthetic_users, hp.synthetic_items, hp.synthetic_clusters, hp.synthetic_min_degree,
                hp.synthetic_max_degree, hp.synthetic_in_cluster, hp.synthetic_popularity_exponent,
                np.random.default_rng([self.seed, _STREAM_GRAPH]))
            return self._split_and_index(users, items)
        if self.source in ("recbole", "movielens100k"):
            path = movielens_100k_path() if self.source == "movielens100k" else _find_inter(self.data_dir)
            data = read_recbole_inter(path)
            return self._split_and_index(data.users, data.items)
        if self.source == "lightgcn_txt":
            return self._load_lightgcn_txt()
        parts = [_unique_pairs(*read_integer_pairs(_require_file(self.data_dir, name, "ntssm_triplets")))
                 for name in ("train.txt", "valid.txt", "test.txt")]
        return reindex_by_train(*parts)

    def _load_lightgcn_txt(self) -> GraphSplit:
        """train.txt/test.txt with the file's ids, sized as the official LightGCN loader: users (items) = the
        largest user (item) id in either file + 1 (a user line without items counts). Every test edge is kept;
        the validation hold-out is drawn from train.txt and keeps its ids too (an item whose only train edge is
        held out stays in the catalogue, isolated in the train graph)."""
        train_path = _require_file(self.data_dir, "train.txt", "lightgcn_txt")
        test_path = _require_file(self.data_dir, "test.txt", "lightgcn_txt")
        train_users, train_items, train_max_user = _read_lightgcn_lines(train_path)
        test_users, test_items, test_max_user = _read_lightgcn_lines(test_path)
        num_users = max(train_max_user, test_max_user) + 1
        num_items = int(max(train_items.max(), test_items.max() if len(test_items) else -1)) + 1
        train = _unique_pairs(train_users, train_items)
        fraction = self.hparams.lightgcn_valid_fraction
        part = per_user_split(train[0], (1 - fraction, fraction, 0.0),
                              np.random.default_rng([self.seed, _STREAM_SPLIT]), self.hparams.split_rounding)
        return GraphSplit((train[0][part == 0], train[1][part == 0]), (train[0][part == 1], train[1][part == 1]),
                          _unique_pairs(test_users, test_items), num_users, num_items, {"valid": 0, "test": 0})

    def _split_and_index(self, users: np.ndarray, items: np.ndarray) -> GraphSplit:
        users, items = _unique_pairs(users, items)
        part = per_user_split(users, tuple(self.hparams.split), np.random.default_rng([self.seed, _STREAM_SPLIT]),
                              self.hparams.split_rounding)
        return reindex_by_train(*[(users[part == k], items[part == k]) for k in range(3)])

    # ----------------------------------------------------------------------------------------- graph
    def train_edge_index(self) -> Tensor:
        """(2, E) long tensor of the train (user, item) edges."""
        users, items = self.data.train
        return torch.from_numpy(np.stack([users, items]))

    def item_lists(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """CSR (indptr, indices) of each user's items in ``split`` ("train", "valid" or "test")."""
        users, items = getattr(self.data, split)
        return _csr(users, items, self.num_users)

    # ----------------------------------------------------------------------------------------- loaders
    def setup(self, stage: str | None = None) -> None:
        data = self.data
        train_csr, valid_csr, test_csr = (self.item_lists(s) for s in ("train", "valid", "test"))
        self.train_set = TrainEdges(data.train[0], data.train[1], data.num_items, self.seed)
        self.val_set = EvalUsers(np.flatnonzero(np.diff(valid_csr[0]) > 0), train_csr, valid_csr, valid_csr)
        self.test_set = EvalUsers(np.flatnonzero(np.diff(test_csr[0]) > 0), train_csr, valid_csr, test_csr)

    def train_dataloader(self) -> DataLoader:
        sampler = training_sampler(len(self.train_set), self.seed, self.trainer, EpochTaggedSampler)
        return self._loader(self.train_set, self.batch_size, sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, self.eval_batch_size, evaluation_sampler(self.val_set, self.trainer))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, self.eval_batch_size, evaluation_sampler(self.test_set, self.trainer))

    predict_dataloader = test_dataloader

    def _loader(self, dataset: Dataset, batch_size: int, sampler: Sampler | None) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False, collate_fn=_as_batch,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)


# ============================================================================================ datasets
def _as_batch(batch):
    """Datasets below build whole batches in ``__getitems__``; the collate step passes them through."""
    return batch


class EpochTaggedSampler(EpochShuffleSampler):
    """`EpochShuffleSampler` whose indices carry the epoch: ``index + epoch * num_samples`` (decoded by
    `TrainEdges`, so that negatives are a function of (seed, epoch, edge) whatever the batching/sharding)."""

    def __iter__(self):
        offset = self.epoch * self.num_samples
        return (offset + i for i in super().__iter__())


class TrainEdges(Dataset):
    """Train (user, item) edges with one sampled negative item each; batched by ``__getitems__``."""

    def __init__(self, users: np.ndarray, items: np.ndarray, num_items: int, seed: int) -> None:
        self.users, self.items, self.num_items, self.seed = users, items, num_items, seed
        self.known = np.sort(users * num_items + items)  # sorted keys for membership tests

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, key: int) -> dict[str, Tensor]:
        return self.__getitems__([key])

    def __getitems__(self, keys: list[int]) -> dict[str, Tensor]:
        keys = np.asarray(keys, dtype=np.int64)
        epoch, edge = np.divmod(keys, len(self.users))
        users, items = self.users[edge], self.items[edge]
        negatives = self.sample_negatives(users, epoch, edge)
        return {"users": torch.from_numpy(users), "items": torch.from_numpy(items),
                "negatives": torch.from_numpy(negatives)}

    def sample_negatives(self, users: np.ndarray, epoch: np.ndarray, edge: np.ndarray) -> np.ndarray:
        """One item per row not in the user's train items (uniform, rejection; after NEGATIVE_TRIES tries the
        last draw is kept: only users who consumed almost every item can be affected)."""
        negatives = np.zeros(len(users), dtype=np.int64)
        todo = np.arange(len(users))
        for attempt in range(NEGATIVE_TRIES):
            draws = _hash_uniform(self.seed, epoch[todo], edge[todo], attempt, self.num_items)
            negatives[todo] = draws
            keys = users[todo] * self.num_items + draws
            pos = np.searchsorted(self.known, keys).clip(max=len(self.known) - 1)
            todo = todo[self.known[pos] == keys]
            if len(todo) == 0:
                break
        return negatives


class EvalUsers(Dataset):
    """Users to rank, with padded (-1) train / valid / target item lists built from CSR arrays."""

    def __init__(self, users: np.ndarray, train_csr, valid_csr, target_csr) -> None:
        self.users, self.train_csr, self.valid_csr, self.target_csr = users, train_csr, valid_csr, target_csr

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        users = self.users[np.asarray(indices, dtype=np.int64)]
        return {"users": torch.from_numpy(users), "train_items": _padded(self.train_csr, users),
                "valid_items": _padded(self.valid_csr, users), "target_items": _padded(self.target_csr, users)}


def _padded(csr: tuple[np.ndarray, np.ndarray], users: np.ndarray) -> Tensor:
    indptr, indices = csr
    starts, lengths = indptr[users], indptr[users + 1] - indptr[users]
    width = int(lengths.max()) if len(lengths) else 0
    offsets = np.arange(width)
    inside = offsets[None, :] < lengths[:, None]
    out = np.full((len(users), width), -1, dtype=np.int64)
    out[inside] = indices[(starts[:, None] + offsets[None, :])[inside]]
    return torch.from_numpy(out)


def _csr(users: np.ndarray, items: np.ndarray, num_users: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((items, users))
    indptr = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=num_users), out=indptr[1:])
    return indptr, items[order]


def _hash_uniform(seed: int, epoch: np.ndarray, edge: np.ndarray, attempt: int, n: int) -> np.ndarray:
    """Counter-based uniform integers in [0, n): splitmix64 of (seed, epoch, edge, attempt)."""
    with np.errstate(over="ignore"):
        salt = np.uint64((attempt * 0x2545F4914F6CDD1D + 1) % 2**64)  # Python ints are unbounded: wrap first
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + epoch.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             + edge.astype(np.uint64) * np.uint64(0x94D049BB133111EB) + salt)
        for _ in range(2):
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(n)).astype(np.int64)


# ============================================================================================ splits
def per_user_split(users: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator,
                   rounding: str = "nearest") -> np.ndarray:
    """Part (0 train, 1 valid, 2 test) of every interaction: per user with n rows, n_test test and n_valid valid rows
    chosen at random, at least one row kept for train (vectorised).

    ``rounding="nearest"``: n_test = round(f_test n), n_valid = round(f_valid n) (halves up). ``"floor"``: RecBole's
    ``split_by_ratio`` counts (``Dataset._calcu_split_ids``): each held-out part rounded down, then a part with
    0 < f n < 1 (test first) gets one row while more than one train row is left.
    """
    n_rows = len(users)
    order = np.lexsort((rng.random(n_rows), users))             # random order within each user
    sorted_users = users[order]
    counts = np.bincount(users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(n_rows) - starts[sorted_users]
    n = counts[sorted_users]
    if rounding == "floor":
        n_test = np.floor(fractions[2] * n).astype(np.int64)
        n_valid = np.floor(fractions[1] * n).astype(np.int64)
        for fraction, count in ((fractions[2], n_test), (fractions[1], n_valid)):
            bump = (fraction * n > 0) & (fraction * n < 1) & (n - n_test - n_valid > 1)
            count += bump
    elif rounding == "nearest":
        n_test = np.floor(fractions[2] * n + 0.5).astype(np.int64)
        n_valid = np.floor(fractions[1] * n + 0.5).astype(np.int64)
    else:
        raise UserInputError(f"split_rounding={rounding!r} is unknown: choose 'nearest' or 'floor' (RecBole).")
    n_test = np.minimum(n_test, n - 1)
    n_valid = np.minimum(n_valid, n - 1 - n_test)
    part_sorted = np.where(rank < n_test, 2, np.where(rank < n_test + n_valid, 1, 0))
    part = np.empty(n_rows, dtype=np.int64)
    part[order] = part_sorted
    return part


def reindex_by_train(train, valid, test) -> GraphSplit:
    """Contiguous ids from the train split (sorted raw ids); valid/test rows with unseen ids are dropped."""
    user_ids, train_users = np.unique(train[0], return_inverse=True)
    item_ids, train_items = np.unique(train[1], return_inverse=True)
    parts, dropped = [], {}
    for name, (users, items) in (("valid", valid), ("test", test)):
        u = np.searchsorted(user_ids, users).clip(max=len(user_ids) - 1)
        i = np.searchsorted(item_ids, items).clip(max=len(item_ids) - 1)
        known = (user_ids[u] == users) & (item_ids[i] == items)
        dropped[name] = int((~known).sum())
        parts.append((u[known].astype(np.int64), i[known].astype(np.int64)))
    return GraphSplit((train_users.astype(np.int64), train_items.astype(np.int64)), parts[0], parts[1],
                      len(user_ids), len(item_ids), dropped)


def _unique_pairs(users: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """De-duplicated (user, item) pairs in first-occurrence order."""
    if len(users) == 0:
        return users.astype(np.int64), items.astype(np.int64)
    pairs = np.stack([users, items], axis=1).astype(np.int64)
    _, first = np.unique(pairs, axis=0, return_index=True)
    first.sort()
    return pairs[first, 0], pairs[first, 1]


# ============================================================================================ generator
def clustered_popularity_graph(num_users: int, num_items: int, num_clusters: int, min_degree: int,
                               max_degree: int, in_cluster: float, popularity_exponent: float,
                               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(users, items) of the clustered bipartite graph with popularity (module docstring)."""
    user_cluster = rng.integers(num_clusters, size=num_users)
    item_cluster = rng.integers(num_clusters, size=num_items)
    popularity = np.empty(num_items)
    popularity[rng.permutation(num_items)] = 1.0 / np.arange(1, num_items + 1) ** popularity_exponent
    members = [np.flatnonzero(item_cluster == c) for c in range(num_clusters)]
    degrees = rng.integers(min_degree, max_degree + 1, size=num_users)
    users, items = [], []
    for user in range(num_users):
        own = members[user_cluster[user]]
        n_in = min(int(round(in_cluster * degrees[user])), len(own))
        chosen = rng.choice(own, size=n_in, replace=False, p=popularity[own] / popularity[own].sum()) \
            if n_in else np.zeros(0, dtype=np.int64)
        weights = popularity.copy()
        weights[chosen] = 0.0
        n_out = min(degrees[user] - n_in, int((weights > 0).sum()))
        others = rng.choice(num_items, size=n_out, replace=False, p=weights / weights.sum()) \
            if n_out else np.zeros(0, dtype=np.int64)
        picked = np.concatenate([chosen, others])
        users.append(np.full(len(picked), user))
        items.append(picked)
    return np.concatenate(users).astype(np.int64), np.concatenate(items).astype(np.int64)


# ============================================================================================ readers
def read_lightgcn_txt(path: str) -> tuple[np.ndarray, np.ndarray]:
    """LightGCN/NGCF ``user item1 item2 ...`` lines (integers) -> (users, items) in file order."""
    users, items, _ = _read_lightgcn_lines(path)
    return users, items


def _read_lightgcn_lines(path: str) -> tuple[np.ndarray, np.ndarray, int]:
    """`read_lightgcn_txt` plus the largest user id of any line (a line may hold a user and no item)."""
    users, items, max_user = [], [], -1
    for line_number, fields in iter_fields(path):
        try:
            ids = [int(x) for x in fields]
        except ValueError:
            raise UserInputError(f"{path}, line {line_number}: expected integer ids 'user item1 item2 ...' "
                                 f"(LightGCN format), got {' '.join(fields)[:80]!r}.") from None
        if min(ids) < 0:
            raise UserInputError(f"{path}, line {line_number}: ids must be non-negative integers.")
        users.extend([ids[0]] * (len(ids) - 1))
        items.extend(ids[1:])
        max_user = max(max_user, ids[0])
    if not users:
        raise UserInputError(f"{path} holds no interactions (expected 'user item1 item2 ...' lines).")
    return np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64), max_user


def read_integer_pairs(path: str) -> tuple[np.ndarray, np.ndarray]:
    """NT-SSM ``user item 1`` (or ``user item``) lines with integer ids, kept as the file's numbers (unlike
    `read_pairs`, which renumbers each file on its own and so cannot align train/valid/test)."""
    users, items = [], []
    for line_number, fields in iter_fields(path):
        if len(fields) not in (2, 3):
            raise UserInputError(f"{path}, line {line_number}: expected 'user item 1' (3 fields) or "
                                 f"'user item' (2), got {len(fields)} fields.")
        try:
            user, item = int(fields[0]), int(fields[1])
        except ValueError:
            raise UserInputError(f"{path}, line {line_number}: user and item must be integer ids, got "
                                 f"{fields[0]!r} {fields[1]!r}.") from None
        if user < 0 or item < 0:
            raise UserInputError(f"{path}, line {line_number}: ids must be non-negative integers.")
        users.append(user)
        items.append(item)
    if not users:
        raise UserInputError(f"{path} holds no interactions (expected 'user item 1' lines).")
    return np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64)


def _require_file(data_dir: str, name: str, source: str) -> str:
    expected = {"lightgcn_txt": "train.txt and test.txt ('user item1 item2 ...' lines)",
                "ntssm_triplets": "train.txt, valid.txt and test.txt ('user item 1' lines)"}[source]
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir '{data_dir}' is not a folder: source={source!r} expects {expected} in it.")
    path = os.path.join(data_dir, name)
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' is missing: source={source!r} expects {expected} in data_dir.")
    return path


def _find_inter(data_dir: str) -> str:
    if os.path.isfile(data_dir):
        return data_dir
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir '{data_dir}' does not exist: for source='recbole' give a RecBole atomic "
                             "<name>.inter file or a folder holding exactly one.")
    found = sorted(glob.glob(os.path.join(data_dir, "*.inter")))
    if len(found) != 1:
        raise UserInputError(f"data_dir '{data_dir}' holds {len(found)} .inter files ({found[:3]}): point "
                             "data_dir at the one to use.")
    return found[0]
