"""Each fit writes its checkpoints into its own ``<dirpath>/version_<N>`` and ``<dirpath>/latest`` names the newest
fit that finished (`icml26.run_files`): a failed fit does not move it, resuming continues the run that wrote the
checkpoint, and the CLI's summary names every file a run wrote. Two fits in a row: ``tests/test_checkpoint_files.py``.
"""
from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from conftest import config_path, run_cli
from icml26.run_files import CheckpointRunFolders, reserve_run, run_summary, written_files

CONFIG = config_path("configs/ec_cem/quick.yaml")  # best.ckpt (val/task_acc) and last.ckpt
SHORT = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
         "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


class FailAtEpoch(Callback):
    """Raises at the end of training epoch ``epoch``, before that epoch's checkpoint is saved (ModelCheckpoint
    callbacks run last), so the run has saved the epochs before it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            raise RuntimeError("failure injected by the test")


def _fit(root: Path, *args: str, fail_at: int | None = None):
    cli = run_cli(*(["fit"] if fail_at is None else []), "--config", CONFIG, f"--trainer.default_root_dir={root}",
                  *SHORT, *args, run=fail_at is None)
    if fail_at is not None:  # run=False built everything; fit with the failing callback added
        cli.trainer.callbacks.insert(0, FailAtEpoch(fail_at))
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def _read(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _runs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_failed_fit_keeps_its_files_but_not_latest_and_a_resume_continues_its_folder(tmp_path):
    root = tmp_path / "run"
    folder = root / "checkpoints" / "quick"
    first = run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT, "--trainer.max_epochs=1")
    assert _runs(folder) == ["latest", "version_0"] and os.readlink(folder / "latest") == "version_0"

    with pytest.raises(RuntimeError, match="failure injected"):  # mid-fit: epoch 0 saved, epoch 1 fails
        _fit(root, "--trainer.max_epochs=3", fail_at=1)
    assert _runs(folder) == ["latest", "version_0", "version_1"]
    assert os.readlink(folder / "latest") == "version_0", "a failed fit moved latest"
    saved = _read(folder / "version_1" / "last.ckpt")
    assert saved["epoch"] == 0 and _read(folder / "latest" / "last.ckpt")["global_step"] == first.trainer.global_step

    with pytest.raises(RuntimeError, match="failure injected"):  # before any save: no folder left behind
        _fit(root, "--trainer.max_epochs=3", fail_at=0)
    assert _runs(folder) == ["latest", "version_0", "version_1"]

    # resuming the failed run from its own folder continues that folder; latest follows once it finishes
    resumed = run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT,
                      "--trainer.max_epochs=2", f"--ckpt_path={folder / 'version_1' / 'last.ckpt'}")
    assert resumed.trainer.global_step == 2 * saved["global_step"]
    assert _runs(folder) == ["latest", "version_0", "version_1"] and os.readlink(folder / "latest") == "version_1"
    assert _read(folder / "version_1" / "last.ckpt")["epoch"] == 1

    # the documented path: latest/last.ckpt resolves to version_1, which the run keeps writing into
    with contextlib.redirect_stdout(io.StringIO()) as out:
        again = run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT,
                        "--trainer.max_epochs=3", f"--ckpt_path={folder / 'latest' / 'last.ckpt'}")
    assert again.trainer.global_step == 3 * saved["global_step"]
    assert _runs(folder) == ["latest", "version_0", "version_1"] and os.readlink(folder / "latest") == "version_1"
    last = _read(folder / "version_1" / "last.ckpt")
    assert (last["epoch"], last["global_step"]) == (2, again.trainer.global_step)
    real = Path(os.path.realpath(folder / "version_1"))
    assert f"last checkpoint: {real / 'last.ckpt'}" in out.getvalue().splitlines()
    # the monitored callback found its own state again (same folder): its best score survived the resumes
    best = [c for c in again.trainer.checkpoint_callbacks if c.monitor][0]
    assert best.dirpath == str(real) and best.best_model_score is not None


def test_a_fit_that_saves_nothing_leaves_no_folder_and_keeps_latest(tmp_path):
    root = tmp_path / "run"
    folder = root / "checkpoints" / "quick"
    run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT, "--trainer.fast_dev_run=true")
    assert not folder.exists()  # fast_dev_run saves no checkpoint: neither a run folder nor an empty parent
    run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT, "--trainer.max_epochs=1")
    run_cli("fit", "--config", CONFIG, f"--trainer.default_root_dir={root}", *SHORT, "--trainer.fast_dev_run=true")
    assert _runs(folder) == ["latest", "version_0"] and os.readlink(folder / "latest") == "version_0"


def test_run_numbers_continue_above_the_highest_and_reserving_is_exclusive(tmp_path):
    (tmp_path / "a" / "version_3").mkdir(parents=True)
    (tmp_path / "a" / "version_x").mkdir()
    (tmp_path / "a" / "last.ckpt").write_text("an old flat file")
    assert reserve_run([str(tmp_path / "a"), str(tmp_path / "b")]) == "version_4"
    assert (tmp_path / "b" / "version_4").is_dir()
    assert reserve_run([str(tmp_path / "b")]) == "version_5"


# ================================================================================================ what a run wrote
class _Tiny(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _WritesFiles(Callback):
    """Writes a plot into the logger's folder and a table beside the checkpoint folders when the fit ends."""

    def on_fit_end(self, trainer, pl_module):
        Path(trainer.log_dir, "plot.png").write_bytes(b"png")
        Path(trainer.default_root_dir, "ckpts", "table.json").write_text("{}")


def test_the_summary_names_checkpoints_latest_logs_and_the_files_a_fit_wrote(tmp_path):
    root = tmp_path / "root"
    (root / "ckpts" / "version_7").mkdir(parents=True)
    (root / "ckpts" / "version_7" / "other_run.png").write_bytes(b"")  # another run's folder: not this run's
    old = root / "ckpts" / "before.json"
    old.write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # written before the run started
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer = Trainer(max_epochs=1, default_root_dir=root, logger=CSVLogger(root, name="logs"),
                      callbacks=[CheckpointRunFolders(), _WritesFiles(),
                                 ModelCheckpoint(root / "ckpts", filename="last", save_on_train_epoch_end=True)],
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(_Tiny(), loader)
    folder = Path(os.path.realpath(root / "ckpts"))
    assert os.readlink(folder / "latest") == "version_8"
    lines = run_summary(trainer)
    assert lines == [f"last checkpoint: {folder / 'version_8' / 'last.ckpt'}",
                     f"latest run: {folder / 'latest'} -> version_8",
                     f"logs: {root / 'logs' / 'version_0'}",
                     f"written: {root / 'logs' / 'version_0' / 'plot.png'}",
                     f"written: {folder / 'table.json'}"], lines
    assert written_files(trainer, since=time.time() + 60) == []  # only what changed since the run started
