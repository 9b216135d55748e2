"""The DARS experiment (``configs/dars/experiment.yaml`` + the hooks in experiments/dars.py and experiments/_rlvr.py):
seed-by-seed differences against the compute-matched and the plain uniform arm, the primary held-out verdict, the
arms as documented (the compute-matched N and breadth's whole-pool batch computed from the seed's earlier runs), and,
in slow tests, the smoke run and a reduced run pinned to the numbers of the pre-conversion script."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from experiments import dars, kit, runner

METRICS = ["pass@1", "pass@32_tier3", "pass@32_tier4", "hard_positives_total"]


def seed_row(**pass1: float) -> dict:
    """One seed's arms: pass@1 as given, the other metrics derived so each pair has a known difference."""
    return {arm: {"pass@1": p, "pass@32_tier3": 2 * p, "pass@32_tier4": 0.0, "hard_positives_total": 100 * p}
            for arm, p in pass1.items()}


def rows(dars_hw: list[float], matched: list[float]) -> list[dict]:
    return [seed_row(uniform=0.5, dars_et=0.5, dars_hw=h, uniform_matched=m, breadth=0.5)
            for h, m in zip(dars_hw, matched)]


def test_paired_block_pairs_each_arm_with_both_baselines_seed_by_seed():
    per_seed = rows([0.71, 0.73, 0.72], [0.70, 0.70, 0.70])  # differences 0.01, 0.03, 0.02
    pairs = dars.paired_block(per_seed, METRICS)
    assert set(pairs) == {"dars_et - uniform_matched", "dars_hw - uniform_matched", "dars_et - uniform",
                          "dars_hw - uniform", "breadth - uniform"}  # breadth costs what uniform does
    cell = pairs["dars_hw - uniform_matched"]["pass@1"]
    half = 4.302652729911275 * 0.01 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n), by hand
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(0.02)
    assert (cell["lo"], cell["hi"]) == (pytest.approx(0.02 - half), pytest.approx(0.02 + half))
    assert pairs["dars_hw - uniform_matched"]["hard_positives_total"]["mean"] == pytest.approx(2.0)
    assert pairs["dars_hw - uniform"]["pass@1"]["mean"] == pytest.approx(0.22)
    assert pairs["breadth - uniform"]["pass@1"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 3}


def test_one_seed_has_no_interval():
    cell = dars.paired_block(rows([0.71], [0.70]), METRICS)["dars_hw - uniform_matched"]["pass@1"]
    assert cell["lo"] is None and cell["hi"] is None and cell["n"] == 1


@pytest.mark.parametrize("dars_hw, matched, verdict", [
    ([0.72, 0.73, 0.725], [0.70, 0.70, 0.70], "held"),               # interval above zero
    ([0.71, 0.69, 0.72], [0.70, 0.70, 0.70], "within seed noise"),   # interval contains zero
    ([0.68, 0.67, 0.675], [0.70, 0.70, 0.70], "not held"),           # interval below zero
    ([0.72], [0.70], "within seed noise"),                           # one seed: no interval
])
def test_primary_claim_is_the_held_out_comparison_against_the_matched_arm(dars_hw, matched, verdict):
    per_seed = rows(dars_hw, matched)
    claim = dars.primary_claim(dars.paired_block(per_seed, METRICS), per_seed)
    assert claim["primary"]["pair"] == "dars_hw - uniform_matched" and claim["primary"]["metric"] == "pass@1"
    assert claim["verdict"] == verdict and claim["held"] == (verdict == "held")
    ratios = [h / m for h, m in zip(dars_hw, matched)]  # hard positives are 100 x pass@1 here
    assert claim["hard_positives_ratio"]["per_seed"] == pytest.approx(ratios)


def arms(smoke: bool = False) -> dict[str, runner.Arm]:
    return {arm.name: arm for arm in runner.load_spec("dars", smoke=smoke).arms}


def resolved(arm: runner.Arm, smoke: bool = False) -> dict:
    """The arm's effective overrides (experiment, arm, smoke layers) as the runner applies them."""
    return runner.arm_overrides(runner.load_spec("dars", smoke=smoke), arm)


GRPO_ARMS = ["uniform", "dars_et", "dars_hw", "uniform_matched", "breadth"]


def test_spec_arms_and_sizes_are_the_documented_ones():
    spec = runner.load_spec("dars")
    assert spec.seeds == 5 and spec.baseline == "uniform_matched" and set(spec.hooks) == set(runner.HOOKS)
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    assert [a.name for a in spec.arms] == ["sft", *GRPO_ARMS]   # dars_hw before the arm matched to it
    by_name = arms()
    assert not by_name["sft"].row and all(by_name[a].row for a in GRPO_ARMS)
    sft = resolved(by_name["sft"])
    assert by_name["sft"].configs == ["configs/grpo/sft_quick.yaml"] and sft["trainer.max_steps"] == 9000
    assert sft["data.init_args.sft_sampling"] == "replacement" and sft["trainer.gradient_clip_val"] == 1.0
    assert sft["data.init_args.digit_tiers"] == [2] * 6 + [3, 4]                # shares 6 : 1 : 1
    for name in GRPO_ARMS:
        values = resolved(by_name[name])
        assert by_name[name].configs == ["configs/dars/quick.yaml"]
        assert values["trainer.max_epochs"] == 3 and values["model.init_args.rollouts_per_prompt"] == 8
        assert values["data.init_args.batch_size"] == 16 and values["data.init_args.train_pool_size"] == 256
    uniform = "lightning_modules.rlvr.rollout_allocation.UniformAllocator"
    for name in ("uniform", "uniform_matched", "breadth"):
        assert resolved(by_name[name])["model.init_args.rollout_allocator"] == uniform
    for name, schedule, cap in (("dars_et", "equal_treatment", 32), ("dars_hw", "hardness_weighted", 64)):
        values = resolved(by_name[name])
        assert "model.init_args.rollout_allocator" not in values            # the config's DARSAllocator
        assert values["model.init_args.rollout_allocator.init_args.schedule"] == schedule
        assert values["model.init_args.rollout_allocator.init_args.max_rollouts"] == cap
    assert resolved(by_name["breadth"])["model.init_args.ppo_epochs"] == 2
    assert spec.settings["matched"] == {"arm": "uniform_matched", "to": "dars_hw"}
    assert spec.settings["whole_pool"] == ["breadth"] and spec.settings["paired"] == dars.PAIRS
    smoke = runner.load_spec("dars", smoke=True)
    assert smoke.seeds == 1 and [a.name for a in smoke.arms] == ["sft", *GRPO_ARMS]
    assert resolved(arms(True)["sft"], True)["trainer.max_steps"] == 5


def test_the_dars_arms_keep_the_configs_allocator_settings():
    from lightning_modules.rlvr.rollout_allocation import DARSAllocator

    spec = runner.load_spec("dars")
    with runner.isolated():
        cli = runner.build_cli(runner.arm_flags(spec, arms()["dars_et"]) + runner.QUIET, 0, kit.REPO_ROOT / "runs/x")
    allocator = cli.model.rollout_allocator
    assert isinstance(allocator, DARSAllocator) and allocator.schedule == "equal_treatment"
    assert allocator.max_rollouts == 32 and allocator.use_std is False           # use_std from the config


class Done:
    def __init__(self, path="/x/sft.ckpt", pool=256, metrics=None, extra=None, n=8):
        self.path = path
        self.datamodule = SimpleNamespace(digit_tiers=[2, 2, 3, 4], train_examples=[None] * pool)
        self.metrics, self.extra = metrics or {}, extra or {}
        self.model = SimpleNamespace(hparams=SimpleNamespace(rollouts_per_prompt=n))

    def best_checkpoint(self):
        return self.path


def fake_run(name, earlier):
    return runner.Run(runner.load_spec("dars"), arms()[name], None, 0, kit.REPO_ROOT, kit.REPO_ROOT, earlier=earlier)


def test_prepare_matches_dars_hw_and_gives_breadth_the_whole_pool():
    hw = Done(metrics={"rollouts_total": 15824.0}, extra={"prompt_visits": 256})   # 61.8 rollouts per visit
    matched = dars.prepare(fake_run("uniform_matched", {"sft": Done(), "dars_hw": hw}))
    assert matched == {"model.init_args.init_from": "/x/sft.ckpt", "model.init_args.max_new_tokens": 6,
                       "model.init_args.rollouts_per_prompt": 62}
    few = Done(metrics={"rollouts_total": 1000.0}, extra={"prompt_visits": 256})   # below N: N stays
    assert dars.prepare(fake_run("uniform_matched", {"sft": Done(), "dars_hw": few}))[
        "model.init_args.rollouts_per_prompt"] == 8
    breadth = dars.prepare(fake_run("breadth", {"sft": Done(pool=100)}))
    assert breadth["data.init_args.batch_size"] == 100
    assert "data.init_args.batch_size" not in dars.prepare(fake_run("uniform", {"sft": Done()}))
    with pytest.raises(runner.ExperimentError, match="not an earlier GRPO arm"):
        dars.prepare(fake_run("uniform_matched", {"sft": Done()}))


def test_report_adds_the_held_out_pairs_and_the_claim():
    spec = runner.load_spec("dars")
    per_seed = rows([0.72, 0.73, 0.725], [0.70, 0.70, 0.70])
    grpo = {"curve": {"rollouts": [8], "effective_ratio_response": [0.5], "hard_positives": [1]},
            "rollouts_per_prompt": 8}
    records = [{"": {"sft": {"tiers": [2, 3, 4], "hard": [1, 2], "pool_size": 8, "p_below_half_share": 0.5},
                     **{a: dict(grpo, rollouts_per_prompt=20 if a == "uniform_matched" else 8) for a in GRPO_ARMS}}}
               ] * 3
    out = dars.report({"per_seed": per_seed}, records, spec)
    assert list(out["paired"]) == ["dars_et - uniform_matched", "dars_hw - uniform_matched", "dars_et - uniform",
                                   "dars_hw - uniform", "breadth - uniform"]
    assert set(out["paired"]["dars_hw - uniform"]) == set(METRICS)
    assert out["claim"]["verdict"] == "held" and out["claim"]["matched_n"] == [20, 20, 20]
    assert out["claim"]["hard_share_of_pool"] == [0.25] * 3
    assert set(out["curves"]) == set(GRPO_ARMS)


@pytest.mark.slow
def test_smoke_experiment_through_the_runner(tmp_path):
    result = runner.run_experiment("dars", smoke=True, out=tmp_path)
    assert list(result["arms"]) == GRPO_ARMS
    assert result["arms"]["uniform"]["rollout_cost_vs_uniform"]["mean"] == 1.0
    assert result["arms"]["breadth"]["rollouts_total"] == result["arms"]["uniform"]["rollouts_total"]
    assert {"dars_hw - uniform_matched", "breadth - uniform"} <= set(result["paired"])
    assert set(result["claim"]) >= {"verdict", "matched_n", "hard_share_of_pool", "sft_p_below_half_share_of_pool"}
    assert (tmp_path / "dars.png").stat().st_size > 0 and json.loads((tmp_path / "dars.json").read_text())["claim"]
