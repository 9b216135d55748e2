"""The InfoGeo experiment as configuration (configs/infogeo/experiment.yaml run by experiments/runner.py): the spec,
its sizes and smoke overlay, the evaluate hook's two test levels, and (slow) the smoke run through the runner."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from experiments import runner
from experiments.infogeo import evaluate

ARMS = ["baseline", "infogeo", "infogeo w/o CACS", "infogeo w/o CSRR"]
METRICS = ["r1_clean", "r1_shifted", "ap_clean", "ap_shifted", "r1_drop"]


def test_spec_parses_with_the_protocol_of_the_former_script():
    spec = runner.load_spec("infogeo")
    assert [arm.name for arm in spec.arms] == ARMS and spec.baseline == "baseline" and spec.seeds == 5
    assert set(METRICS) <= set(spec.metrics)
    assert all(arm.configs == ["configs/infogeo/quick.yaml"] and arm.fit for arm in spec.arms)
    switches = {arm.name: arm.overrides for arm in spec.arms}
    assert switches == {"baseline": {"model.init_args.object_centric": False}, "infogeo": {},
                        "infogeo w/o CACS": {"model.init_args.use_cacs": False},
                        "infogeo w/o CSRR": {"model.init_args.use_csrr": False}}
    # the sizes python -m experiments.infogeo used before it became configuration (500 steps, final weights)
    assert spec.overrides == {
        "trainer.max_steps": 500, "trainer.max_epochs": -1, "trainer.limit_val_batches": 0,
        "trainer.num_sanity_val_steps": 0, "trainer.deterministic": True, "model.init_args.image_size": 48,
        "model.init_args.num_slots": 8, "data.init_args.image_size": 48, "data.init_args.train_locations": 300,
        "data.init_args.train_views": 4, "data.init_args.val_locations": 8, "data.init_args.test_locations": 100,
        "data.init_args.batch_size": 32}
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    assert set(spec.hooks) == {"evaluate", "plot"}


def test_smoke_overlay_is_small():
    spec = runner.load_spec("infogeo", smoke=True)
    smoke = spec.smoke_overrides
    assert spec.seeds == 1 and not spec.variants
    assert smoke["trainer.max_steps"] <= 2 and smoke["data.init_args.train_locations"] <= 12
    assert smoke["data.init_args.test_locations"] <= 6 and smoke["model.init_args.image_size"] == 32
    assert smoke["data.init_args.image_size"] == smoke["model.init_args.image_size"]
    flags = runner.arm_flags(spec, spec.arms[0])
    # the smoke layer comes last, so it replaces the experiment's sizes
    assert "--trainer.max_steps=2" in flags and "--trainer.max_steps=500" not in flags
    assert "--data.init_args.train_locations=12" in flags and "--model.init_args.object_centric=false" in flags


class _Data:
    def retrieval_set(self, level):
        return level

    def eval_loader(self, dataset):
        return f"loader:{dataset}"


class _Trainer:
    """Returns the logged test metrics of each level, and records how it was called."""
    scores = {"clean": {"test/r1": 90.0, "test/ap": 92.0, "test/r5": 99.0, "test/r10": 100.0},
              "shifted": {"test/r1": 47.5, "test/ap": 53.0, "test/r5": 74.0, "test/r10": 80.0}}

    def __init__(self):
        self.calls = []

    def test(self, model, dataloaders, ckpt_path, verbose):
        self.calls.append((dataloaders, ckpt_path))
        return [self.scores[dataloaders.split(":")[1]]]


def test_evaluate_scores_both_levels_on_the_final_weights():
    trainer = _Trainer()
    run = SimpleNamespace(datamodule=_Data(), trainer=trainer, model=None, settings={"levels": ["clean", "shifted"]})
    metrics = evaluate(run)
    assert trainer.calls == [("loader:clean", None), ("loader:shifted", None)]  # no checkpoint selects
    assert metrics == {"r1_clean": 90.0, "ap_clean": 92.0, "r5_clean": 99.0, "r1_shifted": 47.5,
                       "ap_shifted": 53.0, "r5_shifted": 74.0, "r1_drop": 42.5}


@pytest.mark.slow
def test_smoke_experiment_runs_through_the_runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.experiment_command(["infogeo", "--smoke", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "infogeo.json").read_text())
    assert (tmp_path / "out" / "infogeo.png").stat().st_size > 0
    assert list(result["arms"]) == ARMS and result["seeds"] == 1 and result["config"]["smoke"] is True
    (row,) = result["per_seed"]
    for arm in ARMS:
        cells = row[arm]
        assert set(METRICS) <= set(cells)
        assert all(0.0 <= cells[m] <= 100.0 for m in METRICS if m != "r1_drop"), (arm, cells)
        assert cells["r1_drop"] == pytest.approx(cells["r1_clean"] - cells["r1_shifted"])
    assert list(result["paired"]) == [f"{arm} - baseline" for arm in ARMS[1:]]
    cell = result["paired"]["infogeo - baseline"]["r1_shifted"]
    assert cell["n"] == 1 and cell["lo"] is None
    assert math.isclose(cell["mean"], row["infogeo"]["r1_shifted"] - row["baseline"]["r1_shifted"], abs_tol=1e-9)
