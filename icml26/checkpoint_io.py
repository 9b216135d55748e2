"""Checkpoint saving without an in-memory copy of the checkpoint.

Lightning's `TorchCheckpointIO` saves through ``_atomic_save``: ``torch.save`` into a ``BytesIO`` buffer, which is
then written to the file, so a save briefly needs the whole checkpoint once more in host memory. At the paper
configs' sizes that is the largest allocation of a run (PCLM's DPO at published width with one LLM layer: policy and
frozen reference, 6 GB in bfloat16; a save took the process from 8.5 to 14.6 GB). `FileCheckpointIO` keeps
Lightning's guarantee (a save interrupted half-way leaves the previous file intact) by streaming ``torch.save`` into
a temporary file beside the target and renaming it over the target (`os.replace`, atomic on one file system).

Loading a checkpoint to resume or to evaluate reads it twice in full (LightningCLI's read of its hyper-parameters,
then the restore). Both map a local zip-format file instead (``torch.load(mmap=True)``): the tensors are read from
the page cache as the model copies them, so a 6 GB checkpoint costs no 6 GB of process memory at either read. The
mapping is private (copy-on-write) and our saves replace a file instead of rewriting it, so a mapped file is never
changed under a running process.

The CLI installs `FileCheckpointIO` where the strategy uses Lightning's default (`stream_checkpoint_saves`); a plugin
the user configures is kept. Remote paths (``s3://...``) keep Lightning's own save and load.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO


class FileCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local saves stream into ``<path>.tmp-<pid>`` and are then renamed to ``path``, and
    whose local loads map the file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        fs = get_filesystem(path)
        if storage_options is not None or "file" not in fs.protocol:
            return super().save_checkpoint(checkpoint, path, storage_options)  # its errors and remote handling
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        partial = f"{path}.tmp-{os.getpid()}"
        try:
            torch.save(checkpoint, partial)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    def load_checkpoint(self, path: _PATH, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if not is_local_zip_checkpoint(path):
            return super().load_checkpoint(path, map_location, weights_only)
        return torch.load(path, map_location=map_location, weights_only=weights_only, mmap=True)


def is_local_zip_checkpoint(path: _PATH) -> bool:
    """A local file in ``torch.save``'s zip format (the only format ``torch.load`` can map)."""
    if "file" not in get_filesystem(path).protocol or not os.path.isfile(path):
        return False
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


def _load_config():
    return getattr(getattr(torch.utils, "serialization", None), "config", None)  # torch >= 2.5


def map_loads_of(path: _PATH | None) -> None:
    """From now on ``torch.load`` maps its files (``torch.utils.serialization.config.load.mmap``) if ``path`` is a
    local zip checkpoint: set for LightningCLI's read of a ``--ckpt_path``'s hyper-parameters, unset (``None``)
    before the model is built, and undone in any case by `load_settings_kept` around the CLI."""
    config = _load_config()
    if config is not None:
        config.load.mmap = path is not None and is_local_zip_checkpoint(path)


@contextlib.contextmanager
def load_settings_kept():
    """Restore ``torch.load``'s mapping setting when the block ends, however it ends."""
    config = _load_config()
    previous = None if config is None else config.load.mmap
    try:
        yield
    finally:
        if config is not None:
            config.load.mmap = previous


def stream_checkpoint_saves(trainer: Trainer) -> Trainer:
    """Give ``trainer``'s strategy a `FileCheckpointIO` where it would use Lightning's default `TorchCheckpointIO`."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = FileCheckpointIO()
    return trainer
