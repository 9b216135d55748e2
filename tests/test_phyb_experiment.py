"""The PhyB experiment as configuration (configs/phyb/experiment.yaml + the hooks in experiments/phyb.py): the
protocol's arms and sizes, a small smoke overlay, the hooks' computed overrides and their errors, and the smoke run
through the runner in the landed JSON's layout."""
from __future__ import annotations

import json

import pytest

from experiments import phyb, runner
from lightning_modules.shared.errors import UserInputError

ENVS = ("currency_exchange", "pendulum")


def _run(name: str, smoke: bool = False, set_overrides: dict | None = None, earlier: dict | None = None,
         tmp_path=None):
    spec = runner.load_spec("phyb", smoke=smoke)
    spec.set_overrides = dict(set_overrides or {})
    arm = next(a for a in spec.arms if a.name == name)
    return runner.Run(spec, arm, None, 1, tmp_path, tmp_path, earlier=earlier or {})


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    assert "phyb" in runner.available()
    spec = runner.load_spec("phyb")
    names = [arm.name for arm in spec.arms]
    assert names == [f"{env}/{arm}" for env in ENVS for arm in ("ensemble", *phyb.ARMS)]
    assert spec.seeds == 3 and spec.baseline == "pendulum/mean" and spec.metrics == list(phyb.METRICS)
    assert spec.overrides["trainer.max_steps"] == 1000 and spec.overrides["data.init_args.num_transitions"] == 20000
    assert spec.settings["episodes"] == 20
    assert spec.settings["paired"] == [{"baseline": f"{env}/{arm}", "arms": [f"{env}/phyb"]}
                                       for env in ENVS for arm in phyb.ARMS if arm != "phyb"]
    for arm in spec.arms:
        env, kind = phyb.split_arm(arm.name)
        assert arm.row == (kind != "ensemble") and arm.seed_offset == 0 and arm.fit  # one seed: data and model
        assert arm.overrides["data.init_args.source"] == env
        config = {"ensemble": "ensemble_quick", "td3_bc": "td3_bc_quick"}.get(kind, "quick")
        assert arm.configs == [f"configs/phyb/{config}.yaml"]
        if kind in phyb.TARGETS:
            assert arm.overrides["model.init_args.belief_target"] == kind
            assert arm.overrides["trainer.max_epochs"] is None and arm.overrides["trainer.limit_val_batches"] == 0
        if kind == "ensemble":
            assert arm.overrides["trainer.max_epochs"] == 5 and arm.overrides["trainer.limit_train_batches"] == 60
    smoke = runner.load_spec("phyb", smoke=True)
    assert smoke.seeds == 1 and smoke.settings["episodes"] <= 2
    assert smoke.smoke_overrides["trainer.max_steps"] <= 6
    assert smoke.smoke_overrides["data.init_args.num_transitions"] <= 500
    assert [arm.name for arm in smoke.arms] == [f"pendulum/{arm}" for arm in ("ensemble", *phyb.ARMS)]
    assert smoke.arms[0].smoke_overrides == {"trainer.max_epochs": 1, "trainer.limit_train_batches": 3}
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_prepare_links_the_ensemble_and_sizes_each_arm(tmp_path):
    ensemble = _run("pendulum/ensemble", tmp_path=tmp_path / "ens")
    assert phyb.prepare(ensemble) == {"trainer.max_steps": -1}  # its epochs, whatever max_steps says
    td3 = _run("pendulum/td3_bc", set_overrides={"trainer.max_steps": "6000"}, tmp_path=tmp_path)
    assert phyb.prepare(td3) == {"data.init_args.steps_per_epoch": 3000, "trainer.max_steps": -1}
    target = _run("pendulum/phyb", earlier={"pendulum/ensemble": ensemble}, tmp_path=tmp_path)
    assert phyb.prepare(target) == {"model.init_args.init_from": str(tmp_path / "ens" / phyb.ENSEMBLE_CHECKPOINT)}
    with pytest.raises(UserInputError, match="starts from the arm pendulum/ensemble"):
        phyb.prepare(_run("pendulum/phyb", tmp_path=tmp_path))
    with pytest.raises(runner.ExperimentError, match=r"trainer.max_steps=7: must be a positive even number"):
        phyb.prepare(_run("pendulum/mean", set_overrides={"trainer.max_steps": "7"}, tmp_path=tmp_path))
    bad = _run("pendulum/mean", tmp_path=tmp_path)
    bad.spec.settings["episodes"] = 0
    with pytest.raises(UserInputError, match="settings.episodes=0"):
        phyb.prepare(bad)
    with pytest.raises(UserInputError, match="must be named <dataset>/<arm>"):
        phyb.split_arm("pendulum/sac")


def test_report_pairs_phyb_with_every_arm_of_its_dataset_only():
    rows = [{f"{env}/{arm}": {"return": float(10 * i + j + k), "q_overestimation": float(i - j),
                              "abs_q_bias": abs(float(i - j)), "q_abs_error": 1.0}
             for k, env in enumerate(ENVS) for j, arm in enumerate(phyb.ARMS)} for i in range(3)]
    for row in rows:
        row["pendulum/behaviour"] = {"behaviour_return": -570.0}
    spec = runner.load_spec("phyb")
    runner_pairs = runner.paired(rows, spec.baseline, spec.metrics)  # every row minus pendulum/mean
    assert "currency_exchange/phyb - pendulum/mean" in runner_pairs
    added = phyb.report({"arms": {arm: {} for arm in rows[0]}, "per_seed": rows, "paired": runner_pairs}, [], spec)
    # the runner's cross-dataset pairs are dropped from its block; its Pendulum pairs stay
    assert set(runner_pairs) == {f"pendulum/{arm} - pendulum/mean" for arm in phyb.ARMS if arm != "mean"}
    assert set(added["paired"]) == {f"{env}/phyb - {env}/{arm}" for env in ENVS for arm in phyb.ARMS
                                    if arm != "phyb"}
    cell = added["paired"]["pendulum/phyb - pendulum/mean"]["return"]
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(3.0) and cell["lo"] == pytest.approx(3.0)
    # a smoke run keeps Pendulum only: the CurrencyExchange pairs are skipped
    pendulum = [{k: v for k, v in row.items() if k.startswith("pendulum/")} for row in rows]
    assert set(phyb.paired_differences(pendulum, spec.settings["paired"])) == {
        f"pendulum/phyb - pendulum/{arm}" for arm in phyb.ARMS if arm != "phyb"}
    with pytest.raises(UserInputError, match="must be named <dataset>/<arm>"):
        phyb.paired_differences(rows, [{"baseline": "pendulum/sac", "arms": ["pendulum/phyb"]}])
    with pytest.raises(UserInputError, match=r"write \{baseline: ROW, arms: \[ROW, ...\]\}"):
        phyb.paired_differences(rows, [{"baseline": "pendulum/mean", "arm": "pendulum/phyb"}])


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """The ensemble and five policy arms on Pendulum, evaluated in the real environment; the JSON has every row, the
    behaviour row, abs_q_bias beside the signed bias and PhyB's pairs; nothing lands in ./runs."""
    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("phyb", smoke=True, out=tmp_path / "out")
    assert list(result["arms"]) == [*(f"pendulum/{arm}" for arm in phyb.ARMS), "pendulum/behaviour"]
    (row,) = result["per_seed"]
    for arm in phyb.ARMS:
        cells = row[f"pendulum/{arm}"]
        assert list(cells) == list(phyb.METRICS) and cells["abs_q_bias"] == abs(cells["q_overestimation"])
    assert set(row["pendulum/behaviour"]) == {"behaviour_return"}
    assert {f"pendulum/phyb - pendulum/{arm}" for arm in phyb.ARMS if arm != "phyb"} <= set(result["paired"])
    cell = result["paired"]["pendulum/phyb - pendulum/td3_bc"]["return"]
    assert cell["n"] == 1 and cell["lo"] is None
    assert cell["mean"] == pytest.approx(row["pendulum/phyb"]["return"] - row["pendulum/td3_bc"]["return"])
    written = json.loads((tmp_path / "out" / "phyb.json").read_text())
    assert written["per_seed"] == result["per_seed"] and written["config"]["smoke"] is True
    assert (tmp_path / "out" / "phyb.png").is_file() and not (tmp_path / "runs").exists()
