"""The progress bar `train.py` attaches by default: it says where a run is and shows only the run's metrics.

Lightning's own bar prints ``Epoch 0/-2`` for step-based runs (``max_steps`` set, ``max_epochs: -1``), because it
shows ``max_epochs - 1`` as the last epoch, and a ``v_num`` column (the logger's version, formatted as a metric,
e.g. ``v_num: 0.000``). Here a step-based run shows its epoch and its step budget, and the version column is dropped
(the run folder already names the version). Everything else is Lightning's Rich bar (TQDM where Rich is missing).
"""
from __future__ import annotations

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

__all__ = ["RunProgressBar", "RunTQDMProgressBar", "default_progress_bar"]


def _without_version(items: dict) -> dict:
    items.pop("v_num", None)
    return items


class RunProgressBar(RichProgressBar):
    """Lightning's Rich bar with ``Epoch e (max_steps N)`` for step-based runs and no ``v_num`` column."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch} (max_steps {trainer.max_steps})"
        return f"{description:{len(self.validation_description)}}"

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        return _without_version(super().get_metrics(trainer, pl_module))


class RunTQDMProgressBar(TQDMProgressBar):
    """Lightning's TQDM bar (it already shows no epoch total) without the ``v_num`` column."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        return _without_version(super().get_metrics(trainer, pl_module))


def default_progress_bar() -> RichProgressBar | TQDMProgressBar:
    """The bar Lightning would pick (Rich when installed, else TQDM), in the collection's form."""
    return RunProgressBar() if _RICH_AVAILABLE else RunTQDMProgressBar()
