"""The ``icml26`` subcommands that are not LightningCLI stages (``fit``/``validate``/``test``/``predict``).

Each entry maps a subcommand name to ``"module:function"``; the function takes the arguments after the subcommand
(a list of strings) and returns the process exit code. They are imported only when called, so ``icml26 fit`` pays
for none of them.
"""
from __future__ import annotations

import importlib

COMMANDS = {
    "papers": ("icml26.registry:papers_command", "list the papers, or show one: icml26 papers [NAME]"),
    "claims": ("icml26.claims:claims_command", "check every paper's claim against results/: icml26 claims"),
    "experiment": ("experiments.runner:experiment_command",
                   "run a paper's experiment: icml26 experiment NAME [--smoke] [--seeds N] [--out DIR] [--check]"),
    "sweep": ("icml26.sweep:sweep_command",
              "run a W&B sweep file locally, offline: icml26 sweep configs/sweeps/NAME.yaml --count N [-- flags]"),
}


def run_command(name: str, argv: list[str]) -> int:
    """Run subcommand `name` with `argv`; returns its exit code."""
    target, _ = COMMANDS[name]
    module_name, function_name = target.split(":")
    return int(getattr(importlib.import_module(module_name), function_name)(argv) or 0)


def overview() -> str:
    """What ``icml26 --help`` adds after LightningCLI's usage: the collection's commands and every paper's quick
    config."""
    from icml26 import registry

    lines = ["", "collection commands:"]
    lines += [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "papers (icml26 papers NAME shows one; first run: icml26 fit --config <quick config>):"]
    for paper in registry.papers():
        quick = registry.quick_config(paper)
        before = registry.prerequisites(quick) if quick else []
        lines.append(f"  {paper['name']:<18} {quick or '-'}" + (f"  (after {', '.join(before)})" if before else ""))
    return "\n".join(lines)
