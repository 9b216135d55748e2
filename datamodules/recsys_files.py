"""Readers for public implicit-feedback file formats shared by the recommendation datamodules.

Every reader maps the file's raw user and item tokens to contiguous ids in order of first appearance, and
fails with a `UserInputError` naming the file, the line and the problem; nothing is skipped silently.
Nothing is downloaded: MovieLens-100k is found only inside an installed package that ships it (its licence
forbids redistribution, so it is never copied into this repository).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from lightning_modules.shared.errors import UserInputError


@dataclass
class Interactions:
    """Parallel arrays of (user, item[, timestamp]) with contiguous 0-based ids."""

    users: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray | None
    num_users: int
    num_items: int


def _contiguous(tokens: list[str]) -> tuple[np.ndarray, int]:
    mapping: dict[str, int] = {}
    ids = np.fromiter((mapping.setdefault(t, len(mapping)) for t in tokens), dtype=np.int64, count=len(tokens))
    return ids, len(mapping)


def read_recbole_inter(path: str) -> Interactions:
    """RecBole atomic ``.inter`` file: a tab-separated header ``user_id:token item_id:token [timestamp:float] ...``."""
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' does not exist: expected a RecBole atomic file <name>.inter with a header "
                             "like 'user_id:token<TAB>item_id:token<TAB>timestamp:float'.")
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":")[0] for h in header]
        for required in ("user_id", "item_id"):
            if required not in names:
                raise UserInputError(f"{path}, line 1: the header {header} has no '{required}:token' column "
                                     "(RecBole atomic format, tab-separated).")
        u_col, i_col = names.index("user_id"), names.index("item_id")
        t_col = names.index("timestamp") if "timestamp" in names else None
        users, items, stamps = [], [], []
        for line_number, line in enumerate(f, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(header):
                raise UserInputError(f"{path}, line {line_number}: {len(fields)} fields, the header has "
                                     f"{len(header)} (tab-separated).")
            users.append(fields[u_col])
            items.append(fields[i_col])
            if t_col is not None:
                try:
                    stamps.append(float(fields[t_col]))
                except ValueError:
                    raise UserInputError(f"{path}, line {line_number}: timestamp '{fields[t_col]}' is not a "
                                         "number.") from None
    if not users:
        raise UserInputError(f"{path} has a header but no interactions.")
    user_ids, num_users = _contiguous(users)
    item_ids, num_items = _contiguous(items)
    return Interactions(user_ids, item_ids, np.asarray(stamps) if t_col is not None else None, num_users, num_items)


def iter_fields(path: str):
    """Yield ``(line_number, whitespace-separated fields)`` of every non-blank line of a text file."""
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            fields = line.split()
            if fields:  # blank lines carry no interaction
                yield line_number, fields


def read_pairs(path: str, field_counts: tuple[int, ...] = (2, 3)) -> Interactions:
    """Whitespace-separated ``user item`` lines (SASRec format; or ``user item 1`` triplets), in file order."""
    if not os.path.isfile(path):
        raise UserInputError(f"'{path}' does not exist: expected whitespace-separated 'user item' lines.")
    users, items = [], []
    for line_number, fields in iter_fields(path):
        if len(fields) not in field_counts:
            raise UserInputError(f"{path}, line {line_number}: expected {' or '.join(map(str, field_counts))} "
                                 f"whitespace-separated fields ('user item'), got {len(fields)}.")
        users.append(fields[0])
        items.append(fields[1])
    if not users:
        raise UserInputError(f"{path} holds no interactions.")
    user_ids, num_users = _contiguous(users)
    item_ids, num_items = _contiguous(items)
    return Interactions(user_ids, item_ids, None, num_users, num_items)


def movielens_100k_path() -> str:
    """Path of MovieLens-100k's ``ml-100k.inter`` inside an installed ``recbole`` package (never downloaded)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError("MovieLens-100k is read from the recbole package, which is not installed. Install it "
                             "without its heavy dependencies: pip install --no-deps recbole")
    path = os.path.join(spec.submodule_search_locations[0], "dataset_example", "ml-100k", "ml-100k.inter")
    if not os.path.isfile(path):
        raise UserInputError(f"the installed recbole package has no '{path}'.")
    return path


def chronological_sequences(data: Interactions) -> list[np.ndarray]:
    """Each user's items sorted by timestamp (stable: file order breaks ties and stands in for no timestamp)."""
    order = np.lexsort((np.arange(len(data.users)),
                        data.timestamps if data.timestamps is not None else np.zeros(len(data.users)), data.users))
    users, items = data.users[order], data.items[order]
    boundaries = np.flatnonzero(np.diff(users)) + 1
    return np.split(items, boundaries)
