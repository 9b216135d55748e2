"""``python -m experiments.paper_steps [--config PATH ...] [--steps N] [--folder DIR] [--json FILE] [--for-test]
[--prerequisites-done]``: run the release-format cases (`experiments.paper_steps`) and print (or write)
``{config: figures}``."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from experiments.paper_steps import cases, paper_configs, run_case


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", help="a paper config (repeatable; default: every one)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps before the resume (at least 2)")
    parser.add_argument("--folder", help="working folder (default: a temporary one, removed afterwards)")
    parser.add_argument("--json", help="write the figures here instead of printing them")
    parser.add_argument("--for-test", action="store_true", help="apply each case's test_args (the slow test's run)")
    parser.add_argument("--prerequisites-done", action="store_true",
                        help="the configs' prerequisites (a case's `after`) already ran in --folder: do not rerun them")
    args = parser.parse_args(argv)
    registry = cases()
    configs = args.config or paper_configs()
    missing = [c for c in configs if c not in registry]
    if missing:
        parser.error(f"no release-format case for {', '.join(missing)}; add one to experiments/paper_steps/.")
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: need at least 2 (the first step is warm-up, not timed).")
    if args.prerequisites_done and not args.folder:
        parser.error("--prerequisites-done reads the prerequisites' checkpoints from --folder: give --folder.")
    done: dict[str, dict] = {}
    if args.prerequisites_done:
        done.update({before: {} for config in configs for before in registry[config].after})
    with tempfile.TemporaryDirectory(prefix="paper_steps_") as scratch:
        root = Path(args.folder or scratch).resolve()
        for config in configs:
            if config not in done:
                paper = Path(config).parent.name
                run_case(config, registry[config], root / paper, args.steps, args.for_test, done)
    figures = {config: done[config] for config in configs}  # the prerequisites' empty entries are not written
    text = json.dumps(figures, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    return figures


if __name__ == "__main__":
    main()
