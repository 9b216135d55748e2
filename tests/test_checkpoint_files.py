"""The checkpoint files a fit leaves: ``best.ckpt`` (the best validation of the run) and ``last.ckpt`` (the end of
the run), under fixed names in the run's own ``<dirpath>/version_<N>`` folder, with ``<dirpath>/latest`` naming the
newest finished run (`icml26.run_files`; failures and resuming: ``tests/test_run_folders.py``).

Lightning's ``save_last=True`` on a monitored ModelCheckpoint copies ``last.ckpt`` only when a top-k checkpoint is
saved at the same step, so with ``save_top_k: 1`` it holds the best epoch, not the last one, and resuming from it
repeats every epoch after the best. Its version counter also turns a second run's files into ``last-v1.ckpt``,
``epoch=...-v1.ckpt``, so documented ``.../last.ckpt`` paths kept naming the first run. Every config therefore keeps
the best epoch with a monitored callback (``filename: best``) and the latest state with a second, unmonitored one
(``filename: last``), both without the version counter; the YAML check below keeps new configs that way.
"""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from conftest import REPO, config_path, run_cli
from icml26.checkpoints import written_checkpoints

CONFIG = "configs/ec_cem/quick.yaml"  # monitors val/task_acc; 9 training steps per epoch, about a second each
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
CHECKPOINT = "lightning.pytorch.callbacks.ModelCheckpoint"
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").glob("*/*.yaml")
                 if p.parent.name != "sweeps")


def _checkpoint_callbacks(config: str) -> list[dict]:
    """The ``init_args`` of every ModelCheckpoint a config file lists under ``trainer.callbacks``, in order."""
    data = yaml.safe_load((REPO / config).read_text())
    trainer = data.get("trainer") if isinstance(data, dict) else None
    callbacks = (trainer or {}).get("callbacks") or []
    return [c.get("init_args") or {} for c in callbacks if isinstance(c, dict) and c.get("class_path") == CHECKPOINT]


def _first_validation_is_best(config: str, directory: Path) -> str:
    """An overlay of ``config`` whose monitored ModelCheckpoint ranks validations by ``step`` (which Lightning adds
    to every checkpoint's candidates) with ``mode: min``: the first validation is always the best, so a run of
    several epochs has a best epoch that is not its last. Everything else is the config's own callback list."""
    data = yaml.safe_load((REPO / config).read_text())
    callbacks = data["trainer"]["callbacks"]
    monitored = [c for c in callbacks if c.get("class_path") == CHECKPOINT and c["init_args"].get("monitor")]
    assert len(monitored) == 1, monitored
    monitored[0]["init_args"].update(monitor="step", mode="min")
    overlay = directory / "first_validation_is_best.yaml"
    overlay.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(overlay)


def _fit(root: Path, overlay: str, *args: str):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        cli = run_cli("fit", "--config", config_path(CONFIG), "--config", overlay, f"--trainer.default_root_dir={root}",
                      *QUIET, *args)
    return cli, out.getvalue()


def _read(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _same_state(state: dict, other: dict) -> bool:
    return state.keys() == other.keys() and all(torch.equal(state[k], other[k]) for k in other)


def _same_weights(state: dict, model: LightningModule) -> bool:
    return _same_state(state, model.state_dict())


# ================================================================================================ files of a fit
def test_last_is_the_end_of_the_run_and_a_second_run_keeps_the_first(tmp_path):
    overlay = _first_validation_is_best(CONFIG, tmp_path)
    root = tmp_path / "run"
    folder = Path(os.path.realpath(root / "checkpoints" / "quick"))  # ModelCheckpoint reports real paths

    first, printed = _fit(root, overlay, "--trainer.max_epochs=3", "--seed_everything=1")
    steps_per_epoch = first.trainer.global_step // 3
    assert steps_per_epoch > 0
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "version_0"]
    assert os.readlink(folder / "latest") == "version_0"
    run = folder / "version_0"
    assert sorted(p.name for p in run.iterdir()) == ["best.ckpt", "last.ckpt"]
    best, last = _read(run / "best.ckpt"), _read(run / "last.ckpt")
    assert (best["epoch"], best["global_step"]) == (0, steps_per_epoch)  # the first validation
    assert (last["epoch"], last["global_step"]) == (2, first.trainer.global_step)  # the end, not the best epoch
    assert _same_weights(last["state_dict"], first.model)
    assert not _same_weights(best["state_dict"], first.model)
    # train.py names both files, each once, the best with its score, and the link it moved
    assert [line for line in printed.splitlines() if " checkpoint: " in line or line.startswith("latest run:")] == [
        f"best checkpoint: {run / 'best.ckpt'} (step = {steps_per_epoch})",
        f"last checkpoint: {run / 'last.ckpt'}",
        f"latest run: {folder / 'latest'} -> version_0"], printed

    second, _ = _fit(root, overlay, "--trainer.max_epochs=2", "--seed_everything=2")
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "version_0", "version_1"]
    assert os.readlink(folder / "latest") == "version_1"
    assert sorted(p.name for p in (folder / "version_1").iterdir()) == ["best.ckpt", "last.ckpt"]  # no -v1 files
    best_again, last_again = _read(folder / "latest" / "best.ckpt"), _read(folder / "latest" / "last.ckpt")
    assert (last_again["epoch"], last_again["global_step"]) == (1, second.trainer.global_step)
    assert _same_weights(last_again["state_dict"], second.model)
    assert best_again["epoch"] == 0  # the second run's first epoch, not the first run's (another seed)
    assert not _same_state(best_again["state_dict"], best["state_dict"])
    kept = _read(run / "last.ckpt")  # the first run's files are still there, unchanged
    assert (kept["epoch"], kept["global_step"]) == (2, first.trainer.global_step)
    assert _same_state(kept["state_dict"], last["state_dict"])


@pytest.mark.slow
def test_resuming_from_last_after_an_interruption_equals_an_uninterrupted_fit(tmp_path):
    """The README's resume recipe (``--ckpt_path .../last.ckpt``) on a config that monitors a metric, with its best
    epoch before the interruption: the resumed run continues from the interruption, not from the best epoch."""
    overlay = _first_validation_is_best(CONFIG, tmp_path)
    common = ["--seed_everything=7", "--trainer.deterministic=true"]
    straight, _ = _fit(tmp_path / "straight", overlay, *common, "--trainer.max_epochs=4")
    interrupted, _ = _fit(tmp_path / "interrupted", overlay, *common, "--trainer.max_epochs=2")
    folder = tmp_path / "interrupted" / "checkpoints" / "quick" / "latest"  # the documented path
    assert _read(folder / "best.ckpt")["epoch"] == 0  # the best epoch lies before the interruption
    # a deterministic resume from an earlier epoch would end with the same weights after redoing the epochs in
    # between, so the weights below do not show where it resumed: this does
    last = _read(folder / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (1, interrupted.trainer.global_step), \
        "last.ckpt does not hold the state at the interruption"
    resumed, _ = _fit(tmp_path / "interrupted", overlay, *common, "--trainer.max_epochs=4",
                      f"--ckpt_path={folder / 'last.ckpt'}")
    assert os.readlink(folder) == "version_0" and not (folder.parent / "version_1").exists()  # the same run

    assert resumed.trainer.global_step == straight.trainer.global_step > interrupted.trainer.global_step
    expected, got = straight.model.state_dict(), resumed.model.state_dict()
    assert expected.keys() == got.keys()
    assert any(not torch.equal(v, interrupted.model.state_dict()[k]) for k, v in expected.items()), \
        "the weights did not move after the interruption: the comparison would prove nothing"
    different = [k for k, v in expected.items() if not torch.allclose(v, got[k], rtol=1e-5, atol=1e-6)]
    assert not different, f"weights differ after resuming from last.ckpt: {different[:5]}"


# ================================================================================================ every config
def test_every_config_keeps_the_best_and_the_last_checkpoint_under_fixed_names():
    monitored_configs = 0
    problems = []
    for config in CONFIGS:
        callbacks = _checkpoint_callbacks(config)
        if not callbacks:
            continue
        for args in callbacks:
            if args.get("save_last"):
                problems.append(f"{config}: save_last copies last.ckpt only when another file is saved; use an "
                                "unmonitored ModelCheckpoint with filename: last")
            if args.get("enable_version_counter", True):
                problems.append(f"{config}: {args.get('filename')}: enable_version_counter must be false (a second "
                                "run would write -v1 files)")
        last = [i for i, a in enumerate(callbacks) if not a.get("monitor") and a.get("filename") == "last"]
        if len(last) != 1:
            problems.append(f"{config}: needs exactly one unmonitored ModelCheckpoint with filename: last")
            continue
        args = callbacks[last[0]]
        if args.get("save_top_k") != 1 or args.get("save_on_train_epoch_end") is not True:
            problems.append(f"{config}: the last.ckpt callback needs save_top_k: 1 and save_on_train_epoch_end: true "
                            "(so the end of the run is saved whatever the validation schedule)")
        for i, other in enumerate(callbacks):
            if other.get("monitor"):
                monitored_configs += 1
                if other.get("filename") != "best" or other.get("dirpath") != args.get("dirpath"):
                    problems.append(f"{config}: the monitored ModelCheckpoint writes best.ckpt next to last.ckpt")
                if i > last[0]:
                    problems.append(f"{config}: list the monitored ModelCheckpoint first (trainer.checkpoint_callback "
                                    "and ckpt_path='best' use the first one)")
    assert monitored_configs >= 40, monitored_configs  # the check saw the configs it is about
    assert not problems, "\n".join(problems)


# ================================================================================================ printout
class _Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/score", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_written_checkpoints_names_each_file_by_what_it_holds(tmp_path):
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)  # 4 steps per epoch
    callbacks = [ModelCheckpoint(tmp_path, filename="best", monitor="val/score", mode="max"),
                 ModelCheckpoint(tmp_path, filename="last", save_top_k=1, save_on_train_epoch_end=True),
                 ModelCheckpoint(tmp_path, filename="snapshot", every_n_train_steps=3)]
    trainer = Trainer(max_epochs=2, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu")
    trainer.fit(_Tiny(), loader, loader)
    assert written_checkpoints(trainer) == [f"best checkpoint: {tmp_path / 'best.ckpt'} (val/score = 1)",
                                            f"last checkpoint: {tmp_path / 'last.ckpt'}",
                                            f"periodic checkpoint: {tmp_path / 'snapshot.ckpt'}"]
