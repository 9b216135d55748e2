"""``icml26 sweep``: run a W&B sweep file locally, with no W&B server.

    icml26 sweep configs/sweeps/tamed_sgd.yaml --count 6 [--out DIR] [-- --trainer.max_steps=200 ...]

Trials are drawn from the sweep file by W&B's own sweep logic (the ``sweeps`` package that ``wandb agent`` uses on the
server side: grid, random and Bayesian search), each one runs as its own ``python train.py`` process, exactly the
command the file's ``command:`` block gives a W&B agent, with W&B offline. Flags after ``--`` are appended to every
trial (e.g. to shorten trials). The same files still work with ``wandb sweep`` + ``wandb agent`` against a server.
Each trial's final ``trainer.callback_metrics`` decide the search; a table of trials and the best one are printed and
written to ``<out>/sweep.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import yaml

from icml26.collection import INSTALL_ROOT, resolve_config_paths
from lightning_modules.shared.errors import UserInputError

AGENT_TOKENS = ("${env}", "${interpreter}", "${program}")


def read_sweep(path: str | Path) -> dict:
    """The sweep file, checked against W&B's sweep schema and this collection's conventions."""
    path = Path(path)
    if not path.is_file():
        shipped = INSTALL_ROOT / path
        if not shipped.is_file():
            raise UserInputError(f"sweep file '{path}' does not exist; the collection's are in configs/sweeps/.")
        path = shipped
    try:
        sweep = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UserInputError(f"sweep file '{path}' is not valid YAML ({str(err).splitlines()[0]}).") from None
    if not isinstance(sweep, dict):
        raise UserInputError(f"sweep file '{path}' must be a mapping with program, method, metric, parameters.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sweeps
        violations = sweeps.schema_violations_from_proposed_config(sweep)
    if violations:
        raise UserInputError(f"sweep file '{path}' breaks W&B's sweep schema: {'; '.join(violations)}.")
    if not isinstance(sweep.get("metric"), dict) or "name" not in sweep["metric"]:
        raise UserInputError(f"sweep file '{path}' names no metric (metric: {{name: ..., goal: ...}}).")
    if "${args}" not in (sweep.get("command") or []):
        raise UserInputError(f"sweep file '{path}': its command block has no ${{args}} for the sampled values.")
    return sweep


def trial_arguments(sweep: dict, sampled: dict, extra: list[str]) -> list[str]:
    """The ``train.py`` arguments of one trial: the file's command without the agent's tokens and environment
    assignments, ``${args}`` replaced by ``--name=value`` as ``wandb agent`` writes them, then `extra`."""
    args = []
    for token in sweep["command"]:
        if token in AGENT_TOKENS or (isinstance(token, str) and "=" in token and not token.startswith("-")):
            continue
        if token == "${args}":
            args += [f"--{name}={entry['value']}" for name, entry in sampled.items()]
        else:
            args.append(str(token))
    return resolve_config_paths(args + list(extra))


def _score(metrics: dict, name: str) -> float:
    value = metrics.get(name)
    return float(value) if isinstance(value, (int, float)) else math.nan


def run_sweep(path: str | Path, count: int, out: Path, extra: list[str] = (), quiet: bool = False) -> dict:
    """Run up to `count` trials of the sweep file; returns ``{"metric", "goal", "trials": [...], "best": ...}``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sweeps
    sweep = read_sweep(path)
    metric, goal = sweep["metric"]["name"], sweep["metric"].get("goal", "minimize")
    out.mkdir(parents=True, exist_ok=True)
    runs, trials = [], []
    for index in range(count):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            suggestion = sweeps.next_run(sweep, runs)
        if suggestion is None:  # a grid is exhausted
            break
        sampled = {name: entry["value"] for name, entry in suggestion.config.items()}
        args = trial_arguments(sweep, suggestion.config, extra)
        metrics_file = out / f"trial_{index}.json"
        env = {**os.environ, "WANDB_MODE": "offline"}
        result = subprocess.run([sys.executable, "-m", "icml26.sweep", "--trial-metrics", str(metrics_file), *args],
                                cwd=INSTALL_ROOT, env=env, capture_output=True, text=True)
        metrics = json.loads(metrics_file.read_text()) if result.returncode == 0 and metrics_file.is_file() else {}
        score = _score(metrics, metric)
        failure = None
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            failure = lines[-1] if lines else f"exit status {result.returncode}"
        elif math.isnan(score):
            failure = f"the run logged no finite {metric!r}"
        trial = {"trial": index, "params": sampled, metric: score, "command": shlex.join(["python", "train.py", *args]),
                 "failure": failure}
        trials.append(trial)
        if not quiet:
            print(f"trial {index}: {metric} = {score:.6g}  {sampled}" + (f"  [{failure}]" if failure else ""))
        suggestion.state = sweeps.RunState.failed if failure and result.returncode != 0 else sweeps.RunState.finished
        suggestion.summary_metrics = {metric: score} if not math.isnan(score) else {}
        runs.append(suggestion)
    finite = [t for t in trials if not math.isnan(t[metric])]
    sign = 1.0 if goal == "minimize" else -1.0
    best = min(finite, key=lambda t: sign * t[metric]) if finite else None
    summary = {"sweep": str(path), "metric": metric, "goal": goal, "trials": trials, "best": best}
    (out / "sweep.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def markdown(summary: dict) -> str:
    metric = summary["metric"]
    names = sorted({name for trial in summary["trials"] for name in trial["params"]})
    lines = ["| trial | " + " | ".join(names) + f" | {metric} |", "|---" * (len(names) + 2) + "|"]
    for trial in summary["trials"]:
        cells = [str(trial["params"].get(name, "")) for name in names]
        value = "failed" if trial["failure"] and math.isnan(trial[metric]) else f"{trial[metric]:.6g}"
        lines.append(f"| {trial['trial']} | " + " | ".join(cells) + f" | {value} |")
    return "\n".join(lines)


def split_trial_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own arguments, the flags after ``--`` that go to every trial)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return list(argv), []


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="icml26 sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file")
    parser.add_argument("--count", type=int, default=10, help="the most trials to run (a grid may end sooner)")
    parser.add_argument("--out", type=Path, default=None, help="where trial metrics and sweep.json go")
    return parser


def sweep_command(argv: list[str]) -> int:
    """``icml26 sweep FILE [--count N] [--out DIR] [-- extra train.py flags]``."""
    argv, extra = split_trial_flags(argv)
    options = parser().parse_args(argv)
    if options.count < 1:
        parser().error("--count must be at least 1")
    out = options.out or Path(tempfile.mkdtemp(prefix="icml26-sweep-"))
    try:
        summary = run_sweep(options.sweep_file, options.count, out, extra)
    except UserInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(summary))
    best = summary["best"]
    if best is None:
        print(f"no trial logged a finite {summary['metric']}; see the failures above", file=sys.stderr)
        return 1
    print(f"best: trial {best['trial']}, {summary['metric']} = {best[summary['metric']]:.6g} ({summary['goal']})")
    print(f"  {best['command']}")
    print(f"written: {out / 'sweep.json'}")
    return 0


def _run_trial(argv: list[str]) -> None:
    """One trial (a child process): the CLI on `argv`, then its final callback metrics as JSON."""
    metrics_file, args = argv[1], argv[2:]
    import train
    cli = train.main(args)
    metrics = {}
    for name, value in cli.trainer.callback_metrics.items():
        try:
            metrics[name] = float(value)
        except (TypeError, ValueError):
            continue
    if cli.trainer.is_global_zero:
        Path(metrics_file).write_text(json.dumps(metrics))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--trial-metrics":
        sys.argv = [sys.argv[0], *sys.argv[1:]]
        _run_trial(sys.argv[1:])
    else:
        sys.exit(sweep_command(sys.argv[1:]))
