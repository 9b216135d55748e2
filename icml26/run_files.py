"""One checkpoint folder per fit, a ``latest`` link to the newest finished fit, and the list of files a run wrote.

A config names its checkpoint folder once (``dirpath: ${trainer.default_root_dir}/checkpoints/quick``). Each fit
writes into its own ``<dirpath>/version_<N>/`` (``best.ckpt``, ``last.ckpt``), N one above the highest number
already there, so running a config again keeps the earlier runs' files. When a fit ends without an error,
``<dirpath>/latest`` (a relative symbolic link) is pointed at its folder: ``<dirpath>/latest/last.ckpt`` is the end
of the newest finished fit, the one path the docs use to chain stages (``init_from``) and to resume. A fit that
fails keeps what it saved (resume it from its own ``version_<N>/last.ckpt``) but does not move ``latest``; a fit
that saved nothing (``fast_dev_run``, a failure before the first save) leaves no folder behind.

Resuming (``--ckpt_path <dirpath>/latest/last.ckpt`` or ``.../version_<N>/last.ckpt``) continues the run that wrote
the file: the checkpoints keep going into that file's folder (the link resolved), where Lightning's
ModelCheckpoint finds its own state (best score and path) again, and ``latest`` points there once the fit
finishes. A checkpoint from anywhere else starts a new folder.

Only ModelCheckpoint callbacks given a ``dirpath`` get run folders: without one, Lightning already writes into the
logger's own ``version_<N>/checkpoints``. `written_files` lists what else a run wrote into its folders (plots,
tables, prediction files), for the summary the CLI prints after ``fit``, ``validate`` and ``test``.
"""
from __future__ import annotations

import logging
import math
import os
import re
import time

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from icml26.checkpoints import written_checkpoints

log = logging.getLogger(__name__)
RUN_PREFIX = "version_"
LATEST = "latest"
RUN_NAME = re.compile(rf"^{RUN_PREFIX}(\d+)$")
# bookkeeping the loggers and the CLI write into every run folder: the "logs:" line of the summary stands for them
LOG_FILES = ("metrics.csv", "hparams.yaml", "config.yaml")
LOG_FILE_PREFIXES = ("events.out.tfevents",)


def run_numbers(root: str) -> list[int]:
    """The N of every ``version_<N>`` folder in ``root`` (none when ``root`` does not exist)."""
    if not os.path.isdir(root):
        return []
    return [int(m.group(1)) for m in (RUN_NAME.match(e.name) for e in os.scandir(root)
                                      if e.is_dir(follow_symlinks=False)) if m]


def reserve_run(roots: list[str]) -> str:
    """Create ``version_<N>`` in every folder of ``roots`` (N one above the highest there) and return its name.
    Creating the folder reserves it: two runs started at the same time get different numbers."""
    number = max((n for root in roots for n in run_numbers(root)), default=-1) + 1
    while True:
        name, made = f"{RUN_PREFIX}{number}", []
        try:
            for root in roots:
                os.makedirs(root, exist_ok=True)
                os.mkdir(os.path.join(root, name))
                made.append(os.path.join(root, name))
            return name
        except FileExistsError:  # another run took this number in the meantime
            for folder in made:
                os.rmdir(folder)
            number += 1


def point_latest(root: str, name: str) -> str | None:
    """Point ``<root>/latest`` at ``<root>/<name>`` (replacing the link in one step); returns the link, or None
    with a warning where the file system has no symbolic links or ``latest`` is not a link."""
    link = os.path.join(root, LATEST)
    staged = os.path.join(root, f".{LATEST}-{os.getpid()}")
    try:
        if os.path.lexists(staged):
            os.remove(staged)
        os.symlink(name, staged, target_is_directory=True)
        os.replace(staged, link)
    except OSError as err:
        if os.path.lexists(staged):
            os.remove(staged)
        log.warning("warning: could not point %s at %s (%s); use %s directly.", link, name, err,
                    os.path.join(root, name))
        return None
    return link


def _is_empty(folder: str) -> bool:
    return os.path.isdir(folder) and not os.listdir(folder)


class CheckpointRunFolders(Callback):
    """Give each fit its own ``<dirpath>/version_<N>`` for every ModelCheckpoint configured with a ``dirpath`` and
    point ``<dirpath>/latest`` at it when the fit ends without an error (see the module docstring); remembers when
    each stage started, for `written_files`."""

    def __init__(self) -> None:
        self.roots: dict[int, str | None] = {}  # id(ModelCheckpoint) -> its configured folder (None: none given)
        self.run_name: str | None = None
        self.reserved: list[str] = []  # folders this fit created (removed again while empty), run folders first
        self.latest: list[str] = []  # the links moved by the last finished fit
        self.started = time.time()

    def _own(self, trainer: Trainer) -> list[ModelCheckpoint]:
        callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        for callback in callbacks:
            self.roots.setdefault(id(callback), callback.dirpath)  # before its setup: None unless configured
        return [c for c in callbacks if self.roots[id(c)] is not None]

    def _use(self, trainer: Trainer, name: str) -> None:
        for callback in self._own(trainer):
            callback.dirpath = os.path.join(self.roots[id(callback)], name)
        self.run_name = name

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.started = math.floor(time.time())  # whole seconds: file systems with coarse clocks round down
        self.latest = []
        own = self._own(trainer)  # every stage: records the configured folders before ModelCheckpoint.setup
        if stage != "fit":
            return
        if not own:
            self.run_name, self.reserved = None, []
            return
        roots = sorted({self.roots[id(c)] for c in own})
        self.reserved, name = [], None
        if trainer.is_global_zero:
            new_roots = [root for root in roots if not os.path.isdir(root)]
            name = reserve_run(roots)
            self.reserved = [os.path.join(root, name) for root in roots] + new_roots
        self._use(trainer, trainer.strategy.broadcast(name))

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Resuming a fit from ``<dirpath>/version_<N>/...``: keep writing into ``version_<N>``."""
        if trainer.state.fn != TrainerFn.FITTING or self.run_name is None or not trainer.ckpt_path:
            return
        resumed = None
        if trainer.is_global_zero and os.path.exists(str(trainer.ckpt_path)):  # a folder when sharded
            folder = os.path.dirname(os.path.realpath(trainer.ckpt_path))
            roots = {self.roots[id(c)] for c in self._own(trainer)}
            if os.path.dirname(folder) in roots and RUN_NAME.match(os.path.basename(folder)):
                resumed = os.path.basename(folder)
        resumed = trainer.strategy.broadcast(resumed)
        if resumed is None or resumed == self.run_name:
            return
        self._remove_empty_reserved()
        if trainer.is_global_zero:
            for root in {self.roots[id(c)] for c in self._own(trainer)}:
                os.makedirs(os.path.join(root, resumed), exist_ok=True)
        self._use(trainer, resumed)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.run_name is None or not trainer.is_global_zero:
            return
        for root in sorted({self.roots[id(c)] for c in self._own(trainer)}):
            folder = os.path.join(root, self.run_name)
            if not _is_empty(folder) and os.path.isdir(folder) and point_latest(root, self.run_name):
                self.latest.append(os.path.join(root, LATEST))
        self._remove_empty_reserved()  # nothing was saved there (fast_dev_run, checkpointing skipped)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """A failed fit keeps what it saved and leaves ``latest`` where it was; an empty folder goes."""
        self._remove_empty_reserved()

    def _remove_empty_reserved(self) -> None:
        for folder in self.reserved:
            if _is_empty(folder):
                os.rmdir(folder)
        self.reserved = []


def with_checkpoint_run_folders(trainer: Trainer) -> Trainer:
    """``trainer`` with a `CheckpointRunFolders` callback added (once): the CLI's hook after building the Trainer."""
    if not any(isinstance(callback, CheckpointRunFolders) for callback in trainer.callbacks):
        trainer.callbacks.insert(0, CheckpointRunFolders())
    return trainer


def _run_folders(trainer: Trainer) -> tuple[list[str], list[str]]:
    """(folders to search, folders of this run): the logger's folder, the checkpoint folders and their configured
    parents, ``default_root_dir`` when it was set (not the working directory)."""
    own = []
    for logger in trainer.loggers:
        folder = getattr(logger, "log_dir", None)
        if isinstance(folder, str):
            own.append(folder)
    own += [c.dirpath for c in trainer.checkpoint_callbacks if isinstance(getattr(c, "dirpath", None), str)]
    search = list(own) + [os.path.dirname(folder) for folder in own if RUN_NAME.match(os.path.basename(folder))]
    if os.path.realpath(trainer.default_root_dir) != os.path.realpath(os.getcwd()):
        search.append(trainer.default_root_dir)
    return search, own


def written_files(trainer: Trainer, since: float) -> list[str]:
    """Files modified since ``since`` in the run's folders (see `_run_folders`), other than checkpoints and the
    loggers' own bookkeeping: plots, tables and prediction files. Other runs' ``version_<N>`` folders and the
    ``latest`` link are not searched."""
    search, own = _run_folders(trainer)
    own_real = {os.path.realpath(folder) for folder in own}
    found: list[str] = []
    seen: set[str] = set()
    for top in search:
        if not os.path.isdir(top):
            continue
        for folder, subfolders, files in os.walk(top):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d != "wandb"
                                   and not d.endswith(".ckpt")  # a sharded checkpoint is a folder
                                   and not (RUN_NAME.match(d) and os.path.realpath(os.path.join(folder, d)) not in
                                            own_real))
            for name in sorted(files):
                path = os.path.join(folder, name)
                real = os.path.realpath(path)
                if real in seen or name.endswith(".ckpt") or name in LOG_FILES or name.startswith(LOG_FILE_PREFIXES):
                    continue
                seen.add(real)
                try:
                    if os.stat(path).st_mtime >= since:
                        found.append(path)
                except OSError:  # removed while we looked
                    continue
    return found


def run_summary(trainer: Trainer) -> list[str]:
    """The lines the CLI prints after a run: its checkpoints (`written_checkpoints`), the ``latest`` links it moved,
    the logger's folder and every other file it wrote there or into its checkpoint folders."""
    folders = next((c for c in trainer.callbacks if isinstance(c, CheckpointRunFolders)), None)
    lines = written_checkpoints(trainer)
    if folders is not None:
        lines += [f"latest run: {link} -> {folders.run_name}" for link in folders.latest]
    log_dirs = [logger.log_dir for logger in trainer.loggers if isinstance(getattr(logger, "log_dir", None), str)]
    lines += [f"logs: {folder}" for folder in dict.fromkeys(log_dirs) if os.path.isdir(folder)]
    if folders is not None:
        lines += [f"written: {path}" for path in written_files(trainer, folders.started)]
    return lines
