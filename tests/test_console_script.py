"""The ``icml26`` console script, the configs it finds from any directory, and the version it reports."""
from __future__ import annotations

import configparser
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import train
from icml26 import collection
from icml26.collection import resolve_config_paths as resolve
from conftest import REPO, ParseOnlyCLI, run_cli


def _setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    return parser


def test_a_missing_relative_config_is_read_from_the_installed_configs(tmp_path, monkeypatch):
    site = tmp_path / "site"  # stands for site-packages after `pip install .`
    (site / "configs/paper").mkdir(parents=True)
    (site / "configs/paper/quick.yaml").write_text("seed_everything: 1\n")
    monkeypatch.setattr(collection, "INSTALL_ROOT", site)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shipped = str(site / "configs/paper/quick.yaml")
    assert resolve(["fit", "--config", "configs/paper/quick.yaml", "--trainer.max_steps=3"]) \
        == ["fit", "--config", shipped, "--trainer.max_steps=3"]
    assert resolve(["fit", "-c", "configs/paper/quick.yaml"]) == ["fit", "-c", shipped]
    assert resolve(["fit", "--config=configs/paper/quick.yaml"]) == ["fit", f"--config={shipped}"]
    # neither here nor installed: left for the parser to report; other options' values are never touched
    assert resolve(["fit", "--config", "configs/paper/nope.yaml"])[2] == "configs/paper/nope.yaml"
    assert resolve(["fit", "--model.init_args.init_from=configs/paper/quick.yaml"]) \
        == ["fit", "--model.init_args.init_from=configs/paper/quick.yaml"]
    # a file that exists where the command runs always wins (an edited local copy)
    (work / "configs/paper").mkdir(parents=True)
    (work / "configs/paper/quick.yaml").write_text("seed_everything: 2\n")
    assert resolve(["fit", "--config", "configs/paper/quick.yaml"])[2] == "configs/paper/quick.yaml"


def test_the_cli_finds_the_collection_configs_from_another_directory(tmp_path):
    assert not (tmp_path / "configs").exists()  # the test runs from an empty temporary directory
    cli = run_cli("fit", "--config", "configs/trew/classifier_quick.yaml", "--config", "configs/logger/csv.yaml",
                  cli_class=ParseOnlyCLI)
    assert cli.config["fit"]["model"]["class_path"].endswith("ImageClassifier")
    assert cli.config["fit"]["trainer"]["logger"]["init_args"]["name"] == "csv"


def test_the_console_script_is_declared_and_importable():
    scripts = _setup_cfg()["options.entry_points"]["console_scripts"].strip().splitlines()
    assert "icml26 = train:console_main" in [line.strip() for line in scripts]
    module, _, function = "train:console_main".partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_version_comes_from_setup_cfg_and_is_printed(capsys):
    assert train.__version__ == _setup_cfg()["metadata"]["version"]
    with pytest.raises(SystemExit) as info:
        run_cli("--version")
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"train.py {train.__version__}"


def test_explain_run_error_names_the_program_that_was_run():
    from lightning_modules.shared.errors import UserInputError

    err = UserInputError("init_from checkpoint 'runs/x/last.ckpt' does not exist")
    argv = ["fit", "--config", str(REPO / "configs/ldarnet/quick.yaml")]
    assert "run 'icml26 fit --config configs/ldarnet/pretrain_quick.yaml' first" in \
        train.explain_run_error(err, argv, program="icml26")


def _copy_source(destination) -> None:
    """The files a `pip install .` builds from (no tests, results, runs or build leftovers)."""
    skip = shutil.ignore_patterns(".git", "tests", "results", "runs", "docs", "build", "*.egg-info", "__pycache__",
                                  "wandb", "lightning_logs", "data", ".venv")
    shutil.copytree(REPO, destination, ignore=skip)


def test_a_regular_install_runs_a_shipped_config_from_any_directory(tmp_path):
    """`pip install .` (not editable) and `icml26 fit --config configs/...` run from a directory without configs."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed, so pip cannot build the package without the network")
    source, target, elsewhere = tmp_path / "source", tmp_path / "site", tmp_path / "elsewhere"
    _copy_source(source)
    elsewhere.mkdir()
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--no-compile", "--target", str(target), str(source)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    shipped = sorted(p.relative_to(target) for p in target.glob("configs/*/*.yaml"))
    assert shipped == sorted(p.relative_to(REPO) for p in REPO.glob("configs/*/*.yaml"))
    assert Path("configs/trew/card.yaml") in shipped  # paper cards (and experiment.yaml protocols) ship as well
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    origin = subprocess.run([sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('train')"
                             ".origin)"], env=env, cwd=elsewhere, capture_output=True, text=True, timeout=60)
    assert origin.stdout.strip() == str(target / "train.py")  # the installed copy, not this checkout
    run = subprocess.run([str(target / "bin" / "icml26"), "fit", "--config", "configs/trew/classifier_quick.yaml",
                          "--trainer.fast_dev_run=true", "--trainer.enable_progress_bar=false",
                          "--trainer.enable_model_summary=false"],
                         env=env, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    # the registry reads the installed cards (an install has no docs/, results/ or tests/ to check paths against)
    card = subprocess.run([sys.executable, "-m", "icml26.registry", "trew"], env=env, cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert card.returncode == 0 and card.stdout.startswith("trew: "), card.stderr[-3000:]
