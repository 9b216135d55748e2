"""``init_from`` (fine-tuning from a checkpoint's matching weights) is honoured in every stage, once per module.

* A fresh module given ``init_from`` scores those weights in ``validate`` / ``test`` / ``predict``, not its random
  initialisation; a path that does not exist is one error line, in every stage.
* ``trainer.fit`` then ``trainer.test`` on the same module tests the trained weights (``init_from`` is not loaded
  again); weights that come from a checkpoint (``--ckpt_path``, ``load_from_checkpoint``) or ``load_state_dict``
  win, and ``init_from`` is then not read at all.
* HiDe (the user's report): ``train.py test`` / ``predict`` with ``configs/hide/quick.yaml`` score the toy MLLM
  checkpoint given as ``init_from``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import QUICK_CONFIGS, REPO, config_path, run_cli
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
STAGES = ("validate", "test", "predict")


# ============================================================================================ a tiny module
class Affine(PaperModule):
    """y = w.x + b, trained by SGD on a fixed regression; counts how often ``init_from`` is read."""

    def __init__(self, lr: float = 0.1, init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(init_from=init_from, init_from_trusted=init_from_trusted)
        self.save_hyperparameters()
        self.layer = nn.Linear(3, 1)
        self.loads = 0

    def load_initial_weights(self):
        self.loads += 1
        return super().load_initial_weights()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        self.log("val/out", self.layer(batch[0]).mean())

    def test_step(self, batch, batch_idx):
        self.log("test/out", self.layer(batch[0]).mean())

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


X = torch.linspace(-1, 1, 24).reshape(8, 3)
Y = X.sum(1, keepdim=True) * 3 + 1


def loader() -> DataLoader:
    return DataLoader(TensorDataset(X, Y), batch_size=8)


def trainer(**kwargs) -> Trainer:
    defaults = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, max_steps=5)
    return Trainer(**{**defaults, **kwargs})


def run_stage(stage: str, model: Affine, fit: Trainer | None = None, **kwargs) -> torch.Tensor:
    """The stage's output for X: the logged mean (validate/test) or the mean prediction (predict)."""
    fit = fit or trainer()
    if stage == "predict":
        return torch.cat(fit.predict(model, dataloaders=loader(), **kwargs)).mean()
    results = getattr(fit, stage)(model, dataloaders=loader(), verbose=False, **kwargs)
    return torch.tensor(results[0][f"{'val' if stage == 'validate' else 'test'}/out"])


def output_of(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return (X @ state["layer.weight"].T + state["layer.bias"]).mean()


@pytest.fixture
def source(tmp_path) -> tuple[str, dict[str, torch.Tensor]]:
    """A checkpoint of Affine with weights no initialisation draws: w = (2, -1, 0.5), b = 3."""
    state = {"layer.weight": torch.tensor([[2.0, -1.0, 0.5]]), "layer.bias": torch.tensor([3.0])}
    path = tmp_path / "source.ckpt"
    torch.save({"state_dict": state}, path)
    return str(path), state


def same_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    own = model.state_dict()
    return all(torch.equal(own[k], v) for k, v in state.items())


@pytest.mark.parametrize("stage", STAGES)
def test_a_fresh_module_evaluates_the_init_from_weights(stage, source):
    path, state = source
    torch.manual_seed(0)
    model = Affine(init_from=path)
    random_output = output_of(model.state_dict())
    out = run_stage(stage, model)
    assert model.loads == 1 and same_weights(model, state)
    assert out == pytest.approx(float(output_of(state)), abs=1e-5)
    assert abs(float(out) - float(random_output)) > 0.1  # what the stage scored before the fix


@pytest.mark.parametrize("stage", ("fit", *STAGES))
def test_a_missing_init_from_is_an_error_naming_the_path_in_every_stage(stage, tmp_path):
    missing = str(tmp_path / "nowhere" / "x.ckpt")
    model = Affine(init_from=missing)
    with pytest.raises(UserInputError, match=rf"init_from '{re.escape(missing)}' does not exist.*Check the path"):
        if stage == "fit":
            trainer().fit(model, train_dataloaders=loader())
        else:
            run_stage(stage, model)


def test_fit_then_evaluate_in_one_process_keeps_the_trained_weights(source):
    path, state = source
    model = Affine(init_from=path)
    fit = trainer(max_steps=5)
    before_fit = run_stage("validate", model, fit)  # the first stage loads init_from ...
    assert before_fit == pytest.approx(float(output_of(state)), abs=1e-5) and model.loads == 1
    fit.fit(model, train_dataloaders=loader())      # ... fit does not load it again (it trains from it) ...
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.loads == 1 and not same_weights(model, state)
    for stage in STAGES:                            # ... and evaluation scores the trained weights
        for evaluator in (fit, trainer()):          # on the fit's trainer and on a new one
            out = run_stage(stage, model, evaluator)
            assert out == pytest.approx(float(output_of(trained)), abs=1e-5), stage
    assert model.loads == 1 and same_weights(model, trained)


def fitted_checkpoint(tmp_path, init_from: str | None = None) -> tuple[str, dict[str, torch.Tensor]]:
    """A full Lightning checkpoint of an Affine trained for 5 steps (its hparams name `init_from`)."""
    model = Affine(init_from=init_from)
    fit = trainer(max_steps=5)
    fit.fit(model, train_dataloaders=loader())
    path = str(tmp_path / f"fitted{'_from' if init_from else ''}.ckpt")
    fit.save_checkpoint(path)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("stage", STAGES)
def test_ckpt_path_wins_over_init_from_which_is_then_not_read(stage, tmp_path, source):
    ckpt, weights = fitted_checkpoint(tmp_path)
    missing = str(tmp_path / "moved_away.ckpt")  # an exact resume elsewhere: the old init_from file is gone
    model = Affine(init_from=missing)
    evaluator = trainer()
    assert run_stage(stage, model, evaluator, ckpt_path=ckpt) == pytest.approx(float(output_of(weights)), abs=1e-5)
    assert model.loads == 0 and same_weights(model, weights)
    assert run_stage(stage, model, evaluator) == pytest.approx(float(output_of(weights)), abs=1e-5)  # a later call
    assert model.loads == 0
    model = Affine(init_from=source[0])  # an existing init_from: the checkpoint still wins
    run_stage(stage, model, ckpt_path=ckpt)
    assert model.loads == 0 and same_weights(model, weights)


def test_resuming_a_fit_ignores_init_from_and_a_later_test_keeps_the_resumed_weights(tmp_path):
    ckpt, weights = fitted_checkpoint(tmp_path)
    model = Affine(init_from=str(tmp_path / "moved_away.ckpt"))
    resumed = trainer(max_steps=8)
    resumed.fit(model, train_dataloaders=loader(), ckpt_path=ckpt)
    assert resumed.global_step == 8 and model.loads == 0 and not same_weights(model, weights)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert run_stage("test", model, resumed) == pytest.approx(float(output_of(trained)), abs=1e-5)
    assert model.loads == 0


def test_load_from_checkpoint_and_load_state_dict_win_over_init_from(tmp_path, source):
    path, state = source
    ckpt, weights = fitted_checkpoint(tmp_path, init_from=path)
    os.remove(path)  # the checkpoint's hparams still name it
    loaded = Affine.load_from_checkpoint(ckpt)
    assert loaded.init_from == path
    assert run_stage("test", loaded) == pytest.approx(float(output_of(weights)), abs=1e-5)
    assert loaded.loads == 0
    model = Affine(init_from=path)
    model.load_state_dict(weights)
    assert run_stage("predict", model) == pytest.approx(float(output_of(weights)), abs=1e-5)
    assert model.loads == 0


def test_init_from_loaded_by_hand_is_not_loaded_again(source):
    path, state = source
    model = Affine(init_from=path)
    model.load_initial_weights()  # as the experiment scripts do, outside a Trainer
    with torch.no_grad():
        model.layer.bias.add_(1.0)
    assert run_stage("test", model) == pytest.approx(float(output_of(state)) + 1.0, abs=1e-5)
    assert model.loads == 1


# ============================================================================================ every paper module
def _one_config_per_module() -> list[str]:
    chosen: dict[str, str] = {}
    for config in [*QUICK_CONFIGS, "configs/emotion_hierarchy/probe.yaml"]:
        text = (REPO / config).read_text()
        match = re.search(r"^model:\s*\n\s+class_path:\s*(\S+)", text, re.M)
        if match:
            chosen.setdefault(match.group(1), config)
    return sorted(chosen.values())


@pytest.mark.parametrize("config", _one_config_per_module())
def test_every_module_reads_init_from_in_its_evaluation_stages(config, tmp_path):
    """Each paper module, built from its config with an ``init_from`` that does not exist, refuses every
    evaluation stage it has with the one-line error (before the fix: validate/test/predict ignored it)."""
    missing = str(tmp_path / "missing.ckpt")
    cli = run_cli("--config", config_path(config), f"--model.init_args.init_from={missing}", *QUIET,
                  "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
                  "--trainer.limit_predict_batches=1", run=False)
    step = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}
    stages = [s for s in STAGES if is_overridden(step[s], cli.model)]
    assert stages, f"{config}: no evaluation stage"
    for stage in stages:
        with pytest.raises(UserInputError, match=rf"init_from '{re.escape(missing)}' does not exist"):
            getattr(cli.trainer, stage)(cli.model, datamodule=cli.datamodule)


# ============================================================================================ HiDe (the report)
HIDE = config_path("configs/hide/quick.yaml")
HIDE_SMALL = ["--data.init_args.num_val=4", "--data.init_args.num_test=8", "--data.init_args.eval_batch_size=8",
              "--trainer.callbacks=[]", *QUIET]


@pytest.fixture
def toy_mllm(prerequisite_checkpoints) -> tuple[str, dict[str, torch.Tensor]]:
    path = prerequisite_checkpoints("configs/hide/toy_mllm_quick.yaml")
    return path, torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def test_hide_test_scores_the_init_from_checkpoint(toy_mllm):
    path, state = toy_mllm
    with_ckpt = run_cli("test", "--config", HIDE, f"--model.init_args.init_from={path}", *HIDE_SMALL)
    without = run_cli("test", "--config", HIDE, *HIDE_SMALL)
    assert sorted(with_ckpt.model.init_from_report["loaded"]) == sorted(state)  # every backbone tensor
    assert same_weights(with_ckpt.model, state)
    scores = {k: float(v) for k, v in with_ckpt.trainer.callback_metrics.items()}
    baseline = {k: float(v) for k, v in without.trainer.callback_metrics.items()}
    assert scores.keys() == baseline.keys() and "test/box_iou" in scores
    assert scores != baseline  # before the fix: bit-identical


def test_hide_predict_uses_the_init_from_checkpoint(toy_mllm):
    path, state = toy_mllm
    runs = {}
    for name, extra in (("with", [f"--model.init_args.init_from={path}"]), ("without", [])):
        cli = run_cli("predict", "--config", HIDE, *extra, *HIDE_SMALL, "--trainer.limit_predict_batches=1")
        runs[name] = (cli.model, cli.trainer.predict_loop.predictions)
    assert same_weights(runs["with"][0], state) and not same_weights(runs["without"][0], state)
    assert runs["with"][0].init_from_report is not None
    with_ckpt, without = runs["with"][1][0], runs["without"][1][0]
    assert not all(torch.equal(with_ckpt[k], without[k]) for k in ("prediction", "num_boxes"))


def test_hide_test_with_a_missing_init_from_exits_2_with_one_error_line(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "test", "--config", HIDE,
                           "--model.init_args.init_from=/nonexistent/x.ckpt", *QUIET],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and done.stderr.rstrip().endswith(errors[0])
    assert errors[0].startswith("error: init_from '/nonexistent/x.ckpt' does not exist")
    assert "configs/hide/toy_mllm_quick.yaml" in errors[0]  # the config that writes the checkpoint
