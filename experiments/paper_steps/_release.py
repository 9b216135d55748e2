"""Release-format writers that more than one paper's cases use."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def cifar10_python(root: Path, train_per_batch: int = 64, test: int = 64, seed: int = 0) -> Path:
    """``cifar-10-batches-py`` as the official "python version" lays it out: ``data_batch_1..5`` and ``test_batch``,
    Python pickles of dicts with byte keys (``b'data'``: N x 3072 uint8, channel-major 3x32x32; ``b'labels'``;
    ``b'batch_label'``, ``b'filenames'``) plus ``batches.meta`` with the ten label names."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int, name: str) -> dict:
        labels = (np.arange(n) % 10).tolist()
        return {b"batch_label": name.encode(), b"labels": labels,
                b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                b"filenames": [f"img_{i:05d}.png".encode() for i in range(n)]}

    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(train_per_batch, f"training batch {i} of 5"), 2))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(test, "testing batch 1 of 1"), 2))
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": names, b"num_cases_per_batch": 10000,
                                                        b"num_vis": 3072}, 2))
    return folder
