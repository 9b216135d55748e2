"""The contract every paper config satisfies (parametrised over configs/*/*quick.yaml and *paper.yaml)."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shlex
import sys

import pytest
import torch
import yaml
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from conftest import (PAPER_CONFIGS, QUICK_CONFIGS, SWEEP_FILES, GradientProbe, ParseOnlyCLI, checkpoint_writers,
                      config_path, run_cli)

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def test_there_are_configs():
    assert QUICK_CONFIGS and PAPER_CONFIGS and SWEEP_FILES
    for quick in (c for c in QUICK_CONFIGS if c.endswith("/quick.yaml")):
        assert quick.replace("quick.yaml", "paper.yaml") in PAPER_CONFIGS, f"{quick} has no paper.yaml"


def _resolve(class_path: str) -> type:
    module_name, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def _plain(value):
    """A config value as plain Python (jsonargparse Namespaces become dicts, tuples lists)."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_parse_and_instantiate(config):
    cli = run_cli("--config", config_path(config), *QUIET, run=False)
    with open(config_path(config)) as f:
        written = yaml.safe_load(f)
    assert type(cli.model) is _resolve(written["model"]["class_path"])
    assert type(cli.datamodule) is _resolve(written["data"]["class_path"])
    built = [type(c) for c in cli.trainer.callbacks]
    for callback in written.get("trainer", {}).get("callbacks") or []:
        assert _resolve(callback["class_path"]) in built, callback["class_path"]
    # every scalar the config gives the model reaches it (the module saves its init arguments as hparams)
    for key, value in (written["model"].get("init_args") or {}).items():
        if isinstance(value, (bool, int, float, str)) and key in cli.model.hparams:
            assert _plain(cli.model.hparams[key]) == value, key
    trainer = written.get("trainer", {})
    if "max_epochs" in trainer:
        assert cli.trainer.max_epochs == trainer["max_epochs"]
    if "max_steps" in trainer:
        assert cli.trainer.max_steps == trainer["max_steps"]


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_fast_dev_run(config, prerequisite_args):
    cli = run_cli("fit", "--config", config_path(config), "--trainer.fast_dev_run=1", *QUIET,
                  *prerequisite_args(config))
    assert cli.trainer.state.finished


def _print_config(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        run_cli("fit", *args, "--print_config")
    assert exit_info.value.code in (0, None)
    return out.getvalue()


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_print_config_round_trip(config, tmp_path):
    printed = _print_config("--config", config_path(config))
    (tmp_path / "printed.yaml").write_text(printed)
    assert _print_config("--config", str(tmp_path / "printed.yaml")) == printed


def _fit_for_steps(config: str, steps: int, extra: list[str], callbacks: list[Callback] = ()):
    """Fit `config` for `steps` optimiser steps, one validation batch per validation. A config that sets no
    max_epochs gets 20 as a bound: a module that may skip a step (GRPO's zero-variance filter drops every group of
    a batch without a mixed one) cannot then loop for ever; the tests assert how many steps were taken."""
    with open(config_path(config)) as f:
        bounded = "max_epochs" in (yaml.safe_load(f).get("trainer") or {})
    cli = run_cli("--config", config_path(config), f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1",
                  "--trainer.num_sanity_val_steps=0", *([] if bounded else ["--trainer.max_epochs=20"]), *QUIET,
                  *extra, run=False)
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


# The gradient, checkpoint round-trip and determinism contracts share one fit per config: SEEDED_STEPS optimiser
# steps from a fixed seed in deterministic mode, with a GradientProbe on the first backward pass. Their `config`
# parameter is module-scoped, so pytest runs the three tests of a config together and keeps one fit alive at a time.
SEEDED = ["--seed_everything=123", "--trainer.deterministic=true"]
SEEDED_STEPS = 2


class SeededFit:
    def __init__(self, cli, probe: GradientProbe) -> None:
        self.cli, self.probe = cli, probe
        self.steps = cli.trainer.global_step
        self.weights = {k: v.detach().clone() for k, v in cli.model.state_dict().items()}


def _seeded_fit(config: str, prerequisite_args) -> SeededFit:
    probe = GradientProbe()
    cli = _fit_for_steps(config, SEEDED_STEPS, [*SEEDED, *prerequisite_args(config)], [probe])
    return SeededFit(cli, probe)


@pytest.fixture(scope="module")
def seeded_fit(config, prerequisite_args, tmp_path_factory):
    """The shared fit of `config` (built in a directory of its own, as the CLI would from the command line)."""
    directory, cwd, argv = tmp_path_factory.mktemp("seeded_fit"), os.getcwd(), sys.argv
    os.chdir(directory)
    sys.argv = ["train.py"]
    try:
        fit = _seeded_fit(config, prerequisite_args)
    finally:
        os.chdir(cwd)
        sys.argv = argv
        torch.use_deterministic_algorithms(False)
    yield fit


@pytest.mark.parametrize("config", QUICK_CONFIGS, scope="module")
def test_every_trainable_parameter_gets_a_finite_gradient(config, seeded_fit):
    assert any(p.requires_grad for p in seeded_fit.cli.model.parameters())
    assert seeded_fit.probe.bad is not None, "no backward pass ran"
    assert seeded_fit.probe.bad == [], f"parameters without a finite gradient: {seeded_fit.probe.bad}"


def _first_eval_batch(datamodule):
    """First batch of the predict loader (falling back to validation, then training data)."""
    for stage, loader_name in (("predict", "predict_dataloader"), ("validate", "val_dataloader"),
                               ("fit", "train_dataloader")):
        datamodule.setup(stage)
        try:
            return next(iter(getattr(datamodule, loader_name)()))
        except (NotImplementedError, MisconfigurationException):  # the datamodule lacks this loader
            continue
    raise AssertionError(f"{type(datamodule).__name__} has no dataloader")


@pytest.mark.parametrize("config", QUICK_CONFIGS, scope="module")
def test_checkpoint_round_trip(config, seeded_fit, tmp_path):
    cli = seeded_fit.cli
    path = tmp_path / "round_trip.ckpt"
    cli.trainer.save_checkpoint(path)
    reloaded = type(cli.model).load_from_checkpoint(path)  # no extra args: everything comes from the file
    batch = _first_eval_batch(cli.datamodule)
    outputs = []
    for model in (cli.model, reloaded):
        model.eval()
        with torch.no_grad():
            outputs.append(model.predict_step(batch, 0))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    for key, value in cli.model.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key
    for key, value in seeded_fit.weights.items():  # the trained weights, not a fresh initialisation
        assert torch.equal(value, reloaded.state_dict()[key]), key


@pytest.mark.parametrize("config", QUICK_CONFIGS, scope="module")
def test_same_seed_gives_bit_identical_weights(config, seeded_fit, prerequisite_args):
    assert seeded_fit.steps >= 1, "the seeded fit took no optimiser step: equal weights would prove nothing"
    again = _seeded_fit(config, prerequisite_args)
    assert again.steps == seeded_fit.steps
    assert again.weights.keys() == seeded_fit.weights.keys()
    for key, value in seeded_fit.weights.items():
        assert torch.equal(value, again.weights[key]), key


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_paper_config_parses(config):
    cli = run_cli("fit", "--config", config_path(config), cli_class=ParseOnlyCLI)
    parsed = cli.config["fit"]
    assert issubclass(_resolve(parsed["model"]["class_path"]), LightningModule)
    assert issubclass(_resolve(parsed["data"]["class_path"]), LightningDataModule)
    with open(config_path(config)) as f:
        written = yaml.safe_load(f)
    for key, value in (written["model"].get("init_args") or {}).items():  # the file's values, not defaults
        if isinstance(value, (bool, int, float, str)):
            assert _plain(parsed["model"]["init_args"][key]) == value, key


# --------------------------------------------------------------------------------------------- sweeps
def _agent_arguments(run_config: dict) -> list[str]:
    """What `wandb agent` substitutes for ${args}: --<name>=<str(value)>."""
    return [f"--{name}={entry['value']}" for name, entry in run_config.items()]


@pytest.mark.parametrize("sweep_file", SWEEP_FILES)
def test_sweep_file_is_valid_and_every_sampled_command_parses(sweep_file):
    import sweeps

    with open(config_path(sweep_file)) as f:
        sweep = yaml.safe_load(f)
    assert sweeps.schema_violations_from_proposed_config(sweep) == []
    assert sweep["program"] == "train.py"
    command = sweep["command"]
    assert command[:4] == ["${env}", "WANDB_MODE=online", "${interpreter}", "${program}"] and "${args}" in command
    runs: list = []
    for _ in range(4):
        suggestion = sweeps.next_run(sweep, runs)
        if suggestion is None:  # grid exhausted
            break
        args = []
        for token in command[4:]:
            args.extend(_agent_arguments(suggestion.config) if token == "${args}" else [token])
        assert args[0] == "fit"
        args = [config_path(a) if a.endswith(".yaml") else a for a in args]
        cli = run_cli(*args, cli_class=ParseOnlyCLI)
        logger = cli.config["fit"]["trainer"]["logger"]  # an agent receives the metric only through W&B
        assert logger is not None and not isinstance(logger, bool) and logger["class_path"].endswith("WandbLogger"), \
            f"{sweep_file}: the sweep's runs do not log to W&B; add configs/logger/wandb.yaml to its command"
        for name, entry in suggestion.config.items():  # each sampled value took effect in the parsed config
            spec, value = sweep["parameters"][name], _value_at(cli.config["fit"], name)
            assert _same(value, entry["value"]), (name, value, entry["value"], shlex.join(args))
            if "values" in spec:
                assert any(_same(value, v) for v in spec["values"]), (name, value, spec["values"])
            elif "value" in spec:
                assert _same(value, spec["value"]), (name, value, spec["value"])
            else:
                assert float(spec["min"]) <= value <= float(spec["max"]), (name, value, spec)
        suggestion.state = sweeps.RunState.finished
        suggestion.summary_metrics = {sweep["metric"]["name"]: float(len(runs))}
        runs.append(suggestion)
    assert runs, f"{sweep_file}: the sweep engine proposed no run"


def _stand_in(paper: str) -> tuple[str, list[str]]:
    """The quick config that stands in for a ``paper.yaml`` (same directory and module class; among those, the one
    with the most sub-network classes in common, ``quick.yaml`` on a tie) and the flags that carry the paper's
    evaluation settings (``eval_*``, which name metrics such as ``val/pass@32``) over to it."""
    def model(config):
        with open(config_path(config)) as f:
            return yaml.safe_load(f)["model"]

    written = model(paper)
    candidates = [c for c in QUICK_CONFIGS if c.rsplit("/", 1)[0] == paper.rsplit("/", 1)[0]
                  and model(c)["class_path"] == written["class_path"]]
    assert candidates, f"no quick config in the directory of {paper} builds {written['class_path']}"

    def shared_classes(config):
        init_args = model(config).get("init_args") or {}
        return sum(isinstance(v, dict) and v.get("class_path") == init_args.get(k, {}).get("class_path")
                   for k, v in (written.get("init_args") or {}).items() if isinstance(init_args.get(k), dict))

    quick = max(sorted(candidates, key=lambda c: not c.endswith("/quick.yaml")), key=shared_classes)
    evaluation = [f"--model.init_args.{k}={json.dumps(v)}" for k, v in (written.get("init_args") or {}).items()
                  if k.startswith("eval_")]
    return quick, evaluation


@pytest.mark.parametrize("sweep_file", SWEEP_FILES)
def test_sweep_metric_is_logged_by_the_module(sweep_file, prerequisite_checkpoints, prerequisite_args):
    """The metric a sweep optimises is one its runs log: the first sampled command, with fast_dev_run (one
    validation pass) and no logger, puts ``metric.name`` into ``trainer.callback_metrics``. A sweep on a
    ``paper.yaml`` (real data, local model paths, values sized for it) runs on a quick config of the same module
    class (`_stand_in`) with the paper's evaluation settings; a sweep on a quick config runs its sampled command
    as the agent would (the sampled values of every sweep reaching the config is checked above)."""
    import sweeps

    with open(config_path(sweep_file)) as f:
        sweep = yaml.safe_load(f)
    sampled = _agent_arguments(sweeps.next_run(sweep, []).config)
    args = []
    for token in sweep["command"][4:]:
        args.extend(sampled if token == "${args}" else [token])
    assert args[:2] == ["fit", "--config"], args
    if args[2].endswith("paper.yaml"):
        quick, evaluation = _stand_in(args[2])
        args = ["fit", "--config", quick, *evaluation]  # without the local paths and the paper-scale samples
    for i, arg in enumerate(args):  # a checkpoint that a quick config writes: build it
        if arg.endswith(".ckpt"):
            option, path = arg.split("=", 1)
            args[i] = f"{option}={prerequisite_checkpoints(checkpoint_writers()[path])}"
    if not any(a.startswith("--model.init_args.init_from") for a in args):
        args += prerequisite_args(args[2])
    args = [config_path(a) if a.endswith(".yaml") else a for a in args]
    cli = run_cli(*args, "--trainer.fast_dev_run=true", *QUIET)
    metric = sweep["metric"]["name"]
    assert metric in cli.trainer.callback_metrics, \
        f"{sweep_file}: the runs never log {metric!r}; they log {sorted(cli.trainer.callback_metrics)}"


def _same(parsed, proposed) -> bool:
    """Whether a parsed config value is the sweep's proposal (which reaches the CLI as ``--key=<str(value)>``)."""
    if isinstance(proposed, str):
        if proposed == "null":
            return parsed is None
        if isinstance(parsed, (bool, list, dict)):
            return parsed == yaml.safe_load(proposed)
        if isinstance(parsed, (int, float)):
            return float(parsed) == pytest.approx(float(proposed))
        return parsed == proposed
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and not isinstance(proposed, bool):
        return float(parsed) == pytest.approx(float(proposed))
    return parsed == proposed


def _value_at(config, dotted: str):
    """The parsed value at a sweep's dotted key; a list (trainer.callbacks) is entered at its last element, as
    jsonargparse applies ``--trainer.callbacks.init_args.x`` to the last callback."""
    node = config
    for part in dotted.split("."):
        if isinstance(node, list):
            node = node[-1]
        node = node[part]
    return _plain(node)


# cpu.yaml composes in the default suite; the GPU, DDP, CSV and W&B groups (about 19 s each, parse only) in the
# slow suite
@pytest.mark.parametrize("group", ["configs/trainer/cpu.yaml",
                                   pytest.param("configs/trainer/gpu.yaml", marks=pytest.mark.slow),
                                   pytest.param("configs/trainer/ddp.yaml", marks=pytest.mark.slow),
                                   pytest.param("configs/logger/csv.yaml", marks=pytest.mark.slow),
                                   pytest.param("configs/logger/wandb.yaml", marks=pytest.mark.slow)])
def test_trainer_and_logger_groups_compose_with_every_paper_config(group):
    with open(config_path(group)) as f:
        leaves = dict(_leaves(yaml.safe_load(f)))
    assert leaves
    for config in PAPER_CONFIGS + QUICK_CONFIGS:
        cli = run_cli("fit", "--config", config_path(config), "--config", config_path(group), cli_class=ParseOnlyCLI)
        for key, value in leaves.items():  # the group, composed last, wins over the paper config
            composed = _value_at(cli.config["fit"], key)
            if key.endswith("class_path"):  # jsonargparse writes the defining module's path
                composed, value = _resolve(composed), _resolve(value)
            assert composed == value, (config, key)


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
