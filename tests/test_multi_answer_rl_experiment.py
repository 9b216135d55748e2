"""The multi-answer RL experiment (``configs/multi_answer_rl/experiment.yaml`` + the hooks in
experiments/multi_answer_rl.py) trains on one prompt set and reports on held-out prompts; its arms are the documented
ones, each starting from its format's warm-up (fast: no training). Slow tests run the smoke experiment through the
runner, pinned to the numbers of the pre-conversion script."""
from __future__ import annotations

import math
from functools import lru_cache
from types import SimpleNamespace

import pytest

from experiments import kit, runner
from experiments import multi_answer_rl as exp

GRPO_ARMS = [exp.SINGLE, "Multi-RLVR (any)", "Multi-RLVR (count)", "Multi-RLCR", "Multi-RLCR (count accuracy)",
             "Multi-RLCR, no sum(p)<=1 gate (ablation)"]
WARM_UP_ROWS = ["SFT warm-up, single (K samples)", "SFT warm-up, multi"]


def arms(smoke: bool = False) -> dict[str, runner.Arm]:
    return {arm.name: arm for arm in runner.load_spec("multi_answer_rl", smoke=smoke).arms}


def resolved(arm: runner.Arm, smoke: bool = False) -> dict:
    """The arm's effective overrides (experiment, arm, smoke layers) as the runner applies them."""
    return runner.arm_overrides(runner.load_spec("multi_answer_rl", smoke=smoke), arm)


@lru_cache(maxsize=None)
def _cli(seed: int, arm: str):
    spec = runner.load_spec("multi_answer_rl")
    with runner.isolated():
        return runner.build_cli(runner.arm_flags(spec, arms()[arm]) + runner.QUIET, seed, kit.REPO_ROOT / "runs/x")


def _datamodule(seed: int, arm: str):
    return _cli(seed, arm).datamodule


def test_spec_arms_and_sizes_are_the_documented_ones():
    spec = runner.load_spec("multi_answer_rl")
    assert spec.seeds == 5 and spec.baseline == exp.SINGLE and set(spec.hooks) == set(runner.HOOKS)
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    assert [a.name for a in spec.arms] == ["sft_single", "sft_multi", *WARM_UP_ROWS, *GRPO_ARMS]
    by_name = arms()
    assert [a.name for a in spec.arms if not a.row] == ["sft_single", "sft_multi"]
    assert [a.name for a in spec.arms if not a.fit] == WARM_UP_ROWS                 # evaluated as they are
    for name, fmt, tokens in (("sft_single", "single", 6), ("sft_multi", "multi", 16)):
        values = resolved(by_name[name])
        assert by_name[name].configs == ["configs/multi_answer_rl/sft_quick.yaml"]
        assert values["trainer.max_steps"] == 800
        assert values["data.init_args.target_format"] == fmt and values["model.init_args.max_new_tokens"] == tokens
    parents = spec.settings["init_from"]
    order = [a.name for a in spec.arms]
    assert set(parents) == set(WARM_UP_ROWS + GRPO_ARMS)
    for child, parent in parents.items():
        assert order.index(parent) < order.index(child)
        fmt = resolved(by_name[child])["data.init_args.target_format"]
        assert parent == f"sft_{fmt}" and resolved(by_name[child])["model.init_args.answer_format"] == fmt, child
    for name in GRPO_ARMS:
        values = resolved(by_name[name])
        assert values["trainer.max_epochs"] == 20 and values["trainer.max_steps"] == -1   # 20 x 5 = 100 steps
        assert values["model.init_args.rollouts_per_prompt"] == 8 and values["model.init_args.eval_samples"] == 8
        assert values["model.init_args.optimizer.init_args.lr"] == 0.001
        assert values["trainer.callbacks+"]["init_args"] == {"every": 25, "sets": 2}
    modes = {name: resolved(by_name[name]).get("model.init_args.reward.init_args.mode") for name in GRPO_ARMS}
    assert modes == {exp.SINGLE: None, "Multi-RLVR (any)": "rlvr_any", "Multi-RLVR (count)": "rlvr_count",
                     "Multi-RLCR": "rlcr", "Multi-RLCR (count accuracy)": "rlcr",
                     "Multi-RLCR, no sum(p)<=1 gate (ablation)": "rlcr"}
    assert resolved(by_name[exp.SINGLE])["model.init_args.reward"] == "lightning_modules.rlvr.grpo.ExactMatchReward"
    assert resolved(by_name["Multi-RLCR, no sum(p)<=1 gate (ablation)"])[
        "model.init_args.reward.init_args.confidence_sum_constraint"] is False
    assert resolved(by_name["Multi-RLCR (count accuracy)"])["model.init_args.reward.init_args.accuracy"] == "count"


def test_smoke_keeps_the_warm_ups_and_two_arms_and_is_tiny():
    spec = runner.load_spec("multi_answer_rl", smoke=True)
    assert spec.seeds == 1
    assert [a.name for a in spec.arms] == ["sft_single", "sft_multi", *WARM_UP_ROWS, exp.SINGLE, "Multi-RLCR"]
    for arm in spec.arms:
        values = resolved(arm, smoke=True)
        assert values["model.init_args.eval_samples"] == 1
        if arm.fit:
            assert values["trainer.max_steps"] <= 40, arm.name


def test_the_arms_build_with_their_reward_and_format():
    from lightning_modules.multi_answer_rl.multi_answer_rl import MultiAnswerReward
    from lightning_modules.rlvr.grpo import ExactMatchReward

    single = _cli(0, exp.SINGLE).model
    assert isinstance(single.reward, ExactMatchReward) and single.hparams.answer_format == "single"
    rlcr = _cli(0, "Multi-RLCR, no sum(p)<=1 gate (ablation)").model
    assert isinstance(rlcr.reward, MultiAnswerReward) and rlcr.hparams.answer_format == "multi"
    assert any(isinstance(c, exp.ValidationCurve) for c in _cli(0, "Multi-RLCR").trainer.callbacks)
    assert _cli(0, "sft_multi").datamodule.hparams.seed == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_train_validation_and_test_prompts_are_disjoint_and_training_reads_only_train(seed):
    sft = _datamodule(seed, "sft_multi")
    rl = _datamodule(seed, exp.SINGLE)
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
    a = exp.split_prompts(_datamodule(0, exp.SINGLE), 0)
    b = exp.split_prompts(_datamodule(1, exp.SINGLE), 1)
    assert {e.id for e in a["test"]} != {e.id for e in b["test"]}


class _Recorder:
    """Stands in for the policy module: records which prompt ids each evaluation scores."""

    def __init__(self):
        self.training, self.scored, self.rollout_batches = False, [], 0

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
    dm = _datamodule(0, exp.SINGLE)
    pools = exp.split_prompts(dm, 0)
    module = _Recorder()
    metrics = exp.final_metrics(module, dm, pools, 1, 0)
    test_ids, train_ids = [e.id for e in pools["test"]], [e.id for e in pools["train"]]
    assert module.scored == test_ids + train_ids or module.scored == train_ids + test_ids
    assert set(metrics) == {"coverage", "set_brier", "duplicate_rate", "train_coverage", "train_set_brier"}
    curve, module.scored = exp.ValidationCurve(every=2, sets=1), []
    trainer = SimpleNamespace(datamodule=dm)          # the fit's datamodule: its seed picks the validation prompts
    curve.on_train_start(trainer, module)
    assert module.scored == [e.id for e in pools["validation"]]
    for step in (1, 2, 3):
        module.rollout_batches = step
        curve.on_train_batch_end(trainer, module, None, None, step)
    assert [p["step"] for p in curve.points] == [0, 2]
    with pytest.raises(ValueError, match="every"):
        exp.ValidationCurve(every=0)


class Done:
    def __init__(self, path):
        self.path = path

    def best_checkpoint(self):
        return self.path


def fake_run(name, earlier):
    return runner.Run(runner.load_spec("multi_answer_rl"), arms()[name], None, 0, kit.REPO_ROOT, kit.REPO_ROOT,
                      earlier=earlier)


def test_prepare_starts_every_arm_from_its_formats_warm_up():
    earlier = {"sft_single": Done("/x/single.ckpt"), "sft_multi": Done("/x/multi.ckpt")}
    assert exp.prepare(fake_run("sft_multi", {})) == {}
    assert exp.prepare(fake_run(exp.SINGLE, earlier)) == {"model.init_args.init_from": "/x/single.ckpt"}
    assert exp.prepare(fake_run("SFT warm-up, multi", earlier)) == {"model.init_args.init_from": "/x/multi.ckpt"}
    with pytest.raises(runner.ExperimentError, match="not an earlier arm"):
        exp.prepare(fake_run("Multi-RLCR", {"sft_single": Done("/x")}))
    with pytest.raises(runner.ExperimentError, match="saved no checkpoint"):
        exp.prepare(fake_run("Multi-RLCR", {"sft_multi": Done(None)}))


def test_report_summarises_finite_values_pairs_and_curves():
    spec = runner.load_spec("multi_answer_rl")
    nan = float("nan")
    row = {exp.SINGLE: {"coverage": 0.4, "set_brier": nan, "pass@2": 0.1},
           "Multi-RLVR (any)": {"coverage": 0.5, "set_brier": 1.0},
           "Multi-RLCR": {"coverage": 0.45, "set_brier": 0.6}}
    per_seed = [row, {**row, "Multi-RLCR": {"coverage": 0.47, "set_brier": 0.4}}]
    curve = [{"step": 0, "coverage": 0.1}, {"step": 25, "coverage": 0.3}]
    records = [{"": {exp.SINGLE: {"split": {"test": [1]}, "curve": curve}, "Multi-RLCR": {"curve": curve}}}] * 2
    out = exp.report({"per_seed": per_seed}, records, spec)
    assert "set_brier" not in out["arms"][exp.SINGLE] and "pass@2" not in out["arms"][exp.SINGLE]
    assert out["arms"]["Multi-RLCR"]["coverage"]["mean"] == pytest.approx(0.46)
    assert list(out["paired"]) == ["Multi-RLCR - Multi-RLVR (any)"]           # the arms that ran
    assert out["paired"]["Multi-RLCR - Multi-RLVR (any)"]["set_brier"]["mean"] == pytest.approx(-0.5)
    assert out["curves"][exp.SINGLE]["coverage"] == [0.1, 0.3] and out["prompt_splits"] == [{"test": [1]}] * 2
    assert math.isnan(out["curves"]["Multi-RLCR"]["set_brier"][0])


@pytest.mark.slow
def test_smoke_run_equals_the_former_script(tmp_path):
    """The smoke experiment through the runner (seconds): the warm-ups' and arms' numbers of seed 0 are those of the
    script this runner replaced (``python -m experiments.multi_answer_rl`` at the same sizes), to the last bit."""
    result = runner.run_experiment("multi_answer_rl", smoke=True, out=tmp_path)
    assert list(result["arms"]) == [*WARM_UP_ROWS, exp.SINGLE, "Multi-RLCR"]
    row = result["per_seed"][0]
    for arm, values in FORMER_SMOKE.items():
        assert {k: row[arm][k] for k in values} == values, arm
    assert [p for p in result["curves"][exp.SINGLE]["step"]] == [0, 1, 2]
    assert set(result["prompt_splits"][0]) == {"train", "validation", "test"}
    assert "Multi-RLCR - Multi-RLVR (any)" not in result["paired"]               # Multi-RLVR (any) did not run
    assert (tmp_path / "multi_answer_rl.png").stat().st_size > 0


# seed 0 of the former script at the smoke sizes (``--sft-steps 40 --rl-steps 2 --rollouts 2 --eval-sets 1
# --curve-every 1 --curve-sets 1 --arms`` the two arms)
FORMER_SMOKE = {
    "SFT warm-up, single (K samples)": {"coverage": 0.11711711711711711, "duplicate_rate": 0.009009009009009009,
                                        "train_coverage": 0.13242009132420093},
    "SFT warm-up, multi": {"coverage": 0.16216216216216214, "set_brier": 0.5696296296296297,
                           "train_coverage": 0.09817351598173517},
    exp.SINGLE: {"coverage": 0.22072072072072066, "duplicate_rate": 0.11574074074074076,
                 "train_coverage": 0.22602739726027393},
    "Multi-RLCR": {"coverage": 0.07207207207207207, "set_brier": 0.6954545454545454,
                   "train_coverage": 0.08219178082191779},
}
