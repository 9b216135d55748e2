"""How long the documented commands take: measured on this machine, never written by hand.

    python -m experiments.timings                    # the training commands of README.md and docs/*.md
    python -m experiments.timings --parts suite      # the default test suite (the README's test line)
    python -m experiments.timings --parts slow       # the slow suite, as .ci/run runs it
    python -m experiments.timings --parts experiments  # only re-read the experiments' walls from results/

* Training commands: every ``python train.py ...`` line of a fenced block in README.md and docs/*.md, run as a user
  runs it (a fresh process, from a scratch folder per page, in page order, so a command finds the checkpoint an
  earlier line of its page wrote). Commands on ``*paper.yaml`` configs are not run: they read real datasets from a
  local folder and are sized for GPUs.
* Experiment scripts (``python -m experiments.<name>``): the ``wall_s`` their own run wrote into
  ``results/<name>.json`` (re-running hours of experiments here would measure the same thing again).
* The test suites (``--parts suite`` / ``slow``): the README's test line ``python -m pytest -q -n 2`` and the slow
  suite's line of ``.ci/run``, from the repository root, each with its summary line.

Writes ``<out>/timings.json`` (the kit's schema: one arm per command, metric ``wall_s``) and ``<out>/timings.md``,
the table the README links. A part that is not measured keeps the entries of the earlier ``timings.json`` in
``--out``, each with its own date. Wall time depends on what else the machine runs: every entry records the CPU
count and the 1-minute load average before and after it.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments import kit

DOC_FILES = ("README.md", "docs/*.md")
TEST_LINE = "python -m pytest -q -n 2"  # the README's test line
SLOW_LINE = "python -m pytest -q -m slow -n 2 --dist loadgroup"  # .ci/run's second line
SUITES = {"suite": TEST_LINE, "slow": SLOW_LINE}
PARTS = ("commands", "suite", "slow", "experiments")  # experiments: only the walls the scripts wrote (nothing is run)


def doc_files(root: Path = kit.REPO_ROOT) -> list[str]:
    """README.md, then docs/*.md in name order (paths relative to ``root``)."""
    return ["README.md"] + sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))


def _fenced_lines(doc: str, root: Path) -> list[str]:
    """The lines of the fenced code blocks of ``doc``, line continuations joined."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", (root / doc).read_text(), flags=re.S | re.M)
    return [line for block in blocks for line in re.sub(r"\\\n\s*", " ", block).splitlines()]


def documented_commands(doc: str, root: Path = kit.REPO_ROOT) -> list[list[str]]:
    """The shell commands (as words) of the fenced code blocks of ``doc``, in order: line continuations joined,
    ``&&`` chains split, comments dropped."""
    return [shlex.split(part, comments=True) for line in _fenced_lines(doc, root) for part in line.split("&&")
            if part.split()[:1] and part.split()[0] in ("python", "wandb", "pip", "icml26", "bash", "sh")]


OWN_DATA_HEADING = "## Your own data"


def own_data_section(text: str) -> str:
    """The ``## Your own data`` section of a page's markdown (up to the next ``## `` heading; "" without one)."""
    start = text.find(f"\n{OWN_DATA_HEADING}\n")
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(OWN_DATA_HEADING) + 2)
    return text[start:] if end < 0 else text[start:end]


def own_data_commands(doc: str, root: Path = kit.REPO_ROOT) -> list[list[str]]:
    """The documented commands of ``doc``'s ``## Your own data`` section: they train on files the page's own
    examples write, so ``tests/test_your_own_data.py`` runs them (not the timings or the docs-command test)."""
    section = own_data_section((root / doc).read_text())
    if not section:
        return []
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "section.md").write_text(section)
        return documented_commands("section.md", root=Path(scratch))


def documented_comments(doc: str, root: Path = kit.REPO_ROOT) -> list[str]:
    """The ``# ...`` comments on the command lines of the fenced blocks of ``doc``."""
    return [line.split("#", 1)[1].strip() for line in _fenced_lines(doc, root)
            if "#" in line and not line.lstrip().startswith("#")]


def commands_outside_own_data(doc: str, root: Path = kit.REPO_ROOT) -> list[list[str]]:
    """`documented_commands` of ``doc`` without those of its ``## Your own data`` section (by position: a command
    that also appears earlier on the page, such as a plain quick fit, stays)."""
    text = (root / doc).read_text()
    section = own_data_section(text)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "page.md").write_text(text.replace(section, "\n") if section else text)
        return documented_commands("page.md", root=Path(scratch))


def is_timed_training_command(words: list[str]) -> bool:
    """A ``python train.py`` line that runs here: not on a ``*paper.yaml`` config (real data, GPUs)."""
    return words[:2] == ["python", "train.py"] and not any(w.endswith("paper.yaml") for w in words)


def experiment_script(words: list[str]) -> str | None:
    """``knapsack_rl`` for ``python -m experiments.knapsack_rl ...`` (or ``python -m experiments knapsack_rl ...``,
    the experiment runner; ``rna_fm_coverage``, the stem of its result, for a further experiment
    ``python -m experiments rna_fm/coverage ...``); None for any other command."""
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2].startswith("experiments."):
        return words[2].split(".", 1)[1]
    if words[:3] == ["python", "-m", "experiments"] and len(words) > 3 and not words[3].startswith("-"):
        return words[3].replace("/", "_")  # experiments.runner.result_stem
    return None


def machine_state() -> dict:
    return {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}


def run_timed(words: list[str], cwd: Path, timeout: float) -> dict:
    """Run ``words`` (``python`` = this interpreter) in ``cwd``; wall seconds, exit status, load before/after."""
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    command = [sys.executable if words[0] == "python" else words[0], *words[1:]]
    before = machine_state()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "returncode": done.returncode, "cpus": before["cpus"], "load_before": before["load_1min"],
            "load_after": machine_state()["load_1min"], "tail": (done.stdout + done.stderr)[-2000:]}


def documented_training_commands(pages: list[str] | None = None) -> dict[str, list[list[str]]]:
    """``{page: its timed training commands}`` (all pages, or ``pages``, in page order)."""
    return {doc: [words for words in commands_outside_own_data(doc) if is_timed_training_command(words)]
            for doc in doc_files() if pages is None or doc in pages}


def measure_commands(smoke: bool, timeout: float, pages: list[str] | None = None) -> dict[str, dict]:
    """Every documented training command of ``pages`` (default: all), page by page, each page from its own scratch
    folder holding links to the repository's configs and ``train.py`` (so ``runs/`` lands in the scratch folder)."""
    measured = {}
    for doc, commands in documented_training_commands(pages).items():
        if smoke:  # the pipeline in seconds: two commands, parsed and printed, not trained
            commands = [words + ["--print_config"] for words in commands[:2]]
        if not commands:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            for name in ("train.py", "configs"):
                os.symlink(kit.REPO_ROOT / name, Path(scratch) / name)
            for words in kit.progress(commands, f"{doc} commands"):
                key = " ".join(words)
                entry = run_timed(words, Path(scratch), timeout)
                if entry["returncode"] != 0:
                    raise RuntimeError(f"{doc}: `{key}` failed (exit {entry['returncode']}):\n{entry['tail']}")
                measured[key] = {"doc": doc, **{k: v for k, v in entry.items() if k != "tail"}}
        if smoke:
            return measured
    return measured


def measure_suite(line: str, timeout: float) -> dict[str, dict]:
    """A test suite's command line, from the repository root; its last summary line (``N passed, ...``) is kept."""
    entry = run_timed(shlex.split(line), kit.REPO_ROOT, timeout)
    summaries = [text for text in entry.pop("tail").splitlines() if re.search(r"\d+ (passed|failed)", text)]
    return {line: {"doc": "README.md", **entry, "summary": summaries[-1].strip("= ") if summaries else ""}}


def experiment_timings(results: Path) -> dict[str, dict]:
    """``{script: {wall_s, seeds, machine}}`` of every documented experiment script that has a result file."""
    found = {}
    for doc in doc_files():
        for words in documented_commands(doc):
            script = experiment_script(words)
            path = results / f"{script}.json"
            if script and path.is_file():
                result = json.loads(path.read_text())
                found[script] = {"doc": doc, "wall_s": result.get("wall_s"), "seeds": result.get("seeds"),
                                 "machine": result.get("machine")}  # .get: files written before the kit
    return found


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render(result: dict) -> str:
    """The markdown page of ``timings.json`` (the test suite checks that the page equals this rendering)."""
    commands = {k: v for k, v in result["measured"].items() if k not in SUITES.values()}
    lines = ["# Timings", "", "Generated by `python -m experiments.timings` from `results/timings.json`; do not edit.",
             "Wall-clock times on a CPU machine. The load average (runnable processes, 1-minute mean) shows how busy "
             "the machine was: with a load above the core count every job slows down.", "",
             "## Documented training commands", "",
             "| command | page | wall | cores | load before / after | measured |", "|---|---|---|---|---|---|"]
    for command, entry in commands.items():
        lines.append(f"| `{command}` | {entry['doc']} | {_duration(entry['wall_s'])} | {entry['cpus']} | "
                     f"{entry['load_before']:.2f} / {entry['load_after']:.2f} | {entry['date']} |")
    suites = [line for line in SUITES.values() if line in result["measured"]]
    if suites:
        lines += ["", "## The test suites", "", "The default suite (the README's test line), then the slow suite as "
                  "`.ci/run` runs it.", "",
                  "| command | wall | cores | load before / after | result | measured |", "|---|---|---|---|---|---|"]
    for line in suites:
        entry = result["measured"][line]
        lines.append(f"| `{line}` | {_duration(entry['wall_s'])} | {entry['cpus']} | {entry['load_before']:.2f} / "
                     f"{entry['load_after']:.2f} | {entry['summary']} | {entry['date']} |")
    lines += ["", "## Experiment scripts", "", "Their own measurement: `wall_s` in `results/<script>.json`.", "",
              "| script | page | seeds | wall | cores | load at the end |", "|---|---|---|---|---|---|"]
    for script, entry in result["experiments"].items():
        machine = entry["machine"] or {}
        wall = "not recorded" if entry["wall_s"] is None else _duration(entry["wall_s"])
        lines.append(f"| `python -m experiments.{script}` | {entry['doc']} | {entry['seeds'] or 'not recorded'} | "
                     f"{wall} | {machine.get('cpus', 'not recorded')} | "
                     f"{machine.get('load_1min_at_end', 'not recorded')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=1)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=["commands"],
                        help="what to measure now; the other parts keep their entries from <out>/timings.json")
    parser.add_argument("--pages", nargs="+", default=None,
                        help="with commands: re-measure only these pages (e.g. docs/ec_cem.md); the others keep "
                             "their entries from <out>/timings.json")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to one command")
    args = parser.parse_args(argv)
    if args.seeds != 1:
        parser.error("--seeds: each command is timed once (run the script again to compare)")
    unknown = sorted(set(args.pages or []) - set(doc_files()))
    if unknown:
        parser.error(f"--pages {unknown}: not documentation pages; choose from {doc_files()}")
    out = Path(args.out)
    previous = json.loads((out / "timings.json").read_text()) if (out / "timings.json").is_file() else {}
    start = time.perf_counter()
    today = datetime.date.today().isoformat()
    documented = [" ".join(words) for commands in documented_training_commands().values() for words in commands]
    kept_pages = set(doc_files()) - set(args.pages or doc_files()) if "commands" in args.parts else set(doc_files())
    # earlier entries of pages not re-measured now, as long as the docs still show the command
    measured = {k: v for k, v in previous.get("measured", {}).items()
                if k not in SUITES.values() and k in documented and v["doc"] in kept_pages}
    if "commands" in args.parts:
        measured.update({k: {**v, "date": today} for k, v in
                         measure_commands(args.smoke, args.timeout, args.pages).items()})
    for part, line in SUITES.items():
        if part in args.parts and not args.smoke:
            measured.update({k: {**v, "date": today} for k, v in measure_suite(line, args.timeout).items()})
        elif line in previous.get("measured", {}):
            measured[line] = previous["measured"][line]
    order = list(documented) + list(SUITES.values())  # page order, the test suites last
    measured = dict(sorted(measured.items(), key=lambda item: order.index(item[0]) if item[0] in order else -1))
    arms = {command: {"wall_s": {"mean": float(entry["wall_s"]), "std": 0.0}} for command, entry in measured.items()}
    result = kit.write_result("documented command timings", seeds=1, wall_s=time.perf_counter() - start,
                              config={"parts": args.parts, "smoke": args.smoke, "docs": list(DOC_FILES)},
                              arms=arms, per_seed=[{k: v["wall_s"] for k, v in measured.items()}], out=out,
                              name="timings", measured=measured, experiments=experiment_timings(kit.RESULTS))
    (out / "timings.md").write_text(render(result))
    print(render(result))
    return result


if __name__ == "__main__":
    main()
