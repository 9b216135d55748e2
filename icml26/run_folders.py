"""Leave no half-made run folder behind when a run fails before it trained a step.

A CSV (or TensorBoard) logger creates its ``version_N`` folder when the run starts, before the datamodule and the
module are set up, and the CLI writes the run's ``config.yaml`` into it. A run that then fails on bad input (a
malformed data file, an ``init_from`` that is not a checkpoint) would leave a folder that holds nothing but that
config, and the next run would count on from ``version_N+1``. `RemoveFailedRunFolder` removes such a folder when the
run fails before its first optimizer step, and only when the folder holds nothing but the files this run wrote into
it (``config.yaml``, ``hparams.yaml``) and the logger has nothing buffered: a folder with metrics, checkpoints, event
files or anything from an earlier run is left as it is.
"""
from __future__ import annotations

import logging
import os
import shutil
import time

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger

log = logging.getLogger(__name__)
RUN_START_FILES = ("config.yaml", "hparams.yaml")  # what the CLI (config) and a logger (hparams) write at the start


class RemoveFailedRunFolder(Callback):
    """On an exception before the first optimizer step, remove each logger's run folder that holds only files this
    run wrote when it started (``written_files``, modified since this callback was made).

    Args:
        written_files: names of the files a run writes into its folder before it trains (the CLI's config, the
            logger's hyper-parameters); a folder holding anything else is kept.
    """

    def __init__(self, written_files: tuple[str, ...] | list[str] = RUN_START_FILES) -> None:
        self.written_files = frozenset(written_files)
        self.started = time.time()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not trainer.is_global_zero or trainer.global_step > 0:
            return
        for logger in trainer.loggers:
            folder = getattr(logger, "log_dir", None)
            if not isinstance(folder, str) or not self.holds_only_this_runs_start(folder):
                continue
            if isinstance(logger, CSVLogger) and logger.experiment.metrics:
                continue  # metrics logged but not yet written: the logger writes them into the folder next
            shutil.rmtree(folder)
            log.info("removed %s: the run failed before its first step and the folder held only %s", folder,
                     sorted(self.written_files))

    def holds_only_this_runs_start(self, folder: str) -> bool:
        """True when ``folder`` is a directory holding nothing but files named in ``written_files`` that were
        written since this callback was made (an empty folder included)."""
        if not os.path.isdir(folder):
            return False
        for entry in os.scandir(folder):
            if not entry.is_file(follow_symlinks=False) or entry.name not in self.written_files \
                    or entry.stat().st_mtime < self.started - 1.0:  # 1 s of slack for coarse file-system clocks
                return False
        return True


def with_failed_run_cleanup(trainer: Trainer) -> Trainer:
    """``trainer`` with a `RemoveFailedRunFolder` callback added (once): the CLI's hook after building the Trainer."""
    if not any(isinstance(callback, RemoveFailedRunFolder) for callback in trainer.callbacks):
        trainer.callbacks.append(RemoveFailedRunFolder())
    return trainer
