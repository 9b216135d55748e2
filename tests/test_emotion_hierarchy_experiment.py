"""Emotion-hierarchy experiment (experiments/emotion_hierarchy.py): the held-out corpus loss, the learning-rate
selection (validation only, the same grid for every size, the final runs at the chosen rates), the partial
correlation that controls tree complexity vs accuracy for how well the LM learned the corpus, and the paired
size comparisons."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from datamodules.emotion_corpus import EmotionCorpusDataModule, collate_language_model
from experiments import emotion_hierarchy as exp
from experiments import kit, runner
from lightning_modules.rlvr.sft import sft_loss
from lightning_modules.shared.tiny_gpt import TinyGPT


# --------------------------------------------------------------------------------------------- held-out loss
def _fake_run(num_val: int):
    data = EmotionCorpusDataModule(num_train=8, num_val=num_val, num_test=4, personas=["neutral", "biased"],
                                   biased_persona="biased", probe_persona="neutral", seed=3)
    torch.manual_seed(0)
    policy = TinyGPT(vocab_size=236, n_layer=1, d_model=16, n_head=2, context_length=16)
    return SimpleNamespace(datamodule=data, model=SimpleNamespace(policy=policy))


def test_heldout_loss_is_the_token_weighted_loss_on_the_validation_split(monkeypatch):
    run = _fake_run(num_val=7)
    run.model.policy.train()
    monkeypatch.setattr(exp, "LOSS_BATCH", 3)  # 3 + 3 + 1 sentences: batches of unequal token counts
    loss = exp.heldout_loss(run)
    rows = run.datamodule.splits["val"]
    whole = collate_language_model(rows, run.datamodule.tokenizer, "all")
    with torch.no_grad():
        expected = float(sft_loss(run.model.policy, whole["input_tokens"], whole["loss_mask"]))
    assert loss == pytest.approx(expected, rel=1e-5)
    assert run.model.policy.training  # the mode is restored
    assert rows is run.datamodule.splits["val"] and len(rows) == 7  # the validation split, not test
    # an untrained model is close to uniform over the vocabulary
    assert abs(loss - math.log(236)) < 1.0


# --------------------------------------------------------------------------------------------- selection
def _grid_result(losses: dict[str, list[float]], test_acc: float) -> dict:
    seeds = len(next(iter(losses.values())))
    return {"per_seed": [{arm: {"heldout_loss": values[s], "acc_fine": test_acc, "total_path_length": 20 * test_acc}
                          for arm, values in losses.items()} for s in range(seeds)]}


def test_selection_reads_validation_loss_only():
    grid = {0.001: _grid_result({"lm-small": [3.0], "lm-medium": [2.0], "lm-large": [1.5]}, test_acc=0.9),
            0.003: _grid_result({"lm-small": [2.5], "lm-medium": [2.1], "lm-large": [float("nan")]}, test_acc=0.1),
            0.01: _grid_result({"lm-small": [2.4], "lm-medium": [2.0], "lm-large": [9.0]}, test_acc=0.5)}
    chosen = exp.select_lrs(grid)
    assert {arm: cell["chosen_lr"] for arm, cell in chosen.items()} == {
        "lm-small": 0.01, "lm-medium": 0.001, "lm-large": 0.001}  # medium: a tie goes to the smaller rate
    assert chosen["lm-large"]["heldout_loss"] == [1.5, None, 9.0]  # the diverged run lost
    assert chosen["lm-small"]["at_grid_edge"] and chosen["lm-small"]["grid"] == [0.001, 0.003, 0.01]
    for result in grid.values():  # scrambling every test metric changes nothing
        for row in result["per_seed"]:
            for cells in row.values():
                cells["acc_fine"], cells["total_path_length"] = np.random.rand(), np.random.rand()
    assert exp.select_lrs(grid) == chosen
    two_seeds = {lr: _grid_result({"lm-small": [1.0, 3.0]}, 0.0) for lr in (0.001, 0.01)}
    two_seeds[0.01]["per_seed"][1]["lm-small"]["heldout_loss"] = 1.0  # mean 1.0 < 2.0
    assert exp.select_lrs(two_seeds, arms=("lm-small",))["lm-small"]["chosen_lr"] == 0.01


def test_every_size_gets_the_same_grid_and_the_experiment_runs_the_chosen_rates():
    spec = runner.load_spec("emotion_hierarchy")
    grid = spec.settings["lr_grid"]
    assert grid["select"] == "heldout_loss" and len(grid["values"]) >= 3
    arms = {arm.name: arm for arm in spec.arms}
    files = exp.grid_files(spec.settings)
    missing = [name for name in files.values() if not (kit.RESULTS / name).is_file()]
    if missing:
        pytest.skip(f"the learning-rate grid has not been run yet ({missing})")
    results = {lr: json.loads((kit.RESULTS / name).read_text()) for lr, name in files.items()}
    for lr, result in results.items():  # one rate for every size, on the same tuning seeds, at the same steps
        assert result["seeds"] == len(result["per_seed"]) == 1, lr
        for arm in exp.TRAINED:
            flags = result["config"]["arms"][arm]
            assert f"--{grid['key']}={json.dumps(lr)}" in flags, (lr, arm, flags)
            assert "--trainer.max_steps=1000" in flags and "--data.init_args.num_val=2000" in flags
    chosen = exp.select_lrs(results)
    for arm in exp.TRAINED:
        assert arms[arm].overrides.get(grid["key"]) == chosen[arm]["chosen_lr"], (
            f"{arm}: experiment.yaml trains at {arms[arm].overrides.get(grid['key'])}, the grid chose "
            f"{chosen[arm]['chosen_lr']}")


def test_lr_tuning_compares_the_chosen_rate_with_the_rate_the_runs_used(tmp_path):
    settings = {"lr_grid": {"key": "k", "values": [0.001, 0.01], "select": "heldout_loss",
                            "results": "grid_lr{lr:g}.json"}}
    records = [{"": {"lm-small": {"lr": 0.01}, "lm-medium": {"lr": 0.001}, "lm-large": {"lr": 0.001}}}]
    assert exp.lr_tuning(settings, records, tmp_path)["missing"] == ["grid_lr0.001.json", "grid_lr0.01.json"]
    (tmp_path / "grid_lr0.001.json").write_text(json.dumps(_grid_result(
        {"lm-small": [3.0], "lm-medium": [2.0], "lm-large": [1.0]}, 0.0)))
    (tmp_path / "grid_lr0.01.json").write_text(json.dumps(_grid_result(
        {"lm-small": [2.0], "lm-medium": [1.0], "lm-large": [2.0]}, 0.0)))
    sizes = exp.lr_tuning(settings, records, tmp_path)["sizes"]
    assert sizes["lm-small"]["final_runs_use_chosen_lr"] and sizes["lm-large"]["final_runs_use_chosen_lr"]
    assert sizes["lm-medium"]["chosen_lr"] == 0.01 and not sizes["lm-medium"]["final_runs_use_chosen_lr"]


# --------------------------------------------------------------------------------------------- statistics
def test_partial_correlation_matches_the_closed_form_and_removes_a_shared_cause():
    rng = np.random.default_rng(0)
    loss = rng.normal(size=40)
    length = -loss + 0.3 * rng.normal(size=40)      # both driven by the loss, nothing else shared
    accuracy = -loss + 0.3 * rng.normal(size=40)
    raw = exp.correlation_summary(length, accuracy)
    partial = exp.correlation_summary(length, accuracy, loss)
    r_xy, r_xz, r_yz = (np.corrcoef(a, b)[0, 1] for a, b in ((length, accuracy), (length, loss), (accuracy, loss)))
    closed = (r_xy - r_xz * r_yz) / math.sqrt((1 - r_xz ** 2) * (1 - r_yz ** 2))
    assert partial["r"] == pytest.approx(closed, abs=1e-10) and partial["controls"] == 1 and partial["n"] == 40
    assert raw["r"] > 0.8 and raw["lo"] > 0 and raw["p_permutation"] < 0.001
    assert partial["lo"] < 0 < partial["hi"] and partial["p_permutation"] > 0.05
    # Fisher interval: atanh(r) +- 1.96 / sqrt(n - 3 - controls)
    half = 1.959963984540054 / math.sqrt(40 - 4)
    assert partial["lo"] == pytest.approx(math.tanh(math.atanh(partial["r"]) - half))
    # a direct link survives the control
    accuracy = length + 0.2 * rng.normal(size=40)
    kept = exp.correlation_summary(length, accuracy, loss)
    assert kept["r"] > 0.5 and kept["lo"] > 0 and kept["p_permutation"] < 0.01


def test_correlation_of_a_constant_side_is_undefined_not_zero():
    cell = exp.correlation_summary([1.0, 1.0, 1.0, 1.0], [0.1, 0.2, 0.3, 0.4])
    assert cell["r"] is None and cell["lo"] is None and cell["p_permutation"] is None


def test_arm_pairs_are_seed_by_seed_differences():
    per_seed = [{"lm-small": {"edges": 10.0}, "lm-medium": {"edges": 12.0}, "lm-large": {"edges": 11.0}},
                {"lm-small": {"edges": 11.0}, "lm-medium": {"edges": 14.0}, "lm-large": {"edges": 20.0}},
                {"lm-small": {"edges": 9.0}, "lm-medium": {"edges": 12.0}, "lm-large": {"edges": 15.0}}]
    pairs = exp.arm_pairs(per_seed, metrics=("edges",))
    cell = pairs["lm-medium - lm-small"]["edges"]
    diffs = [2.0, 3.0, 3.0]  # seed by seed
    half = 4.302652729911275 * np.std(diffs, ddof=1) / math.sqrt(3)
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(np.mean(diffs))
    assert (cell["lo"], cell["hi"]) == pytest.approx((np.mean(diffs) - half, np.mean(diffs) + half))
    assert list(pairs) == ["lm-medium - lm-small", "lm-large - lm-medium", "lm-large - lm-small"]
    one = exp.arm_pairs(per_seed[:1], metrics=("edges",))["lm-large - lm-small"]["edges"]
    assert one["n"] == 1 and one["lo"] is None and one["hi"] is None


def test_report_controls_for_the_loss_and_keeps_the_runners_pairs(monkeypatch):
    rng = np.random.default_rng(1)
    per_seed = []
    for _ in range(4):
        row = {}
        for arm in exp.TRAINED:
            loss = rng.uniform(2.0, 4.0)
            row[arm] = {"total_path_length": 30 - 5 * loss + rng.normal(), "acc_fine": 0.6 - 0.1 * loss,
                        "heldout_loss": loss}
        per_seed.append(row)
    monkeypatch.setattr(exp, "lr_tuning", lambda settings, records: {})
    out = exp.report({"per_seed": per_seed}, [])
    correlation = out["correlation"]
    assert correlation["points"] == 12 and len(correlation["runs"]) == 12
    assert correlation["total_path_length_vs_acc_fine"]["r"] > 0.5
    assert abs(correlation["total_path_length_vs_acc_fine_given_heldout_loss"]["r"]) < 0.5
    assert correlation["total_path_length_vs_acc_fine_pearson_r"] == correlation["total_path_length_vs_acc_fine"]["r"]
    assert "paired" not in out  # the runner's pairs against lm-untrained stay as they are
    assert list(out["paired_arms"]) == ["lm-medium - lm-small", "lm-large - lm-medium", "lm-large - lm-small"]
