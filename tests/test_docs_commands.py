"""Every command in a fenced block of README.md and docs/*.md is run (or, where it cannot run here, checked), so no
documented command can go stale.

* ``python train.py <subcommand> ...`` (or ``icml26 <subcommand> ...``, the installed entry point) runs
  in-process with ``--trainer.fast_dev_run=true`` appended, from the test's temporary directory (so ``runs/...``
  lands there). A ``.ckpt`` path in the command is replaced by a checkpoint of the quick config that writes that
  path (after two training steps), and a config that fine-tunes another config's result gets its prerequisite's
  checkpoint, as in the contract harness. ``--print_config``, ``--help``, ``--version`` and ``--*.help`` must exit
  0. A command on a ``*paper.yaml`` config is parsed, not run: paper configs read the real
  dataset from a local ``data_dir`` and are sized for GPUs.
* ``python train.py fit --config <one quick config>`` with nothing else is exactly what the harness's
  ``test_fast_dev_run`` runs for every quick config, so here it only has to name a quick config.
* ``python -m experiments.<script> ...``: the script exists and its documented flags parse (the script's argument
  parser runs; nothing else does). Every script's ``--smoke`` run is in ``tests/test_experiments.py``.
* ``python -m experiments NAME ...`` (the experiment runner): the flags parse and ``configs/NAME/experiment.yaml``
  loads and validates; its ``--smoke`` run is in ``tests/test_experiments.py``.
* ``wandb sweep <file>``: the file is one of the sweep files that ``tests/test_configs.py`` validates.
* A command that uses a checkpoint names one that an earlier command of the same page writes, so a reader who runs
  the page top to bottom has it.

* Commands of a page's ``## Your own data`` section are run by ``tests/test_your_own_data.py`` (they need the
  files the section's examples write).

Anything else fails, unless listed in ``NOT_RUN`` with the reason.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex

import pytest

from experiments.timings import commands_outside_own_data, doc_files, documented_commands
from icml26 import commands as collection_commands
from conftest import (PREREQUISITES, QUICK_CONFIGS, REPO, SWEEP_FILES, ParseOnlyCLI,
                      checkpoint_writers, config_path, run_cli)

DOC_FILES = doc_files()

# documented commands that this test does not run, each with the reason
NOT_RUN = {
    "python -m pip install -e .": "installs the package (the test environment is that install)",
    "python -m pip install -e .[dev]": "installs the package with its test dependencies",
    "python -m pytest -q -n 2": "the test suite itself",
    "python -m pytest -q -m slow": "the slow test suite itself",
    "wandb agent <entity>/<project>/<sweep_id>": "a placeholder for the id `wandb sweep` prints; needs a W&B server",
    "pip install d3rlpy==2.8.1": "installs the optional offline_rl extra (tests/test_phyb_d3rlpy.py skips without it)",
    "python -m venv --system-site-packages /tmp/d3venv": "creates an environment for the optional d3rlpy extra",
}


# a page's "## Your own data" commands train on the files its own examples write (absent here): they are run by
# tests/test_your_own_data.py, which writes those files first
COMMANDS = [(doc, " ".join(words)) for doc in DOC_FILES for words in commands_outside_own_data(doc)]




def _checkpoint_values(args: list[str]) -> list[tuple[int, str, str]]:
    """``(index, option, path)`` of every option whose value is a ``.ckpt`` path (``--k=v`` or ``--k v``)."""
    found = []
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg and arg.endswith(".ckpt"):
            found.append((i, arg.split("=", 1)[0], arg.split("=", 1)[1]))
        elif arg.startswith("--") and "=" not in arg and i + 1 < len(args) and args[i + 1].endswith(".ckpt"):
            found.append((i + 1, arg, args[i + 1]))
    return found


def _configs(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]


def test_the_docs_have_commands():
    assert len(DOC_FILES) >= 2 and len(COMMANDS) >= 20, COMMANDS
    assert any(c.startswith("python train.py test ") for _, c in COMMANDS)
    assert checkpoint_writers(), "no quick config writes a last.ckpt"


def test_continuations_chains_and_comments_are_split(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("text `python train.py not-a-block`\n```bash\npython train.py fit \\\n    --config a.yaml"
                    "   # comment\nwandb sweep s.yaml && python -m experiments.x --seeds 2\n```\n")
    assert documented_commands("page.md", root=tmp_path) == [["python", "train.py", "fit", "--config", "a.yaml"],
                                              ["wandb", "sweep", "s.yaml"],
                                              ["python", "-m", "experiments.x", "--seeds", "2"]]


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c}" for d, c in COMMANDS])
def test_documented_command(doc, command, prerequisite_checkpoints, prerequisite_args, monkeypatch):
    words = shlex.split(command)
    if command in NOT_RUN:
        return
    if re.search(r"<[a-z_]+>|/path/to/", command):
        pytest.fail(f"{doc}: `{command}` has a placeholder; make it runnable or list it in NOT_RUN with the reason")
    head = words[1] if words[0] == "icml26" else (words[2] if words[:2] == ["python", "train.py"] else None)
    if head in collection_commands.COMMANDS:
        _check_collection_command(doc, command, head, words[1 if words[0] == "icml26" else 2:][1:])
    elif words[:2] == ["python", "train.py"] or words[0] == "icml26":  # icml26: the installed train.py
        _check_train_command(doc, command, words[1 if words[0] == "icml26" else 2:], prerequisite_checkpoints,
                             prerequisite_args)
    elif words[:2] == ["python", "-m"] and words[2].startswith("experiments."):
        _check_experiment_command(words[2], [w.strip("[]") for w in words[3:]], monkeypatch)  # [--optional]
    elif words[:3] == ["python", "-m", "experiments"]:
        from experiments import runner

        args = runner.parser().parse_args([w.strip("[]") for w in words[3:]])
        runner.load_spec(args.name, smoke=args.smoke)  # a missing or invalid experiment.yaml fails here
    elif words[:2] == ["wandb", "sweep"]:
        assert len(words) == 3 and words[2] in SWEEP_FILES, f"{doc}: `{command}` names no sweep file"
    else:
        pytest.fail(f"{doc}: `{command}` is neither run nor listed in NOT_RUN with a reason")


def _check_collection_command(doc, command, name, argv):
    """``icml26 papers|claims`` run (they only read files); ``icml26 sweep`` and ``icml26 experiment`` parse and
    validate their file (their runs are in tests/test_sweep.py and tests/test_experiments.py)."""
    if name in ("papers", "claims"):
        with contextlib.redirect_stdout(io.StringIO()):
            assert collection_commands.run_command(name, argv) == 0, f"{doc}: `{command}`"
    elif name == "sweep":
        from icml26 import sweep

        own, _ = sweep.split_trial_flags(argv)
        options = sweep.parser().parse_args(own)
        assert options.sweep_file in SWEEP_FILES, f"{doc}: `{command}` names no sweep file"
        sweep.read_sweep(REPO / options.sweep_file)
    else:
        from experiments import runner

        args = runner.parser().parse_args([w.strip("[]") for w in argv])
        runner.load_spec(args.name, smoke=args.smoke)


def _check_train_command(doc, command, args, prerequisite_checkpoints, prerequisite_args):
    configs = _configs(args)
    for config in configs:
        assert (REPO / config).is_file(), f"{doc}: `{command}` names a missing config {config}"
    args = [config_path(a) if a in configs else a for a in args]
    quick = [c for c in configs if c in QUICK_CONFIGS]
    if any(c.endswith("paper.yaml") for c in configs):  # real data and GPUs: parse only
        run_cli(*args, cli_class=ParseOnlyCLI)
        return
    if len(args) == 3 and args[:2] == ["fit", "--config"] and quick:  # the harness runs exactly this
        return
    for index, option, path in _checkpoint_values(args):
        writer = checkpoint_writers().get(path)
        assert writer, f"{doc}: `{command}`: no quick config writes {path} ({option})"
        args[index] = args[index].replace(path, prerequisite_checkpoints(writer))
    if quick and not any(a.startswith("--model.init_args.init_from") for a in args):
        args += prerequisite_args(quick[-1])
    if any(a in ("--print_config", "--help", "--version") or a.endswith(".help") for a in args):
        with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as exit_info:
            run_cli(*args)
        assert exit_info.value.code in (0, None), f"{doc}: `{command}`"
        assert out.getvalue().strip(), f"{doc}: `{command}` printed nothing"
        return
    cli = run_cli(*args, "--trainer.fast_dev_run=true")
    assert cli.trainer.state.finished, f"{doc}: `{command}`"


class _Parsed(Exception):
    """Raised right after a script's arguments parsed, so that nothing runs."""


def _check_experiment_command(module_name, flags, monkeypatch):
    module = importlib.import_module(module_name)  # a missing script fails here
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed):
        module.main(flags)


def test_checkpoints_are_written_earlier_on_the_same_page():
    """A reader who runs a page top to bottom has every checkpoint a command uses: its prerequisite config (or the
    config writing a ``.ckpt`` it names) was fitted by an earlier command of the page."""
    for doc in DOC_FILES:
        fitted: set[str] = set()
        for words in commands_outside_own_data(doc):  # own-data chains run in tests/test_your_own_data.py
            command = " ".join(words)
            if words[:2] != ["python", "train.py"] and words[0] != "icml26":
                continue
            args = words[1 if words[0] == "icml26" else 2:]
            if args and args[0] in collection_commands.COMMANDS:
                continue
            configs = _configs(args)
            needed = {checkpoint_writers().get(path, path) for _, _, path in _checkpoint_values(args)}
            if not any(a.startswith("--model.init_args.init_from") for a in args):
                needed |= {PREREQUISITES[c] for c in configs if c in PREREQUISITES}
            missing = needed - fitted
            assert not missing, f"{doc}: `{command}` needs {sorted(missing)}, which no earlier command fits"
            if args[0] == "fit":
                fitted.update(configs)
