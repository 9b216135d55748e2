"""What the CLI knows about the collection: its version, its modules (imported so short class names resolve), where
its shipped configs live, and a quieter Lightning log."""
from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DISTRIBUTION = "icml26-lightning"
try:  # the one version number lives in setup.cfg; an installed copy (editable or not) carries it in its metadata
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# The folder holding ``configs/``: the repository root in a checkout, site-packages after a regular install (the
# configs are shipped as package data beside the packages).
INSTALL_ROOT = Path(__file__).resolve().parents[1]
COLLECTION_PACKAGE_NAMES = ("lightning_modules", "datamodules", "callbacks")


def import_collection() -> list[str]:
    """Import every module of the collection's packages; returns their names.

    jsonargparse resolves a short class name (``--model ImageClassifier``, ``class_path: KnapsackAllocator``)
    among the subclasses that are already imported, and the package ``__init__`` files import nothing (so that
    loading one datamodule does not load every model), so the CLI imports the modules here. A new paper's file
    is picked up without being listed (``lightning_modules`` has one subpackage per paper).
    """
    packages = [importlib.import_module(name) for name in COLLECTION_PACKAGE_NAMES]
    names = sorted(info.name for package in packages
                   for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
                   if not info.ispkg)
    for name in names:
        importlib.import_module(name)
    return names


def is_config_option(arg: str) -> bool:
    return arg in ("--config", "-c")


def resolve_config_paths(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config`` file that does not exist relative to the working directory replaced by the
    collection's own file of that relative path (``configs/trew/quick.yaml``), when there is one.

    A file that exists where the user runs the command always wins, so a local edited copy of a config is used as
    given; only a missing relative path is looked up in the installed collection (the repository root in a
    checkout, the installed configs after ``pip install``). Anything else is left for the parser to report.
    """
    def resolve(path: str) -> str:
        if os.path.isabs(path) or os.path.exists(path):
            return path
        shipped = INSTALL_ROOT / path
        return str(shipped) if shipped.is_file() else path

    resolved = list(argv)
    for i, arg in enumerate(resolved):
        if is_config_option(arg) and i + 1 < len(resolved):
            resolved[i + 1] = resolve(resolved[i + 1])
        elif arg.startswith("--config="):
            resolved[i] = "--config=" + resolve(arg.split("=", 1)[1])
    return resolved


class _DropLitLoggerTip(logging.Filter):
    """Lightning advertises a cloud logger on every run; the collection's runs stay quiet by default."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_lightning_chatter() -> None:
    """Drop Lightning's cloud-logger tip and a torch deprecation warning nobody can act on."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DropLitLoggerTip())
    # Lightning 2.6's pytree helper calls an API that torch >= 2.10 deprecates, once per fit
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
