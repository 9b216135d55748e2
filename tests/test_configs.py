"""The contract every paper config satisfies (parametrised over configs/*/*quick.yaml and *paper.yaml)."""
from __future__ import annotations

import contextlib
import io
import math
import shlex

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

import train
from conftest import PAPER_CONFIGS, QUICK_CONFIGS, SWEEP_FILES, config_path, run_cli

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class ParseOnlyCLI(train.CollectionCLI):
    """Parses and validates a config (types, class paths, ranges of jsonargparse) without building it."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def test_there_are_configs():
    assert QUICK_CONFIGS and PAPER_CONFIGS and SWEEP_FILES
    for quick in (c for c in QUICK_CONFIGS if c.endswith("/quick.yaml")):
        assert quick.replace("quick.yaml", "paper.yaml") in PAPER_CONFIGS, f"{quick} has no paper.yaml"


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_parse_and_instantiate(config):
    cli = run_cli("--config", config_path(config), *QUIET, run=False)
    assert cli.model is not None and cli.datamodule is not None


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


class GradientProbe(Callback):
    """Records, after the first backward pass, which trainable parameters lack a finite gradient."""

    def __init__(self):
        self.bad: list[str] | None = None

    def on_after_backward(self, trainer, pl_module):
        if self.bad is None:
            self.bad = [name for name, p in pl_module.named_parameters() if p.requires_grad and
                        (p.grad is None or not torch.isfinite(p.grad).all())]


def _fit_for_steps(config: str, steps: int, extra: list[str], callbacks: list[Callback] = ()):
    cli = run_cli("--config", config_path(config), f"--trainer.max_steps={steps}", "--trainer.limit_val_batches=1",
                  "--trainer.num_sanity_val_steps=0", *QUIET, *extra, run=False)
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_every_trainable_parameter_gets_a_finite_gradient(config, prerequisite_args):
    probe = GradientProbe()
    cli = _fit_for_steps(config, 1, prerequisite_args(config), [probe])
    assert any(p.requires_grad for p in cli.model.parameters())
    assert probe.bad == [], f"parameters without a finite gradient: {probe.bad}"


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


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_checkpoint_round_trip(config, prerequisite_args, tmp_path):
    cli = _fit_for_steps(config, 2, prerequisite_args(config))
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


@pytest.mark.parametrize("config", QUICK_CONFIGS)
def test_same_seed_gives_bit_identical_weights(config, prerequisite_args):
    weights = []
    for _ in range(2):
        cli = _fit_for_steps(config, 3, ["--seed_everything=123", "--trainer.deterministic=true",
                                         *prerequisite_args(config)])
        weights.append({k: v.clone() for k, v in cli.model.state_dict().items()})
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_paper_config_parses(config):
    cli = run_cli("fit", "--config", config_path(config), cli_class=ParseOnlyCLI)
    assert cli.config["fit"]["model"]["class_path"]


# --------------------------------------------------------------------------------------------- sweeps
def _agent_arguments(run_config: dict) -> list[str]:
    """What `wandb agent` substitutes for ${args}: --<name>=<str(value)>."""
    return [f"--{name}={entry['value']}" for name, entry in run_config.items()]


@pytest.mark.parametrize("sweep_file", SWEEP_FILES)
def test_sweep_file_is_valid_and_every_sampled_command_parses(sweep_file):
    import yaml
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
        assert cli.config["fit"]["model"]["class_path"], shlex.join(args)
        suggestion.state = sweeps.RunState.finished
        metric = sweep["metric"]["name"]
        suggestion.summary_metrics = {metric: float(len(runs))}
        runs.append(suggestion)
    assert runs, f"{sweep_file}: the sweep engine proposed no run"
    assert all(math.isfinite(r.summary_metrics[sweep["metric"]["name"]]) for r in runs)


@pytest.mark.parametrize("group", ["configs/trainer/cpu.yaml", "configs/trainer/gpu.yaml",
                                   "configs/trainer/ddp.yaml", "configs/logger/csv.yaml",
                                   "configs/logger/wandb.yaml"])
def test_trainer_and_logger_groups_compose_with_every_paper_config(group):
    for config in PAPER_CONFIGS + QUICK_CONFIGS:
        cli = run_cli("fit", "--config", config_path(config), "--config", config_path(group), cli_class=ParseOnlyCLI)
        trainer = cli.config["fit"]["trainer"]
        if group.endswith("gpu.yaml"):
            assert trainer["precision"] == "bf16-mixed" and trainer["strategy"] == "ddp" and trainer["devices"] == -1
