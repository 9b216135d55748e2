"""RSIR's paper config on the RSIR release's Amazon-Beauty split (``dataset/amazon-beauty/beauty/``).

The release (github.com/USTC-StarTeam/RSIR) stores ``train.pth``, ``val.pth`` and ``test.pth`` as ``torch.save``d
Python lists. A training row is ``[user, history, target, seq_len, label, domain]`` with ``history`` and
``target`` (the history shifted by one) right-padded with 0 to ``max_seq_len`` = 50, ``label`` = ``[1] * seq_len``
then zeros, ``domain`` = 50 domain ids (1), exactly as ``model/basemodel.py::generate_and_save_sequences_parallel``
writes them. Evaluation rows are ``[user, history, target_item, seq_len, label, domain]``. Items are 1..12,101
(Amazon Beauty 5-core), 0 is padding.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from experiments.paper_steps import Case

ITEMS, MAX_LEN = 12101, 50
FORMAT = ("RSIR release amazon-beauty/beauty/{train,val,test}.pth: torch.save'd lists of [user, history (50, "
          "right-padded), target (50), seq_len, label (50), domain (50)] rows (eval: target item); items 1..12,101; "
          "256 train / 64 val / 64 test users")


def _row(user: int, seq: list[int], evaluation: bool) -> list:
    history = seq[:-1][-MAX_LEN:]
    n = len(history)
    pad = [0] * (MAX_LEN - n)
    label, domain = [1] * n + pad, [1] * MAX_LEN
    target = seq[-1] if evaluation else seq[1:][-MAX_LEN:] + pad
    return [user, history + pad, target, n, label, domain]


def write_beauty(root: Path, users: int = 256, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    sequences = [rng.integers(1, ITEMS + 1, int(rng.integers(5, 60))).tolist() for _ in range(users)]
    sequences[0][-1] = ITEMS  # the largest item id occurs, so the model is built for all 12,101 items
    train = [_row(u, s[:-2], False) for u, s in enumerate(sequences)]
    val = [_row(u, s[:-1], True) for u, s in enumerate(sequences[:64])]
    test = [_row(u, s, True) for u, s in enumerate(sequences[:64])]
    for name, rows in (("train", train), ("val", val), ("test", test)):
        torch.save(rows, root / f"{name}.pth")
    return root


def beauty(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={write_beauty(folder / 'data' / 'rsir' / 'Beauty' / 'beauty')}",
            "--data.init_args.num_workers=0"]


CASES = {"configs/rsir/paper.yaml": Case(beauty, release_format=FORMAT, test_args=(
    "--data.init_args.batch_size=32", "--data.init_args.eval_batch_size=64"))}
