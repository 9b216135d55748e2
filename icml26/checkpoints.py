"""Checks of ``--ckpt_path`` before LightningCLI resumes from it.

LightningCLI (2.6) reads the checkpoint's saved model hyper-parameters over the configured ones between parsing the
arguments and building the classes: it loads the file with no error handling and silently turns the run into
whatever class the checkpoint names. The collection's CLI therefore checks the file in its public
``parse_arguments`` hook, before that step (`read_resume_checkpoint`), says which configured values the checkpoint
replaced in ``before_instantiate_classes`` (`report_replaced_values`), and refuses a checkpoint whose tensors do not fit
the built model before Lightning fails on it (`check_checkpoint_fits_model`).
"""
from __future__ import annotations

import logging

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

from icml26.parse_errors import class_of
from icml26.run_config import flatten
from lightning_modules.shared.base import read_checkpoint
from lightning_modules.shared.errors import UserInputError

log = logging.getLogger("train")
NAMED_CHECKPOINTS = ("last", "best", "hpc", "registry")  # resolved by Lightning itself when the run starts


def resume_path(config) -> str | None:
    """The file ``--ckpt_path`` names for the parsed subcommand, or None (no path, or a name Lightning resolves)."""
    subcommand = config.get("subcommand")
    ckpt_path = config[subcommand].get("ckpt_path") if subcommand else None
    if not isinstance(ckpt_path, str) or ckpt_path in NAMED_CHECKPOINTS:
        return None
    return ckpt_path


def read_resume_checkpoint(config) -> dict | None:
    """Read and check ``--ckpt_path``: readable, a full training checkpoint when resuming a fit, written by the
    configured model (and, for fit, datamodule) class. Returns ``{"state_dict_shapes": ..., "hyper_parameters": ...}``
    or None when no file is given."""
    ckpt_path = resume_path(config)
    if ckpt_path is None:
        return None
    subcommand = config["subcommand"]
    try:
        checkpoint = read_checkpoint(ckpt_path, trusted=False, what="--ckpt_path", mmap=True)  # shapes only
    except UserInputError as err:
        if "weights-only" not in str(err):
            raise
        raise UserInputError(
            f"--ckpt_path '{ckpt_path}' contains Python objects that weights-only loading refuses, and LightningCLI "
            "reads a checkpoint's hyper-parameters with weights-only loading. Resume it from Python "
            "(`Trainer.fit(model, datamodule, ckpt_path=..., weights_only=False)`) if you trust the file, or start "
            "a new run from its weights with --model.init_args.init_from and init_from_trusted: true.") from None
    if subcommand == "fit" and not {"optimizer_states", "loops"} <= set(checkpoint):
        raise UserInputError(
            f"--ckpt_path '{ckpt_path}' is a weights-only file, not a full Lightning training checkpoint, "
            "so training cannot resume from it. To start from these weights with a new config use "
            "--model.init_args.init_from instead.")
    check_checkpoint_classes(ckpt_path, checkpoint, config[subcommand], check_data=subcommand == "fit")
    return {"path": ckpt_path, "hyper_parameters": checkpoint.get("hyper_parameters"),
            "state_dict_shapes": {name: tuple(t.shape) for name, t in checkpoint["state_dict"].items()}}


def check_checkpoint_classes(ckpt_path: str, checkpoint: dict, config, check_data: bool) -> None:
    """Refuse a ``--ckpt_path`` whose saved LightningModule (or, when resuming a fit, datamodule) class differs
    from the configured one. Checkpoints that name no class are left to `check_checkpoint_fits_model`."""
    parts = [("LightningModule", "hyper_parameters", "model")]
    if check_data:
        parts.append(("datamodule", "datamodule_hyper_parameters", "data"))
    differences = []
    for what, saved_key, config_key in parts:
        saved = checkpoint.get(saved_key)
        saved = saved.get("_class_path") if isinstance(saved, dict) else None
        configured = config.get(config_key)
        configured = configured.get("class_path") if configured is not None and hasattr(configured, "get") else None
        if isinstance(saved, str) and isinstance(configured, str) and class_of(saved) is not class_of(configured) \
                and saved != configured:
            differences.append(f"its {what} is {saved.rpartition('.')[2]} ({saved}) but the config builds "
                               f"{configured.rpartition('.')[2]} ({configured})")
    if differences:
        raise UserInputError(
            f"--ckpt_path '{ckpt_path}' was written by another run: {'; '.join(differences)}. --ckpt_path only "
            "resumes the run that wrote it, with that run's config; to start this config from the checkpoint's "
            f"weights use --model.init_args.init_from={ckpt_path} instead (README: 'Fine-tuning vs resuming').")


def model_values(config) -> dict:
    """{'model.init_args.lr': 0.1, ...}: the parsed subcommand's model values, to compare before/after resuming."""
    node = config[config["subcommand"]].get("model") if config.get("subcommand") else None
    if node is None:
        return {}
    if hasattr(node, "as_dict"):
        node = node.as_dict()
    return flatten(node, "model.") if isinstance(node, dict) else {"model": node}


def _differs(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b))
    return a != b


def report_replaced_values(ckpt_path: str, before: dict, after: dict) -> list[str]:
    """Warn (once, on rank 0) about configured model values that the checkpoint's hyper-parameters replaced;
    returns them."""
    replaced = [f"{key}={before[key]!r} (checkpoint: {after.get(key)!r})" for key in before
                if key in after and _differs(before[key], after[key])]
    replaced += [f"{key}={before[key]!r} (checkpoint: not set)" for key in before if key not in after]
    if replaced and rank_zero_only.rank == 0:
        log.warning(
            "warning: --ckpt_path '%s' restores the checkpoint's model hyper-parameters, so these values from the "
            "config files and flags are ignored: %s. To change them, start a new run from the weights with "
            "--model.init_args.init_from instead of resuming.", ckpt_path, "; ".join(replaced))
    return replaced


def check_checkpoint_fits_model(resume: dict | None, model: LightningModule) -> None:
    """Refuse a ``--ckpt_path`` written by a different model before Lightning fails on it."""
    if resume is None:
        return
    own, saved = model.state_dict(), resume["state_dict_shapes"]
    missing = [k for k in own if k not in saved]
    mismatched = [k for k in own if k in saved and tuple(own[k].shape) != saved[k]]
    if missing or mismatched:
        raise UserInputError(
            f"--ckpt_path does not fit {type(model).__name__} as configured ({len(missing)} missing "
            f"tensors, e.g. {missing[:3]}; {len(mismatched)} shape mismatches, e.g. {mismatched[:3]}). "
            "--ckpt_path resumes the *same* run; to fine-tune a different configuration use "
            "--model.init_args.init_from.")


def written_checkpoints(trainer: Trainer) -> list[str]:
    """One line per checkpoint file a fit wrote, once each: a monitored ModelCheckpoint's best file (with its score)
    and its ``save_last`` copy, an unmonitored one's file (it keeps the latest save: "last" when it saves every epoch
    or validation, "periodic" when it saves on a step or time interval)."""
    lines: list[str] = []

    def add(line: str) -> None:
        if line not in lines:
            lines.append(line)

    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.best_model_path and callback.monitor:
            score = callback.best_model_score
            scored = f" ({callback.monitor} = {float(score):.4g})" if score is not None else ""
            add(f"best checkpoint: {callback.best_model_path}{scored}")
        elif callback.best_model_path:
            kind = "last" if callback.every_n_epochs else "periodic"
            add(f"{kind} checkpoint: {callback.best_model_path}")
        if callback.last_model_path:
            add(f"last checkpoint: {callback.last_model_path}")
    return lines
