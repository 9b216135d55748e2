"""Sequential recommendation data (leave-one-out by time), with the growable training set RSIR needs.

Sources (``source``):

* ``synthetic`` (default, no files): a clustered Markov generator (a reconstruction for CPU tests). ``num_items``
  items (ids 1..N, 0 = padding) in ``num_clusters`` clusters (item i in cluster (i-1) mod K); each item has 3
  fixed successors in its own cluster with probabilities (.5, .3, .2). User u draws cluster preferences
  pi_u ~ Dirichlet(0.2) and a length L ~ U{min_length..max_length}; the first item is a random item of a
  cluster drawn from pi_u; each next item follows a successor w.p. ``p_follow``, else jumps to a random item
  of a cluster drawn from pi_u w.p. ``p_jump``, else is uniform. ``regime: setlike`` is (0.3, 0.6) (order
  matters little: a user is a bag of preferred clusters), ``regime: markov`` is (0.75, 0.15). Seeded.
* ``recbole``: ``data_dir/<dataset>.inter`` (RecBole atomic file), sorted by timestamp per user.
* ``sasrec_txt``: ``data_dir/<dataset>.txt``, ``user item`` lines in chronological order (SASRec format).
* ``rsir_pth``: RSIR's released ``train.pth`` / ``val.pth`` / ``test.pth`` lists (``train_file`` may name a
  pre-generated ``train_1th.pth``), read with ``torch.load(weights_only=True)``. Train rows are
  ``[user, history (right-padded), target (shifted), seq_len, label, domain]``, the full sequence being
  ``history[:seq_len] + [target[seq_len - 1]]``; val/test rows ``[user, history, target_item, ...]`` are used
  as given (their own histories).
* ``movielens100k``: ``ml-100k.inter`` from an installed ``recbole`` package (optional smoke test; never
  downloaded or vendored: the MovieLens licence forbids redistribution).

Split (all sources except ``rsir_pth``): leave-one-out; train = seq[:-2], valid target = seq[-2] (history
seq[:-2]), test target = seq[-1] (history seq[:-1]). Users with fewer than 3 interactions are **dropped**
(their count is logged and kept in ``dropped_users``); SASRec's own code puts them entirely into training,
which changes nothing in evaluation but is a different training set, so this is a documented deviation.
File ids are mapped to contiguous ids 1..N in order of first appearance.

Batches: training ``(input, target)``, both (B, max_len) and LEFT-padded with 0: the next item at every
position (input = s[:-1], target = s[1:] of the most recent ``max_len + 1`` items of a training sequence s;
target 0 = ignore). Evaluation ``(history, target, index)``: history (B, max_len) left-padded (most recent items),
target (B,), index (B,) the row's position in its split (the global index that seeds a user's sampled-protocol
negatives and drops the sampler's padding copies, so 1 and N processes evaluate alike). ``predict_dataloader`` is
the test loader.

RSIR API: ``training_sequences`` (the current list, original first), ``add_training_sequences(list of 1-D
LongTensors)`` (appended as pseudo-users, counted and capped by ``max_total_sequences`` with an error that
names the fix), ``reset_training_sequences()``, and ``synthetic_from`` (a text file, one sequence of item
ids per line, as written by ``callbacks.rsir.RSIRSelfImprovement``), which is how round k of a config chain
trains on the data of round k-1. The training order of epoch e is a pure function of (seed, e)
(`EpochShuffleSampler`), so resuming is exact.
"""
from __future__ import annotations

import glob
import logging
import os
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from datamodules.sampling import evaluation_sampler, training_sampler
from datamodules.recsys_files import (chronological_sequences, movielens_100k_path, read_pairs,
                                      read_recbole_inter)
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)

SOURCES = ("synthetic", "recbole", "sasrec_txt", "rsir_pth", "movielens100k")
REGIMES = {"setlike": (0.3, 0.6), "markov": (0.75, 0.15)}


# =============================================================================== synthetic generator
def clustered_markov_sequences(num_users: int, num_items: int, num_clusters: int, min_length: int,
                               max_length: int, p_follow: float, p_jump: float, seed: int) -> list[np.ndarray]:
    """The clustered Markov generator (vectorised over users); items 1..num_items."""
    rng = np.random.default_rng(seed)
    items = np.arange(1, num_items + 1)
    cluster_of = (items - 1) % num_clusters
    members = [items[cluster_of == c] for c in range(num_clusters)]
    successors = np.stack([rng.choice(members[cluster_of[i - 1]][members[cluster_of[i - 1]] != i], 3,
                                      replace=False) for i in items])          # (N, 3)
    prefs = rng.dirichlet(np.full(num_clusters, 0.2), size=num_users)          # (U, K)
    lengths = rng.integers(min_length, max_length + 1, size=num_users)
    cum = prefs.cumsum(1)

    def from_preferred_cluster() -> np.ndarray:
        clusters = np.minimum((rng.random((num_users, 1)) > cum).sum(1), num_clusters - 1)
        sizes = np.array([len(members[c]) for c in clusters])
        offsets = (rng.random(num_users) * sizes).astype(int)
        return np.array([members[c][o] for c, o in zip(clusters, offsets)])

    seq = np.zeros((num_users, max_length), dtype=np.int64)
    seq[:, 0] = from_preferred_cluster()
    for t in range(1, max_length):
        u = rng.random(num_users)
        follow = successors[seq[:, t - 1] - 1, np.minimum((rng.random(num_users)[:, None] > [0.5, 0.8]).sum(1), 2)]
        jump = from_preferred_cluster()
        uniform = rng.integers(1, num_items + 1, size=num_users)
        seq[:, t] = np.where(u < p_follow, follow, np.where(u < p_follow + p_jump, jump, uniform))
    return [seq[i, :lengths[i]] for i in range(num_users)]


# ================================================================================== padding helpers
def left_pad(rows: list[Tensor], length: int) -> Tensor:
    """Stack the last `length` items of each 1-D tensor, left-padded with 0, into (len(rows), length)."""
    out = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[-length:]
        if len(row):
            out[i, length - len(row):] = row
    return out


def training_pairs(sequences: list[Tensor], max_len: int) -> tuple[Tensor, Tensor]:
    """(input, target) next-item matrices of the training sequences with >= 2 items, left-padded."""
    usable = [s for s in sequences if len(s) >= 2]
    if not usable:
        return torch.zeros(0, max_len, dtype=torch.long), torch.zeros(0, max_len, dtype=torch.long)
    windows = [s[-(max_len + 1):] for s in usable]
    return left_pad([w[:-1] for w in windows], max_len), left_pad([w[1:] for w in windows], max_len)


# ===================================================================================== datamodule
class SequentialRecDataModule(LightningDataModule):
    """Leave-one-out sequential recommendation data (see the module docstring).

    Args:
        source: ``synthetic`` | ``recbole`` | ``sasrec_txt`` | ``rsir_pth`` | ``movielens100k``.
        data_dir: folder of the file sources. dataset: file stem (``<dataset>.inter`` / ``<dataset>.txt``);
            None = the only such file in data_dir.
        train_file: RSIR training file inside data_dir (``train.pth``, or a released ``train_1th.pth`` ...).
        regime / synthetic_users / synthetic_items / synthetic_clusters / synthetic_min_length /
            synthetic_max_length: the synthetic generator (named apart from the model's ``num_items``, which
            Lightning merges with these hyper-parameters; the data's item count is the ``num_items`` attribute).
        seed: generator seed and the seed of the epoch shuffle.
        max_len: window length (most recent items kept).
        batch_size / eval_batch_size / num_workers: loaders.
        synthetic_from: text file of synthetic sequences (one per line) appended to training (RSIR rounds).
        max_total_sequences: cap on the number of training sequences (original + synthetic).
    """

    def __init__(self, source: Literal["synthetic", "recbole", "sasrec_txt", "rsir_pth", "movielens100k"] = "synthetic",
                 data_dir: str | None = None, dataset: str | None = None, train_file: str = "train.pth",
                 regime: str = "setlike", synthetic_users: int = 1500, synthetic_items: int = 400,
                 synthetic_clusters: int = 8, synthetic_min_length: int = 4, synthetic_max_length: int = 10,
                 seed: int = 0, max_len: int = 20,
                 batch_size: int = 64, eval_batch_size: int = 512, num_workers: int = 0,
                 synthetic_from: str | None = None, max_total_sequences: int = 200_000) -> None:
        super().__init__()
        if source not in SOURCES:
            raise UserInputError(f"data source {source!r} is unknown: choose one of {', '.join(SOURCES)}.")
        if regime not in REGIMES:
            raise UserInputError(f"regime={regime!r} is unknown: choose 'setlike' or 'markov'.")
        for name, value, low in (("synthetic_users", synthetic_users, 1), ("synthetic_items", synthetic_items, 2),
                                 ("synthetic_clusters", synthetic_clusters, 1),
                                 ("synthetic_min_length", synthetic_min_length, 3),
                                 ("max_len", max_len, 1), ("batch_size", batch_size, 1),
                                 ("eval_batch_size", eval_batch_size, 1), ("num_workers", num_workers, 0),
                                 ("max_total_sequences", max_total_sequences, 1)):
            check_range(name, value, low)
        check_range("synthetic_max_length", synthetic_max_length, synthetic_min_length)
        if source == "synthetic" and synthetic_items // synthetic_clusters < 4:
            raise UserInputError(f"synthetic_items={synthetic_items} gives fewer than 4 items per cluster with "
                                 f"synthetic_clusters={synthetic_clusters}; each item needs 3 successors in its "
                                 "cluster.")
        if source in ("recbole", "sasrec_txt", "rsir_pth") and not data_dir:
            raise UserInputError(f"source={source!r} reads local files: set data.init_args.data_dir.")
        self.save_hyperparameters()
        self.source, self.data_dir, self.seed, self.max_len = source, data_dir, seed, max_len
        self.batch_size, self.eval_batch_size, self.num_workers = batch_size, eval_batch_size, num_workers
        self.max_total_sequences = max_total_sequences
        self.dropped_users = 0
        train, valid, test, self.num_items = self._load(
            source, data_dir, dataset, train_file, regime, synthetic_users, synthetic_items, synthetic_clusters,
            synthetic_min_length, synthetic_max_length, seed)
        self.original_sequences: list[Tensor] = train
        self.training_sequences: list[Tensor] = list(train)
        self.valid_history, self.valid_target = left_pad([h for h, _ in valid], max_len), \
            torch.tensor([t for _, t in valid], dtype=torch.long)
        self.test_history, self.test_target = left_pad([h for h, _ in test], max_len), \
            torch.tensor([t for _, t in test], dtype=torch.long)
        self.num_users = len(train)
        log.info("%s data: %d users, %d items, %d training sequences (%d users with < 3 items dropped)", source,
                 self.num_users, self.num_items, len(train), self.dropped_users)
        self._train_set: TensorDataset | None = None
        if synthetic_from is not None:
            self.add_training_sequences(read_sequence_file(synthetic_from, self.num_items))

    # ------------------------------------------------------------------------------------ loading
    def _load(self, source, data_dir, dataset, train_file, regime, num_users, num_items, num_clusters,
              min_length, max_length, seed):
        if source == "rsir_pth":
            return _load_rsir_pth(data_dir, train_file)
        if source == "synthetic":
            p_follow, p_jump = REGIMES[regime]
            raw = clustered_markov_sequences(num_users, num_items, num_clusters, min_length, max_length,
                                             p_follow, p_jump, seed)
            count = num_items
        else:
            if source == "movielens100k":
                data = read_recbole_inter(movielens_100k_path())
            elif source == "recbole":
                data = read_recbole_inter(_find_file(data_dir, dataset, "inter"))
            else:
                data = read_pairs(_find_file(data_dir, dataset, "txt"), field_counts=(2,))
            raw = [s + 1 for s in chronological_sequences(data)]  # ids 1..N, 0 = padding
            count = data.num_items
        kept = [torch.as_tensor(np.asarray(s), dtype=torch.long) for s in raw if len(s) >= 3]
        self.dropped_users = len(raw) - len(kept)
        if self.dropped_users:
            log.warning("dropped %d users with fewer than 3 interactions (leave-one-out needs 3)", self.dropped_users)
        if not kept:
            raise UserInputError(f"{source}: no user has 3 or more interactions, so leave-one-out has nothing "
                                 "to train or evaluate on.")
        train = [s[:-2] for s in kept]
        valid = [(s[:-2], int(s[-2])) for s in kept]
        test = [(s[:-1], int(s[-1])) for s in kept]
        return train, valid, test, count

    # ------------------------------------------------------------------------------------ RSIR API
    def add_training_sequences(self, sequences: list[Tensor]) -> None:
        """Append synthetic pseudo-users (1-D LongTensors of item ids in 1..num_items)."""
        new = []
        for i, s in enumerate(sequences):
            s = torch.as_tensor(s, dtype=torch.long).flatten()
            if len(s) and (s.min() < 1 or s.max() > self.num_items):
                raise UserInputError(f"synthetic sequence {i} has item ids outside 1..{self.num_items}: it was "
                                     "generated for different data (check synthetic_from / the generator).")
            new.append(s)
        total = len(self.training_sequences) + len(new)
        if total > self.max_total_sequences:
            raise UserInputError(f"adding {len(new)} synthetic sequences would make {total} training sequences, "
                                 f"over max_total_sequences={self.max_total_sequences}. Raise "
                                 "data.init_args.max_total_sequences, or generate less (smaller m, a fidelity "
                                 "threshold tau, fewer rounds).")
        self.training_sequences.extend(new)
        self._train_set = None
        lengths = [len(s) for s in new]
        log.info("added %d synthetic training sequences (mean length %.2f): %d in total (%d original)", len(new),
                 float(np.mean(lengths)) if lengths else 0.0, total, len(self.original_sequences))

    def reset_training_sequences(self) -> None:
        """Back to the original training data (drops every synthetic sequence)."""
        self.training_sequences = list(self.original_sequences)
        self._train_set = None

    @property
    def synthetic_sequences(self) -> list[Tensor]:
        return self.training_sequences[len(self.original_sequences):]

    # ------------------------------------------------------------------------------------ loaders
    @property
    def train_set(self) -> TensorDataset:
        if self._train_set is None:
            self._train_set = TensorDataset(*training_pairs(self.training_sequences, self.max_len))
        return self._train_set

    def train_dataloader(self) -> DataLoader:
        sampler = training_sampler(len(self.train_set), self.seed, self.trainer)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def _eval_loader(self, history: Tensor, target: Tensor) -> DataLoader:
        dataset = TensorDataset(history, target, torch.arange(len(target)))
        return DataLoader(dataset, batch_size=self.eval_batch_size, sampler=evaluation_sampler(dataset, self.trainer),
                          shuffle=False, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.valid_history, self.valid_target)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_history, self.test_target)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()


# ================================================================================== file helpers
def _find_file(data_dir: str, dataset: str | None, ext: str) -> str:
    if not os.path.isdir(data_dir):
        raise UserInputError(f"data_dir '{data_dir}' is not a folder: it must hold <dataset>.{ext}.")
    if dataset is not None:
        path = os.path.join(data_dir, f"{dataset}.{ext}")
        if not os.path.isfile(path):
            raise UserInputError(f"'{path}' does not exist: put the {ext} file there or fix data.init_args.dataset.")
        return path
    found = sorted(glob.glob(os.path.join(data_dir, f"*.{ext}")))
    if len(found) != 1:
        raise UserInputError(f"data_dir '{data_dir}' holds {len(found)} *.{ext} files ({found[:4]}); name one "
                             "with data.init_args.dataset=<stem>.")
    return found[0]


def read_sequence_file(path: str, num_items: int) -> list[Tensor]:
    """One sequence per line, whitespace-separated item ids in 1..num_items (written by write_sequence_file)."""
    if not os.path.isfile(path):
        raise UserInputError(f"synthetic_from '{path}' does not exist: it is written by the RSIRSelfImprovement "
                             "callback of the previous round (its output_path).")
    out = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            try:
                ids = [int(t) for t in line.split()]
            except ValueError:
                raise UserInputError(f"{path}, line {line_number}: expected whitespace-separated integer item "
                                     "ids.") from None
            if not ids:
                continue
            if min(ids) < 1 or max(ids) > num_items:
                raise UserInputError(f"{path}, line {line_number}: item ids must lie in 1..{num_items} (the "
                                     "file was generated for different data).")
            out.append(torch.tensor(ids, dtype=torch.long))
    return out


def write_sequence_file(path: str, sequences: list[Tensor]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for s in sequences:
            f.write(" ".join(str(int(i)) for i in s) + "\n")


def _load_rsir_pth(data_dir: str, train_file: str):
    def load(name: str) -> list:
        path = os.path.join(data_dir, name)
        if not os.path.isfile(path):
            raise UserInputError(f"'{path}' does not exist: source 'rsir_pth' needs {train_file}, val.pth and "
                                 "test.pth from the RSIR release (dataset/<name>/<domain>/).")
        try:
            rows = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling problem is a bad file for the user
            raise UserInputError(f"'{path}' could not be read as a plain list with torch.load(weights_only=True) "
                                 f"({type(err).__name__}): it must be a list of [user, history, target, seq_len, "
                                 "...] rows of ints and int lists.") from None
        if not isinstance(rows, list) or not rows:
            raise UserInputError(f"'{path}' is not a non-empty list of rows (got {type(rows).__name__}).")
        return rows

    def field(path, i, row, k, kind):
        value = row[k] if isinstance(row, (list, tuple)) and len(row) > 3 else None
        if hasattr(value, "tolist"):
            value = value.tolist()
        if kind == "int":
            ok = isinstance(value, int)
        else:
            ok = isinstance(value, list) and all(isinstance(v, int) for v in value)
        if not ok:
            what = "an int" if kind == "int" else "a list of ints"
            raise UserInputError(f"{path}, row {i}: field {k} must be {what} "
                                 "(RSIR format [user, history, target, seq_len, label, domain]).")
        return value

    train, valid, test, top = [], [], [], 0
    for i, row in enumerate(load(train_file)):
        hist, tgt, n = (field(train_file, i, row, 1, "list"), field(train_file, i, row, 2, "list"),
                        field(train_file, i, row, 3, "int"))
        if not 1 <= n <= len(hist):
            raise UserInputError(f"{train_file}, row {i}: seq_len {n} does not fit the history of length {len(hist)}.")
        seq = hist[:n] + [tgt[n - 1]]
        top = max(top, max(seq))
        train.append(torch.tensor(seq, dtype=torch.long))
    for name, out in (("val.pth", valid), ("test.pth", test)):
        for i, row in enumerate(load(name)):
            hist, tgt = field(name, i, row, 1, "list"), field(name, i, row, 2, "int")
            items = [h for h in hist if h != 0]
            top = max(top, tgt, *items) if items else max(top, tgt)
            out.append((torch.tensor(items, dtype=torch.long), tgt))
    return train, valid, test, top
