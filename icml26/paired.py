"""The ``"paired"`` block of a result JSON: each arm minus a baseline arm, seed by seed, with a 95% t interval.

The collection's rule is that a claim holds only where this interval excludes zero; otherwise it is within seed
noise. Every result JSON carries the block::

    "paired": {"<arm> - <baseline>": {"<metric>": {"mean": float, "lo": float, "hi": float, "n": int}}}

``mean`` is the mean over seeds of ``arm - baseline`` on the same seed, ``lo``/``hi`` the two-sided 95% Student-t
interval with n - 1 degrees of freedom (`icml26.claims.paired_interval`; null with one seed, where there is no
interval), ``n`` the number of seeds that measured the metric on both arms.

An experiment script builds it from its per-seed records at the end of its run::

    from icml26.paired import paired_block
    kit.write_result(..., per_seed=per_seed, paired=paired_block(per_seed, "baseline"))
    # several baselines: paired={**paired_block(per_seed, "a"), **paired_block(per_seed, "b", arms=["c"])}

(the experiment runner does this for every ``configs/<paper>/experiment.yaml`` with a ``baseline:``). For a result
already written, ``python -m icml26.paired results/X.json --baseline ARM [--arm ARM ...] [--metric M ...] --write``
adds the pairs to the file's block (keeping the pairs it has) and records in ``paired_note`` that they were computed
afterwards from the file's ``per_seed`` values, with the commands that did it; without ``--write`` it only prints
the table.

A per-seed record is ``{arm: {metric: value}}``, or ``{"seed": s, "arms": {...}}`` / ``{"seed": s, "runs": {...}}``
(results that keep the seed and other per-seed facts beside the arms).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from icml26.claims import paired_interval
from lightning_modules.shared.errors import UserInputError

NOTE_KEY = "paired_note"
AFTER_THE_RUN = "computed after the run from this file's per_seed values; no run was repeated for it"

__all__ = ["add_paired", "paired_block", "paired_command", "paired_table", "seed_arms"]


def seed_arms(record: Any, baseline: str) -> dict:
    """A per-seed record's ``{arm: {metric: value}}`` mapping: the record itself, or its ``arms``/``runs``
    mapping when the baseline is not a key of the record."""
    if isinstance(record, dict) and baseline not in record:
        for key in ("arms", "runs"):
            if isinstance(record.get(key), dict):
                return record[key]
    return record if isinstance(record, dict) else {}


def _value(cells: Any, metric: str) -> float | None:
    value = cells.get(metric) if isinstance(cells, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _cell(differences: list[float]) -> dict:
    mean, lo, hi, n = paired_interval(differences)
    if n < 2:  # one seed: no interval (JSON has no NaN)
        return {"mean": mean, "lo": None, "hi": None, "n": n}
    return {"mean": mean, "lo": lo, "hi": hi, "n": n}


def paired_block(per_seed: Sequence[Any], baseline: str, metrics: Iterable[str] | None = None,
                 arms: Iterable[str] | None = None) -> dict:
    """``{"<arm> - <baseline>": {metric: {"mean", "lo", "hi", "n"}}}`` from a result's per-seed records.

    ``arms`` default to every arm of the records except the baseline (in the records' order); ``metrics`` default
    to every numeric metric the arm and the baseline share. A seed counts for a metric only where both arms have a
    finite number for it; a pair with no such seed is left out. Raises `UserInputError` when the baseline, a named
    arm or a named metric appears in no record.
    """
    if not isinstance(per_seed, (list, tuple)) or not per_seed:
        raise UserInputError("per_seed must be a non-empty list of per-seed records; pass the result's 'per_seed'.")
    rows = [seed_arms(record, baseline) for record in per_seed]
    known = list(dict.fromkeys(arm for row in rows for arm, cells in row.items() if isinstance(cells, dict)))
    if baseline not in known:
        raise UserInputError(f"baseline {baseline!r} is not an arm of the per-seed records (arms: {known}); "
                             f"name one of them.")
    if arms is None:
        arms = [arm for arm in known if arm != baseline]
    else:
        arms = list(arms)
        missing = [arm for arm in arms if arm not in known]
        if missing:
            raise UserInputError(f"arm(s) {missing} are not in the per-seed records (arms: {known}); "
                                 f"name arms the result has.")
    names = None if metrics is None else list(metrics)
    if names is not None:
        seen = {m for row in rows for cells in row.values() if isinstance(cells, dict) for m in cells}
        missing = [m for m in names if m not in seen]
        if missing:
            raise UserInputError(f"metric(s) {missing} are in no per-seed record; name metrics the result has.")
    block = {}
    for arm in arms:
        if arm == baseline:
            continue
        wanted = names
        if wanted is None:
            wanted = list(dict.fromkeys(m for row in rows for m in (row.get(arm) or {})
                                        if any(m in (r.get(baseline) or {}) for r in rows)))
        cells = {}
        for metric in wanted:
            differences = []
            for row in rows:
                a, b = _value(row.get(arm), metric), _value(row.get(baseline), metric)
                if a is not None and b is not None:
                    differences.append(a - b)
            if differences:
                cells[metric] = _cell(differences)
        if cells:
            block[f"{arm} - {baseline}"] = cells
    return block


def add_paired(result: dict, baseline: str, metrics: Iterable[str] | None = None,
               arms: Iterable[str] | None = None) -> dict:
    """Add ``paired_block(result["per_seed"], ...)`` to ``result["paired"]`` (pairs of the same name are replaced,
    others kept); returns the new pairs."""
    if not isinstance(result, dict) or "per_seed" not in result:
        raise UserInputError("the result has no 'per_seed' list; pairs are computed from per-seed values only.")
    block = paired_block(result["per_seed"], baseline, metrics, arms)
    if not block:
        raise UserInputError(f"no seed measured the same metric on an arm and on {baseline!r}; "
                             f"name metrics both arms have.")
    result.setdefault("paired", {}).update(block)
    return block


def _fmt(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def paired_table(block: dict, digits: int = 3) -> str:
    """The block as a markdown table: difference, metric, mean, 95% interval, seeds, verdict by the interval."""
    lines = ["| difference | metric | mean | 95% interval | n | interval |", "|---|---|---|---|---|---|"]
    for name, cells in block.items():
        for metric, c in cells.items():
            if c["lo"] is None:
                interval, reading = "-", "one seed, no interval"
            else:
                interval = f"[{_fmt(c['lo'], digits)}, {_fmt(c['hi'], digits)}]"
                reading = "excludes 0" if c["lo"] > 0 or c["hi"] < 0 else "within seed noise"
            lines.append(f"| {name} | {metric} | {_fmt(c['mean'], digits)} | {interval} | {c['n']} | {reading} |")
    return "\n".join(lines)


def paired_command(argv: Sequence[str]) -> int:
    """``python -m icml26.paired RESULT.json --baseline ARM [--arm ARM ...] [--metric M ...] [--write]``."""
    parser = argparse.ArgumentParser(prog="python -m icml26.paired",
                                     description="Paired differences (arm - baseline, seed by seed) of a result "
                                                 "JSON's per_seed values, with 95% t intervals.")
    parser.add_argument("result", help="a result JSON with a per_seed list")
    parser.add_argument("--baseline", required=True, help="the arm every other arm is compared with")
    parser.add_argument("--arm", action="append", default=None, help="an arm to compare (repeatable; default all)")
    parser.add_argument("--metric", action="append", default=None,
                        help="a metric (repeatable; default every metric both arms have)")
    parser.add_argument("--write", action="store_true",
                        help="add the pairs to the file's 'paired' block and note that they were computed from "
                             "its per_seed values")
    args = parser.parse_args(list(argv))
    path = Path(args.result)
    try:
        if not path.is_file():
            raise UserInputError(f"no result file {path}; pass the path of a result JSON.")
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise UserInputError(f"{path} is not valid JSON ({err}); pass a result JSON.") from err
        block = add_paired(result, args.baseline, args.metric, args.arm)
    except UserInputError as err:
        print(f"python -m icml26.paired: error: {err}", file=sys.stderr)
        return 2
    print(paired_table(block))
    if args.write:
        note = result.get(NOTE_KEY) if isinstance(result.get(NOTE_KEY), dict) else {}
        command = " ".join(["python -m icml26.paired", *(shlex.quote(a) for a in argv)])
        result[NOTE_KEY] = {"source": AFTER_THE_RUN,
                            "commands": list(dict.fromkeys([*note.get("commands", []), command]))}
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {len(block)} pair(s) into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(paired_command(sys.argv[1:]))
