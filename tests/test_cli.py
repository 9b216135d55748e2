"""train.py behaviour users rely on: W&B offline by default, configs saved per run, short names, fine-tuning."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

from conftest import REPO, config_path, run_cli

QUICK = config_path("configs/trew/classifier_quick.yaml")


def test_wandb_is_offline_unless_the_user_says_otherwise(tmp_path):
    code = "import os; import train; print(os.environ['WANDB_MODE'])"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "offline", out.stderr[-2000:]
    env["WANDB_MODE"] = "disabled"  # an explicit user choice wins
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "disabled"


def test_config_is_saved_into_each_wandb_run_and_a_second_run_does_not_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    run_dirs = []
    for _ in range(2):  # Lightning's default SaveConfigCallback crashes on the second run here
        cli = run_cli("fit", "--config", QUICK, "--config", config_path("configs/logger/wandb.yaml"),
                      "--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false")
        run_dirs.append(cli.trainer.logger.experiment.dir)
        assert cli.trainer.logger.experiment.config["model.class_path"].endswith("ImageClassifier")
        assert cli.trainer.logger.experiment.config["model.init_args.hidden_dim"] == 128
        wandb.finish()
    assert run_dirs[0] != run_dirs[1]
    for run_dir in run_dirs:
        saved = open(os.path.join(run_dir, "config.yaml")).read()
        assert "ImageClassifier" in saved and "seed_everything: 42" in saved


def test_csv_runs_get_their_own_config(tmp_path):
    for version in range(2):
        run_cli("fit", "--config", QUICK, "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
                "--trainer.enable_progress_bar=false")
        assert (tmp_path / f"runs/trew/classifier/version_{version}/config.yaml").is_file()


def test_short_class_names_work():
    cli = run_cli("--config", QUICK, "--model=ImageClassifier", "--model.hidden_dim=16",
                  "--data=ImageClassificationDataModule", "--trainer.logger=false", run=False)
    assert cli.model.hparams.hidden_dim == 16


def test_fine_tuning_with_a_new_config_keeps_weights_but_not_the_old_hyper_parameters(tmp_path):
    first = run_cli("fit", "--config", QUICK, "--trainer.max_steps=3", "--trainer.limit_val_batches=1",
                    "--trainer.logger=false", "--trainer.enable_progress_bar=false")
    ckpt = first.trainer.checkpoint_callback.last_model_path
    # the new run uses another learning rate; init_from copies weights only (checked before any step)
    second = run_cli("--config", QUICK, f"--model.init_args.init_from={ckpt}",
                     "--model.init_args.optimizer.init_args.lr=0.0123", "--trainer.logger=false", run=False)
    second.model.load_initial_weights()
    for key, value in first.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[key]), key
    assert second.model.configure_optimizers().param_groups[0]["lr"] == 0.0123
    assert second.model.init_from_report["shape_mismatch"] == []
