"""train.py behaviour users rely on: W&B offline by default, configs saved per run, short names, fine-tuning."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.callbacks import ProgressBar

from conftest import REPO, ParseOnlyCLI, config_path, run_cli
from lightning_modules.shared.errors import UserInputError

QUICK = config_path("configs/trew/classifier_quick.yaml")


def test_wandb_is_offline_unless_the_user_says_otherwise(tmp_path):
    # one fresh interpreter (importing train costs seconds): the first import runs without WANDB_MODE; re-executing
    # train.py's top level (importlib.reload) after the user set it must keep the user's choice
    code = ("import importlib, os; import train; print(os.environ['WANDB_MODE']); "
            "os.environ['WANDB_MODE'] = 'disabled'; importlib.reload(train); print(os.environ['WANDB_MODE'])")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["offline", "disabled"], out.stderr[-2000:]


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
        # not config.yaml: W&B writes its own record of the run config under that name in the same folder
        saved = open(os.path.join(run_dir, "run_config.yaml")).read()
        assert "class_path: lightning_modules.shared.classifier.ImageClassifier" in saved
        assert "seed_everything: 42" in saved


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
    ckpt = f"{first.trainer.checkpoint_callback.dirpath}/last.ckpt"
    # the new run uses another learning rate; init_from copies weights only (checked before any step)
    second = run_cli("--config", QUICK, f"--model.init_args.init_from={ckpt}",
                     "--model.init_args.optimizer.init_args.lr=0.0123", "--trainer.logger=false", run=False)
    second.model.load_initial_weights()
    for key, value in first.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[key]), key
    assert second.model.configure_optimizers().param_groups[0]["lr"] == 0.0123
    assert second.model.init_from_report["shape_mismatch"] == []


# --------------------------------------------------------------------------------------------- --ckpt_path
SFT = config_path("configs/grpo/sft_quick.yaml")
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def test_resuming_a_checkpoint_of_another_paper_is_refused_naming_both_classes(prerequisite_checkpoints):
    # real checkpoints of two papers: the GRPO warm-up (SupervisedWarmup) and the TREW classifier, 2 steps each
    sft = prerequisite_checkpoints("configs/grpo/sft_quick.yaml")
    classifier = prerequisite_checkpoints("configs/trew/classifier_quick.yaml")
    with pytest.raises(UserInputError) as info:  # before: the run silently became SupervisedWarmup and exited 0
        run_cli("fit", "--config", QUICK, f"--ckpt_path={sft}", "--trainer.fast_dev_run=1", *QUIET)
    message = str(info.value)
    for name in ("SupervisedWarmup", "ImageClassifier", "VerifiableTaskDataModule", "ImageClassificationDataModule",
                 f"--model.init_args.init_from={sft}", "Fine-tuning vs resuming"):
        assert name in message, name
    with pytest.raises(UserInputError, match=r"LightningModule is ImageClassifier .* builds SupervisedWarmup"):
        run_cli("fit", "--config", SFT, f"--ckpt_path={classifier}", "--trainer.fast_dev_run=1", *QUIET)
    with pytest.raises(UserInputError, match="LightningModule is SupervisedWarmup"):  # evaluation too
        run_cli("validate", "--config", QUICK, f"--ckpt_path={sft}", *QUIET)
    # the same model with another datamodule cannot resume a fit, but may be evaluated on other data
    with pytest.raises(UserInputError, match=r"datamodule is VerifiableTaskDataModule .* ImageClassificationData"):
        run_cli("fit", "--config", SFT, "--data=ImageClassificationDataModule", f"--ckpt_path={sft}",
                cli_class=ParseOnlyCLI)
    run_cli("test", "--config", SFT, "--data=ImageClassificationDataModule", f"--ckpt_path={sft}",
            cli_class=ParseOnlyCLI)


def test_cross_paper_resume_from_the_command_line_is_one_error_line_and_status_2(prerequisite_checkpoints,
                                                                                 tmp_path):
    sft = prerequisite_checkpoints("configs/grpo/sft_quick.yaml")
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "fit", "--config", QUICK, f"--ckpt_path={sft}",
                             "--trainer.fast_dev_run=1", *QUIET], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --ckpt_path '{sft}' was written by another run") and "init_from" in last
    assert "Traceback" not in result.stderr and "Restored all states" not in result.stdout + result.stderr


def test_same_model_resume_continues_and_names_the_configured_values_it_ignores(prerequisite_checkpoints, caplog):
    classifier = prerequisite_checkpoints("configs/trew/classifier_quick.yaml")  # 2 steps done
    with caplog.at_level(logging.WARNING, logger="train"):
        cli = run_cli("fit", "--config", QUICK, f"--ckpt_path={classifier}", "--trainer.max_steps=3",
                      "--trainer.limit_val_batches=1", "--model.init_args.hidden_dim=16",
                      "--model.init_args.optimizer.init_args.lr=0.5", "--data.init_args.seed=0", *QUIET)
    assert cli.trainer.state.finished and cli.trainer.global_step == 3  # resumed at step 2, ran one more
    assert cli.model.hparams.hidden_dim == 128  # the checkpoint's value: the weights have that shape
    warnings = [r.getMessage() for r in caplog.records if r.name == "train"]
    assert len(warnings) == 1, warnings
    assert "model.init_args.hidden_dim=16 (checkpoint: 128)" in warnings[0]
    assert "model.init_args.optimizer.init_args.lr=0.5 (checkpoint: 0.001)" in warnings[0]
    assert warnings[0].count("(checkpoint:") == 2  # nothing else: an unchanged config resumes without warnings
    assert "data." not in warnings[0] and "init_from" in warnings[0]  # data values are not replaced on resume


def test_step_based_runs_show_their_step_budget_and_no_version_column(tmp_path, monkeypatch, caplog):
    """Lightning's bar shows ``Epoch 0/-2`` and ``v_num: 0.000`` for step-based runs and every run prints a tip."""
    from callbacks.progress import RunProgressBar

    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO):
        cli = run_cli("fit", "--config", config_path("configs/tamed_sgd/quick.yaml"), "--trainer.max_steps=3")
    bars = [c for c in cli.trainer.callbacks if isinstance(c, ProgressBar)]
    assert len(bars) == 1 and isinstance(bars[0], RunProgressBar)
    assert cli.trainer.max_epochs == -1 and bars[0]._get_train_description(0).strip() == "Epoch 0 (max_steps 3)"
    assert cli.trainer.logger is not None and "v_num" not in bars[0].get_metrics(cli.trainer, cli.model)
    assert not [r for r in caplog.records if str(r.msg).startswith("💡")], "Lightning's advertising tip is shown"
    # a config that disables the bar, or brings its own, keeps that choice
    quiet = run_cli("fit", "--config", config_path("configs/tamed_sgd/quick.yaml"), "--trainer.max_steps=1",
                    "--trainer.enable_progress_bar=false")
    assert not [c for c in quiet.trainer.callbacks if isinstance(c, ProgressBar)]


def test_a_finished_cli_run_frees_its_model_and_trainer(tmp_path, monkeypatch):
    """Runs in one process (the experiment runner, the release-format steps) must not pile up: jsonargparse keeps
    its last parser in a context variable, and the parser refers to the CLI, so `train.main` runs in a copy of the
    context. Without that copy all three objects stay alive here."""
    import gc
    import weakref

    import train

    monkeypatch.chdir(tmp_path)

    def run() -> list:
        cli = train.main(["fit", "--config", "configs/tamed_sgd/quick.yaml", "--trainer.max_steps=2",
                          "--trainer.enable_progress_bar=false", "--trainer.logger=false"])
        return [weakref.ref(cli), weakref.ref(cli.model), weakref.ref(cli.trainer)]

    refs = run()
    gc.collect()
    assert [ref() is None for ref in refs] == [True, True, True]
