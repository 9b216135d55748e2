"""The one kit every experiment script uses: quiet trainer, keep-best, modules from the configs, seed summary,
one result writer with one JSON schema, and the common command line.

A script ``experiments/<paper>.py`` has ``main(argv: list[str] | None = None) -> dict``, the flags ``--seeds``,
``--out`` (a directory) and ``--smoke`` (a seconds-long run with tiny sizes), and writes ``<out>/<paper>.json``::

    {"paper": str, "seeds": int, "wall_s": float, "config": {...},
     "arms": {arm: {metric: {"mean": float, "std": float}}}, "per_seed": [...],
     "machine": {"cpus", "torch_threads", "load_1min_at_end"}, ...optional extra keys}

Where it trains a collection module it starts from that paper's config file through `from_config` and overrides
only what the experiment varies, so the experiment and ``python train.py fit --config ...`` cannot drift apart.
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "results"

__all__ = ["REPO_ROOT", "RESULTS", "KeepBest", "experiment_parser", "from_config", "markdown_table", "progress",
           "quiet_single_thread", "quiet_trainer", "summarise", "write_result"]


def quiet_single_thread() -> None:
    """The experiments' common set-up: one torch thread (2-core machines, stable timings) and no Lightning chatter."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def quiet_trainer(callbacks: Sequence[Callback] = (), **overrides: Any) -> Trainer:
    """A CPU, single-device Trainer with no logger, checkpoints, progress bar, model summary or sanity check.

    ``overrides`` are Trainer arguments and win over these defaults (e.g. ``max_epochs=3``,
    ``limit_val_batches=0``).
    """
    kwargs = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    kwargs.update(overrides)
    return Trainer(callbacks=list(callbacks), **kwargs)


class KeepBest(Callback):
    """Keep a CPU copy of the module's ``state_dict`` at the best value of ``monitor`` seen at a validation end.

    ``best_score`` / ``best_step`` (the trainer's ``global_step`` then) describe it; ``restore(module)`` loads it
    back (call it after ``fit``, before testing). Ties keep the earlier state. Selection reads only the
    validation metric named by ``monitor`` (``trainer.callback_metrics``), never test data.
    """

    def __init__(self, monitor: str, mode: str = "max") -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.monitor, self.mode = monitor, mode
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.best_state: dict[str, torch.Tensor] | None = None

    def _better(self, score: float) -> bool:
        if self.best_score is None:
            return True
        return score > self.best_score if self.mode == "max" else score < self.best_score

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        score = float(trainer.callback_metrics[self.monitor])
        if math.isnan(score) or not self._better(score):
            return
        self.best_score, self.best_step = score, int(trainer.global_step)
        self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()}

    def restore(self, module: LightningModule) -> LightningModule:
        """Load the best state into ``module`` (in place) and return it."""
        if self.best_state is None:
            raise RuntimeError(f"KeepBest({self.monitor!r}) saw no validation value; nothing to restore")
        module.load_state_dict(self.best_state)
        return module


def _config_path(config: str | Path) -> str:
    path = Path(config)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.is_file():
        raise FileNotFoundError(f"no config file {path}")
    return str(path)


def from_config(config: str | Path, *overrides: str) -> tuple[LightningModule, LightningDataModule]:
    """Build ``(model, datamodule)`` exactly as ``python train.py fit --config <config> <overrides>`` would.

    ``config`` is relative to the repository root (or absolute); ``overrides`` are CLI strings such as
    ``"--model.init_args.lr=0.001"`` or ``"--seed_everything=3"``. The CLI's trainer is built with
    ``--trainer.logger=false`` and discarded, so nothing is written; train the returned pair with
    `quiet_trainer`. Note the CLI calls ``seed_everything`` (default 42, or the override) before building.
    """
    import train  # the repository's entry point; imported here so that importing the kit stays light

    # the discarded Trainer must leave no global state behind (``deterministic: true`` in a config would switch
    # torch's deterministic algorithms on for the rest of the process); pass ``deterministic=True`` to
    # `quiet_trainer` where the experiment wants it
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        cli = train.main(["--config", _config_path(config), "--trainer.logger=false", *overrides], run=False)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas
    return cli.model, cli.datamodule


def _stat(values: Sequence[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "std": float(array.std())}


def summarise(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """``[{arm: {metric: value}} per seed]`` -> ``{arm: {metric: {"mean", "std"}}}`` over the seeds.

    ``std`` is the population standard deviation (``numpy.std``, ddof=0), the convention of the collection's
    published numbers (so one seed gives std 0). An arm or metric missing on some seeds is summarised over the
    seeds that have it; order follows first appearance.
    """
    values: dict[str, dict[str, list[float]]] = {}
    for row in per_seed:
        for arm, metrics in row.items():
            for metric, value in metrics.items():
                values.setdefault(arm, {}).setdefault(metric, []).append(float(value))
    return {arm: {metric: _stat(v) for metric, v in metrics.items()} for arm, metrics in values.items()}


def markdown_table(arms: dict[str, dict[str, dict[str, float]]], metrics: Sequence[str] | None = None,
                   digits: int = 3) -> str:
    """A markdown table, one row per arm, one ``mean ± std`` column per metric ("-" where an arm lacks it)."""
    if metrics is None:
        metrics = list(dict.fromkeys(m for cells in arms.values() for m in cells))
    lines = ["| arm | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for arm, cells in arms.items():
        row = [f"{cells[m]['mean']:.{digits}f} ± {cells[m]['std']:.{digits}f}" if m in cells else "-"
               for m in metrics]
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def experiment_parser(description: str, seeds: int) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every script has: ``--seeds``, ``--out`` (a directory) and ``--smoke``."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seeds", type=int, default=seeds, help="number of seeds (0, 1, ..., seeds - 1)")
    parser.add_argument("--out", type=str, default=str(RESULTS), help="directory for the JSON (and PNG)")
    parser.add_argument("--smoke", action="store_true",
                        help="a seconds-long run with tiny sizes (checks the pipeline, not the claim)")
    return parser


def _plain(value: Any) -> Any:
    """JSON-ready copy: tensors and numpy values become Python numbers/lists, paths become strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _plain(value.tolist())
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(paper: str, *, seeds: int, wall_s: float, config: dict, arms: dict, per_seed: list,
                 out: str | Path, name: str | None = None, **extra: Any) -> dict:
    """Write ``<out>/<name or paper>.json`` with the one schema (plus ``extra`` keys) and return the dict."""
    for arm, metrics in arms.items():
        for metric, cell in metrics.items():
            if set(cell) != {"mean", "std"}:
                raise ValueError(f"arms[{arm!r}][{metric!r}] must be {{'mean', 'std'}}, got {sorted(cell)}")
    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
               "load_1min_at_end": round(os.getloadavg()[0], 2)}  # wall_s depends on what else the machine ran
    result = {"paper": paper, "seeds": int(seeds), "wall_s": float(wall_s), "config": copy.deepcopy(config),
              "arms": arms, "per_seed": per_seed, "machine": machine, **extra}
    result = _plain(result)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name or paper}.json").write_text(json.dumps(result, indent=1))
    return result


def progress(iterable: Iterable, desc: str, total: int | None = None):
    """A tqdm bar over seeds/arms on stderr; ``disable=None`` is tqdm's own rule: no bar when stderr is not a
    terminal (a log file, a test run), so logs do not fill with bar redraws."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, disable=None, leave=False, dynamic_ncols=True)
