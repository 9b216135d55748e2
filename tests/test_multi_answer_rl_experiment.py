"""The multi-answer RL experiment trains on one prompt set and reports on held-out prompts (fast: no training)."""
from __future__ import annotations

from argparse import Namespace
from functools import lru_cache

import pytest

from experiments import multi_answer_rl as exp
from experiments.kit import from_config


@lru_cache(maxsize=None)
def _datamodule(seed: int, fmt: str, split: str):
    _, dm = from_config(exp.SFT_CONFIG if split == "sft" else exp.RL_CONFIG,
                        *exp._data_overrides(fmt, seed, 199), f"--data.init_args.train_split={split}")
    return dm


@pytest.mark.parametrize("seed", [0, 1])
def test_train_validation_and_test_prompts_are_disjoint_and_training_reads_only_train(seed):
    sft = _datamodule(seed, "multi", "sft")
    rl = _datamodule(seed, "single", "rl")
    pools = exp.split_prompts(rl, seed)
    ids = {name: {e.id for e in pool} for name, pool in pools.items()}
    questions = {name: {e.question for e in pool} for name, pool in pools.items()}
    assert len(ids["train"]) == 73 and len(ids["validation"]) == len(ids["test"]) == 37
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert not ids[a] & ids[b] and not questions[a] & questions[b], (a, b)
    # both warm-ups and every RL arm draw the same split (it depends on the seed only)
    assert exp.split_prompts(sft, seed) == pools
    # what training reads: SFT targets and GRPO batches come from the training prompts only
    assert {row["prompt"] for row in sft.sft_examples} == questions["train"]
    seen = {int(i) for batch in rl.train_dataloader() for i in batch["prompt_ids"]}
    assert seen == ids["train"]
    # the final evaluation loader serves exactly the test prompts
    served = {int(i) for batch in exp.pool_loader(rl, pools["test"]) for i in batch["prompt_ids"]}
    assert served == ids["test"]


def test_splits_differ_across_seeds():
    a = exp.split_prompts(_datamodule(0, "single", "rl"), 0)
    b = exp.split_prompts(_datamodule(1, "single", "rl"), 1)
    assert {e.id for e in a["test"]} != {e.id for e in b["test"]}


class _Recorder:
    """Stands in for the policy module: records which prompt ids each evaluation scores."""

    def __init__(self):
        self.training, self.scored = False, []

    def eval(self):
        pass

    def train(self, mode):
        pass

    def set_tokenizer(self, tokenizer):
        pass

    def new_accumulator(self):
        class Acc:
            def compute(self):
                return {"coverage": 0.5, "set_brier": 0.1, "duplicate_rate": 0.0}
        return Acc()

    def score_sets(self, batch, accumulator, sets, temperature, generator):
        self.scored.extend(int(i) for i in batch["prompt_ids"])


def test_reported_metrics_come_from_test_prompts_and_curves_from_validation():
    dm = _datamodule(0, "single", "rl")
    pools = exp.split_prompts(dm, 0)
    module = _Recorder()
    metrics = exp.final_metrics(module, dm, pools, Namespace(eval_sets=1), 0)
    test_ids, train_ids = [e.id for e in pools["test"]], [e.id for e in pools["train"]]
    assert module.scored == test_ids + train_ids or module.scored == train_ids + test_ids
    assert set(metrics) == {"coverage", "set_brier", "duplicate_rate", "train_coverage", "train_set_brier"}
    curve, module.scored = exp.Curve(dm, pools["validation"], every=1, sets=1, seed=0), []
    curve.on_train_start(None, module)
    assert module.scored == [e.id for e in pools["validation"]]
