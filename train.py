"""The collection's one entry point: a thin LightningCLI over every paper module and datamodule.

    python train.py fit --config configs/tamed_sgd/quick.yaml --trainer.max_steps=100
    python train.py fit --config configs/trew/paper.yaml --config configs/trainer/gpu.yaml
    icml26 fit --config configs/trew/classifier_quick.yaml       # the same, as the installed console script
    icml26 papers | icml26 claims | icml26 experiment NAME       # the collection's own commands (`icml26.commands`)

Every module of ``lightning_modules``, ``datamodules`` and ``callbacks`` is imported, so short class names
(``--model ImageClassifier``) work. W&B runs offline unless ``WANDB_MODE`` is set. Bad user input ends with one
``error:`` line and exit status 2. Configs may interpolate other keys of the final config
(``dirpath: ${trainer.default_root_dir}/checkpoints``), resolved after every ``--config`` file and flag is applied.
A ``--config`` path not found from the working directory is looked up among the collection's own configs. The
support code (error messages, checkpoint checks and I/O, config saving) lives in the ``icml26`` package.
"""
from __future__ import annotations

import contextvars
import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")  # online W&B without an API key fails; opt in explicitly

from jsonargparse import set_parsing_settings  # noqa: E402
from lightning.pytorch import LightningDataModule, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ProgressBar  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402

from callbacks.progress import default_progress_bar  # noqa: E402
from icml26 import checkpoints, run_files  # noqa: E402
from icml26.checkpoint_io import load_settings_kept, map_loads_of, stream_checkpoint_saves  # noqa: E402
from icml26.collection import __version__, import_collection, quiet_lightning_chatter, resolve_config_paths  # noqa
from icml26.commands import COMMANDS, overview, run_command  # noqa: E402
from icml26.parse_errors import CollectionArgumentParser, explain_run_error, find_user_error  # noqa: E402
from icml26.run_config import RunConfigSaver  # noqa: E402
from icml26.run_folders import with_failed_run_cleanup  # noqa: E402

COLLECTION_MODULES = import_collection()
quiet_lightning_chatter()
# "omegaconf+" resolves ``${...}`` once, on the final config; a file's ``${trainer.x}`` is relative to its own key
set_parsing_settings(omegaconf_absolute_to_relative_paths=True)


class CollectionCLI(LightningCLI):
    """LightningCLI with the collection's progress bar, ``--version``, a default seed and ``--ckpt_path`` checks."""

    def init_parser(self, **kwargs) -> LightningArgumentParser:
        """No prefix matching of option names: ``--trainer.max_epoch`` is an error, not ``max_epochs``."""
        return super().init_parser(allow_abbrev=False, **kwargs)

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        self.parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                                 help="Print the version of the collection and exit.")

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"seed_everything": 42})

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse, then check ``--ckpt_path`` before LightningCLI applies its hyper-parameters (`icml26.checkpoints`)."""
        super().parse_arguments(parser, args)
        self.resume = checkpoints.read_resume_checkpoint(self.config)
        map_loads_of(self.resume and self.resume["path"])  # LightningCLI reads its hyper-parameters next
        self._configured_model_values = checkpoints.model_values(self.config) if self.resume else {}

    def before_instantiate_classes(self) -> None:
        map_loads_of(None)
        if self.resume:
            checkpoints.report_replaced_values(self.resume["path"], self._configured_model_values,
                                               checkpoints.model_values(self.config))

    def instantiate_classes(self) -> None:
        """Instantiate, surfacing our own validation error instead of jsonargparse's Union wrapper."""
        try:
            super().instantiate_classes()
        except Exception as err:  # noqa: BLE001 - re-raised unchanged unless it wraps a UserInputError
            user_error = find_user_error(err)
            if user_error is None:
                raise
            raise user_error from None

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with our progress bar (unless configured), streamed saves and a folder per run (`icml26`)."""
        config = self.config_init[self.subcommand]["trainer"] if self.subcommand else self.config_init["trainer"]
        configured = config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        if config.get("enable_progress_bar") is not False and not config.get("fast_dev_run") \
                and not any(isinstance(callback, ProgressBar) for callback in configured) \
                and "callbacks" not in self.trainer_defaults:
            self.trainer_defaults = {**self.trainer_defaults, "callbacks": [default_progress_bar()]}
        trainer = stream_checkpoint_saves(super().instantiate_trainer(**kwargs))
        return run_files.with_checkpoint_run_folders(with_failed_run_cleanup(trainer))

    def before_fit(self) -> None:
        checkpoints.check_checkpoint_fits_model(self.resume, self.model)

    before_validate = before_test = before_predict = before_fit

    def after_fit(self) -> None:
        """Say where the run's checkpoints, logs, plots and tables went (rank 0 only; `icml26.run_files`)."""
        if self.trainer.is_global_zero:
            for line in run_files.run_summary(self.trainer):
                print(line)

    after_validate = after_test = after_fit


CLI_KWARGS = dict(model_class=LightningModule, datamodule_class=LightningDataModule, subclass_mode_model=True,
                  subclass_mode_data=True, auto_configure_optimizers=False, save_config_callback=RunConfigSaver,
                  parser_class=CollectionArgumentParser, parser_kwargs={"parser_mode": "omegaconf+"})


def main(args: list[str] | dict | None = None, run: bool = True, cli_class: type = CollectionCLI) -> LightningCLI:
    """Build (and with ``run=True`` execute) the CLI; ``args`` replaces ``sys.argv[1:]`` (tests, the runner). In a
    context copy: jsonargparse's last parser stays in a context variable, which would keep the CLI and model alive."""
    if isinstance(args, list):
        args = resolve_config_paths(args)
    with load_settings_kept():
        return contextvars.copy_context().run(cli_class, args=args, run=run, **CLI_KWARGS)


def console_main() -> None:
    """``python train.py ...`` and the ``icml26`` console script: a collection command (`icml26.commands`) or the
    CLI; a user-input failure ends with one ``error:`` line and exit status 2."""
    program = "icml26" if Path(sys.argv[0]).stem == "icml26" else "python train.py"
    top_level_help = sys.argv[1:] in (["-h"], ["--help"])
    try:
        if len(sys.argv) > 1 and sys.argv[1] in COMMANDS:
            sys.exit(run_command(sys.argv[1], sys.argv[2:]))
        sys.argv[1:] = resolve_config_paths(sys.argv[1:])
        main()
    except SystemExit:
        if top_level_help:
            print(overview())
        raise
    except ValueError as err:  # UserInputError, and Lightning's refusals of a config value
        explained = explain_run_error(err, sys.argv[1:], program)
        if explained is None:
            raise
        print(f"error: {explained}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    console_main()
