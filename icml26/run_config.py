"""Save the resolved config of a run where that run's files are, and into the W&B run when there is one."""
from __future__ import annotations

import json
import os

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

WANDB_RUN_CONFIG_FILENAME = "run_config.yaml"  # W&B keeps config.yaml in its run folder for itself


def flatten(config: dict, prefix: str = "") -> dict:
    """{"model": {"init_args": {"lr": 1}}} -> {"model.init_args.lr": 1}; lists stay values."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class RunConfigSaver(SaveConfigCallback):
    """Write the resolved config into the run's *own* directory and, with W&B, into the W&B run.

    Lightning's default writes ``config.yaml`` into ``trainer.log_dir``, which for WandbLogger is the
    logger's shared ``save_dir``: the second run (e.g. of a sweep) then crashes. Here the file goes to
    the version directory of CSV/TensorBoard loggers, or to the W&B run's files directory, and the
    config is also stored as the W&B run config (so sweeps and the W&B UI show every value). The file is named
    ``run_config.yaml`` in a W&B run folder, where W&B reserves ``config.yaml`` for its own record of the run
    config (Lightning's ``config.yaml`` elsewhere).
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # broadcasts: must be called on every rank
        if trainer.is_global_zero:
            logger = trainer.logger
            wandb = isinstance(logger, WandbLogger)
            run_dir = logger.experiment.dir if wandb else log_dir
            os.makedirs(run_dir, exist_ok=True)
            filename = WANDB_RUN_CONFIG_FILENAME if wandb else self.config_filename
            self.parser.save(self.config, os.path.join(run_dir, filename), overwrite=True, multifile=False)
            if wandb:  # one W&B config entry per dotted key, as sweeps name them
                config = json.loads(self.parser.dump(self.config, format="json"))
                logger.experiment.config.update(flatten(config), allow_val_change=True)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)
