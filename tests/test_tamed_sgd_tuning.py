"""Tamed SGD experiment: the baselines' selection budget and protocol (clipped SGD's threshold and the dissipative
(r, a) are both tuned on the same number of candidates, on data the reported metric does not use)."""
from __future__ import annotations

import math

import pytest
import torch

from experiments import runner
from experiments import tamed_sgd as exp


def test_experiment_yaml_parses_and_its_smoke_overlay_is_small():
    spec = runner.load_spec("tamed_sgd")
    assert spec.seeds == 100 and len(spec.arms) == 29 and all(arm.seeds == 3 for arm in spec.arms)
    assert spec.baseline == "synthetic/plain_sgd" and set(spec.hooks) == {"evaluate", "report", "plot"}
    smoke = runner.load_spec("tamed_sgd", smoke=True)
    assert smoke.seeds == 1 and len(smoke.arms) == 5 and smoke.smoke_overrides == {"trainer.max_epochs": 1}
    assert smoke.settings["synthetic"]["steps"] <= 50 and smoke.settings["check"]["steps"] <= 20
    assert smoke.settings["check"]["arms"] == spec.settings["check"]["arms"]  # the smoke keeps the check's arms


def _digits_arm(spec, name: str) -> dict:
    return {**spec.overrides, **next(arm for arm in spec.arms if arm.name == f"digits/{name}").overrides}


def test_clipped_and_dissipative_get_the_same_number_of_candidates():
    spec = runner.load_spec("tamed_sgd")
    families = spec.settings["digits"]["families"]
    assert set(families) == {"clipped_sgd_tuned", "dissipative_tuned"}
    assert len(families["clipped_sgd_tuned"]) == len(families["dissipative_tuned"]) == 5
    # the two dissipative settings reported before are candidates, not a pre-selection
    assert {"dissipative_r2_a0.001", "dissipative_r1_a0"} <= set(families["dissipative_tuned"])
    names = {arm.name for arm in spec.arms}
    for lr in spec.settings["digits"]["large_lrs"]:  # every candidate is an arm at every large lr
        for candidate in (c for cs in families.values() for c in cs):
            assert f"digits/{candidate}_lr{lr:g}" in names


def test_clipping_threshold_scales_with_the_learning_rate():
    spec = runner.load_spec("tamed_sgd")
    lr_key = "model.init_args.optimizer.init_args.lr"
    for lr in (5.0, 50.0):
        for s in (0.1, 0.3, 1.0, 3.0, 10.0):
            arm = _digits_arm(spec, f"clipped_sgd_s{s:g}_lr{lr:g}")
            assert arm[lr_key] == lr and arm["trainer.gradient_clip_val"] == pytest.approx(s / lr)
            assert arm["trainer.gradient_clip_algorithm"] == "norm"
            assert [c["class_path"] for c in arm["trainer.callbacks"]] == ["experiments.tamed_sgd.StepLossRecorder"]
        assert _digits_arm(spec, f"clipped_sgd_lr{lr:g}")["trainer.gradient_clip_val"] == 1.0  # the earlier fixed row
    arm = _digits_arm(spec, "dissipative_r2_a0.001_lr50")
    assert "trainer.gradient_clip_val" not in arm
    assert arm["trainer.callbacks"][1] == {"class_path": "callbacks.sgd_taming.SGDTaming", "init_args": {
        "scheme": "dissipative", "restoring_coef": 1e-3, "iterate_power": 2.0}}
    assert _digits_arm(spec, "tamed_lr5")["trainer.callbacks"][1]["init_args"] == {"scheme": "tamed", "lr_power": 1.0}


def _fake(val_accuracy, test_accuracy, val_loss):
    return {"val_accuracy": torch.tensor(val_accuracy, dtype=torch.float64),
            "test_accuracy": torch.tensor(test_accuracy, dtype=torch.float64),
            "val_loss": torch.tensor(val_loss, dtype=torch.float64)}


def test_selection_reads_the_validation_split_never_the_test_split():
    candidates = ("a", "b", "c")
    results = {"a_lr50": _fake([0.5, 0.6], [0.99, 0.99], [1.0, 1.0]),    # best on test, worse on validation
               "b_lr50": _fake([0.9, 0.8], [0.10, 0.10], [0.5, 0.5]),
               "c_lr50": _fake([0.8, 0.9], [0.50, 0.50], [0.4, math.nan])}  # ties b on accuracy, NaN loss loses
    assert exp.select_candidate(results, candidates, 50.0) == "b"
    for key in results:  # scrambling the test numbers changes nothing
        results[key]["test_accuracy"] = torch.rand(2, dtype=torch.float64)
    assert exp.select_candidate(results, candidates, 50.0) == "b"
    results["c_lr50"]["val_loss"] = torch.tensor([0.4, 0.4], dtype=torch.float64)
    assert exp.select_candidate(results, candidates, 50.0) == "c"                # the tie goes to lower val loss


def test_tune_digits_reports_the_chosen_candidates_runs_per_lr():
    families = {"clipped_sgd_tuned": ("clipped_sgd_s1", "clipped_sgd_s3")}
    results = {"clipped_sgd_s1_lr5": _fake([0.9], [0.8], [0.1]), "clipped_sgd_s3_lr5": _fake([0.2], [0.9], [2.0]),
               "clipped_sgd_s1_lr50": _fake([0.1], [0.9], [3.0]), "clipped_sgd_s3_lr50": _fake([0.3], [0.2], [2.0])}
    tuned, record = exp.tune_digits(results, (5.0, 50.0), families)
    assert tuned["clipped_sgd_tuned_lr5"] is results["clipped_sgd_s1_lr5"]
    assert tuned["clipped_sgd_tuned_lr50"] is results["clipped_sgd_s3_lr50"]
    assert record["clipped_sgd_tuned"]["5"]["chosen"] == "clipped_sgd_s1"
    assert record["clipped_sgd_tuned"]["50"]["chosen"] == "clipped_sgd_s3"
    assert "validation" in record["clipped_sgd_tuned"]["5"]["split"]


def test_synthetic_threshold_is_chosen_on_validation_seeds_disjoint_from_the_reported_ones():
    seeds = exp.validation_seeds(20)
    assert not set(seeds) & set(range(1000)) and len(set(seeds)) == 20
    grid, steps = (0.3, 1.0, 10.0), 60
    record = exp.tune_synthetic_clipping(3, steps, grid=grid)
    assert record["chosen"] in grid and str(exp.VALIDATION_SEED_OFFSET) in record["split"]
    # the vectorised grid equals one simulation per threshold on the validation noise
    noise = exp.stack_noise(seeds[:3], steps)
    lrs = exp.robbins_monro_lrs(steps)
    for i, threshold in enumerate(grid):
        alone = exp.simulate(lambda g, x, lr, c=threshold: exp.clipped_rule(g, x, lr, max_norm=c), noise, lrs)
        fraction, minus_first = exp.synthetic_selection_score(alone)
        assert record["val_near_minimiser"][i] == pytest.approx(fraction)
        assert record["val_mean_first_step_near_minimiser"][i] == pytest.approx(-minus_first)
    best = max(range(len(grid)), key=lambda i: (record["val_near_minimiser"][i],
                                                -record["val_mean_first_step_near_minimiser"][i], -i))
    assert record["chosen"] == grid[best]
