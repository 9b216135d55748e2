"""The RNA-FM coverage study as configuration (configs/rna_fm/coverage.yaml + the hooks in
experiments/rna_fm_coverage.py), a further experiment of rna_fm run as ``rna_fm/coverage``: the protocol's arms,
learning rates, grid and smoke overlay, the hooks' protocol (the choice reads validation only, the test split is read
for the two derived rows and the regressors) and their one-line errors, the report in the landed JSON's layout
(results/rna_fm_coverage.json), and the smoke run through the runner."""
from __future__ import annotations

import json
import math

import pytest

from experiments import kit, runner
from experiments import rna_fm_coverage as cov
from lightning_modules.shared.errors import UserInputError

NAME = "rna_fm/coverage"
ARMS = ["RNA-FM", "RNA-FM, raw weights", "HE2RNA-lite", "tRNAsformer-lite"]
ROWS = ["RNA-FM default", "RNA-FM chosen on val", "HE2RNA-lite", "tRNAsformer-lite"]
METRICS = ["pearson", "coverage", "coverage_bimodal", "energy_bimodal", "crps_bimodal"]
LANDED = kit.RESULTS / "rna_fm_coverage.json"
# the old script's cells: default, Euler steps 50 and 100, guidance 1 and 1.5, 99 samples, raw weights (guidance 2, 1)
FULL_GRID = [("EMA", 19, 2.0, 19), ("EMA", 50, 2.0, 19), ("EMA", 100, 2.0, 19), ("EMA", 19, 1.0, 19),
             ("EMA", 19, 1.5, 19), ("EMA", 19, 2.0, 99), ("raw", 19, 2.0, 19), ("raw", 19, 1.0, 19)]


def _cells(grid: list[tuple[str, dict]]) -> list[tuple]:
    return [(w, s["sampling_steps"], s["cfg_scale"], s["test_samples"]) for w, s in grid]


def test_the_study_is_named_rna_fm_slash_coverage(capsys):
    assert NAME not in runner.available() and NAME in runner.available(secondary=True)
    assert runner.experiment_path(NAME) == kit.REPO_ROOT / "configs" / "rna_fm" / "coverage.yaml"
    source = (kit.REPO_ROOT / "experiments" / "rna_fm_coverage.py").read_text()
    assert not hasattr(cov, "main") and "argparse" not in source and "quiet_trainer" not in source
    assert runner.experiment_command(["rna_fm_coverage", "--smoke"]) == 2  # the hooks module is no script
    assert "holds the hooks of rna_fm/coverage: python -m experiments rna_fm/coverage" in capsys.readouterr().err
    assert runner.experiment_command(["rna_fm/nope"]) == 2
    assert "rna_fm/coverage" in capsys.readouterr().err  # the known experiments, further ones included


def test_coverage_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    spec = runner.load_spec(NAME)
    assert spec.title == "rna_fm_coverage" and spec.seeds == 3 and runner.result_stem(NAME) == "rna_fm_coverage"
    assert [arm.name for arm in spec.arms] == ARMS and [arm.name for arm in spec.arms if arm.row] == ARMS[2:]
    assert spec.metrics == METRICS and spec.baseline == "tRNAsformer-lite"
    assert spec.overrides == runner.load_spec("rna_fm").overrides  # the rna_fm experiment's data scale and trainer
    fm, raw, he2rna, trnasformer = spec.arms
    assert fm.configs == raw.configs == ["configs/rna_fm/quick.yaml"]
    assert fm.overrides == {"model.init_args.hidden_dim": 64, "model.init_args.pathway_tokens": True}
    assert "trainer.callbacks" not in fm.overrides  # quick.yaml's callbacks: EMA and the best-val/pearson checkpoint
    (checkpoint,) = raw.overrides["trainer.callbacks"]  # the same without EMAWeights
    assert checkpoint["class_path"].endswith("ModelCheckpoint")
    assert checkpoint["init_args"]["monitor"] == "val/pearson" and checkpoint["init_args"]["mode"] == "max"
    ema = {"class_path": "callbacks.ema.EMAWeights", "init_args": {"decay": 0.999, "warmup": True}}
    assert he2rna.overrides == {"model.init_args.hidden_dim": 64, "model.init_args.ks": [10],
                                "trainer.callbacks+": [ema]}
    assert trnasformer.overrides == {"model.init_args.dim": 64, "model.init_args.mlp_dim": 128,
                                     "model.init_args.dropout": 0.0, "trainer.callbacks+": [ema]}
    assert _cells(cov.grid(spec.settings)) == FULL_GRID and spec.settings["nominal"] == 0.9
    assert spec.settings["lrs"] == {"RNA-FM": [0.01, 0.003, 0.01], "HE2RNA-lite": [0.01, 0.003, 0.01],
                                    "tRNAsformer-lite": [0.001, 0.003, 0.003]}
    rna_fm_result = kit.RESULTS / "rna_fm.json"
    if rna_fm_result.is_file():  # the stored choices are the rna_fm experiment's
        chosen = json.loads(rna_fm_result.read_text())["chosen_lr"]
        assert all(chosen[arm] == lrs for arm, lrs in spec.settings["lrs"].items())
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)
    smoke = runner.load_spec(NAME, smoke=True)
    assert smoke.seeds == 1 and [arm.name for arm in smoke.arms] == ARMS
    assert smoke.smoke_overrides["trainer.max_epochs"] == 1 and smoke.smoke_overrides["data.init_args.num_slides"] <= 40
    assert _cells(cov.grid(smoke.settings)) == [("EMA", 2, 2.0, 19), ("EMA", 2, 1.0, 19), ("raw", 2, 2.0, 19),
                                                ("raw", 2, 1.0, 19)]


@pytest.mark.skipif(not LANDED.is_file(), reason="no landed results/rna_fm_coverage.json")
def test_the_grid_is_the_landed_runs():
    landed = json.loads(LANDED.read_text())
    spec = runner.load_spec(NAME)
    assert [{"weights": w, **s} for w, s in cov.grid(spec.settings)] == landed["config"]["settings"]
    assert spec.settings["lrs"] == landed["config"]["lrs"]
    assert cov.default_setting(spec.settings) == {k: v for k, v in landed["config"]["default"].items()
                                                  if k != "weights"}
    assert list(landed["validation_grid_mean"]) == [cov._cell_name({"weights": w, **s})
                                                    for w, s in cov.grid(spec.settings)]


def _run(name: str, seed: int = 0, spec=None, earlier: dict | None = None):
    spec = spec or runner.load_spec(NAME)
    arm = next(a for a in spec.arms if a.name == name)
    return runner.Run(spec, arm, None, seed, None, None, earlier=earlier or {})


def test_prepare_gives_each_arm_its_learning_rate_for_the_seed():
    assert [cov.prepare(_run("RNA-FM", seed)) for seed in range(3)] == [{cov.LR_KEY: lr} for lr in (0.01, 0.003, 0.01)]
    assert cov.prepare(_run("RNA-FM, raw weights", 1)) == {cov.LR_KEY: 0.003}  # settings.lr_from
    assert cov.prepare(_run("tRNAsformer-lite", 2)) == {cov.LR_KEY: 0.003}
    spec = runner.load_spec(NAME)
    spec.seeds = 4
    with pytest.raises(UserInputError, match="RNA-FM: 3 learning rates for 4 seeds in settings.lrs; give one per seed"):
        cov.prepare(_run("RNA-FM", spec=spec))
    spec = runner.load_spec(NAME)
    spec.settings["lr_from"] = {}
    with pytest.raises(runner.ExperimentError, match="settings.lrs has no list of learning rates for arm 'RNA-FM, raw"):
        cov.prepare(_run("RNA-FM, raw weights", spec=spec))
    for grid, message in (([{"weights": "EMA", "steps": 50}], "settings.grid cell"),
                          ([{"weights": "ema"}], r"give weights \(one of \['EMA', 'raw'\]"),
                          ([], "settings.grid must be a non-empty list")):
        spec = runner.load_spec(NAME)
        spec.settings["grid"] = grid
        with pytest.raises(UserInputError, match=message) as err:
            cov.prepare(_run("RNA-FM", spec=spec))
        assert "\n" not in str(err.value)
    spec = runner.load_spec(NAME)
    spec.settings["default"] = {"sampling_steps": 19}
    with pytest.raises(UserInputError, match="settings.default must give exactly"):
        cov.prepare(_run("RNA-FM", spec=spec))


def test_choose_is_closest_to_nominal_then_higher_pearson():
    cells = [{"id": 0, "val": {"coverage_bimodal": 0.80, "pearson": 0.9}},
             {"id": 1, "val": {"coverage_bimodal": 0.95, "pearson": 0.5}},   # |0.05|
             {"id": 2, "val": {"coverage_bimodal": 0.85, "pearson": 0.6}},   # |0.05|, higher pearson: chosen
             {"id": 3, "val": {"coverage_bimodal": 0.70, "pearson": 0.99}}]
    assert cov.choose(cells, 0.9)["id"] == 2
    assert cov.choose(cells, 0.8)["id"] == 0
    tied = [{"id": 0, "val": {"coverage_bimodal": 0.90004, "pearson": 0.1}},  # equal after rounding to 4 places
            {"id": 1, "val": {"coverage_bimodal": 0.9, "pearson": 0.2}}]
    assert cov.choose(tied, 0.9)["id"] == 1


class _FakeTrainer:
    def __init__(self, log: list, arm: str) -> None:
        self.log, self.arm = log, arm

    def validate(self, model, datamodule=None, ckpt_path=None, verbose=True):
        self.log.append((self.arm, "validate", ckpt_path))


def _fake_run(name: str, log: list, earlier: dict, spec=None):
    run = _run(name, spec=spec, earlier=earlier)
    run.cli = type("CLI", (), {"trainer": _FakeTrainer(log, name), "model": None, "datamodule": None})()
    run.fitted = True
    return run


def test_evaluate_chooses_on_validation_and_reads_test_only_for_the_rows(monkeypatch):
    """Each model is validated from its best checkpoint; after the raw-weights run, every grid cell is measured on
    validation, the choice (raw weights, guidance 1 here) reads validation only, and the test split is read once for
    the default (EMA weights, default setting), once for the chosen setting and once per regressor (with the chosen
    number of samples)."""
    log: list = []

    def measure(run, split, **setting):
        log.append((run.arm.name, split, dict(setting)))
        good = run.arm.name == "RNA-FM, raw weights" and setting.get("cfg_scale") == 1.0
        return {"pearson": 0.5, "coverage_bimodal": 0.89 if good else 0.7, "coverage": 0.8}

    monkeypatch.setattr(cov, "measure", measure)
    monkeypatch.setattr(runner.Run, "best_checkpoint", lambda self: f"{self.arm.name}.ckpt")
    earlier: dict = {}
    fm = _fake_run("RNA-FM", log, dict(earlier))
    assert cov.evaluate(fm) == {} and not fm.derived and log == [("RNA-FM", "validate", "RNA-FM.ckpt")]
    earlier["RNA-FM"] = fm
    raw = _fake_run("RNA-FM, raw weights", log, dict(earlier))
    assert cov.evaluate(raw) == {}
    earlier["RNA-FM, raw weights"] = raw
    grid = cov.grid(raw.settings)
    expected = [("RNA-FM, raw weights", "validate", "RNA-FM, raw weights.ckpt")]
    expected += [({"EMA": "RNA-FM", "raw": "RNA-FM, raw weights"}[w], "val", s) for w, s in grid]
    chosen = {"sampling_steps": 19, "cfg_scale": 1.0, "test_samples": 19}
    expected += [("RNA-FM", "test", cov.default_setting(raw.settings)), ("RNA-FM, raw weights", "test", chosen)]
    assert log[1:] == expected
    assert raw.extra["chosen"] == {"weights": "raw", **chosen} and len(raw.extra["cells"]) == len(grid)
    assert raw.extra["cells"][-1] == {"weights": "raw", **chosen, "val": measure(raw, "val", **chosen)}
    assert list(raw.derived) == ["RNA-FM default", "RNA-FM chosen on val"]
    del log[:]
    he2rna = _fake_run("HE2RNA-lite", log, dict(earlier))
    assert cov.evaluate(he2rna) == measure(he2rna, "test", test_samples=19)
    assert log[:2] == [("HE2RNA-lite", "validate", "HE2RNA-lite.ckpt"), ("HE2RNA-lite", "test", {"test_samples": 19})]
    with pytest.raises(UserInputError, match="list it after the arms of settings.weights") as err:
        cov.evaluate(_fake_run("tRNAsformer-lite", log, {"RNA-FM": fm}))
    assert "\n" not in str(err.value)


def test_report_writes_the_landed_layout(capsys):
    spec = runner.load_spec(NAME)
    grid = cov.grid(spec.settings)
    rows, records = [], []
    for seed in range(2):
        rows.append({row: {m: 0.1 * i + seed for m in METRICS} for i, row in enumerate(ROWS)})
        cells = [{"weights": w, **s, "val": {m: 0.01 * j + seed for m in METRICS}} for j, (w, s) in enumerate(grid)]
        chosen = {"weights": "EMA", "sampling_steps": 19, "cfg_scale": 1.0, "test_samples": 19}
        records.append({"": {"RNA-FM, raw weights": {"cells": cells, "chosen": chosen}}})
    added = cov.report({"arms": kit.summarise(rows), "per_seed": rows}, records, spec)
    assert set(added) == {"per_seed", "title", "grid", "validation_grid_mean"} and added["title"] == cov.TITLE
    assert [set(s) for s in added["per_seed"]] == [{"seed", "chosen", "runs"}] * 2
    assert added["per_seed"][1] == {"seed": 1, "chosen": chosen, "runs": rows[1]}
    assert len(added["grid"]) == 2 and len(added["grid"][0]) == len(FULL_GRID)
    mean = added["validation_grid_mean"]
    assert list(mean)[0] == "EMA steps 19 cfg 2 samples 19" and list(mean)[-1] == "raw steps 19 cfg 1 samples 19"
    assert mean["EMA steps 100 cfg 2 samples 19"]["pearson"] == pytest.approx(0.02 + 0.5)
    assert "| EMA steps 19 cfg 1.5 samples 19 |" in capsys.readouterr().out
    if LANDED.is_file():  # the landed file's keys: the runner's, the report's, and the pairs noted afterwards
        landed = json.loads(LANDED.read_text())
        assert set(landed) - {"paired_note"} == runner.RUNNER_KEYS | set(added)
        assert set(landed["per_seed"][0]) == set(added["per_seed"][0]) and list(landed["arms"]) == ROWS


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """Four fits and a four-cell grid (a few seconds): the JSON has the landed keys and layout, the runner's pairs
    against tRNAsformer-lite; nothing lands in ./runs or results/."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert runner.experiment_command([NAME, "--smoke", "--out", str(out)]) == 0
    written = json.loads((out / "rna_fm_coverage.json").read_text())
    assert set(written) == {"paper", "seeds", "wall_s", "config", "arms", "per_seed", "machine", "paired", "title",
                            "grid", "validation_grid_mean"} and written["paper"] == "rna_fm_coverage"
    assert list(written["arms"]) == ROWS and all(list(cells) == METRICS for cells in written["arms"].values())
    (row,) = written["per_seed"]
    assert row["seed"] == 0 and list(row["runs"]) == ROWS
    assert set(row["chosen"]) == {"weights", "sampling_steps", "cfg_scale", "test_samples"}
    (cells,) = written["grid"]
    assert [(c["weights"], c["cfg_scale"]) for c in cells] == [("EMA", 2.0), ("EMA", 1.0), ("raw", 2.0), ("raw", 1.0)]
    assert all(math.isfinite(c["val"]["coverage_bimodal"]) for c in cells)
    chosen = next(c for c in cells if all(c[k] == row["chosen"][k] for k in row["chosen"]))
    assert chosen == cov.choose(cells, 0.9)
    assert list(written["paired"]) == [f"{arm} - tRNAsformer-lite" for arm in ROWS[:-1]]
    assert written["config"]["settings"]["default"]["sampling_steps"] == 2
    assert not (tmp_path / "runs").exists() and not (out / "rna_fm_coverage.png").exists()
