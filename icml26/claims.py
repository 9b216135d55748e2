"""Each paper's claim as a check over its result JSON, and the ``icml26 claims`` command that prints them all.

A paper's registry card (``configs/<paper>/card.yaml``) ends with a ``check:`` mapping::

    check:
      result: phyb_pendulum_10000_steps.json   # optional; default <paper>.json, relative to the results folder
      note: why this file is the primary result  # optional, free text
      paired:                                  # method arm minus baseline arm, seed by seed
        - {method: PhyB, baseline: MOPO, metric: return, direction: greater}
      compare:                                 # a documented threshold: left <op> scale * right + offset
        - {left: [arms, PhyB, return, mean], op: ">", right: 0.5}

A **paired** check takes ``per_seed`` (or the list at the path ``per_seed:``), whose entries are
``{arm: {metric: value}}`` (or ``{"seed": s, "arms": {...}}`` / ``"runs"``), forms the differences method - baseline
over the seeds that have both, and reports their mean with a two-sided 95% t interval (``scipy.stats.t``, n - 1
degrees of freedom): the collection's rule is that a claim holds only where the paired interval excludes zero.
``margin`` (default 0) is the amount the difference must clear in the claimed ``direction`` (negative for a
non-inferiority claim). Without ``metric``, ``method`` and ``baseline`` are key paths inside each per-seed entry
(to pair two metrics of one arm).

A **compare** check tests ``left <op> scale * right + offset``; ``left`` and ``right`` are numbers or key paths
(lists of keys; list indices as integers) into the JSON, ``op`` one of ``<, <=, >, >=``.

Verdicts, strongest first: ``held`` (every paired interval clears the margin in the claimed direction and every
compare passes), ``within seed noise`` (an interval contains the margin, whichever side its mean is on, or there is
only one seed and so no interval), ``no per-seed values`` (the JSON has no per-seed values for a paired check, so
nothing is guessed) and ``not held`` (an interval lies wholly on the wrong side of the margin, or a compare fails).
A card's verdict is its weakest check's. A compare check has no interval: use it for a documented threshold or for
figures measured once (say so in its label), and a paired check wherever the result has per-seed values.

Each result JSON also carries the intervals themselves as its ``"paired"`` block (`icml26.paired`).
"""
from __future__ import annotations

import argparse
import json
import math
import operator
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_modules.shared.errors import UserInputError

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "results"

HELD, NOISE, NO_SEEDS, NOT_HELD = "held", "within seed noise", "no per-seed values", "not held"
STRENGTH = {HELD: 3, NOISE: 2, NO_SEEDS: 1, NOT_HELD: 0}
OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
CHECK_KEYS = {"result", "note", "paired", "compare"}
PAIRED_KEYS = {"method", "baseline", "metric", "direction", "margin", "per_seed", "label"}
COMPARE_KEYS = {"left", "op", "right", "scale", "offset", "label"}

__all__ = ["HELD", "NOISE", "NOT_HELD", "NO_SEEDS", "CheckOutcome", "Verdict", "check_paper", "claims_command",
           "claims_table", "evaluate_check", "paired_interval"]


@dataclass
class CheckOutcome:
    """One paired or compare check: its verdict and the figures it measured (``lo``/``hi`` NaN without an interval)."""

    kind: str
    label: str
    verdict: str
    figures: str
    mean: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    n: int = 0


@dataclass
class Verdict:
    """A paper's claim checked against one result JSON: the weakest of its checks' verdicts."""

    paper: str
    claim: str
    result: Path
    outcomes: list[CheckOutcome] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return min((o.verdict for o in self.outcomes), key=STRENGTH.__getitem__, default=NOT_HELD)

    @property
    def held(self) -> bool:
        """True only for ``held``: within seed noise, missing per-seed values and not held are all False."""
        return self.verdict == HELD

    @property
    def figures(self) -> str:
        return "; ".join(o.figures for o in self.outcomes)


# ---------------------------------------------------------------------------------------------------- the math
def paired_interval(differences: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, int]:
    """``(mean, lo, hi, n)`` of paired differences: the two-sided t interval with n - 1 degrees of freedom.

    ``lo``/``hi`` are NaN for one difference (no interval); a zero spread gives ``lo == hi == mean``.
    """
    from scipy import stats

    values = [float(v) for v in differences]
    n = len(values)
    if n == 0:
        raise ValueError("paired_interval needs at least one difference")
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan, math.nan, 1
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return mean, mean - half, mean + half, n


def paired_verdict(mean: float, lo: float, hi: float, n: int, direction: str, margin: float = 0.0) -> str:
    """The verdict by the interval alone: ``held`` where it clears ``margin`` in ``direction``, ``not held`` where it
    lies wholly on the other side of ``margin``, ``within seed noise`` where it contains ``margin`` or where one seed
    gives no interval (``mean`` is kept for the signature: the side of the mean decides nothing)."""
    if n < 2:
        return NOISE
    low, high = (lo, hi) if direction == "greater" else (-hi, -lo)
    if low > margin:
        return HELD
    if high < margin:
        return NOT_HELD
    return NOISE


# ---------------------------------------------------------------------------------------------- JSON access
def _lookup(data: Any, path: Sequence[Any], where: str) -> Any:
    node = data
    for i, key in enumerate(path):
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            known = list(node)[:12] if isinstance(node, dict) else f"a list of {len(node)}" if isinstance(
                node, list) else repr(node)
            raise UserInputError(f"{where}: no key {key!r} at {list(path[:i])} (there: {known}); "
                                 f"use a key path the result JSON has.")
    return node


def _number(data: Any, spec: Any, where: str) -> float:
    value = spec if isinstance(spec, (int, float)) else _lookup(data, _path(spec, where), where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserInputError(f"{where}: {spec!r} is {value!r}, not a number; point the path at a number.")
    return float(value)


def _constant(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserInputError(f"{where}: {value!r} is not a number; write a number.")
    return float(value)


def _path(spec: Any, where: str) -> list:
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, list) and spec and all(isinstance(k, (str, int)) for k in spec):
        return spec
    raise UserInputError(f"{where}: {spec!r} is not a key path; write a list of keys such as "
                         f"[arms, ARM, METRIC, mean].")


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}" if 0 < abs(x) < 1e-3 else f"{x:.3f}"


def _where_cell(path: list) -> str:
    return ".".join(str(k) for k in path)


def _seed_arms(row: Any, arm: str) -> Any:
    """A per-seed entry's ``{arm: {metric: value}}`` mapping: the entry itself, or its ``arms``/``runs`` mapping
    (results that also record the seed next to the arms: ``{"seed": 0, "arms": {...}}``)."""
    if isinstance(row, dict) and arm not in row:
        for key in ("arms", "runs"):
            if isinstance(row.get(key), dict):
                return row[key]
    return row


# ------------------------------------------------------------------------------------------------- the checks
def _paired(data: dict, spec: dict, where: str) -> CheckOutcome:
    unknown = set(spec) - PAIRED_KEYS
    missing = {"method", "baseline", "direction"} - set(spec)
    if unknown or missing:
        raise UserInputError(f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; a paired "
                             f"check has {sorted(PAIRED_KEYS)} (method, baseline, direction required).")
    if spec["direction"] not in ("greater", "less"):
        raise UserInputError(f"{where}: direction {spec['direction']!r} must be 'greater' or 'less'.")
    margin = _constant(spec.get("margin", 0.0), f"{where}.margin")
    metric = spec.get("metric")
    if metric is None:
        method, baseline = _path(spec["method"], where), _path(spec["baseline"], where)
        label = spec.get("label") or f"{_where_cell(method)} - {_where_cell(baseline)}"
    else:
        method, baseline = [spec["method"], metric], [spec["baseline"], metric]
        label = spec.get("label") or f"{spec['method']} - {spec['baseline']}, {metric}"
        arms = data.get("arms", {})
        for arm in (spec["method"], spec["baseline"]):
            if arm not in arms:
                raise UserInputError(f"{where}: arm {arm!r} is not in the result's arms {list(arms)}; "
                                     f"use the arm names the JSON uses.")
            if metric not in arms[arm]:
                raise UserInputError(f"{where}: arm {arm!r} has no metric {metric!r} (it has {list(arms[arm])}); "
                                     f"use a metric name the JSON uses.")
    rows = data.get("per_seed") if "per_seed" not in spec else _lookup(data, _path(spec["per_seed"], where), where)
    differences = []
    for row in rows if isinstance(rows, list) else []:
        if metric is not None:
            row = _seed_arms(row, spec["method"])
        try:
            a, b = _lookup(row, method, where), _lookup(row, baseline, where)
        except UserInputError:
            continue
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            differences.append(float(a) - float(b))
    if not differences:
        return CheckOutcome("paired", label, NO_SEEDS, f"{label}: no per-seed values")
    mean, lo, hi, n = paired_interval(differences)
    verdict = paired_verdict(mean, lo, hi, n, spec["direction"], margin)
    side = ">" if spec["direction"] == "greater" else "<"
    bound = f", claimed {side} {_fmt((margin if side == '>' else -margin) + 0.0)}" if margin else ""
    interval = f"[{_fmt(lo)}, {_fmt(hi)}]" if n >= 2 else "(one seed, no interval)"
    return CheckOutcome("paired", label, verdict, f"{label}: {_fmt(mean)} {interval}, n={n}{bound} ({verdict})",
                        mean, lo, hi, n)


def _compare(data: dict, spec: dict, where: str) -> CheckOutcome:
    unknown = set(spec) - COMPARE_KEYS
    missing = {"left", "op", "right"} - set(spec)
    if unknown or missing:
        raise UserInputError(f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; a compare "
                             f"check has {sorted(COMPARE_KEYS)} (left, op, right required).")
    if spec["op"] not in OPERATORS:
        raise UserInputError(f"{where}: op {spec['op']!r} must be one of {list(OPERATORS)}.")
    scale = _constant(spec.get("scale", 1.0), f"{where}.scale")
    offset = _constant(spec.get("offset", 0.0), f"{where}.offset")
    left, right = _number(data, spec["left"], where), _number(data, spec["right"], where)
    target = scale * right + offset
    passed = OPERATORS[spec["op"]](left, target)

    def name(side: Any) -> str:
        return _fmt(side) if isinstance(side, (int, float)) else _where_cell(_path(side, where))

    rhs = (f"{_fmt(scale)} * " if scale != 1 else "") + name(spec["right"])
    if offset:
        rhs += f" {'+' if offset > 0 else '-'} {_fmt(abs(offset))}"
    label = spec.get("label") or f"{name(spec['left'])} {spec['op']} {rhs}"
    shown = _fmt(left) + f" {spec['op']} " + _fmt(target)
    return CheckOutcome("compare", label, HELD if passed else NOT_HELD,
                        f"{label}: {shown} ({'held' if passed else 'not held'})", left, target, target, 1)


def evaluate_check(check: dict, data: dict, where: str = "check") -> list[CheckOutcome]:
    """The outcomes of a card's ``check:`` mapping on a loaded result JSON, paired checks first."""
    if not isinstance(check, dict) or not (set(check) & {"paired", "compare"}):
        raise UserInputError(f"{where}: must be a mapping with a 'paired' and/or 'compare' list.")
    unknown = set(check) - CHECK_KEYS
    if unknown:
        raise UserInputError(f"{where}: unknown keys {sorted(unknown)}; the keys are {sorted(CHECK_KEYS)}.")
    outcomes = []
    for kind, evaluate in (("paired", _paired), ("compare", _compare)):
        specs = check.get(kind, [])
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise UserInputError(f"{where}.{kind}: must be a list of mappings.")
        outcomes += [evaluate(data, spec, f"{where}.{kind}[{i}]") for i, spec in enumerate(specs)]
    if not outcomes:
        raise UserInputError(f"{where}: has no checks; give at least one paired or compare entry.")
    return outcomes


# ------------------------------------------------------------------------------------------------- the cards
class MissingResult(UserInputError):
    """The result JSON a check reads does not exist (the experiment has not been run there)."""


def _load_card(name: str) -> dict:
    from icml26 import registry

    card = registry.card(name)
    where = f"configs/{name}/card.yaml"
    check = card.get("check")
    if not isinstance(check, dict):
        raise UserInputError(f"{where} has no 'check:' mapping; add one (the format is in icml26/claims.py).")
    result = check.get("result", f"{name}.json")
    if f"results/{result}" not in card["results"]:
        raise UserInputError(f"{where} check.result {result!r} is not one of the card's results {card['results']}; "
                             f"name one of them (without the results/ folder).")
    return card


def check_paper(name: str, result_path: str | Path | None = None, results_dir: str | Path | None = None) -> Verdict:
    """Check paper ``name``'s claim (its card's ``check:``) against a result JSON and return the `Verdict`.

    ``result_path`` is the JSON to read (e.g. the one ``icml26 experiment NAME --check`` just wrote); by default the
    card's ``check.result`` (or ``<name>.json``) in ``results_dir`` (default the repository's ``results/``).
    ``Verdict.held`` is True only when every check held, so a caller exits non-zero on anything else;
    ``Verdict.verdict`` is the weakest verdict and ``Verdict.outcomes`` the per-check figures.
    """
    card = _load_card(name)
    check = card["check"]
    if result_path is None:
        base = Path(results_dir) if results_dir is not None else RESULTS
        result_path = base / str(check.get("result", f"{name}.json"))
    result_path = Path(result_path)
    if not result_path.is_file():
        raise MissingResult(f"no result file {result_path}; run `icml26 experiment {name}` or pass the JSON's path.")
    try:
        data = json.loads(result_path.read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{result_path} is not valid JSON ({err}); re-run the experiment.") from err
    outcomes = evaluate_check(check, data, f"configs/{name}/card.yaml check")
    return Verdict(name, str(card.get("claim", "")), result_path, outcomes)


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0] + " ..."


def claims_table(verdicts: Sequence[Verdict]) -> str:
    """One markdown table: paper, claim (shortened), measured figures, verdict."""
    lines = ["| paper | claim | measured | verdict |", "|---|---|---|---|"]
    for v in verdicts:
        figures = "<br>".join(o.figures.replace("|", "/") for o in v.outcomes)
        lines.append(f"| {v.paper} | {_short(v.claim).replace('|', '/')} | {figures} | {v.verdict} |")
    return "\n".join(lines)


def claims_command(argv: Sequence[str]) -> int:
    """``icml26 claims [--results DIR] [--paper NAME]``: print every paper's claim check as one table; exit 0.

    A verdict that is not ``held`` is reported in the table, not in the exit code; bad input (an unknown paper, a
    missing folder, a malformed check) is one line on stderr and exit code 2.
    """
    parser = argparse.ArgumentParser(prog="icml26 claims",
                                     description="Check each paper's claim against its result JSON.")
    parser.add_argument("--results", default=str(RESULTS), help="folder of the result JSONs")
    parser.add_argument("--paper", default=None, help="check only this paper (a configs/<paper>/card.yaml)")
    args = parser.parse_args(list(argv))
    try:
        print(claims_table(_verdicts(args)))
    except UserInputError as err:
        print(f"icml26 claims: error: {err}", file=sys.stderr)
        return 2
    return 0


def _verdicts(args: argparse.Namespace) -> list[Verdict]:
    if not Path(args.results).is_dir():
        raise UserInputError(f"--results {args.results} is not a folder; pass the folder of the result JSONs.")
    from icml26 import registry

    names = [args.paper] if args.paper else registry.paper_names()
    verdicts = []
    for name in names:
        try:
            verdicts.append(check_paper(name, results_dir=args.results))
        except MissingResult as err:  # one unrun experiment is a row of the table, not the end of the command
            card = _load_card(name)
            verdicts.append(Verdict(name, str(card.get("claim", "")), Path(args.results),
                                    [CheckOutcome("result", "result", NOT_HELD, str(err).split(";")[0])]))
    return verdicts
