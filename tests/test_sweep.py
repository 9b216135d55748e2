"""``icml26 sweep``: sweep files run locally and offline, trials drawn by W&B's sweep logic, the best one reported."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import REPO
from icml26.sweep import read_sweep, run_sweep, trial_arguments
from lightning_modules.shared.errors import UserInputError

SHORT = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def test_trial_arguments_are_the_agent_command_without_its_tokens():
    sweep = read_sweep("configs/sweeps/tamed_sgd.yaml")
    args = trial_arguments(sweep, {"model.init_args.optimizer.init_args.lr": {"value": 0.5}}, ["--trainer.max_steps=5"])
    assert args[0] == "fit" and args[1] == "--config" and args[2].endswith("configs/tamed_sgd/paper.yaml")
    assert "WANDB_MODE=online" not in args and "${args}" not in args
    assert args[-2:] == ["--model.init_args.optimizer.init_args.lr=0.5", "--trainer.max_steps=5"]


def test_a_bad_sweep_file_is_one_clear_error(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        read_sweep(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("program: train.py\nmethod: grid\nparameters: {a: {values: [1]}}\ncommand: [fit]\n")
    with pytest.raises(UserInputError, match="metric|args"):
        read_sweep(bad)


def test_tamed_sgd_grid_runs_offline_and_reports_the_best_trial(tmp_path):
    summary = run_sweep("configs/sweeps/tamed_sgd.yaml", 2, tmp_path,
                        ["--trainer.max_steps=30", "--data.init_args.num_steps=30", *SHORT], quiet=True)
    trials = summary["trials"]
    assert len(trials) == 2 and all(t["failure"] is None for t in trials)
    values = [t["val/dist_to_min"] for t in trials]
    assert all(math.isfinite(v) for v in values) and len({tuple(sorted(t["params"].items())) for t in trials}) == 2
    assert summary["best"]["val/dist_to_min"] == min(values)  # goal: minimize
    assert json.loads((tmp_path / "sweep.json").read_text())["best"]["trial"] == summary["best"]["trial"]


@pytest.mark.slow
def test_causcibench_random_sweep_through_the_console_command(tmp_path):
    """A second sweep file (a quick config, goal: maximize), run as a user would, with the table and best printed."""
    result = subprocess.run([sys.executable, "train.py", "sweep", "configs/sweeps/causcibench.yaml", "--count", "2",
                             "--out", str(tmp_path), "--", *SHORT], cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["goal"] == "maximize" and len(summary["trials"]) == 2
    best = max(t["val/method_acc"] for t in summary["trials"])
    assert summary["best"]["val/method_acc"] == best and "best: trial" in result.stdout
