"""The coupled-diffusion experiment as configuration (configs/coupled_diffusion/experiment.yaml + the hooks in
experiments/coupled_diffusion.py): the protocol's arms and sizes, the smoke overlay, the hooks' computed overrides
and their one-line errors, the run as train.py builds it (trainer and callbacks from the YAML), the report's rows and
pairs against the landed results, and the smoke run through the runner in the landed JSON's layout."""
from __future__ import annotations

import json
import types

import pytest

from callbacks.ema import EMAWeights
from experiments import coupled_diffusion as exp
from experiments import kit, runner
from lightning_modules.shared.errors import UserInputError

LEVELS = ("0.3", "0.6")
TRAINED = ("enhanced", "enhanced_3x", "parallel")
# the card's check (configs/coupled_diffusion/card.yaml) and the docs read these pairs
CARD_PAIRS = ("parallel (p=0.3) - enhanced (p=0.3)", "parallel (p=0.3) - enhanced_3x (p=0.3)")


def _run(name: str, smoke: bool = False, set_overrides: dict | None = None, earlier: dict | None = None,
         tmp_path=None, seed: int = 1):
    spec = runner.load_spec("coupled_diffusion", smoke=smoke)
    spec.set_overrides = dict(set_overrides or {})
    arm = next(a for a in spec.arms if a.name == name)
    return runner.Run(spec, arm, None, seed, tmp_path, tmp_path, earlier=earlier or {})


def _classifier(path="/somewhere/last.ckpt"):
    return types.SimpleNamespace(best_checkpoint=lambda: path)


def test_experiment_yaml_is_the_protocol_and_its_smoke_overlay_is_small():
    assert "coupled_diffusion" in runner.available()
    spec = runner.load_spec("coupled_diffusion")
    assert [a.name for a in spec.arms] == ["classifier", *(f"{a} (p={lv})" for lv in LEVELS for a in TRAINED)]
    assert spec.seeds == 3 and spec.metrics == ["acc"] and spec.baseline == "enhanced (p=0.3)"
    assert spec.title.startswith("Joint Enhancement and Classification using Coupled Diffusion Models")
    assert spec.overrides["trainer.max_steps"] == 1000 and spec.overrides["trainer.max_epochs"] == 30
    assert spec.overrides["trainer.limit_val_batches"] == 0
    assert spec.overrides["trainer.callbacks+"] == {"class_path": "experiments.coupled_diffusion.StepTimer"}
    classifier, *coupled = spec.arms
    assert classifier.configs == ["configs/coupled_diffusion/classifier_quick.yaml"] and not classifier.row
    for arm in coupled:
        name, level = exp.split_row(arm.name)
        assert arm.configs == ["configs/coupled_diffusion/quick.yaml"] and arm.row and arm.fit
        assert arm.seed_offset == 0 and arm.seeds is None  # one seed: data and model
        o = arm.overrides
        assert o["data.init_args.corruption_level"] == float(level)
        assert o["model.init_args.strategy"] == ("parallel" if name == "parallel" else "enhanced")
        # the earlier script's MODEL_OVERRIDES and recipe
        assert (o["model.init_args.prediction_type"], o["model.init_args.condition_sampling_steps"],
                o["model.init_args.alternating_iterations"], o["model.init_args.nested_refresh_every"],
                o["model.init_args.nested_refresh_from"], o["model.init_args.validate_sampling"],
                o["model.init_args.signal_denoiser"]) == ("v_prediction", 10, 2, 5, 10, False, "mlp")
        assert o["model.init_args.optimizer.init_args.lr"] == 0.002
        assert o["model.init_args.lr_scheduler"] == {
            "class_path": "torch.optim.lr_scheduler.OneCycleLR",
            "init_args": {"max_lr": 0.002, "total_steps": 1000, "pct_start": 0.25, "anneal_strategy": "cos"}}
    assert spec.settings["step_factor"] == {"enhanced_3x": 3} and spec.settings["sample_seed"] == 1000
    assert spec.settings["also_sampled"] == {"parallel": ["alternating", "nested"]}
    smoke = runner.load_spec("coupled_diffusion", smoke=True)
    assert smoke.seeds == 1 and smoke.smoke_overrides == {"trainer.max_epochs": 1, "trainer.max_steps": 5}
    assert [a.name for a in smoke.arms] == ["classifier", *(f"{a} (p=0.3)" for a in TRAINED)]
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def test_prepare_sizes_each_arm_and_links_the_classifier(tmp_path):
    assert exp.prepare(_run("classifier", tmp_path=tmp_path)) == {"trainer.max_steps": -1}  # its epochs
    earlier = {"classifier": _classifier(str(tmp_path / "last.ckpt"))}
    for name, steps in (("enhanced (p=0.3)", 1000), ("enhanced_3x (p=0.6)", 3000), ("parallel (p=0.6)", 1000)):
        assert exp.prepare(_run(name, earlier=earlier, tmp_path=tmp_path)) == {
            "trainer.max_epochs": -1, "trainer.max_steps": steps,
            "model.init_args.lr_scheduler.init_args.total_steps": steps,
            "model.init_args.init_from": str(tmp_path / "last.ckpt")}
    # --set trainer.max_steps (the old --steps): Enhanced 3x gets three times it, the smoke size is overridden
    computed = exp.prepare(_run("enhanced_3x (p=0.3)", smoke=True, set_overrides={"trainer.max_steps": "1200"},
                                earlier=earlier, tmp_path=tmp_path))
    assert computed["trainer.max_steps"] == 3600 == computed["model.init_args.lr_scheduler.init_args.total_steps"]
    assert exp.prepare(_run("parallel (p=0.3)", smoke=True, earlier=earlier, tmp_path=tmp_path))[
        "trainer.max_steps"] == 5


@pytest.mark.parametrize(("name", "set_overrides", "earlier", "message"), [
    ("parallel (p=0.3)", {}, {}, "starts from the classifier arm 'classifier', which did not run before it"),
    ("parallel (p=0.3)", {"trainer.max_steps": "0"}, {"classifier": None},
     "trainer.max_steps=0: must be a positive integer"),
    ("parallel (p=0.3)", {}, {"classifier": _classifier(None)}, "saved no checkpoint"),
])
def test_prepare_errors_are_one_line(name, set_overrides, earlier, message, tmp_path):
    earlier = {k: v if v is not None else _classifier() for k, v in earlier.items()}
    with pytest.raises(UserInputError, match=message) as info:
        exp.prepare(_run(name, set_overrides=set_overrides, earlier=earlier, tmp_path=tmp_path))
    assert isinstance(info.value, runner.ExperimentError) and "\n" not in str(info.value)


def test_setting_errors_are_one_line(tmp_path):
    run = _run("enhanced_3x (p=0.3)", earlier={"classifier": _classifier()}, tmp_path=tmp_path)
    run.spec.settings["step_factor"] = {"enhanced_3x": 0}
    with pytest.raises(UserInputError, match=r"settings.step_factor.enhanced_3x=0: must be a positive integer"):
        exp.prepare(run)
    for bad in ("parallel", "parallel (p=)", "parallel(p=0.3)"):
        with pytest.raises(UserInputError, match=r"must be named '<arm> \(p=<level>\)'") as info:
            exp.split_row(bad)
        assert "\n" not in str(info.value)
    assert exp.split_row("enhanced_3x (p=0.6)") == ("enhanced_3x", "0.6")
    with pytest.raises(UserInputError, match="settings.paired"):
        exp.paired_rows([], "enhanced (p=0.3)", {"enhanced": "parallel"})


def test_the_run_is_built_as_train_py_builds_it_with_the_yaml_callbacks(tmp_path, monkeypatch):
    """The flags of an arm plus the prepare hook's overrides, through the CLI: the recipe, the schedule over 3x the
    steps for Enhanced 3x, and the trainer's callbacks from quick.yaml (EMA 0.995 with warm-up) and the YAML (the
    step timer)."""
    monkeypatch.chdir(tmp_path)
    run = _run("enhanced_3x (p=0.6)", earlier={"classifier": _classifier(str(tmp_path / "c.ckpt"))},
               tmp_path=tmp_path)
    computed = exp.prepare(run)
    args = runner.arm_flags(run.spec, run.arm) + runner.QUIET + [runner.flag(k, v) for k, v in computed.items()]
    with runner.isolated():
        cli = runner.build_cli(args, run.seed, tmp_path / "root")
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    assert (model.hparams.strategy, model.hparams.prediction_type, model.hparams.init_from) == (
        "enhanced", "v_prediction", str(tmp_path / "c.ckpt"))
    assert model.hparams.coupling_iterations == run.spec.settings["step_factor"]["enhanced_3x"]
    assert data.corruption_level == 0.6 and data.seed == run.seed
    assert trainer.max_steps == 3000 and trainer.max_epochs == -1 and trainer.limit_val_batches == 0
    import torch

    optimiser = torch.optim.AdamW(model.parameters(), lr=0.002)
    scheduler = model.build_lr_scheduler(optimiser)
    assert type(scheduler).__name__ == "OneCycleLR" and scheduler.total_steps == 3000
    ema = [c for c in trainer.callbacks if isinstance(c, EMAWeights)]
    assert len(ema) == 1 and (ema[0].decay, ema[0].warmup) == (0.995, True)
    assert sum(isinstance(c, exp.StepTimer) for c in trainer.callbacks) == 1


def _rows(seeds: int = 3) -> list[dict]:
    """Per-seed rows in the runner's order (each trained arm, then the rows its evaluation derived)."""
    rows = []
    for s in range(seeds):
        row = {}
        for lv in LEVELS:
            for i, arm in enumerate(TRAINED):
                row[f"{arm} (p={lv})"] = {"acc": 0.5 + 0.1 * i + 0.01 * s, "acc_f_enhanced": 0.4}
            row[f"corrupted (p={lv})"] = {"acc": 0.6 + 0.02 * s}
            row[f"clean (p={lv})"] = {"acc": 0.97}
            row[f"alternating (p={lv})"] = {"acc": 0.55, "acc_f_enhanced": 0.4}
            row[f"nested (p={lv})"] = {"acc": 0.52 + 0.03 * s, "acc_f_enhanced": 0.4}
        rows.append(row)
    return rows


def test_report_orders_the_rows_and_pairs_within_each_level(capsys):
    spec = runner.load_spec("coupled_diffusion")
    rows = _rows()
    arms = kit.summarise(rows)
    runner_pairs = runner.paired(rows, spec.baseline, spec.metrics)
    assert "parallel (p=0.6) - enhanced (p=0.3)" in runner_pairs
    added = exp.report({"arms": arms, "per_seed": rows, "paired": runner_pairs}, [], spec)
    order = [f"{arm} (p={lv})" for lv in LEVELS for arm in (*exp.ARMS, "clean")]
    assert list(arms) == order and all(list(row) == order for row in rows)  # the earlier script's order
    # the runner's pairs within the baseline's level, in the rows' order (tests/test_experiments.py reads them so)
    assert list(runner_pairs) == [f"{n} - enhanced (p=0.3)" for n in order[:7] if n != "enhanced (p=0.3)"]
    landed = json.loads((kit.RESULTS / "coupled_diffusion.json").read_text())
    assert set(landed["paired"]) <= set(added["paired"]) and set(CARD_PAIRS) <= set(added["paired"])
    assert all(p.split(" - ")[0][-6:] == p.split(" - ")[1][-6:] for p in added["paired"])  # never across levels
    cell = added["paired"]["parallel (p=0.6) - enhanced_3x (p=0.6)"]["acc"]
    assert cell["n"] == 3 and cell["mean"] == pytest.approx(0.1) and cell["lo"] == pytest.approx(0.1)
    cell = added["paired"]["enhanced (p=0.3) - corrupted (p=0.3)"]["acc"]
    assert cell["mean"] == pytest.approx(-0.11)  # 0.5 + 0.01 s - (0.6 + 0.02 s), mean over s = 0, 1, 2
    shown = capsys.readouterr().out
    assert "| clean test images, f(x) | 0.970 ± 0.000 | 0.970 ± 0.000 |" in shown
    assert "compute per arm, p=0.6" in shown


@pytest.mark.parametrize("name", ["coupled_diffusion", "coupled_diffusion_unet_3600steps"])
def test_landed_results_have_the_rows_and_pairs_the_report_writes(name):
    """The report's order and pairs, applied to a landed result's per-seed values, give that file's rows in its
    order and its paired block (computed afterwards by icml26.paired) exactly."""
    landed = json.loads((kit.RESULTS / f"{name}.json").read_text())
    assert exp.row_order(landed["arms"]) == list(landed["arms"])
    spec = runner.load_spec("coupled_diffusion")
    pairs = exp.paired_rows(landed["per_seed"], spec.baseline, spec.settings["paired"])
    assert set(landed["paired"]) <= set(pairs)
    for key, cells in landed["paired"].items():
        for bound in ("mean", "lo", "hi"):
            assert pairs[key]["acc"][bound] == pytest.approx(cells["acc"][bound], abs=1e-12), (key, bound)


@pytest.mark.slow
def test_smoke_run_through_the_runner(tmp_path, monkeypatch):
    """Classifier, Enhanced, Enhanced 3x and Parallel at p = 0.3 through the runner: the JSON has the landed file's
    rows (in its order), each row's metric keys, the card's pairs, a PNG; nothing lands in ./runs."""
    monkeypatch.chdir(tmp_path)
    result = runner.run_experiment("coupled_diffusion", smoke=True, out=tmp_path / "out")
    landed = json.loads((kit.RESULTS / "coupled_diffusion.json").read_text())
    expected = [a for a in landed["arms"] if a.endswith("(p=0.3)")]
    assert list(result["arms"]) == expected
    (row,) = result["per_seed"]
    for arm in expected:
        assert list(row[arm]) == list(landed["per_seed"][0][arm]), arm
    assert row["enhanced_3x (p=0.3)"]["train_steps"] == 3 * row["enhanced (p=0.3)"]["train_steps"] == 15
    assert row["parallel (p=0.3)"]["train_calls_per_step_signal_net"] == 3.0
    assert set(CARD_PAIRS) <= set(result["paired"]) and result["paired"][CARD_PAIRS[0]]["acc"]["n"] == 1
    written = json.loads((tmp_path / "out" / "coupled_diffusion.json").read_text())
    assert written["per_seed"] == result["per_seed"] and written["config"]["smoke"] is True
    assert (tmp_path / "out" / "coupled_diffusion.png").is_file() and not (tmp_path / "runs").exists()
