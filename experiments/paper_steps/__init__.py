"""Real optimizer steps of every paper config on tiny files in its dataset's release format.

    python -m experiments.paper_steps                                   # every paper config
    python -m experiments.paper_steps --config configs/trew/paper.yaml  # one (its prerequisites run first)

For each paper config (``configs/*/*paper*.yaml``) a `Case` in ``experiments/paper_steps/<paper>.py`` writes a
handful of examples exactly as the public release lays them out (file names, formats, image sizes, sequence lengths,
vocabularies, feature and gene counts) and names the flags that point the config at them. Then, through the real
entry point (`train.main`, what ``python train.py`` runs), in one working folder per paper:

1. ``fit`` for ``steps`` optimizer steps (one validation batch, no logger), timing every step after the first;
2. ``fit`` again from the checkpoint it wrote (``--ckpt_path``) for one more step: the resume must continue at step
   ``steps`` and end at ``steps + 1``;
3. ``predict`` from that checkpoint on one batch, which must return predictions.

Inference-only configs (an LLM agent or probe that is never trained) run ``test`` and ``predict`` instead. A config
whose published model does not fit in CPU memory (or needs weights that are not here) runs the same architecture
with fewer layers at the published widths; the case's ``note`` says what differs from the published run. Configs
that start from another config's checkpoint (``init_from``) name it in ``after``; it runs first, in the same folder.

The result per config (``results/paper_scale.json``'s ``cpu_steps``, ``step_s`` and ``release_run``) is written by
``python -m experiments.paper_scale``, which calls `run_case`; ``tests/test_paper_steps.py`` runs every case.
"""
from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch import Callback

ROOT = Path(__file__).resolve().parents[2]
# flags of every stage: one CPU process, no progress bar, at most one evaluation batch (the config's logger stays:
# W&B runs offline, into the working folder)
COMMON = ("--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.num_nodes=1",
          "--trainer.enable_progress_bar=false")
# fit: max_steps bounds the run (a checkpoint written when max_steps stops an epoch early resumes at the next
# epoch, so a one-epoch config could not take the resumed step)
LIMITS = {"fit": ("--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.max_epochs=-1"),
          "test": ("--trainer.limit_test_batches=1",), "predict": ("--trainer.limit_predict_batches=1",)}


@dataclass(frozen=True)
class Case:
    """How one paper config takes real steps on release-format files.

    ``write(folder)`` writes the tiny release-format dataset under ``folder`` and returns the flags that point the
    config at it (``--data.init_args.data_dir=...``). ``args`` are further flags of every stage that keep the run
    on one CPU (a smaller batch, fewer layers, a shorter generation): each is explained in ``note``, which is empty
    only when the run is the published configuration. ``test_args`` shrink it further for the slow test only
    (never the recorded figures). ``after`` lists the paper configs whose checkpoints this one starts from.
    ``memory_gib`` is the CPU memory the run was measured to need, where that is near or above what a laptop has:
    on a machine with less the case is not run and its figures say so (`machine_memory_gib`).
    """

    write: Callable[[Path], list[str]]
    args: tuple[str, ...] = ()
    note: str = ""
    test_args: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    inference_only: bool = False
    release_format: str = ""  # the files written, as the release names them
    optimizer_steps_per_batch: int = 1  # a module that steps two optimizers per batch (critic and actor) says 2
    memory_gib: float | None = None

    def too_big(self) -> str | None:
        """Why this machine cannot run the case (its memory is below ``memory_gib``), or None."""
        if self.memory_gib is None or machine_memory_gib() >= self.memory_gib:
            return None
        return (f"not run: it needs {self.memory_gib:g} GiB of CPU memory or more (its measured peak); "
                f"this machine has {machine_memory_gib():.1f} GiB")


def machine_memory_gib() -> float:
    """Total physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30


class StepTimer(Callback):
    """Wall time of every training batch, and the bytes autograd saves for backward in it (the activations).

    Saved tensors are counted once per storage, parameters excluded, over the whole batch: with automatic
    optimization that is one forward's activations; a manual-optimization module that runs several micro-batches
    per step frees each before the next, so its sum overstates the peak (`run_case` records it only for the
    former)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.saved_bytes: list[int] = []
        self._start = 0.0
        self._hooks = None
        self._seen: dict[int, int] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        parameters = {p.untyped_storage()._cdata for p in pl_module.parameters()}
        self._seen = {}

        def pack(tensor):
            if tensor.layout != torch.strided:  # sparse tensors have no single storage
                return tensor
            storage = tensor.untyped_storage()
            if storage._cdata not in parameters and tensor.device.type != "meta":
                self._seen[storage._cdata] = max(self._seen.get(storage._cdata, 0), storage.nbytes())
            return tensor

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._hooks.__enter__()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        self.saved_bytes.append(sum(self._seen.values()))


def cases() -> dict[str, Case]:
    """``{config path: Case}`` of every paper module in this package."""
    found: dict[str, Case] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for config, case in getattr(module, "CASES", {}).items():
            if config in found:
                raise ValueError(f"{config}: two cases ({module.__name__} and another module)")
            found[config] = case
    return found


def in_order(configs: list[str]) -> list[str]:
    """The configs with each one's prerequisites (`Case.after`, transitively) before it."""
    registry = cases()
    ordered: list[str] = []

    def add(config: str) -> None:
        for before in registry[config].after:
            add(before)
        if config not in ordered:
            ordered.append(config)

    for config in configs:
        add(config)
    return ordered


def paper_configs() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/*/*paper*.yaml"))


def _cli(args: list[str]):
    import train

    return train.main(args=args, run=True)


def _checkpoint(trainer) -> str:
    """The checkpoint a fit wrote: the ``last`` one where the config keeps one, else the best."""
    written = [path for callback in trainer.checkpoint_callbacks
               for path in (callback.last_model_path, callback.best_model_path) if path and Path(path).is_file()]
    if not written:
        raise RuntimeError("fit wrote no checkpoint (the config's ModelCheckpoint saved nothing)")
    return next((path for path in written if Path(path).stem == "last"), written[-1])


def run_case(config: str, case: Case, folder: Path, steps: int = 2, for_test: bool = False,
             done: dict[str, dict] | None = None) -> dict:
    """Write the case's files under ``folder`` and run fit -> resume -> predict there (test -> predict for an
    inference-only config); returns the figures recorded in ``results/paper_scale.json``'s ``release_run``.

    ``done`` maps configs already run in ``folder`` to their results: prerequisites in ``after`` that are not in it
    run first (``done`` is updated), so a paper's configs can share one folder and one prerequisite run.
    """
    done = {} if done is None else done
    registry = cases()
    too_big = case.too_big()
    if too_big:
        done[config] = {"release_format": case.release_format, "note": case.note, "cpu_steps": 0, "step_s": None,
                        "not_run": too_big}
        return done[config]
    for prerequisite in case.after:
        if prerequisite not in done:
            run_case(prerequisite, registry[prerequisite], folder, steps, for_test, done)
    folder.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(folder)
    torch_threads = torch.get_num_threads()
    try:
        data_flags = case.write(folder)
        base = ["--config", str(ROOT / config), *data_flags, *case.args, *(case.test_args if for_test else ()),
                *COMMON]
        result: dict = {"release_format": case.release_format, "note": case.note}
        if case.inference_only:
            start = time.perf_counter()
            cli = _cli(["test", *base, *LIMITS["test"]])
            assert cli.trainer.state.finished, f"{config}: test did not finish"
            result.update(cpu_steps=0, step_s=None, test_s=round(time.perf_counter() - start, 2),
                          test_metrics=sorted(cli.trainer.callback_metrics))
            ckpt = []
        else:
            per_batch = case.optimizer_steps_per_batch
            earlier = set(folder.rglob("*.ckpt"))  # a prerequisite's checkpoints, which later configs may read
            cli, timer = _fit(base + [f"--trainer.max_steps={steps * per_batch}", *LIMITS["fit"]])
            reached = cli.trainer.global_step
            if reached != steps * per_batch:
                raise RuntimeError(f"{config}: fit ended at step {reached // per_batch}, not {steps}")
            last = _checkpoint(cli.trainer)
            activation_bytes = max(timer.saved_bytes) if cli.model.automatic_optimization else None
            batch_size = _batch_size(cli.datamodule)
            del cli
            gc.collect()  # the next stage builds the model again: do not hold two copies
            resumed, _ = _fit(base + [f"--trainer.max_steps={(steps + 1) * per_batch}", *LIMITS["fit"],
                                      "--ckpt_path", last])
            if resumed.trainer.global_step != (steps + 1) * per_batch:
                raise RuntimeError(f"{config}: the resume from step {steps} ended at step "
                                   f"{resumed.trainer.global_step // per_batch}, not {steps + 1}")
            timed = timer.seconds[1:] or timer.seconds
            result.update(cpu_steps=steps + 1, step_s=round(sum(timed) / len(timed), 4),
                          first_step_s=round(timer.seconds[0], 4), resumed_from=steps,
                          activation_bytes=activation_bytes, batch_size=batch_size)
            final = Path(_checkpoint(resumed.trainer))
            ckpt = ["--ckpt_path", str(final)]
            del resumed
            gc.collect()
            for written in set(folder.rglob("*.ckpt")) - earlier - {final}:  # at published width these are GBs each
                written.unlink()
        start = time.perf_counter()
        predicted = _cli(["predict", *base, *LIMITS["predict"], *ckpt])
        predictions = predicted.trainer.predict_loop.predictions
        if not predictions:
            raise RuntimeError(f"{config}: predict returned no predictions")
        result.update(predict_s=round(time.perf_counter() - start, 2), predict_batches=len(predictions))
        done[config] = result
        return result
    finally:
        os.chdir(cwd)
        torch.set_num_threads(torch_threads)


def _fit(args: list[str]):
    """``train.py fit`` with `StepTimer` appended to the config's callbacks; returns the CLI and the timer."""
    cli = _cli(["fit", *args, "--trainer.callbacks+=experiments.paper_steps.StepTimer"])
    if not cli.trainer.state.finished:
        raise RuntimeError("fit did not finish")
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer))
    for attached in ("log", "log_dict"):  # Lightning binds the module's methods to every callback: the timer, kept
        timer.__dict__.pop(attached, None)  # after the CLI is dropped, would otherwise keep the model alive
    return cli, timer


def _batch_size(datamodule) -> int | None:
    """The datamodule's batch size (its ``batch_size`` hyper-parameter), if it has one."""
    hparams = getattr(datamodule, "hparams", None) or {}
    size = hparams.get("batch_size", getattr(datamodule, "batch_size", None))
    return int(size) if isinstance(size, int) else None
