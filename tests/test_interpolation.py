"""Configs interpolate their run folder: ``default_root_dir`` is written once and the logger's ``save_dir`` and the
checkpoint ``dirpath`` refer to it, resolved after every ``--config`` file and flag (train.py's omegaconf+ mode)."""
from __future__ import annotations

import contextlib
import io
import os

import pytest

from conftest import ParseOnlyCLI, config_path, run_cli

QUICK = config_path("configs/trew/classifier_quick.yaml")


def _paths(trainer_config) -> tuple[str, str, str]:
    """(default_root_dir, logger save_dir, ModelCheckpoint dirpath) of a parsed ``trainer`` config."""
    checkpoints = [c for c in trainer_config["callbacks"] if c["class_path"].endswith("ModelCheckpoint")]
    return (trainer_config["default_root_dir"], trainer_config["logger"]["init_args"]["save_dir"],
            checkpoints[0]["init_args"]["dirpath"])


def test_an_interpolated_config_resolves_to_the_run_folder_it_names():
    with open(QUICK) as f:
        assert f.read().count("${trainer.default_root_dir}") == 2  # written once, referred to twice
    cli = run_cli("fit", "--config", QUICK, cli_class=ParseOnlyCLI)
    assert _paths(cli.config["fit"]["trainer"]) == ("runs/trew", "runs/trew", "runs/trew/original_digits")


def test_overriding_the_run_folder_on_the_command_line_moves_the_logs_and_checkpoints():
    # resolved per file, the logger and the checkpoints stayed in runs/trew while default_root_dir moved
    cli = run_cli("--config", QUICK, "--trainer.default_root_dir=elsewhere", run=False)
    assert cli.trainer.default_root_dir == "elsewhere"
    assert cli.trainer.logger.save_dir == "elsewhere"
    assert cli.trainer.checkpoint_callback.dirpath == os.path.realpath("elsewhere/original_digits")
    # the saved and printed config holds the resolved values, so a run can be repeated from it as it is
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        run_cli("fit", "--config", QUICK, "--trainer.default_root_dir=elsewhere", "--print_config")
    assert "${" not in out.getvalue() and "dirpath: elsewhere/original_digits" in out.getvalue()


def test_a_later_config_file_can_move_the_run_folder(tmp_path):
    moved = tmp_path / "moved.yaml"
    moved.write_text("trainer:\n  default_root_dir: runs/mine\n")
    cli = run_cli("fit", "--config", QUICK, "--config", str(moved), cli_class=ParseOnlyCLI)
    assert _paths(cli.config["fit"]["trainer"]) == ("runs/mine", "runs/mine", "runs/mine/original_digits")


def test_an_interpolation_that_does_not_resolve_is_one_error_line(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n"
                      "    init_args: {save_dir: '${trainer.default_rot_dir}'}\n")
    with pytest.raises(SystemExit) as info:
        run_cli("fit", "--config", QUICK, "--config", str(broken), cli_class=ParseOnlyCLI)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: trainer.logger.init_args.save_dir: the interpolated key 'trainer.default_rot_dir' "
                          "does not exist (did you mean trainer.default_root_dir"), err
