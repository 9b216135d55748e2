"""The NT-SSM experiment (configs/nt_ssm/experiment.yaml + the hooks in experiments/nt_ssm.py): the baselines get as
large a validation grid as NT-SSM, every tuned arm is chosen on validation NDCG@20 alone (fast: the training runs
are replaced by a fake), and (slow) the smoke experiment through the runner."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments import nt_ssm, runner

TUNED = ("SSM, tau tuned", "bidirectional SSM (NT, all alphas 1), tau tuned", "NT-SSM, uniform alpha + tau tuned",
         "NT-SSM, type-specific alphas + tau tuned")


def _overrides(spec, arm) -> dict:
    return {**spec.overrides, **arm.overrides, **spec.smoke_overrides}


def _taus(spec, names) -> list[float]:
    arms = {arm.name: arm for arm in spec.arms}
    return [_overrides(spec, arms[name])["model.init_args.tau"] for name in names]


def test_spec_parses_and_the_smoke_overlay_is_small():
    spec = runner.load_spec("nt_ssm")
    assert spec.seeds == 3 and spec.baseline == "SSM, tau 0.2 (paper)"
    assert spec.overrides["trainer.max_epochs"] == 80 and spec.overrides["model.init_args.ks"] == [20]
    nt_ssm.check_settings(spec)
    smoke = runner.load_spec("nt_ssm", smoke=True)
    assert smoke.seeds == 1 and smoke.smoke_overrides["trainer.max_epochs"] == 1
    assert smoke.smoke_overrides["data.init_args.synthetic_users"] <= 200
    assert smoke.settings["speed"]["epochs"] <= 2 and smoke.settings["speed"]["eval_repeats"] <= 2
    for arm in spec.arms:  # every arm sets its loss and tau; the seed is the runner's, not the arm's
        assert {"model.init_args.loss", "model.init_args.tau"} <= set(arm.overrides), arm.name


def test_baseline_temperature_grid_is_as_large_as_nt_ssm_grid():
    spec = runner.load_spec("nt_ssm")
    select = spec.settings["select"]
    nt_grid = len(select["NT-SSM, uniform alpha + tau tuned"]) + len(nt_ssm.ALPHA_KEYS)  # plus one probe per alpha
    ssm_taus = _taus(spec, select["SSM, tau tuned"])
    assert len(set(ssm_taus)) == len(ssm_taus) >= nt_grid == 12
    assert _taus(spec, select["bidirectional SSM (NT, all alphas 1), tau tuned"]) == ssm_taus
    assert 0.2 in ssm_taus  # the paper's fixed temperature stays an arm
    assert max(ssm_taus) > 3.0  # past the old top, where SSM's choice landed on 2 of 3 seeds
    assert spec.settings["probes"] == {"from": TUNED[2], "name": TUNED[3]}


def _fake(loss, tau, alphas) -> dict:
    """Validation peaks at an interior tau (5 for the baselines, 0.5 / alpha 0.4 for NT-SSM, where halving alpha_ii
    helps); the test metric is its mirror image, so any selection that looks at test picks a different run."""
    if loss == "nt_ssm":
        target = (0.4, 0.2, 0.4, 0.4)
        val = 0.3 - abs(math.log(tau / 0.5)) - sum(abs(a - t) for a, t in zip(alphas, target))
    else:
        val = 0.2 - abs(math.log(tau / 5.0))
    return {"loss": loss, "tau": tau, "alphas": list(alphas), "best_epoch": 3, "val/ndcg@20": val,
            "test/ndcg@20": -val, "test/recall@20": -val, "backbone": "lightgcn"}


def _run_fake_seed(monkeypatch, spec, seed=0):
    """Every arm of ``spec`` through `nt_ssm.evaluate` in order with fake training; returns the runner-style row
    and the records."""
    fits = []

    def record(run):
        o = _overrides(run.spec, run.arm)
        alphas = [o[f"model.init_args.{key}"] for key in nt_ssm.ALPHA_KEYS]
        return {"arm": run.arm.name, **_fake(o["model.init_args.loss"], o["model.init_args.tau"], alphas)}

    def fit_and_record(run, arm, flags, root):
        given = dict(re.fullmatch(r"--([^=]+)=(.*)", f).groups() for f in flags if f.startswith("--model"))
        fits.append(given)
        alphas = [float(given[f"model.init_args.{key}"]) for key in nt_ssm.ALPHA_KEYS]
        return {"arm": arm.name, **_fake(given["model.init_args.loss"], float(given["model.init_args.tau"]), alphas)}

    monkeypatch.setattr(nt_ssm, "record", record)
    monkeypatch.setattr(nt_ssm, "fit_and_record", fit_and_record)
    row, records = {}, {}
    for arm in spec.arms:
        run = SimpleNamespace(spec=spec, arm=arm, variant=None, seed=seed, settings=spec.settings, extra={},
                              derived={}, root=Path("unused"), out=None)
        row[arm.name] = nt_ssm.evaluate(run)
        row.update(run.derived)
        records[arm.name] = run.extra
    return row, records, fits


def test_tuned_arms_are_chosen_on_validation_with_the_same_budget(monkeypatch):
    spec = runner.load_spec("nt_ssm")
    row, records, fits = _run_fake_seed(monkeypatch, spec)
    assert len(fits) == len(nt_ssm.ALPHA_KEYS)  # 4 probes from the uniform choice
    for probe in fits:  # each probe is the chosen uniform point (tau 0.5, alpha 0.4) with one alpha halved
        assert probe["model.init_args.loss"] == "nt_ssm" and float(probe["model.init_args.tau"]) == 0.5
        assert sorted(float(probe[f"model.init_args.{k}"]) for k in nt_ssm.ALPHA_KEYS) == [0.2, 0.4, 0.4, 0.4]
    chosen = {}
    for extra in records.values():
        chosen.update(extra["chosen"])
    assert set(chosen) == set(TUNED)
    for arm in TUNED[:2]:
        assert chosen[arm]["tau"] == 5.0 and chosen[arm]["tau_position"] == "interior"
    assert chosen[TUNED[2]]["tau"] == 0.5 and chosen[TUNED[2]]["alphas"] == [0.4] * 4
    assert chosen[TUNED[2]]["tau_position"] == "bottom"
    assert chosen[TUNED[3]]["alphas"] == [0.4, 0.2, 0.4, 0.4]  # the alpha_ii probe beat the uniform point
    for arm in TUNED:  # the reported test value is the chosen run's, which is the worst on test
        assert row[arm]["test/ndcg@20"] == -row[arm]["val/ndcg@20"]
    for arm in TUNED[:3]:
        assert row[arm]["val/ndcg@20"] == max(row[a]["val/ndcg@20"] for a in spec.settings["select"][arm])
    assert row[TUNED[3]]["val/ndcg@20"] > row[TUNED[2]]["val/ndcg@20"]


def test_report_lists_choices_runs_and_the_tuned_pair(monkeypatch, capsys):
    spec = runner.load_spec("nt_ssm")
    spec.settings["speed"] = None  # timing is measured by the smoke run below
    rows, records = [], []
    for seed in range(2):
        row, extra, _ = _run_fake_seed(monkeypatch, spec, seed)
        rows.append(row)
        records.append({"": extra})
    from experiments import kit

    result = {"arms": kit.summarise(rows), "per_seed": rows}
    out = nt_ssm.report(result, records)
    assert list(out["chosen"]) == spec.settings["reported"]
    assert out["chosen"]["SSM, tau tuned"] == [{"tau": 5.0, "alphas": [1.0] * 4, "best_epoch": 3,
                                                 "tau_position": "interior"}] * 2
    assert "tau_position" not in out["chosen"]["SSM, tau 0.2 (paper)"][0]
    assert [len(runs) for runs in out["runs"]] == [len(spec.arms) + 4] * 2
    pair = out["paired_tuned"]["NT-SSM, type-specific alphas + tau tuned - SSM, tau tuned"]["test/ndcg@20"]
    assert pair["n"] == 2 and pair["mean"] == pytest.approx(rows[0]["NT-SSM, type-specific alphas + tau tuned"][
        "test/ndcg@20"] - rows[0]["SSM, tau tuned"]["test/ndcg@20"])
    assert out["backbone"] == "lightgcn" and out["speed"] is None
    assert "| SSM, tau tuned |" in capsys.readouterr().out


def test_settings_naming_unknown_arms_or_out_of_order_are_refused():
    spec = runner.load_spec("nt_ssm")
    spec.settings["select"] = {"SSM, tau tuned": ["SSM, tau 0.2 (paper)", "SSM, tau 99"]}
    with pytest.raises(runner.ExperimentError, match=r"select.SSM, tau tuned .*unknown arms \['SSM, tau 99'\]"):
        nt_ssm.check_settings(spec)
    spec.settings["select"] = {"SSM, tau tuned": ["SSM, tau 0.5", "SSM, tau 0.2 (paper)"]}
    with pytest.raises(runner.ExperimentError, match="in the order of `arms`"):
        nt_ssm.check_settings(spec)
    spec = runner.load_spec("nt_ssm")
    spec.settings["reported"] = [*spec.settings["reported"], "SSM, tau tuned twice"]
    with pytest.raises(runner.ExperimentError, match=r"unknown arms \['SSM, tau tuned twice'\]"):
        nt_ssm.check_settings(spec)
    with pytest.raises(runner.ExperimentError, match="unknown key"):
        nt_ssm.speed_arguments({"epochs": 2, "repeats": 3})


@pytest.mark.parametrize("value, position", [(0.2, "bottom"), (3.0, "interior"), (20.0, "top")])
def test_grid_position(value, position):
    taus = (0.2, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0)
    assert nt_ssm.grid_position(value, taus) == position


def test_halved():
    assert nt_ssm.halved([0.4, 0.4, 0.4, 0.4], 1) == [0.4, 0.2, 0.4, 0.4]
    assert nt_ssm.halved([1.2, 0.8, 0.8, 1.0], 0) == [0.6, 0.8, 0.8, 1.0]


@pytest.mark.slow
def test_smoke_experiment_writes_the_result(tmp_path, monkeypatch):
    """``icml26 experiment nt_ssm --smoke``: every arm and the 4 probes for one epoch on the small graph (about a
    minute): the JSON in the runner's schema plus chosen / runs / paired_tuned / speed."""
    monkeypatch.chdir(tmp_path)
    assert runner.experiment_command(["nt_ssm", "--smoke", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "nt_ssm.json").read_text())
    spec = runner.load_spec("nt_ssm", smoke=True)
    assert result["seeds"] == 1 and set(result["arms"]) == {a.name for a in spec.arms} | set(TUNED)
    assert list(result["chosen"]) == spec.settings["reported"]
    assert len(result["runs"][0]) == len(spec.arms) + 4
    for run in result["runs"][0]:
        assert 0 <= run["test/ndcg@20"] <= 1 and run["best_epoch"] == 0
    for cells in result["arms"].values():
        assert set(cells) == {"test/ndcg@20", "test/recall@20", "val/ndcg@20"}
    assert result["paired_tuned"] and result["speed"]["train_samples_per_s"]["ratio"] > 0
    assert (tmp_path / "out" / "nt_ssm.png").is_file() and not (tmp_path / "runs").exists()
