"""The experiments kit, every ``configs/*/experiment.yaml`` run through the runner with ``--smoke``, and every
remaining ``experiments/*.py`` script run with ``--smoke``, all against the one JSON schema."""
from __future__ import annotations

import importlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from conftest import ScriptedScores
from experiments import kit, runner
from icml26.paired import seed_arms

EXPERIMENTS = Path(kit.__file__).resolve().parent
# papers whose protocol is configs/<paper>/experiment.yaml: run by the runner; their module holds only its hooks
CONFIGURED = runner.available()
# a paper's further experiments, configs/<paper>/<stem>.yaml run as <paper>/<stem>, their hooks in
# experiments/<paper>_<stem>.py (each has its own test file: tests/test_rna_fm_coverage_experiment.py, ...)
FURTHER = [name for name in runner.available(secondary=True) if runner.is_secondary(name)]
# every script: not the package, not the kit or the runner, not private helpers shared by scripts (``_name.py``),
# not the hooks of a configured experiment, not the paper-scale check (its own schema, tests/test_paper_scale.py)
SCRIPTS = sorted(p.stem for p in EXPERIMENTS.glob("*.py") if p.stem not in ("__init__", "kit", "runner", "paper_scale")
                 and not p.stem.startswith("_") and p.stem not in CONFIGURED
                 and p.stem not in {runner.result_stem(name) for name in FURTHER})


# --------------------------------------------------------------------------------------------- schema
def check_schema(result: dict) -> None:
    assert set(result) >= {"paper", "seeds", "wall_s", "config", "arms", "per_seed"}, sorted(result)
    assert isinstance(result["paper"], str) and result["paper"]
    assert isinstance(result["seeds"], int) and result["seeds"] >= 1
    assert isinstance(result["wall_s"], float) and math.isfinite(result["wall_s"]) and result["wall_s"] >= 0
    assert isinstance(result["config"], dict) and result["config"]
    assert isinstance(result["per_seed"], list) and result["per_seed"]
    arms = result["arms"]
    assert isinstance(arms, dict) and arms
    for arm, metrics in arms.items():
        assert isinstance(arm, str) and isinstance(metrics, dict) and metrics, arm
        for metric, cell in metrics.items():
            assert set(cell) == {"mean", "std"}, (arm, metric, cell)
            for key in ("mean", "std"):
                assert isinstance(cell[key], float) and math.isfinite(cell[key]), (arm, metric, key, cell)
            assert cell["std"] >= 0, (arm, metric, cell)


def test_every_paper_is_configured_and_the_scripts_left_are_tools():
    """All nineteen papers run from configs/<paper>/experiment.yaml; the scripts left are side studies and tools
    (library comparisons, speed benchmarks, the timings table), none of them a paper's experiment."""
    from icml26.registry import paper_names

    papers = set(paper_names())
    assert len(papers) == 19 and papers <= set(CONFIGURED), sorted(papers - set(CONFIGURED))
    assert not papers & set(SCRIPTS), sorted(papers & set(SCRIPTS))
    assert {"rlvr_speed", "phyb_d3rlpy", "timings"} <= set(SCRIPTS) and "kit" not in SCRIPTS, SCRIPTS


@pytest.mark.parametrize("paper", CONFIGURED + FURTHER)
def test_configured_experiment_has_no_command_line_of_its_own(paper):
    """A configured paper's module (or a further experiment's, ``experiments/<paper>_<stem>.py``) holds hooks only:
    no argparse, no ``main`` that could drift from the YAML."""
    module = runner.result_stem(paper)
    source = (EXPERIMENTS / f"{module}.py").read_text()
    assert "argparse" not in source and "experiment_parser" not in source, paper
    assert not hasattr(importlib.import_module(f"experiments.{module}"), "main"), paper
    spec = runner.load_spec(paper)
    assert spec.metrics and spec.baseline, f"{paper}: experiment.yaml must name the metrics and the baseline arm"
    for hook in spec.hooks.values():
        runner.resolve_hook(hook)


def _files_under(*folders: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for folder in folders if folder.exists() for p in folder.rglob("*")}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_without_running(script, capsys, tmp_path):
    module = importlib.import_module(f"experiments.{script}")
    before = _files_under(tmp_path, kit.RESULTS)  # tmp_path is the working directory
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert time.perf_counter() - start < 1, "--help must not start a run"
    assert _files_under(tmp_path, kit.RESULTS) == before, "--help wrote files"
    text = capsys.readouterr().out
    for flag in ("--seeds", "--out", "--smoke"):
        assert flag in text, (script, flag)


class _CountingBar:
    """Stands in for tqdm in `kit.progress`: counts how often the bars advance."""
    ticks = 0

    def __init__(self, iterable=None, **kwargs) -> None:
        self.iterable = iterable

    def __iter__(self):
        for item in self.iterable:
            _CountingBar.ticks += 1
            yield item

    def update(self, n: int = 1) -> None:
        _CountingBar.ticks += n

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):  # set_postfix_str, set_description, ...: shown text only
        return lambda *args, **kwargs: None


@pytest.mark.slow  # every paper's smoke run (with the configured ones below): the slow suite runs them all
@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run_writes_the_schema(script, tmp_path, monkeypatch):
    module = importlib.import_module(f"experiments.{script}")
    for package in getattr(module, "REQUIRES", ()):  # an optional extra (setup.cfg) that this machine may not have
        pytest.importorskip(package)
    monkeypatch.setattr("tqdm.auto.tqdm", _CountingBar)
    _CountingBar.ticks = 0
    result = module.main(["--smoke", "--seeds", "1", "--out", str(tmp_path)])
    # progress within a seed (arms, grid points, stages), not only over seeds: one seed advances a bar twice or more
    assert _CountingBar.ticks >= 2, f"{script}: a one-seed run advanced its progress bars {_CountingBar.ticks} times"
    assert isinstance(result, dict)
    check_schema(result)
    assert result["seeds"] == 1
    written = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert written, f"{script} wrote no JSON into --out"
    matches = [name for name, data in written.items() if data == json.loads(json.dumps(result))]
    assert matches, f"{script}: no JSON in --out equals the returned dict ({sorted(written)})"
    for data in written.values():
        check_schema(data)


@pytest.mark.slow
@pytest.mark.parametrize("paper", CONFIGURED)
def test_configured_smoke_run_writes_the_schema(paper, tmp_path, monkeypatch):
    monkeypatch.setattr("tqdm.auto.tqdm", _CountingBar)
    monkeypatch.chdir(tmp_path)  # trainer outputs go to a temporary folder, never to ./runs
    _CountingBar.ticks = 0
    out = tmp_path / "out"
    before = _files_under(kit.RESULTS)
    assert runner.experiment_command([paper, "--smoke", "--seeds", "1", "--out", str(out)]) == 0
    assert _files_under(kit.RESULTS) == before, f"{paper}: the smoke run wrote into results/"
    spec = runner.load_spec(paper, smoke=True)
    runs = len(spec.arms) * (1 + len(spec.variants))
    assert _CountingBar.ticks == runs, f"{paper}: {_CountingBar.ticks} progress ticks for {runs} runs"
    assert {f"{paper}.json", f"{paper}.png"} <= {p.name for p in out.iterdir()}
    assert not (tmp_path / "runs").exists()
    result = json.loads((out / f"{paper}.json").read_text())
    check_schema(result)
    names = [arm.name for arm in spec.arms if arm.row]  # an evaluate hook may add derived arms after the one it
    shown = [arm for arm in result["arms"] if arm in names]  # measured; `row: false` arms are read by hooks only
    # tamed_sgd's report makes its own table: the tuned arms' choices, not every candidate
    assert result["seeds"] == 1 and shown and shown == (names if paper != "tamed_sgd" else [a for a in names
                                                                                             if a in shown])
    assert set(spec.metrics) <= set.union(*(set(cells) for cells in result["arms"].values())), paper

    def measured(arm: str) -> set:  # per-seed rows may nest the arms under "runs" (icml26.paired.seed_arms)
        return {metric for row in result["per_seed"] for metric in seed_arms(row, spec.baseline).get(arm, {})} \
            & set(spec.metrics)

    expected = [f"{arm} - {spec.baseline}" for arm in result["arms"]  # arms sharing a metric with the baseline
                if arm != spec.baseline and measured(arm) & measured(spec.baseline)]
    if "paired" in spec.settings:  # settings.paired: the report hook adds its own pairs after the runner's
        assert list(result["paired"])[:len(expected)] == expected
    else:
        assert list(result["paired"]) == expected
    for cells in result["paired"].values():
        for cell in cells.values():
            assert cell["n"] == 1 and cell["lo"] is None and math.isfinite(cell["mean"])


def test_ldarnet_speed_only_writes_the_schema(tmp_path):
    from experiments import ldarnet

    result = ldarnet.speed_result(tmp_path, smoke=True)
    check_schema(json.loads((tmp_path / "ldarnet_speed.json").read_text()))
    assert {"sequential", "chunked_64", "micro_ldarnet"} <= set(result["arms"])


# --------------------------------------------------------------------------------------------- the kit
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream", [_Terminal, io.StringIO])
def test_progress_bar_on_stderr_only_on_a_terminal(stream, monkeypatch):
    monkeypatch.setattr("sys.stderr", stream())
    assert list(kit.progress(range(3), "seeds")) == [0, 1, 2]
    shown = sys.stderr.getvalue()
    assert ("seeds:" in shown and "0/3" in shown) if stream is _Terminal else shown == ""


def test_summarise_on_hand_values():
    per_seed = [{"a": {"x": 1.0, "y": 2.0}, "b": {"x": 0.0}},
                {"a": {"x": 3.0, "y": 2.0}, "b": {"x": 4.0}},
                {"a": {"x": 5.0, "y": 2.0}}]  # b is missing on the third seed
    arms = kit.summarise(per_seed)
    assert list(arms) == ["a", "b"]
    assert arms["a"]["x"] == {"mean": 3.0, "std": pytest.approx(math.sqrt(8 / 3))}  # population std (ddof=0)
    assert arms["a"]["y"] == {"mean": 2.0, "std": 0.0}
    assert arms["b"]["x"] == {"mean": 2.0, "std": 2.0}
    assert kit.summarise([{"a": {"x": 7.0}}]) == {"a": {"x": {"mean": 7.0, "std": 0.0}}}


def test_markdown_table():
    arms = {"a": {"x": {"mean": 1.0, "std": 0.5}}, "b": {"y": {"mean": 2.0, "std": 0.0}}}
    lines = kit.markdown_table(arms, digits=2).splitlines()
    assert lines[0] == "| arm | x | y |"
    assert lines[2] == "| a | 1.00 ± 0.50 | - |"
    assert lines[3] == "| b | - | 2.00 ± 0.00 |"


def test_write_result_schema(tmp_path):
    arms = {"m": {"acc": {"mean": 0.5, "std": 0.1}}}
    result = kit.write_result("demo", seeds=2, wall_s=1.5, config={"lr": 0.1}, arms=arms,
                              per_seed=[{"m": {"acc": torch.tensor(0.4)}}, {"m": {"acc": 0.6}}], out=tmp_path / "o",
                              claim={"held": True})
    on_disk = json.loads((tmp_path / "o" / "demo.json").read_text())
    assert on_disk == result
    check_schema(on_disk)
    assert on_disk["claim"] == {"held": True} and on_disk["per_seed"][0]["m"]["acc"] == pytest.approx(0.4)
    assert on_disk["machine"]["cpus"] == os.cpu_count() and on_disk["machine"]["load_1min_at_end"] >= 0
    kit.write_result("demo", seeds=1, wall_s=0.0, config={"a": 1}, arms=arms, per_seed=[{}], out=tmp_path,
                     name="demo_other")
    assert (tmp_path / "demo_other.json").is_file() and not (tmp_path / "demo.json").exists()
    with pytest.raises(ValueError, match="mean"):
        kit.write_result("bad", seeds=1, wall_s=0.0, config={}, arms={"m": {"acc": {"mean": 1.0}}}, per_seed=[],
                         out=tmp_path)


def test_experiment_parser_flags():
    args = kit.experiment_parser("demo", seeds=3).parse_args([])
    assert (args.seeds, args.smoke, Path(args.out)) == (3, False, kit.RESULTS)
    args = kit.experiment_parser("demo", seeds=3).parse_args(["--seeds", "1", "--smoke", "--out", "x"])
    assert (args.seeds, args.smoke, args.out) == (1, True, "x")


@pytest.mark.parametrize("mode, best_epoch", [("max", 2), ("min", 1)])
def test_keep_best_restores_the_best_weights(mode, best_epoch):
    torch.manual_seed(0)
    scores = [0.3, 0.1, 0.9, 0.5, 0.9]  # the later tie at 0.9 must not replace epoch 2
    module = ScriptedScores(scores, "val/score")
    keep = kit.KeepBest("val/score", mode=mode)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    kit.quiet_trainer([keep], max_epochs=len(scores)).fit(module, loader, loader)
    assert keep.best_score == pytest.approx(scores[best_epoch])
    assert keep.best_step == 2 * (best_epoch + 1)  # two batches per epoch
    final = {k: v.clone() for k, v in module.state_dict().items()}
    assert not torch.equal(final["layer.weight"], module.snapshots[best_epoch]["layer.weight"])
    keep.restore(module)
    for key, value in module.state_dict().items():
        assert torch.equal(value, module.snapshots[best_epoch][key]), key
    assert keep.best_state["layer.weight"].device.type == "cpu"


def test_keep_best_without_validation_refuses_to_restore():
    with pytest.raises(RuntimeError, match="nothing to restore"):
        kit.KeepBest("val/score").restore(ScriptedScores([0.0], "val/score"))


def test_quiet_trainer_defaults_and_overrides():
    trainer = kit.quiet_trainer(max_epochs=3, num_sanity_val_steps=1)
    assert trainer.logger is None and trainer.checkpoint_callback is None
    assert not trainer.progress_bar_callback and trainer.max_epochs == 3 and trainer.num_sanity_val_steps == 1


def test_from_config_resolves_from_the_repo_root_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, data = kit.from_config("configs/knapsack_rl/quick.yaml", "--model.init_args.init_from=null",
                                  "--model.init_args.rollouts_per_prompt=3", "--seed_everything=5")
    assert type(model).__name__ == "GRPO" and type(data).__name__ == "VerifiableTaskDataModule"
    assert model.hparams.rollouts_per_prompt == 3 and torch.initial_seed() == 5
    assert list(tmp_path.iterdir()) == []
    # the config's trainer has deterministic: true; the discarded Trainer must not leave it switched on
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(FileNotFoundError):
        kit.from_config("configs/no_such_paper/quick.yaml")
