"""Readers of public recommendation file formats: ids, order and every error path."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from datamodules.recsys_files import chronological_sequences, read_pairs, read_recbole_inter
from lightning_modules.shared.errors import UserInputError


def test_recbole_inter_is_read_and_sorted_by_time(tmp_path):
    path = tmp_path / "toy.inter"
    path.write_text("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                    "u1\ta\t5\t30\nu2\tb\t3\t10\nu1\tb\t4\t10\nu1\tc\t4\t20\n")
    data = read_recbole_inter(str(path))
    assert (data.num_users, data.num_items) == (2, 3)
    sequences = chronological_sequences(data)
    assert [s.tolist() for s in sequences] == [[1, 2, 0], [1]]  # u1: b(10) c(20) a(30); u2: b


@pytest.mark.parametrize("content, message", [
    ("user:token\titem_id:token\n1\t2\n", "no 'user_id:token' column"),
    ("user_id:token\titem_id:token\n1\t2\t3\n", "line 2: 3 fields"),
    ("user_id:token\titem_id:token\ttimestamp:float\n1\t2\tyesterday\n", "line 2: timestamp 'yesterday'"),
    ("user_id:token\titem_id:token\n", "no interactions"),
])
def test_recbole_inter_errors_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.inter"
    path.write_text(content)
    with pytest.raises(UserInputError, match=message):
        read_recbole_inter(str(path))


def test_pairs_keep_file_order_and_reject_bad_lines(tmp_path):
    path = tmp_path / "seq.txt"
    path.write_text("7 3\n7 1\n9 3 1\n\n7 2\n")
    data = read_pairs(str(path))
    assert np.array_equal(data.users, [0, 0, 1, 0]) and np.array_equal(data.items, [0, 1, 0, 2])
    assert [s.tolist() for s in chronological_sequences(data)] == [[0, 1, 2], [0]]
    path.write_text("7 3\n7\n")
    with pytest.raises(UserInputError, match="line 2: expected 2 or 3"):
        read_pairs(str(path))
    with pytest.raises(UserInputError, match="does not exist"):
        read_pairs(str(tmp_path / "missing.txt"))


@pytest.mark.skipif(importlib.util.find_spec("recbole") is None,
                    reason="optional real-data smoke test: pip install --no-deps recbole (ships MovieLens-100k)")
def test_movielens_100k_smoke():
    """MovieLens-100k from an installed recbole wheel (never vendored): both recommendation datamodules read it."""
    from datamodules.interaction_graph import GraphRecDataModule
    from datamodules.sequences import SequentialRecDataModule

    sequences = SequentialRecDataModule(source="movielens100k")
    assert (sequences.num_users, sequences.num_items) == (943, 1682)
    graph = GraphRecDataModule(source="movielens100k")
    graph.setup("fit")
    assert graph.num_users == 943 and 1600 <= graph.num_items <= 1682  # items unseen in train are dropped
