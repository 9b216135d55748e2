"""The experiment runner (`experiments.runner`) on tiny experiment.yaml files: validation errors, the seed that
drives both ``seed_everything`` and the data seed, the default ``trainer.test`` path, paired intervals, ``--check``."""
from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch
import yaml

from experiments import kit, runner

QUICK = "configs/tamed_sgd/quick.yaml"  # a few hundred scalar SGD steps: the cheapest config of the collection


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tiny(**extra) -> dict:
    spec = {"title": "tiny", "seeds": 2, "configs": [QUICK],
            "overrides": {"trainer.max_steps": 5, "data.init_args.num_steps": 5, "model.init_args.start": [1.0, 0.5]},
            "arms": {"tamed": {}, "plain": {"overrides": {"trainer.callbacks": []}}},
            "metrics": ["f"], "baseline": "plain"}
    spec.update(extra)
    return spec


# ------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("change, message", [
    ({"arm": {"tamed": {}}}, r"unknown key\(s\) \['arm'\]"),
    ({"arms": {"tamed": {"config": [QUICK]}}}, r"arms.tamed: unknown key\(s\) \['config'\]"),
    ({"arms": {"tamed": {"configs": ["configs/tamed_sgd/nope.yaml"]}}}, "no config file configs/tamed_sgd/nope.yaml"),
    ({"arms": {}}, "arms is missing or empty"),
    ({"overrides": {"seed_everything": 3}}, "seed_everything is set by the runner"),
    ({"overrides": {"data.init_args.seed": 3}}, "data.init_args.seed is set by the runner"),
    ({"overrides": {"--trainer.max_steps": 3}}, "without dashes"),
    ({"baseline": "nope"}, "baseline 'nope' is not an arm"),
    ({"evaluate": "experiments.causcibench.evaluate"}, "evaluate must be 'module:function'"),
    ({"seeds": 0}, "seeds must be a positive integer"),
    ({"smoke": {"sizes": {}}}, r"smoke: unknown key\(s\) \['sizes'\]"),
    ({"variants": {"v": {"group": "arms"}}}, "group must be a name other than"),
    ({"arms": {"tamed": {"fit": "yes"}}}, "fit must be true or false"),
    ({"arms": {"tamed": {"row": 0}, "plain": {}}}, "tamed.row must be true or false"),
    ({"arms": {"tamed": {"seed_offset": -1}}}, r"seed_offset must be an integer >= 0 \(the model seed"),
    ({"arms": {"tamed": {"seed_offset": 1.5}}}, "seed_offset must be an integer"),
    ({"arms": {"tamed": {"seeds": 0}}}, r"tamed.seeds must be a positive integer \(the arm runs on seeds"),
    ({"arms": {"tamed": {"seed_stride": 0}}}, r"tamed.seed_stride must be an integer >= 1 \(the model seed is"),
    ({"arms": {"tamed": {"seed_stride": True}}}, "tamed.seed_stride must be an integer"),
    ({"arms": {"tamed": {"row": False}}, "baseline": None}, "every arm says row: false"),
    ({"arms": {"tamed": {}, "plain": {"row": False}}}, "baseline arm 'plain' says row: false"),
    ({"prepare": "experiments.trew.prepare"}, "prepare must be 'module:function'"),
    ({"smoke": {"arms": ["nope"]}}, r"smoke.arms names unknown arms \['nope'\]"),
    ({"smoke": {"arms": {"plain": {"override": {}}}}}, r"smoke.arms.plain: unknown key\(s\) \['override'\]"),
    ({"smoke": {"arms": {"plain": {"overrides": {"seed_everything": 1}}}}}, "seed_everything is set by the runner"),
])
def test_invalid_experiment_yaml_is_one_clear_error(tmp_path, change, message):
    with pytest.raises(runner.ExperimentError, match=message):
        runner.load_spec("tiny", path=write(tmp_path, tiny(**change)))


def test_unknown_experiment_names_the_known_ones(capsys):
    assert runner.experiment_command(["no_such_paper", "--smoke"]) == 2
    error = capsys.readouterr().err
    assert "no experiment 'no_such_paper'" in error and "causcibench" in error


def test_smoke_overlay_and_flag_order(tmp_path):
    spec = tiny(variants={"big": {"group": "sizes", "overrides": {"trainer.max_steps": 7}},
                          "other": {"overrides": {"trainer.max_steps": 9}}},
                smoke={"overrides": {"trainer.max_steps": 2}, "seeds": 1, "variants": ["big"], "settings": {"k": 1}})
    path = write(tmp_path, spec)
    full = runner.load_spec("tiny", path=path)
    assert full.seeds == 2 and [v.name for v in full.variants] == ["big", "other"] and full.settings == {}
    plain = full.arms[1]
    flags = runner.arm_flags(full, plain, full.variants[0])
    assert flags[:2] == ["--config", str(kit.REPO_ROOT / QUICK)]
    # experiment < arm < variant: the variant's max_steps wins, the arm's callbacks list is JSON (YAML) text
    assert flags[2:] == ["--trainer.max_steps=7", "--data.init_args.num_steps=5", "--model.init_args.start=[1.0, 0.5]",
                         "--trainer.callbacks=[]"]
    smoke = runner.load_spec("tiny", smoke=True, path=path)
    assert smoke.seeds == 1 and [v.name for v in smoke.variants] == ["big"] and smoke.settings == {"k": 1}
    assert runner.arm_flags(smoke, plain, smoke.variants[0])[2] == "--trainer.max_steps=2"  # smoke wins over all


def test_smoke_arms_keep_a_subset_with_their_own_overrides_and_set_wins(tmp_path):
    spec = tiny(arms={"tamed": {}, "plain": {"overrides": {"trainer.callbacks": []}}, "third": {}},
                smoke={"overrides": {"trainer.max_steps": 2}, "arms": {"plain": {"overrides": {"trainer.max_steps": 3}},
                                                                        "tamed": None}})
    path = write(tmp_path, spec)
    assert [arm.name for arm in runner.load_spec("tiny", path=path).arms] == ["tamed", "plain", "third"]
    smoke = runner.load_spec("tiny", smoke=True, path=path)
    assert [arm.name for arm in smoke.arms] == ["tamed", "plain"]  # the order of `arms`, not of smoke.arms
    tamed, plain = smoke.arms
    assert "--trainer.max_steps=2" in runner.arm_flags(smoke, tamed)
    flags = runner.arm_flags(smoke, plain)
    assert "--trainer.max_steps=3" in flags and "--trainer.max_steps=2" not in flags  # the smoke arm wins
    smoke.set_overrides = {"trainer.max_steps": 9}
    flags = runner.arm_flags(smoke, plain)
    assert "--trainer.max_steps=9" in flags and "--trainer.max_steps=3" not in flags  # --set over every layer
    listed = runner.load_spec("tiny", smoke=True, path=write(tmp_path, tiny(smoke={"arms": ["plain"]})))
    assert [arm.name for arm in listed.arms] == ["plain"] and listed.arms[0].smoke_overrides == {}


# ------------------------------------------------------------------------------------------- running
SEEN: list[dict] = []


def record_seeds(run) -> dict[str, float]:
    """An evaluate hook that records what the run was built with, then tests as the default path does."""
    SEEN.append({"arm": run.arm.name, "seed": run.seed, "config_seed": run.cli.config["seed_everything"],
                 "data_seed": run.datamodule.hparams.seed, "steps": run.trainer.global_step,
                 "root": run.trainer.default_root_dir, "callbacks": [type(c).__name__ for c in run.trainer.callbacks]})
    metrics = run.test()
    run.extra["f"] = metrics["f"]
    return metrics


def report_extra(result: dict, records: list[dict]) -> dict:
    return {"objectives": [{arm: r["f"] for arm, r in seed[""].items()} for seed in records]}


def test_runs_every_seed_and_arm_as_the_cli_would(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing may land in ./runs
    SEEN.clear()
    path = write(tmp_path, tiny(evaluate="test_runner:record_seeds", report="test_runner:report_extra",
                                variants={"longer": {"group": "longer", "overrides": {"trainer.max_steps": 4},
                                                     "keep": ["f"]}}))
    result = runner.run_experiment("tiny", spec_path=path, out=tmp_path / "out")
    assert [(s["arm"], s["seed"]) for s in SEEN] == [("tamed", 0), ("plain", 0), ("tamed", 0), ("plain", 0),
                                                      ("tamed", 1), ("plain", 1), ("tamed", 1), ("plain", 1)]
    for seen in SEEN:
        assert seen["config_seed"] == seen["seed"] == seen["data_seed"]  # one seed drives both
        assert seen["steps"] in (4, 5) and not Path(seen["root"]).is_relative_to(tmp_path)
    # the YAML's callbacks are the trainer's: SGDTaming in the config, none in the arm that empties the list
    assert "SGDTaming" in SEEN[0]["callbacks"] and "SGDTaming" not in SEEN[1]["callbacks"]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out" / "tiny_runs").exists()
    on_disk = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert on_disk == result and result["paper"] == "tiny" and result["seeds"] == 2
    assert set(result["arms"]) == {"tamed", "plain"} and "grad_norm" in result["arms"]["tamed"]
    assert set(result["longer"]["longer"]["tamed"]) == {"f"} and len(result["per_seed_longer"]) == 2
    per_seed = [row["tamed"]["f"] - row["plain"]["f"] for row in result["per_seed"]]
    cell = result["paired"]["tamed - plain"]["f"]
    assert cell["n"] == 2 and cell["mean"] == pytest.approx(sum(per_seed) / 2)
    assert result["objectives"] == [{arm: row[arm]["f"] for arm in row} for row in result["per_seed"]]
    assert result["config"]["arms"]["plain"][-1] == "--trainer.callbacks=[]"
    assert "| tamed |" in capsys.readouterr().out
    assert not torch.are_deterministic_algorithms_enabled()


def test_default_evaluation_is_trainer_test_and_fit_false_skips_training(tmp_path):
    path = write(tmp_path, tiny(seeds=1, arms={"trained": {}, "untrained": {"fit": False}}, baseline="untrained"))
    result = runner.run_experiment("tiny", spec_path=path, out=tmp_path)
    trained, untrained = result["per_seed"][0]["trained"], result["per_seed"][0]["untrained"]
    assert set(trained) >= {"f", "grad_norm", "diverged"}  # test/ prefix removed
    from lightning_modules.tamed_sgd.tamed_sgd import ExpSaddle

    assert untrained["f"] == pytest.approx(float(ExpSaddle.value(torch.tensor([1.0, 0.5]))), rel=1e-6)  # the start
    assert trained["f"] != pytest.approx(untrained["f"])
    assert result["paired"]["trained - untrained"]["f"]["lo"] is None  # one seed: no interval


def test_set_for_scopes_an_override_and_arms_runs_a_part(tmp_path, monkeypatch):
    """``--set-for ARMS KEY=VALUE`` reaches only the matching arms, after ``--set``; ``--arms`` keeps the matching
    arms (pairs only where the baseline was run); a pattern that matches nothing is one error."""
    monkeypatch.chdir(tmp_path)
    SEEN.clear()
    path = write(tmp_path, tiny(seeds=1, evaluate="test_runner:record_seeds",
                                arms={"tamed": {}, "plain": {"overrides": {"trainer.callbacks": []}}, "tamed2": {}}))
    result = runner.run_experiment("tiny", spec_path=path, out=tmp_path / "out", overrides={"trainer.max_steps": 4},
                                   arm_overrides=[("tamed*", {"trainer.max_steps": 3})])
    assert [(s["arm"], s["steps"]) for s in SEEN] == [("tamed", 3), ("plain", 4), ("tamed2", 3)]
    assert result["config"]["set_for"] == [["tamed*", {"trainer.max_steps": 3}]]
    SEEN.clear()
    part = runner.run_experiment("tiny", spec_path=path, out=tmp_path / "part", only_arms=["tamed?"])
    assert [s["arm"] for s in SEEN] == ["tamed2"] and list(part["per_seed"][0]) == ["tamed2"]
    assert "paired" not in part and part["config"]["only_arms"] == ["tamed?"]
    for kwargs, message in (({"only_arms": ["nope*"]}, "--arms \\['nope\\*'\\]: matches no arm"),
                            ({"arm_overrides": [("nope", {"trainer.max_steps": 1})]}, "--set-for 'nope': matches")):
        with pytest.raises(runner.ExperimentError, match=message):
            runner.run_experiment("tiny", spec_path=path, out=tmp_path / "bad", **kwargs)
    parsed = runner.parser().parse_args(["tiny", "--set-for", "a*", "x=1", "--arms", "a", "b"])
    assert parsed.set_for == [["a*", "x=1"]] and parsed.arms == ["a", "b"]


def test_cli_refusal_is_one_error(tmp_path, capsys):
    path = write(tmp_path, tiny(seeds=1, overrides={"trainer.max_stepz": 5}))
    with pytest.raises(runner.ExperimentError, match="the CLI refused the arguments"):
        runner.run_experiment("tiny", spec_path=path, out=tmp_path)
    assert "max_stepz" in capsys.readouterr().err


def prepare_from_earlier(run) -> dict:
    """A prepare hook: the "follower" arm starts where the seed's "helper" run ended (an earlier run's result)."""
    SEEN.append({"prepare": run.arm.name, "seed": run.seed, "earlier": list(run.earlier)})
    if run.arm.name != "follower":
        return {}
    helper = run.earlier["helper"]
    return {"model.init_args.start": [float(v) for v in helper.model.x.detach()]}


def replacing_report(result: dict, records: list[dict], spec) -> dict:
    """A report that takes the spec and replaces the rows: a row computed without a Lightning run."""
    rows = [dict(row, computed={"f": 2.0 + seed}) for seed, row in enumerate(result["per_seed"])]
    return {"per_seed": rows, "arms": {**result["arms"], "computed": kit.summarise(rows)["computed"]},
            "spec_name": spec.name}


def test_seed_offsets_fewer_seeds_helper_runs_earlier_runs_and_hook_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    SEEN.clear()
    spec = tiny(arms={"helper": {"seed_offset": 1000, "seeds": 1, "row": False},
                      "follower": {"overrides": {"trainer.max_steps": 1}, "seeds": 1},
                      "plain": {"overrides": {"trainer.callbacks": []}, "seed_offset": 7}},
                prepare="test_runner:prepare_from_earlier", evaluate="test_runner:record_seeds",
                report="test_runner:replacing_report", metrics=["f"], baseline="plain")
    result = runner.run_experiment("tiny", spec_path=write(tmp_path, spec), out=tmp_path / "out")
    runs = [s for s in SEEN if "arm" in s]
    assert [(s["arm"], s["seed"]) for s in runs] == [("helper", 0), ("follower", 0), ("plain", 0), ("plain", 1)]
    assert [s["earlier"] for s in SEEN if "prepare" in s] == [[], ["helper"], ["helper", "follower"], []]
    offsets = {"helper": 1000, "follower": 0, "plain": 7}
    for seen in runs:  # the model seed carries the arm's offset, the data seed is the seed
        assert seen["config_seed"] == seen["seed"] + offsets[seen["arm"]] and seen["data_seed"] == seen["seed"]
    # no row for the helper; the follower only on seed 0; the report's own row and table replace the runner's
    assert [sorted(row) for row in result["per_seed"]] == [["computed", "follower", "plain"], ["computed", "plain"]]
    assert list(result["arms"]) == ["follower", "plain", "computed"] and result["spec_name"] == "tiny"
    assert result["arms"]["computed"]["f"] == {"mean": 2.5, "std": 0.5}
    assert result["paired"]["computed - plain"]["f"]["n"] == 2 and "follower - plain" in result["paired"]
    # the follower started where the helper ended: one step from there, not from the config's start
    helper_end = result["config"]["arms"]["helper"]
    assert helper_end[-3:] == ["(model seed S + 1000, data seed S)", "(seeds 0-0 only)", "(no row: read by the hooks)"]
    assert result["per_seed"][0]["follower"]["f"] < result["per_seed"][0]["plain"]["f"]



def test_seed_stride_spaces_the_model_seeds_of_consecutive_seeds(tmp_path, monkeypatch):
    """``seed_stride: M`` with ``seed_offset: K``: the model seed is M * S + K, the data seed still S; the config
    shows it; the default stride 1 leaves S + K."""
    monkeypatch.chdir(tmp_path)
    SEEN.clear()
    spec = tiny(arms={"strided": {"seed_stride": 1000, "seed_offset": 3}, "plain": {"seed_offset": 3}},
                evaluate="test_runner:record_seeds")
    result = runner.run_experiment("tiny", spec_path=write(tmp_path, spec), out=tmp_path / "out")
    seeds = {(s["arm"], s["seed"]): (s["config_seed"], s["data_seed"]) for s in SEEN}
    assert seeds == {("strided", 0): (3, 0), ("plain", 0): (3, 0), ("strided", 1): (1003, 1), ("plain", 1): (4, 1)}
    assert result["config"]["arms"]["strided"][-1] == "(model seed 1000 S + 3, data seed S)"
    assert result["config"]["arms"]["plain"][-1] == "(model seed S + 3, data seed S)"
    loaded = runner.load_spec("tiny", path=write(tmp_path, spec))
    assert [(a.seed_stride, a.seed_offset) for a in loaded.arms] == [(1000, 3), (1, 3)]

# ------------------------------------------------------------------------------------------- statistics
def test_paired_interval_on_hand_values():
    per_seed = [{"b": {"m": 0.0}, "a": {"m": 1.0}}, {"b": {"m": 1.0}, "a": {"m": 3.0}},
                {"b": {"m": 2.0}, "a": {"m": 5.0}}]  # differences 1, 2, 3: mean 2, sd 1
    cell = runner.paired(per_seed, "b", ["m"])["a - b"]["m"]
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert cell == {"mean": 2.0, "lo": pytest.approx(2 - half), "hi": pytest.approx(2 + half), "n": 3}
    assert "b - b" not in runner.paired(per_seed, "b", ["m"])
    partial = runner.paired(per_seed[:1] + [{"b": {"m": 1.0}}], "b", ["m"])["a - b"]["m"]  # a missing on seed 1
    assert partial == {"mean": 1.0, "lo": None, "hi": None, "n": 1}


# ------------------------------------------------------------------------------------------- --check
@pytest.mark.parametrize("verdict, code", [("held", 0), ("not held", 1), ({"verdict": "held"}, 0)])
def test_check_exit_code_follows_the_verdict(tmp_path, monkeypatch, verdict, code):
    claims = types.ModuleType("icml26.claims")
    claims.check_paper = lambda name, path: verdict
    monkeypatch.setitem(sys.modules, "icml26.claims", claims)
    assert runner.check("tiny", tmp_path / "tiny.json") == code


def test_check_without_the_claims_module_fails_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "icml26.claims", None)  # import fails
    assert runner.check("tiny", tmp_path / "tiny.json") == 2
    assert "icml26.claims" in capsys.readouterr().err


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        runner.experiment_command(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--smoke", "--seeds", "--out", "--check"):
        assert flag in text


def test_a_paper_whose_experiment_is_still_a_script_runs_it_with_the_same_flags(monkeypatch, tmp_path):
    """``icml26 experiment NAME`` for every paper: without an experiment.yaml the script's main gets --smoke,
    --seeds and --out; flags only the runner has are refused in one line."""
    import importlib

    def is_script(stem: str) -> bool:  # an experiments/<stem>.py with its own main and no experiment.yaml
        return (not stem.startswith("_") and stem not in ("kit", "runner", "paper_scale")
                and not runner.experiment_path(stem).is_file()
                and hasattr(importlib.import_module(f"experiments.{stem}"), "main"))

    # a script not yet converted (the papers' scripts convert one by one; any script with a main will do)
    name = next(p.stem for p in sorted((kit.REPO_ROOT / "experiments").glob("*.py")) if is_script(p.stem))
    script = importlib.import_module(f"experiments.{name}")
    calls = []
    monkeypatch.setattr(script, "main", lambda argv: calls.append(argv), raising=True)
    assert runner.experiment_command([name, "--smoke", "--seeds", "2", "--out", str(tmp_path)]) == 0
    assert calls == [["--smoke", "--seeds", "2", "--out", str(tmp_path)]]
    assert runner.experiment_command([name, "--set", "trainer.max_steps=3"]) == 2
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------- further experiments
def test_a_papers_further_experiment_is_named_paper_slash_stem(tmp_path, monkeypatch, capsys):
    """``configs/<paper>/<stem>.yaml`` runs as ``<paper>/<stem>``: its result is ``<paper>_<stem>.json`` (or
    ``--name``); `available` lists the main experiments only unless asked; ``--check`` says in one line that a further
    experiment has no claim check of its own."""
    root = tmp_path / "repo"
    (root / "configs" / "tiny").mkdir(parents=True)
    (root / "configs" / "tamed_sgd").symlink_to(kit.REPO_ROOT / "configs" / "tamed_sgd")
    (root / "configs" / "tiny" / "experiment.yaml").write_text(yaml.safe_dump(tiny(seeds=1)))
    (root / "configs" / "tiny" / "side.yaml").write_text(yaml.safe_dump(tiny(seeds=1, title="side study")))
    (root / "configs" / "tiny" / "quick.yaml").write_text("trainer: {max_epochs: 1}\n")  # a config, no experiment
    monkeypatch.setattr(kit, "REPO_ROOT", root)
    monkeypatch.chdir(tmp_path)  # nothing may land in ./runs
    assert runner.experiment_path("tiny/side") == root / "configs" / "tiny" / "side.yaml"
    assert runner.experiment_path("tiny") == root / "configs" / "tiny" / "experiment.yaml"
    assert runner.result_stem("tiny/side") == "tiny_side" and runner.result_stem("tiny") == "tiny"
    assert runner.is_secondary("tiny/side") and not runner.is_secondary("tiny")
    assert "tiny" in runner.available() and not any("/" in name for name in runner.available())
    assert [n for n in runner.available(secondary=True) if n.startswith("tiny")] == ["tiny", "tiny/side"]
    spec = runner.load_spec("tiny/side", smoke=True)
    assert spec.name == "tiny/side" and spec.title == "side study" and spec.path == root / "configs/tiny/side.yaml"

    out = tmp_path / "out"
    assert runner.experiment_command(["tiny/side", "--out", str(out), "--check", "--keep-runs"]) == 0
    assert "tiny/side is a further experiment of tiny" in capsys.readouterr().err
    result = json.loads((out / "tiny_side.json").read_text())
    assert result["paper"] == "side study" and set(result["arms"]) == {"tamed", "plain"}
    assert result["config"]["experiment"] == "configs/tiny/side.yaml" and (out / "tiny_side_runs").is_dir()
    assert runner.experiment_command(["tiny/side", "--out", str(out), "--name", "side_small"]) == 0
    assert (out / "side_small.json").is_file() and not (tmp_path / "runs").exists()
    for name, message in (("tiny/nope", "no experiment 'tiny/nope'"), ("tiny/side/x", "write PAPER or PAPER/STEM"),
                          ("tiny/", "write PAPER or PAPER/STEM"), ("tiny/quick", r"unknown key\(s\)")):
        assert runner.experiment_command([name, "--out", str(out)]) == 2, name
        err = capsys.readouterr().err
        assert re.search(message, err), (name, err)


def test_check_of_a_main_experiment_reads_its_result_stem(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "run_experiment", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "check", lambda name, path: seen.append((name, path)) or 0)
    assert runner.experiment_command(["rna_fm", "--out", str(tmp_path), "--check"]) == 0
    assert runner.experiment_command(["rna_fm/coverage", "--out", str(tmp_path), "--check"]) == 0
    assert seen == [("rna_fm", tmp_path / "rna_fm.json")]  # the further experiment is not checked
