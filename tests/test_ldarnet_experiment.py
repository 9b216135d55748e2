"""The LDARNet experiment as configuration (configs/ldarnet/experiment.yaml + the hooks in experiments/ldarnet.py):
the protocol's sizes, a small smoke overlay, and the smoke run through the runner in the landed JSON's layout."""
from __future__ import annotations

import json
import math

import pytest

from experiments import ldarnet, runner


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    assert "ldarnet" in runner.available()
    spec = runner.load_spec("ldarnet")
    assert spec.seeds == 5 and [arm.name for arm in spec.arms] == ["learned", "fixed"] and spec.baseline == "fixed"
    assert all(arm.configs == ["configs/ldarnet/pretrain_quick.yaml"] and arm.fit for arm in spec.arms)
    assert {arm.name: arm.overrides["model.init_args.boundaries"] for arm in spec.arms} == {"learned": "learned",
                                                                                           "fixed": "fixed"}
    assert {k: spec.overrides[k] for k in ("trainer.max_steps", "trainer.val_check_interval", "data.init_args.seq_len",
                                           "data.init_args.genome_length", "data.init_args.batch_size",
                                           "data.init_args.eval_batch_size")} == {
        "trainer.max_steps": 120, "trainer.val_check_interval": 120, "data.init_args.seq_len": 128,
        "data.init_args.genome_length": 300_000, "data.init_args.batch_size": 32, "data.init_args.eval_batch_size": 128}
    finetune = spec.settings["finetune"]
    assert finetune["config"] == "configs/ldarnet/quick.yaml"
    assert finetune["overrides"] == {"trainer.max_steps": 120, "trainer.limit_val_batches": 0,
                                     "model.init_args.init_from": None, "data.init_args.synthetic_train": 2000,
                                     "data.init_args.synthetic_test": 500}
    assert spec.settings["speed"] == {"repeats": 3, "length": 1024, "micro_length": 1024}
    assert set(spec.metrics) <= set(ldarnet.METRICS)
    smoke = runner.load_spec("ldarnet", smoke=True)
    assert smoke.seeds == 1 and smoke.smoke_overrides["trainer.max_steps"] <= 5
    assert smoke.smoke_overrides["data.init_args.genome_length"] <= 20_000
    assert smoke.settings["finetune"]["overrides"]["trainer.max_steps"] <= 5
    assert smoke.settings["finetune"]["overrides"]["data.init_args.synthetic_train"] <= 64
    assert smoke.settings["speed"]["repeats"] == 1 and smoke.settings["speed"]["length"] <= 64


def test_speed_settings_are_validated():
    assert ldarnet.speed_arguments({"repeats": 2}) == {"repeats": 2}
    with pytest.raises(runner.ExperimentError, match="unknown key"):
        ldarnet.speed_arguments({"repeat": 2})


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """Pretraining by the runner, fine-tuning by the hook: per_seed is [{seed, runs: {arm: record}}] with the
    profiles, the paired block is learned - fixed, the speed block is there; nothing lands in ./runs."""
    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("ldarnet", smoke=True, out=tmp_path / "out")
    assert list(result["arms"]) == ["learned", "fixed"] and list(result["arms"]["learned"]) == list(ldarnet.METRICS)
    (row,) = result["per_seed"]
    assert row["seed"] == 0 and list(row["runs"]) == ["learned", "fixed"]
    for arm, record in row["runs"].items():
        assert record["arm"] == arm and record["seed"] == 0
        assert len(record["profile"]) == len(record["mlm_profile"]) == len(ldarnet.PROFILE_OFFSETS)
        assert all(record[k] == result["arms"][arm][k]["mean"] for k in ldarnet.METRICS)
    fixed = row["runs"]["fixed"]
    assert fixed["compression"] == fixed["pretrain_compression"] == 0.25  # the control's grid, by construction
    assert list(result["paired"]) == ["learned - fixed"]
    cell = result["paired"]["learned - fixed"]["mcc"]
    assert cell["n"] == 1 and cell["mean"] == pytest.approx(row["runs"]["learned"]["mcc"] - fixed["mcc"])
    assert math.isfinite(result["speed"]["micro_ldarnet"]["tokens_per_s"])
    assert result["title"].startswith("LDARNet") and json.loads((tmp_path / "out" / "ldarnet.json").read_text())
    assert (tmp_path / "out" / "ldarnet.png").is_file() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("stage, message", [({"config": "configs/ldarnet/none.yaml"}, "no config file"),
                                            ({"overides": {}}, "unknown key")])
def test_finetune_settings_are_validated(stage, message):
    class Run:  # what finetune_cli reads before it builds anything
        settings = {"finetune": stage}

    with pytest.raises(runner.ExperimentError, match=message):
        ldarnet.finetune_cli(Run())
