"""One runner for every paper's experiment: ``python -m experiments NAME [--smoke] [--seeds N] [--out DIR] [--check]``
(also ``icml26 experiment NAME ...``; ``--set KEY=VALUE --name STEM`` runs an ablation of the whole protocol,
``--set-for ARMS KEY=VALUE`` one for the arms matching a shell-style pattern, ``--arms ARMS ...`` a part of it).

The protocol is configuration, ``configs/<NAME>/experiment.yaml``::

    title: "Paper title (venue)"           # the JSON's "paper" (default: NAME)
    seeds: 3                               # seeds 0 .. seeds-1 (``--seeds`` overrides)
    configs: [configs/<NAME>/quick.yaml]   # the default config files of every arm
    overrides: {trainer.max_epochs: 30}    # dotted keys, exactly as CLI flags (``--trainer.max_epochs=30``)
    arms:                                  # name -> overlay
      baseline: {configs: [...], overrides: {...}, fit: true}   # configs replace the default list
      method: {overrides: {model.init_args.x: 1}}
      helper: {seed_offset: 1000, seeds: 3, row: false}         # see "Arm keys" below
    variants:                              # optional: more settings of every arm, reported apart
      noise=2.0: {group: other_noise, overrides: {data.init_args.noise: 2.0}, keep: [acc]}
    smoke: {overrides: {...}, seeds: 1, variants: [], settings: {...}, arms: {...}}   # a seconds-long run
    metrics: [acc]                         # the table's columns and the paired differences
    baseline: baseline                     # paired differences "<arm> - <baseline>" over seeds
    settings: {...}                        # free values for the hooks (``run.settings``)
    prepare: experiments.<NAME>:prepare    # optional: run -> {dotted key: value}, overrides computed before a build
    evaluate: experiments.<NAME>:evaluate  # optional: run -> {metric: value}; default trainer.test
    report: experiments.<NAME>:report      # optional: (result, records[, spec]) -> extra JSON keys
    plot: experiments.<NAME>:plot          # optional: (result, png path) -> None

Arm keys beyond ``configs`` / ``overrides`` / ``fit`` (all optional):

* ``seed_offset: K`` (an integer >= 0, default 0): the model seed is S + K (``--seed_everything``) while the data
  seed stays S, for protocols that train several models on one data split with seeds of their own (a retrained
  reference and a shadow model beside the original, say);
* ``seed_stride: M`` (an integer >= 1, default 1): the model seed is M * S + K, so that the models of one seed keep
  apart from those of the next however many there are (RSIR's round k of seed S is trained with seed 1000 S + k);
* ``seeds: N`` (>= 1): the arm runs on seeds 0 .. N-1 only (fewer than the experiment's), e.g. an expensive arm
  measured on 3 seeds beside a cheap one on 100; ``--seeds`` / ``smoke.seeds`` below N cap it;
* ``row: false``: the run is made (hooks read it, see ``Run.earlier``) but its own metrics are no row of the result:
  a helper model, or a grid point that a hook selects from and reports as a derived arm (``Run.derived``).

The smoke overlay may keep a subset of the arms: ``smoke.arms`` is a list of arm names, or a mapping of arm name
to ``{overrides: {...}}`` applied after the smoke overrides (a per-arm smoke size).

Hooks: ``prepare(run)`` is called before each build and returns overrides applied after every other layer (values
computed from the seed's earlier runs, e.g. ``model.init_args.init_from`` = an earlier arm's checkpoint). Every run
sees the same seed's (and variant's) earlier runs as ``run.earlier`` (``{arm name: Run}``, in run order, each with
its ``metrics``, model, datamodule and checkpoints). ``report`` may take the spec as a third argument, and may return
``arms`` and ``per_seed`` to replace the runner's (arms or per-seed rows a hook computed without a Lightning run, or
statistics other than `kit.summarise`); ``paired`` is then computed from the returned rows.

A paper's further experiments (side studies of the same models) live beside it as ``configs/<paper>/<stem>.yaml``
(the same keys) and are named ``<paper>/<stem>``: ``python -m experiments rna_fm/coverage`` runs
``configs/rna_fm/coverage.yaml``, its hooks by convention in ``experiments/<paper>_<stem>.py``, and writes
``<out>/<paper>_<stem>.json`` (and ``.png``) unless ``--name`` says otherwise. `available` lists the papers' main
experiments only (``available(secondary=True)`` adds these: the YAML files of ``configs/<paper>/`` with a top-level
``arms:``); ``--check`` checks the paper's claim, which its card reads from the main experiment's result, so for a
further experiment it prints one line saying so and checks nothing.

For every seed S and arm (and variant) the runner builds everything exactly as ``python train.py fit --config ...
<flags>`` would (``train.main(args, run=False)``: model, datamodule and the trainer with the YAML's callbacks), with
``--seed_everything=S`` (S + the arm's ``seed_offset``) and, when the datamodule takes a ``seed``,
``--data.init_args.seed=S``; overrides apply in the order experiment, arm, variant, smoke, smoke arm, ``--set``,
``prepare``. Then ``trainer.fit`` (unless the arm says ``fit: false``) and ``trainer.test`` from the best checkpoint
of the config's ModelCheckpoint (or the ``evaluate`` hook). Trainer outputs
(checkpoints, logs) go to a temporary folder, never to ``runs/``. The result, ``<out>/<NAME>.json``, has the schema of
`experiments.kit.write_result` plus ``paired``: ``{"<arm> - <baseline>": {metric: {"mean", "lo", "hi", "n"}}}``,
the mean paired difference over seeds with its 95% t interval (``lo``/``hi`` null with fewer than 2 seeds).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import fnmatch
import importlib
import inspect
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from experiments import kit

TOP_KEYS = {"title", "seeds", "configs", "overrides", "arms", "variants", "smoke", "metrics", "baseline", "settings",
            "prepare", "evaluate", "report", "plot"}
ARM_KEYS = {"configs", "overrides", "fit", "seed_offset", "seed_stride", "seeds", "row"}
VARIANT_KEYS = {"group", "overrides", "keep"}
SMOKE_KEYS = {"overrides", "seeds", "variants", "settings", "arms"}
SMOKE_ARM_KEYS = {"overrides"}
HOOKS = ("prepare", "evaluate", "report", "plot")
# JSON keys the runner writes itself (a variant group may not take one)
RUNNER_KEYS = {"paper", "seeds", "wall_s", "config", "arms", "per_seed", "machine", "paired"}
# flags the runner sets itself: the seeds are linked, the trainer's outputs go to the run's folder
RESERVED = ("seed_everything", "data.init_args.seed", "trainer.default_root_dir")


class ExperimentError(ValueError):
    """An experiment.yaml that cannot run: the message names the file, the key and the fix."""


# ------------------------------------------------------------------------------------------- the spec
@dataclass
class Arm:
    name: str
    configs: list[str]
    overrides: dict[str, Any]
    fit: bool = True
    seed_offset: int = 0       # the model seed is seed_stride * S + seed_offset, the data seed S
    seeds: int | None = None   # run on seeds 0 .. seeds-1 only (None: every seed of the experiment)
    row: bool = True           # False: a helper run, its own metrics are no row of the result
    smoke_overrides: dict[str, Any] = field(default_factory=dict)  # smoke.arms.<name>.overrides (smoke runs only)
    seed_stride: int = 1       # see seed_offset


@dataclass
class Variant:
    name: str
    group: str
    overrides: dict[str, Any]
    keep: list[str] | None = None


@dataclass
class Spec:
    name: str
    path: Path
    title: str
    seeds: int
    arms: list[Arm]
    variants: list[Variant]
    overrides: dict[str, Any]
    metrics: list[str]
    baseline: str | None
    settings: dict[str, Any]
    hooks: dict[str, str]
    smoke: bool = False
    smoke_overrides: dict[str, Any] = field(default_factory=dict)  # applied over every layer of experiment.yaml
    set_overrides: dict[str, Any] = field(default_factory=dict)    # ``--set``: applied last, over everything
    arm_set_overrides: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # ``--set-for``: then these


def experiment_path(name: str) -> Path:
    """``configs/<name>/experiment.yaml``; for ``<paper>/<stem>`` (a paper's further experiment)
    ``configs/<paper>/<stem>.yaml``."""
    paper, sep, stem = name.partition("/")
    if sep:
        return kit.REPO_ROOT / "configs" / paper / f"{stem}.yaml"
    return kit.REPO_ROOT / "configs" / name / "experiment.yaml"


def is_secondary(name: str) -> bool:
    """Whether ``name`` is a paper's further experiment ``<paper>/<stem>`` (not its main one)."""
    return "/" in name


def result_stem(name: str) -> str:
    """The default stem of the result files: ``<name>``, or ``<paper>_<stem>`` for ``<paper>/<stem>``."""
    return name.replace("/", "_")


def available(secondary: bool = False) -> list[str]:
    """The papers that have an experiment.yaml; with ``secondary``, also every ``<paper>/<stem>`` whose
    ``configs/<paper>/<stem>.yaml`` is an experiment (a top-level ``arms:`` key), sorted together."""
    root = kit.REPO_ROOT / "configs"
    names = [p.parent.name for p in root.glob("*/experiment.yaml")]
    if secondary:
        names += [f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.yaml") if p.name != "experiment.yaml"
                  and any(line.startswith("arms:") for line in p.read_text().splitlines())]
    return sorted(names)


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ExperimentError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _check_keys(value: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ExperimentError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _overrides(value: Any, where: str) -> dict[str, Any]:
    value = _mapping(value, where)
    for key in value:
        if not isinstance(key, str) or key.startswith("-") or not key:
            raise ExperimentError(f"{where}: key {key!r} must be a dotted option without dashes, "
                                  "e.g. trainer.max_epochs")
        if key in RESERVED:
            raise ExperimentError(f"{where}: {key} is set by the runner (one seed drives seed_everything and the "
                                  "data seed; trainer outputs go to a temporary folder); remove it")
    return dict(value)


def _configs(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ExperimentError(f"{where} must be a non-empty list of config files")
    for config in value:
        if not (kit.REPO_ROOT / config).is_file():
            raise ExperimentError(f"{where}: no config file {config} (paths are relative to the repository root)")
    return list(value)


def _names(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ExperimentError(f"{where} must be a list of names")
    return list(value)


def load_spec(name: str, smoke: bool = False, path: str | Path | None = None) -> Spec:
    """Read and validate ``configs/<name>/experiment.yaml`` (or ``path``), with the smoke overlay applied."""
    if path is None and (name.count("/") > 1 or any(not part for part in name.split("/"))):
        raise ExperimentError(f"no experiment '{name}': write PAPER or PAPER/STEM (configs/PAPER/STEM.yaml)")
    path = Path(path) if path is not None else experiment_path(name)
    if not path.is_file():
        known = ", ".join(available(secondary=True)) or "none"
        raise ExperimentError(f"no experiment '{name}': {path} does not exist (experiments: {known})")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path}: not valid YAML: {err}") from None
    where = str(path)
    raw = _mapping(raw, where)
    _check_keys(raw, TOP_KEYS, where)
    default_configs = _configs(raw["configs"], f"{where}: configs") if "configs" in raw else None
    arms_raw = _mapping(raw.get("arms"), f"{where}: arms")
    if not arms_raw:
        raise ExperimentError(f"{where}: arms is missing or empty; give at least one arm")
    arms = []
    for arm_name, arm_raw in arms_raw.items():
        arm_where = f"{where}: arms.{arm_name}"
        arm_raw = _mapping(arm_raw, arm_where)
        _check_keys(arm_raw, ARM_KEYS, arm_where)
        if "configs" in arm_raw:
            configs = _configs(arm_raw["configs"], f"{arm_where}.configs")
        elif default_configs is not None:
            configs = default_configs
        else:
            raise ExperimentError(f"{arm_where}: no config files (give configs at the top or in the arm)")
        fit, row = arm_raw.get("fit", True), arm_raw.get("row", True)
        for key, value in (("fit", fit), ("row", row)):
            if not isinstance(value, bool):
                raise ExperimentError(f"{arm_where}.{key} must be true or false")
        offset = arm_raw.get("seed_offset", 0)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ExperimentError(f"{arm_where}.seed_offset must be an integer >= 0 (the model seed is S + "
                                  f"seed_offset), got {offset!r}")
        stride = arm_raw.get("seed_stride", 1)
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ExperimentError(f"{arm_where}.seed_stride must be an integer >= 1 (the model seed is seed_stride "
                                  f"* S + seed_offset), got {stride!r}")
        arm_seeds = arm_raw.get("seeds")
        if arm_seeds is not None and (isinstance(arm_seeds, bool) or not isinstance(arm_seeds, int) or arm_seeds < 1):
            raise ExperimentError(f"{arm_where}.seeds must be a positive integer (the arm runs on seeds 0 .. "
                                  f"seeds-1), got {arm_seeds!r}")
        arms.append(Arm(str(arm_name), configs, _overrides(arm_raw.get("overrides"), f"{arm_where}.overrides"),
                        fit, offset, arm_seeds, row, seed_stride=stride))
    if not any(arm.row for arm in arms):
        raise ExperimentError(f"{where}: every arm says row: false; at least one arm must be a row of the result")
    variants = []
    for variant_name, variant_raw in _mapping(raw.get("variants"), f"{where}: variants").items():
        variant_where = f"{where}: variants.{variant_name}"
        variant_raw = _mapping(variant_raw, variant_where)
        _check_keys(variant_raw, VARIANT_KEYS, variant_where)
        group = variant_raw.get("group", "variants")
        if not isinstance(group, str) or group in RUNNER_KEYS or group.startswith("per_seed"):
            raise ExperimentError(f"{variant_where}.group must be a name other than {sorted(RUNNER_KEYS)} "
                                  "and per_seed*")
        keep = variant_raw.get("keep")
        variants.append(Variant(str(variant_name), group,
                                _overrides(variant_raw.get("overrides"), f"{variant_where}.overrides"),
                                None if keep is None else _names(keep, f"{variant_where}.keep")))
    seeds = raw.get("seeds", 1)
    overrides = _overrides(raw.get("overrides"), f"{where}: overrides")
    settings = dict(_mapping(raw.get("settings"), f"{where}: settings"))
    smoke_raw = _mapping(raw.get("smoke"), f"{where}: smoke")
    _check_keys(smoke_raw, SMOKE_KEYS, f"{where}: smoke")
    smoke_overrides = _overrides(smoke_raw.get("overrides"), f"{where}: smoke.overrides")
    smoke_arms = _smoke_arms(smoke_raw["arms"], arms, f"{where}: smoke.arms") if "arms" in smoke_raw else []
    if smoke:
        settings.update(_mapping(smoke_raw.get("settings"), f"{where}: smoke.settings"))
        seeds = smoke_raw.get("seeds", seeds)
        if "variants" in smoke_raw:
            kept = _names(smoke_raw["variants"], f"{where}: smoke.variants")
            unknown = sorted(set(kept) - {v.name for v in variants})
            if unknown:
                raise ExperimentError(f"{where}: smoke.variants names unknown variants {unknown}")
            variants = [v for v in variants if v.name in kept]
        if "arms" in smoke_raw:
            arms = [dataclasses.replace(arm, smoke_overrides=overrides) for arm, overrides in smoke_arms]
    if not isinstance(seeds, int) or seeds < 1:
        raise ExperimentError(f"{where}: seeds must be a positive integer, got {seeds!r}")
    metrics = _names(raw.get("metrics"), f"{where}: metrics")
    baseline = raw.get("baseline")
    if baseline is not None and baseline not in arms_raw and "report" not in raw:
        raise ExperimentError(f"{where}: baseline {baseline!r} is not an arm ({list(arms_raw)}); name an arm (or a "
                              "row the report hook adds)")
    if baseline in arms_raw and not next(arm.row for arm in arms if arm.name == baseline):
        raise ExperimentError(f"{where}: the baseline arm {baseline!r} says row: false; give it a row or name "
                              "another baseline")
    hooks = {}
    for hook in HOOKS:
        if hook in raw:
            target = raw[hook]
            if not isinstance(target, str) or target.count(":") != 1:
                raise ExperimentError(f"{where}: {hook} must be 'module:function', got {target!r}")
            hooks[hook] = target
    return Spec(name, path, str(raw.get("title", name)), seeds, arms, variants, overrides, metrics, baseline,
                settings, hooks, smoke, smoke_overrides if smoke else {})


def _smoke_arms(value: Any, arms: list[Arm], where: str) -> list[tuple[Arm, dict[str, Any]]]:
    """The arms a smoke run keeps (``smoke.arms``: a list of names, or name -> ``{overrides: {...}}``), in the order
    of ``arms``, each with its smoke overrides."""
    if isinstance(value, list):
        value = {name: None for name in _names(value, where)}
    value = _mapping(value, where)
    if not value:
        raise ExperimentError(f"{where} is empty; list the arms a smoke run keeps, or leave the key out")
    known = [arm.name for arm in arms]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ExperimentError(f"{where} names unknown arms {unknown}; name arms of `arms`")
    kept = []
    for arm in arms:
        if arm.name in value:
            overlay = _mapping(value[arm.name], f"{where}.{arm.name}")
            _check_keys(overlay, SMOKE_ARM_KEYS, f"{where}.{arm.name}")
            kept.append((arm, _overrides(overlay.get("overrides"), f"{where}.{arm.name}.overrides")))
    if not any(arm.row for arm, _ in kept):
        raise ExperimentError(f"{where} keeps no arm with a row; keep at least one")
    return kept


def resolve_hook(target: str) -> Callable:
    module_name, function_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ExperimentError(f"hook {target}: cannot import {module_name} ({err})") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ExperimentError(f"hook {target}: {module_name} has no function {function_name}")
    return function


def flag(key: str, value: Any) -> str:
    """``--key=value`` as the CLI reads it (strings as given, everything else as JSON, which is YAML)."""
    return f"--{key}={value if isinstance(value, str) else json.dumps(value)}"


def arm_overrides(spec: Spec, arm: Arm, variant: Variant | None = None) -> dict[str, Any]:
    """The dotted overrides of ``arm`` (and ``variant``) in the order they apply: experiment, arm, variant, smoke,
    smoke arm, ``--set``, ``--set-for`` (``prepare``'s come at build time)."""
    overrides = {**spec.overrides, **arm.overrides, **(variant.overrides if variant else {}), **spec.smoke_overrides,
                 **arm.smoke_overrides, **spec.set_overrides}
    for pattern, scoped in spec.arm_set_overrides:
        if fnmatch.fnmatchcase(arm.name, pattern):
            overrides.update(scoped)
    return overrides


def arm_flags(spec: Spec, arm: Arm, variant: Variant | None = None) -> list[str]:
    """The CLI arguments of ``arm`` (and ``variant``), seed and output folder excluded."""
    args = []
    for config in arm.configs:
        args += ["--config", str(kit.REPO_ROOT / config)]
    return args + [flag(k, v) for k, v in arm_overrides(spec, arm, variant).items()]


# ------------------------------------------------------------------------------------------- one run
@dataclass
class Run:
    """One seed x arm (x variant): the CLI objects and what the hooks need."""
    spec: Spec
    arm: Arm
    variant: Variant | None
    seed: int
    root: Path
    out: Path
    cli: Any = None
    fitted: bool = False
    extra: dict = field(default_factory=dict)  # per-run records a hook keeps for `report`
    # the same seed's (and variant's) runs made before this one, {arm name: Run}, in run order
    earlier: dict[str, Run] = field(default_factory=dict, repr=False)
    metrics: dict[str, float] = field(default_factory=dict)  # this run's own metrics, once evaluated
    # metrics of further arms measured on this run's trained model (another evaluation of the same weights), which
    # the evaluate hook adds; they follow this arm in the result
    derived: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def model(self):
        return self.cli.model

    @property
    def datamodule(self):
        return self.cli.datamodule

    @property
    def trainer(self):
        return self.cli.trainer

    @property
    def settings(self) -> dict:
        return self.spec.settings

    @property
    def model_seed(self) -> int:
        """``--seed_everything``: the arm's ``seed_stride`` times the seed plus its ``seed_offset`` (the data seed is
        `seed`)."""
        return self.arm.seed_stride * self.seed + self.arm.seed_offset

    def build(self, args: list[str]):
        """A LightningCLI (not run) of ``args`` plus this run's seeds and output folder (``--seed_everything`` =
        `model_seed`, the datamodule's ``seed`` = `seed` when it takes one, ``--trainer.default_root_dir``), as
        train.py would build it."""
        return build_cli(args, self.seed, self.root, model_seed=self.model_seed)

    def best_checkpoint(self) -> str | None:
        """After ``fit``, the best checkpoint of the config's ModelCheckpoint that monitors a metric (of the first
        ModelCheckpoint when none monitors: its latest); None when not fitted or nothing was saved."""
        callbacks = self.trainer.checkpoint_callbacks if self.fitted else []
        monitored = [c for c in callbacks if getattr(c, "monitor", None)]
        callback = (monitored or callbacks or [None])[0]
        path = getattr(callback, "best_model_path", "") if callback is not None else ""
        return path or None

    def checkpoint_of(self, arm: str, setting: str) -> str:
        """The best checkpoint (`best_checkpoint`) of this seed's earlier run of ``arm``: what a ``prepare`` hook
        passes as ``model.init_args.init_from`` to an arm that starts where another ended. ``setting`` names the
        experiment.yaml key that chained the two (for the error when ``arm`` has not run or saved nothing)."""
        if arm not in self.earlier:
            raise ExperimentError(f"{setting}: arm {self.arm.name!r} starts from {arm!r}, which is not an earlier arm "
                                  f"of this seed (earlier: {list(self.earlier)}); list it before")
        path = self.earlier[arm].best_checkpoint()
        if path is None:
            raise ExperimentError(f"{setting}: arm {arm!r} saved no checkpoint for {self.arm.name!r}; give its config "
                                  "a ModelCheckpoint and leave fit on")
        return path

    def load_best(self) -> None:
        """Load the best checkpoint's weights into the model (what ``trainer.test(ckpt_path='best')`` tests)."""
        path = self.best_checkpoint()
        if path is not None:
            state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
            self.model.load_state_dict(state)

    def test(self, **kwargs) -> dict[str, float]:
        """``trainer.test`` on the datamodule (or ``dataloaders=``) from the best checkpoint; the logged metrics
        with the ``test/`` prefix removed."""
        if "dataloaders" not in kwargs:
            kwargs["datamodule"] = self.datamodule
        outputs = self.trainer.test(self.model, ckpt_path=self.best_checkpoint(), verbose=False, **kwargs)
        merged = {k: v for output in outputs for k, v in output.items()}
        return {k.removeprefix("test/"): float(v) for k, v in merged.items()}


def _takes_seed(cls: type) -> bool:
    return "seed" in inspect.signature(cls.__init__).parameters


_DATA_TAKES_SEED: dict[tuple[str, ...], bool] = {}


def build_cli(args: list[str], seed: int, root: Path, model_seed: int | None = None):
    """``train.main(args + seed flags, run=False)``: ``--seed_everything=model_seed`` (default ``seed``) and the
    data seed ``seed``; global torch state is restored afterwards by `isolated`."""
    import train

    base = [*args, f"--seed_everything={seed if model_seed is None else model_seed}",
            f"--trainer.default_root_dir={root}"]
    key = tuple(args)
    try:
        if key not in _DATA_TAKES_SEED:  # the first build tells whether the datamodule has a seed to link
            cli = train.main(base, run=False)
            _DATA_TAKES_SEED[key] = cli.datamodule is not None and _takes_seed(type(cli.datamodule))
            if not _DATA_TAKES_SEED[key]:
                return cli
        cli = train.main([*base, f"--data.init_args.seed={seed}"] if _DATA_TAKES_SEED[key] else base, run=False)
    except SystemExit as err:
        raise ExperimentError(f"the CLI refused the arguments {' '.join(args)} (its error is printed above)") \
            from err
    return cli


class isolated:
    """Restore torch's deterministic-algorithm switch and CUBLAS_WORKSPACE_CONFIG after a run (a config's
    ``deterministic: true`` sets them for the whole process)."""

    def __enter__(self):
        self.state = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        return self

    def __exit__(self, *exc) -> None:
        deterministic, warn_only, cublas = self.state
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def execute(run: Run, evaluate: Callable | None, prepare: Callable | None = None) -> dict[str, float]:
    """Build (with the ``prepare`` hook's overrides last), fit (unless the arm says no), evaluate; returns the run's
    metrics (also kept as ``run.metrics``)."""
    with isolated():
        computed = _overrides(prepare(run), f"prepare hook for {run.arm.name}") if prepare is not None else {}
        run.cli = run.build(arm_flags(run.spec, run.arm, run.variant) + QUIET
                            + [flag(k, v) for k, v in computed.items()])
        if run.arm.fit:
            run.trainer.fit(run.model, datamodule=run.datamodule)
            run.fitted = True
        metrics = evaluate(run) if evaluate is not None else run.test()
    run.metrics = _kept(run, metrics)
    return run.metrics


def _kept(run: Run, metrics: dict) -> dict[str, float]:
    """The metrics as floats, only those the variant keeps."""
    keep = run.variant.keep if run.variant is not None else None
    return {k: float(v) for k, v in metrics.items() if keep is None or k in keep}


# ------------------------------------------------------------------------------------------- statistics
def paired(per_seed: list[dict], baseline: str, metrics: list[str]) -> dict:
    """``{"<arm> - <baseline>": {metric: {"mean", "lo", "hi", "n"}}}``: `icml26.paired.paired_block` over the
    metrics some run measured (the mean over seeds of the per-seed difference and its 95% Student-t interval;
    ``lo``/``hi`` None with fewer than 2 seeds)."""
    from icml26.paired import paired_block

    measured = {m for row in per_seed for cells in row.values() if isinstance(cells, dict) for m in cells}
    return paired_block(per_seed, baseline, [m for m in metrics if m in measured])


# ------------------------------------------------------------------------------------------- the experiment
def run_experiment(name: str, *, smoke: bool = False, seeds: int | None = None, out: str | Path = kit.RESULTS,
                   keep_runs: bool = False, spec_path: str | Path | None = None,
                   overrides: dict[str, Any] | None = None, result_name: str | None = None,
                   arm_overrides: list[tuple[str, dict[str, Any]]] | None = None,
                   only_arms: list[str] | None = None) -> dict:
    """Run every seed x arm (x variant) of ``configs/<name>/experiment.yaml``; writes and returns the result.

    ``overrides`` (dotted keys) apply to every arm after all the experiment's layers (an ablation of the whole
    protocol), then ``arm_overrides`` (``(arm pattern, overrides)``, shell-style patterns) to the arms they match;
    ``only_arms`` (patterns) keeps the matching arms only, in the YAML's order (a part of the protocol: the arms a
    kept arm's hooks read must be kept too); ``result_name`` replaces `result_stem` (``name``, ``<paper>_<stem>``
    for ``<paper>/<stem>``) as the stem of the JSON and PNG."""
    spec = load_spec(name, smoke=smoke, path=spec_path)
    spec.set_overrides = _overrides(overrides, "--set")
    names = [arm.name for arm in spec.arms]
    for pattern, scoped in arm_overrides or []:
        if not fnmatch.filter(names, pattern):
            raise ExperimentError(f"--set-for {pattern!r}: matches no arm of {name} ({names})")
        spec.arm_set_overrides.append((pattern, _overrides(scoped, f"--set-for {pattern}")))
    if only_arms:
        unmatched = [pattern for pattern in only_arms if not fnmatch.filter(names, pattern)]
        if unmatched:
            raise ExperimentError(f"--arms {unmatched}: matches no arm of {name} ({names})")
        spec.arms = [arm for arm in spec.arms if any(fnmatch.fnmatchcase(arm.name, p) for p in only_arms)]
        if not any(arm.row for arm in spec.arms):
            raise ExperimentError(f"--arms {only_arms}: keeps no arm with a row ({[a.name for a in spec.arms]})")
        if spec.baseline is not None and spec.baseline not in {arm.name for arm in spec.arms}:
            spec.baseline = None  # no paired differences against an arm that was not run
    stem = result_name or result_stem(name)
    if seeds is not None:
        if seeds < 1:
            raise ExperimentError(f"--seeds must be at least 1, got {seeds}")
        spec.seeds = seeds
    hooks = {hook: resolve_hook(target) for hook, target in spec.hooks.items()}
    kit.quiet_single_thread()
    for package in ("lightning_modules", "datamodules"):  # the modules' and datamodules' notes; errors still show
        logging.getLogger(package).setLevel(logging.ERROR)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = [(None, arm) for arm in spec.arms] + [(v, arm) for v in spec.variants for arm in spec.arms]
    start = time.perf_counter()
    per_seed: list[dict] = []
    per_seed_groups: dict[str, list[dict]] = {v.group: [] for v in spec.variants}
    records: list[dict] = []
    scratch = tempfile.TemporaryDirectory(prefix=f"{stem}_runs_")
    runs_root = out / f"{stem}_runs" if keep_runs else Path(scratch.name)
    done, total = 0, sum(_arm_seeds(spec, arm) for _, arm in settings)
    bar = kit.progress(None, name, total=total)
    try:
        for seed in range(spec.seeds):
            row: dict = {}
            groups: dict[str, dict] = {v.group: {} for v in spec.variants}
            kept: dict = {}
            earlier: dict[str, dict[str, Run]] = {}
            for variant, arm in settings:
                if seed >= _arm_seeds(spec, arm):
                    continue
                label = arm.name if variant is None else f"{variant.name}/{arm.name}"
                bar.set_postfix_str(f"seed {seed} {label}")
                root = runs_root / f"seed{seed}" / _slug(label)
                seen = earlier.setdefault(variant.name if variant else "", {})
                run = Run(spec, arm, variant, seed, root, out, earlier=dict(seen))
                began = time.perf_counter()
                metrics = execute(run, hooks.get("evaluate"), hooks.get("prepare"))
                seen[arm.name] = run
                if getattr(bar, "disable", False) is True:  # no terminal (a log file): one line per run instead
                    print(f"{name}: seed {seed} {label} done in {time.perf_counter() - began:.0f} s "
                          f"({done + 1}/{total})", file=sys.stderr, flush=True)
                done += 1
                measured = {**({arm.name: metrics} if arm.row else {}),
                            **{k: _kept(run, v) for k, v in run.derived.items()}}
                if variant is None:
                    row.update(measured)
                else:
                    groups[variant.group].setdefault(variant.name, {}).update(measured)
                if run.extra:
                    kept.setdefault(variant.name if variant else "", {})[arm.name] = run.extra
                bar.update()
            per_seed.append(row)
            for group, values in groups.items():
                per_seed_groups[group].append(values)
            records.append(kept)
    finally:
        bar.close()
        scratch.cleanup()
    arms = kit.summarise(per_seed)
    extra: dict[str, Any] = {}
    for group, rows in per_seed_groups.items():
        names = list(dict.fromkeys(n for r in rows for n in r))
        extra[group] = {n: kit.summarise([r[n] for r in rows if n in r]) for n in names}
        extra[f"per_seed_{group}"] = rows
    if spec.baseline is not None and any(spec.baseline in row for row in per_seed):  # else a report hook's row
        extra["paired"] = paired(per_seed, spec.baseline, spec.metrics or list(next(iter(arms.values()))))
    config = {"experiment": str(spec.path.relative_to(kit.REPO_ROOT)) if spec.path.is_relative_to(kit.REPO_ROOT)
              else str(spec.path), "smoke": smoke, **({"set": dict(overrides)} if overrides else {}),
              **({"set_for": [[p, dict(o)] for p, o in spec.arm_set_overrides]} if spec.arm_set_overrides else {}),
              **({"only_arms": list(only_arms)} if only_arms else {}),
              "arms": {arm.name: _shown(arm_flags(spec, arm), arm) for arm in spec.arms}}
    if spec.variants:
        config["variants"] = {v.name: {arm.name: _shown(arm_flags(spec, arm, v), arm) for arm in spec.arms}
                              for v in spec.variants}
    if spec.settings:
        config["settings"] = copy.deepcopy(spec.settings)
    result = {"arms": arms, "per_seed": per_seed, **extra}
    if "report" in hooks:
        report = hooks["report"]
        added = dict((report(result, records, spec) if len(inspect.signature(report).parameters) >= 3
                      else report(result, records)) or {})
        if "arms" in added or "per_seed" in added:  # the hook's own table / rows replace the runner's
            arms, per_seed = added.pop("arms", arms), added.pop("per_seed", per_seed)
            if spec.baseline is not None and any(spec.baseline in row for row in per_seed):
                extra["paired"] = paired(per_seed, spec.baseline, spec.metrics or list(next(iter(arms.values()))))
        if isinstance(added.get("paired"), dict) and "paired" in extra:  # more pairs (other baselines): added
            added["paired"] = {**extra["paired"], **added["paired"]}
        extra.update(added)
    if spec.baseline is not None and "paired" not in extra:
        raise ExperimentError(f"{spec.path}: baseline {spec.baseline!r} is in no per-seed row; name an arm or a row "
                              "the report hook adds")
    wall = time.perf_counter() - start
    result = kit.write_result(spec.title, name=stem, seeds=spec.seeds, wall_s=wall, config=config, arms=arms,
                              per_seed=per_seed, out=out, **extra)
    if "plot" in hooks:
        hooks["plot"](result, out / f"{stem}.png")
    print(kit.markdown_table(arms, spec.metrics or None))
    for group in per_seed_groups:
        for variant_name, table in result[group].items():
            print(f"\n{group}: {variant_name}\n{kit.markdown_table(table)}")
    if result.get("paired"):
        from icml26.paired import paired_table

        print("\n" + paired_table(result["paired"]))
    print(f"\nwall {wall:.0f} s ({spec.seeds} seeds); wrote {out / f'{stem}.json'}")
    return result


def _arm_seeds(spec: Spec, arm: Arm) -> int:
    """How many seeds ``arm`` runs on: its own ``seeds``, capped by the experiment's."""
    return spec.seeds if arm.seeds is None else min(arm.seeds, spec.seeds)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def _shown(flags: list[str], arm: Arm) -> list[str]:
    """The arm's CLI arguments as a user would type them (config paths relative to the repository root), with
    notes on what is not a flag: no fit, a model seed offset, fewer seeds, no row."""
    root = str(kit.REPO_ROOT) + os.sep
    notes = [note for note, given in (("(test only, no fit)", not arm.fit),
                                      (f"(model seed S + {arm.seed_offset}, data seed S)",
                                       arm.seed_offset and arm.seed_stride == 1),
                                      (f"(model seed {arm.seed_stride} S + {arm.seed_offset}, data seed S)",
                                       arm.seed_stride != 1),
                                      (f"(seeds 0-{(arm.seeds or 1) - 1} only)", arm.seeds is not None),
                                      ("(no row: read by the hooks)", not arm.row)) if given]
    return [f.removeprefix(root) for f in flags] + notes


# ------------------------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="icml26 experiment",
                                description="Run a paper's experiment from configs/<NAME>/experiment.yaml "
                                            "(or, where a paper has none yet, its experiments/<NAME>.py).")
    p.add_argument("name", help="the paper (a folder of configs/; icml26 papers lists them), or PAPER/STEM for a "
                                "paper's further experiment configs/PAPER/STEM.yaml")
    p.add_argument("--smoke", action="store_true", help="the experiment's smoke overlay: tiny sizes, seconds")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds 0..N-1 (default: the experiment's)")
    p.add_argument("--out", default=str(kit.RESULTS),
                   help="folder for <NAME>.json and <NAME>.png (PAPER_STEM.json for PAPER/STEM)")
    p.add_argument("--keep-runs", action="store_true",
                   help="keep the trainer outputs (checkpoints, logs) in <out>/<NAME>_runs instead of a temp folder")
    p.add_argument("--check", action="store_true",
                   help="check the paper's claim on the result; exit 1 unless held (main experiments only)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a dotted override for every arm, after all of experiment.yaml (repeatable), e.g. "
                        "--set trainer.max_steps=2000: an ablation; give it its own --name")
    p.add_argument("--set-for", action="append", nargs=2, default=[], metavar=("ARMS", "KEY=VALUE"),
                   help="a dotted override for the arms whose names match the shell-style pattern ARMS, after --set "
                        "(repeatable), e.g. --set-for '*p=0.3*' model.init_args.signal_denoiser=unet")
    p.add_argument("--arms", nargs="+", default=None, metavar="ARMS",
                   help="run only the arms matching these shell-style patterns (with the arms their hooks read)")
    p.add_argument("--name", dest="name_", metavar="STEM", default=None,
                   help="stem of the result files (default: NAME; PAPER_STEM for PAPER/STEM)")
    return p


def _parse_set(items: list[str]) -> dict[str, Any]:
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ExperimentError(f"--set {item!r}: write KEY=VALUE, e.g. --set trainer.max_steps=2000")
        parsed[key.removeprefix("--")] = value
    return parsed


def check(name: str, result_path: Path) -> int:
    """``icml26.claims.check_paper(name, result_path)``: 0 when the verdict is ``held``, else 1."""
    try:
        from icml26.claims import check_paper
    except ImportError as err:
        print(f"error: --check needs icml26.claims.check_paper, which cannot be imported ({err})", file=sys.stderr)
        return 2
    from lightning_modules.shared.errors import UserInputError

    try:
        outcome = check_paper(name, result_path)
    except (UserInputError, FileNotFoundError) as err:  # no card or check for the paper, an unreadable result
        print(f"error: --check: {err}", file=sys.stderr)
        return 2
    verdict = outcome if isinstance(outcome, str) else (
        outcome.get("verdict") if isinstance(outcome, dict) else getattr(outcome, "verdict", None))
    for line in (getattr(o, "figures", None) for o in getattr(outcome, "outcomes", ())):
        if line:
            print(line)
    print(f"claim of {name}: {verdict}")
    return 0 if verdict == "held" else 1


def script_argv(args: argparse.Namespace) -> list[str]:
    """The flags of a paper whose experiment is still a script (``experiments/<NAME>.py`` with its own ``main``,
    no experiment.yaml yet): --smoke, --seeds and --out mean the same there; the runner-only flags do not exist."""
    unsupported = [flag for flag, given in (("--set", args.set), ("--keep-runs", args.keep_runs),
                                            ("--name", args.name_)) if given]
    if unsupported:
        raise ExperimentError(f"{', '.join(unsupported)}: only for experiments in configs/<NAME>/experiment.yaml; "
                              f"'{args.name}' is a script: python -m experiments.{args.name} --help lists its flags")
    return [*(["--smoke"] if args.smoke else []), *(["--seeds", str(args.seeds)] if args.seeds is not None else []),
            "--out", str(args.out)]


def experiment_command(argv: list[str]) -> int:
    """``icml26 experiment ...`` / ``python -m experiments ...``; returns the exit code. A paper without an
    experiment.yaml runs its script's ``main`` with the same --smoke / --seeds / --out."""
    args = parser().parse_args(argv)
    script_path = kit.REPO_ROOT / "experiments" / f"{args.name}.py"
    if not is_secondary(args.name) and not experiment_path(args.name).is_file() and script_path.is_file():
        try:
            script = importlib.import_module(f"experiments.{args.name}")
            if not hasattr(script, "main"):
                further = [n for n in available(secondary=True) if result_stem(n) == args.name]
                hint = f" (it holds the hooks of {further[0]}: python -m experiments {further[0]})" if further else ""
                raise ExperimentError(f"experiments/{args.name}.py has no main(): not an experiment{hint}")
            script.main(script_argv(args))
        except ExperimentError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return check(args.name, Path(args.out) / f"{args.name}.json") if args.check else 0
    try:
        run_experiment(args.name, smoke=args.smoke, seeds=args.seeds, out=args.out, keep_runs=args.keep_runs,
                       overrides=_parse_set(args.set), result_name=args.name_,
                       arm_overrides=[(arms, _parse_set([item])) for arms, item in args.set_for],
                       only_arms=args.arms)
    except ExperimentError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        if is_secondary(args.name):
            paper = args.name.partition("/")[0]
            print(f"--check: {args.name} is a further experiment of {paper}; the claim check reads the main "
                  f"experiment's result (python -m experiments {paper} --check), so nothing was checked",
                  file=sys.stderr)
            return 0
        return check(args.name, Path(args.out) / f"{args.name_ or result_stem(args.name)}.json")
    return 0
