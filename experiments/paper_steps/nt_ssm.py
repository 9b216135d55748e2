"""NT-SSM's paper config on the release's MovieLens-1M split (github.com/geon0325/NT-SSM, ``dataset/ml-1m``).

The release ships ``train.txt``, ``valid.txt`` and ``test.txt``, one ``user item 1`` line per interaction
(space-separated, 0-indexed ids, read by SELFRec's ``FileIO.load_data_set``). Its training split holds 6,039 users
and 3,583 items (the shapes of the released ``embs/ml-1m_LightGCN_NT_...pkl`` embedding tables), so the written
split uses exactly those ids, every one of them in ``train.txt``, with MovieLens-1M's scale of about one million
interactions.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

USERS, ITEMS = 6039, 3583  # the release's ml-1m training split (its embedding tables)
PER_USER = (132, 16, 16)  # train / valid / test items per user: ~1M interactions, 80/10/10
FORMAT = ("NT-SSM release dataset/ml-1m/{train,valid,test}.txt: 'user item 1' lines, 0-indexed, 6,039 users x "
          "3,583 items, 132/16/16 interactions per user (990,396 in all)")


def write_ml1m(root: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    popularity = 1.0 / np.arange(1, ITEMS + 1) ** 0.8
    popularity /= popularity.sum()
    per_user = [rng.choice(ITEMS, sum(PER_USER), replace=False, p=popularity) for _ in range(USERS)]
    cut = np.cumsum(PER_USER)
    # item i is one of user (i mod USERS)'s train items, so every id of the release occurs in train.txt
    for item in range(ITEMS):
        items = per_user[item % USERS]
        if item not in items[:cut[0]]:
            where = np.flatnonzero(items == item)
            if where.size:  # swap it into the train part
                items[where[0]], items[0] = items[0], item
            else:
                items[0] = item
    for name, lo, hi in (("train", 0, cut[0]), ("valid", cut[0], cut[1]), ("test", cut[1], cut[2])):
        with open(root / f"{name}.txt", "w") as f:
            f.writelines(f"{u} {i} 1\n" for u in range(USERS) for i in per_user[u][lo:hi])
    return root


def ml1m(folder: Path) -> list[str]:
    return [f"--data.init_args.data_dir={write_ml1m(folder / 'dataset' / 'ml-1m')}"]


CASES = {"configs/nt_ssm/paper.yaml": Case(ml1m, release_format=FORMAT, test_args=(
    "--data.init_args.batch_size=256", "--data.init_args.eval_batch_size=256"))}
