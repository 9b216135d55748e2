"""Timings in the docs come from `experiments.timings`, not from hand-written estimates.

The measured page ``results/timings.md`` is the rendering of ``results/timings.json``, covers every documented
training command and experiment script, and no comment on a documented command states a duration of its own.
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import REPO
from experiments import timings

MEASURED = REPO / "results" / "timings.json"
# a duration written by hand: "~5 min", "20 s", "1.5 hours", "25-35 minutes"
DURATION = re.compile(r"\d+(\.\d+)?\s*(-\s*\d+\s*)?(s|sec|seconds|min|mins|minutes|h|hours)\b")


@pytest.fixture(scope="module")
def measured() -> dict:
    assert MEASURED.is_file(), "results/timings.json is missing: run `python -m experiments.timings`"
    return json.loads(MEASURED.read_text())


def test_the_page_is_the_rendering_of_the_measurement(measured):
    page = (REPO / "results" / "timings.md").read_text()
    assert page == timings.render(measured), "results/timings.md was edited by hand or is stale: run " \
                                             "`python -m experiments.timings --parts suite` (keeps the rest)"


def test_every_documented_command_is_measured(measured):
    missing = []
    for doc in timings.doc_files():
        # commands of a "Your own data" section need the page's example files: tests/test_your_own_data.py
        for words in timings.commands_outside_own_data(doc):
            if timings.is_timed_training_command(words) and \
                    " ".join(words) not in measured["measured"]:
                missing.append(f"{doc}: {' '.join(words)}")
            script = timings.experiment_script(words)
            if script and (REPO / "results" / f"{script}.json").is_file() and script not in measured["experiments"]:
                missing.append(f"{doc}: experiments.{script}")
    assert not missing, "documented but not measured (run `python -m experiments.timings`): " + "; ".join(missing)
    assert all(entry["returncode"] == 0 for entry in measured["measured"].values() if "summary" not in entry)


def test_experiment_walls_are_the_scripts_own(measured):
    for script, entry in measured["experiments"].items():
        assert entry["wall_s"] == json.loads((REPO / "results" / f"{script}.json").read_text()).get("wall_s"), script


@pytest.mark.parametrize("doc", timings.doc_files())
def test_no_hand_written_durations_on_documented_commands(doc):
    written = [comment for comment in timings.documented_comments(doc) if DURATION.search(comment)]
    assert not written, f"{doc}: durations written by hand on commands {written}; link results/timings.md instead"


def test_the_readme_states_no_duration_of_its_own():
    text = (REPO / "README.md").read_text()  # "< 1 min" is a rule for quick configs, not a measurement
    found = [m.group(0) for m in DURATION.finditer(text) if not text[:m.start()].rstrip().endswith("<")]
    assert not found, f"README.md: durations written by hand {found}; link results/timings.md instead"


def test_pages_re_measures_one_page_and_keeps_the_others(tmp_path, monkeypatch):
    pages = timings.documented_training_commands()
    first, second = [doc for doc, commands in pages.items() if commands][:2]
    kept, redone = " ".join(pages[second][0]), " ".join(pages[first][0])
    entry = {"wall_s": 1.0, "returncode": 0, "cpus": 2, "load_before": 0.0, "load_after": 0.0, "date": "old"}
    previous = {"measured": {kept: {**entry, "doc": second}, redone: {**entry, "doc": first},
                             "python train.py fit --config gone.yaml": {**entry, "doc": first}}}
    (tmp_path / "timings.json").write_text(json.dumps(previous))
    monkeypatch.setattr(timings, "measure_commands", lambda smoke, timeout, pages: {
        redone: {**entry, "wall_s": 2.0, "doc": first, "date": None}})
    result = timings.main(["--pages", first, "--out", str(tmp_path)])
    assert list(result["measured"]) == [redone, kept]  # page order; the command no page shows any more is gone
    assert result["measured"][kept]["date"] == "old" and result["measured"][redone]["wall_s"] == 2.0
    assert (tmp_path / "timings.md").read_text() == timings.render(result)
    with pytest.raises(SystemExit):
        timings.main(["--pages", "docs/nope.md", "--out", str(tmp_path)])


def test_the_duration_pattern():
    for text in ("~5 min on 2 cores", "20 s", "1.5 hours", "25-35 minutes", "~10 s;"):
        assert DURATION.search(text), text
    for text in ("3 seeds", "the SFT cache", "--seeds 2", "top-5 items", "max_steps=50"):
        assert not DURATION.search(text), text
