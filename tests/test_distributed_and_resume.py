"""Slow checks: 2-process CPU DDP reduces validation metrics exactly; resume equals an uninterrupted fit."""
from __future__ import annotations

import pytest
import torch

from conftest import config_path, run_cli

QUICK = config_path("configs/trew/classifier_quick.yaml")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.mark.slow
def test_two_process_ddp_gives_the_same_validation_metrics_as_one_process(tmp_path):
    # one short training run, then the same checkpoint validated by 1 and by 2 processes
    fit = run_cli("fit", "--config", QUICK, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}",
                  "--trainer.logger=false", *QUIET)
    ckpt = fit.trainer.checkpoint_callback.last_model_path
    results = {}
    for devices, strategy in ((1, "auto"), (2, "ddp_spawn")):
        cli = run_cli("validate", "--config", QUICK, f"--ckpt_path={ckpt}", f"--trainer.devices={devices}",
                      f"--trainer.strategy={strategy}", "--trainer.logger=false", *QUIET)
        results[devices] = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert results[1].keys() == results[2].keys() and "val/acc" in results[1]
    for key in results[1]:
        assert results[2][key] == pytest.approx(results[1][key], abs=1e-6), key


@pytest.mark.slow
def test_ddp_fit_runs_on_two_cpu_processes(tmp_path):
    cli = run_cli("fit", "--config", QUICK, "--trainer.max_epochs=1", "--trainer.devices=2",
                  "--trainer.strategy=ddp_spawn", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
                  *QUIET)
    assert cli.trainer.state.finished and 0.0 <= float(cli.trainer.callback_metrics["val/acc"]) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/trew/classifier_quick.yaml", "configs/tamed_sgd/quick.yaml"])
def test_resume_after_epoch_one_equals_an_uninterrupted_fit(config, tmp_path):
    common = ["--config", config_path(config), "--trainer.logger=false", "--seed_everything=7",
              "--trainer.deterministic=true", "--trainer.max_steps=-1", *QUIET]
    straight = run_cli("fit", *common, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}/a")
    first = run_cli("fit", *common, "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path}/b")
    checkpointing = first.trainer.checkpoint_callback
    ckpt = checkpointing.last_model_path or checkpointing.best_model_path
    resumed = run_cli("fit", *common, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}/c",
                      f"--ckpt_path={ckpt}")
    assert resumed.trainer.current_epoch == straight.trainer.current_epoch == 2
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
