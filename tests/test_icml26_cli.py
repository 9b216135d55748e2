"""The support code of the ``icml26`` command (`icml26.collection`, `icml26.parse_errors`, `icml26.checkpoints`,
`icml26.run_config`) on its own, and the one place it relies on LightningCLI's internal order of steps."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from conftest import REPO, ParseOnlyCLI, run_cli
from icml26 import checkpoints, commands
from icml26.parse_errors import did_you_mean, explain_parse_error, explain_run_error
from icml26.run_config import flatten
from lightning_modules.shared.errors import UserInputError

QUICK = "configs/tamed_sgd/quick.yaml"
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def test_train_py_stays_a_thin_entry_point():
    lines = (REPO / "train.py").read_text().splitlines()
    assert len(lines) < 150, len(lines)
    assert "def _parse_ckpt_path" not in "\n".join(lines)  # no override of a private LightningCLI method


def test_flatten_names_every_leaf_by_its_dotted_key():
    assert flatten({"model": {"init_args": {"lr": 1, "betas": [0.9, 0.99]}}, "seed": 3, "empty": {}}) == \
        {"model.init_args.lr": 1, "model.init_args.betas": [0.9, 0.99], "seed": 3, "empty": {}}


def test_did_you_mean_compares_whole_keys_and_their_last_part():
    assert did_you_mean("trainer.max_epoch", ["trainer.max_epochs", "data.batch_size"]) \
        == " (did you mean trainer.max_epochs?)"
    assert did_you_mean("lrr", ["model.init_args.lr", "model.init_args.momentum"]) \
        == " (did you mean model.init_args.lr?)"
    assert did_you_mean("zzz", ["trainer.max_epochs"]) == ""


def test_an_unrecognised_parse_message_keeps_its_words_on_one_line():
    assert explain_parse_error("Something\n   went\nwrong", parser=None) == "Something went wrong"


def test_explain_run_error_passes_real_bugs_through():
    assert explain_run_error(UserInputError("bad value"), []) == "bad value"
    assert explain_run_error(ValueError("a bug"), []) is None
    assert explain_run_error(KeyError("x"), []) is None


def test_replaced_values_are_reported_and_returned(caplog):
    before = {"model.init_args.lr": 0.1, "model.init_args.depth": 2, "model.init_args.extra": 1}
    after = {"model.init_args.lr": 0.5, "model.init_args.depth": 2}
    with caplog.at_level(logging.WARNING, logger="train"):
        replaced = checkpoints.report_replaced_values("x.ckpt", before, after)
    assert replaced == ["model.init_args.lr=0.1 (checkpoint: 0.5)", "model.init_args.extra=1 (checkpoint: not set)"]
    assert "ignored" in caplog.text and "init_from" in caplog.text


def test_a_checkpoint_of_other_shapes_is_refused_before_lightning_loads_it():
    model = torch.nn.Linear(2, 3)
    checkpoints.check_checkpoint_fits_model({"state_dict_shapes": {"weight": (3, 2), "bias": (3,)}}, model)
    checkpoints.check_checkpoint_fits_model(None, model)
    with pytest.raises(UserInputError, match="1 shape mismatches"):
        checkpoints.check_checkpoint_fits_model({"state_dict_shapes": {"weight": (4, 2), "bias": (3,)}}, model)


def test_named_checkpoints_are_left_to_lightning():
    assert checkpoints.resume_path({"subcommand": "fit", "fit": {"ckpt_path": "last"}}) is None
    assert checkpoints.resume_path({"subcommand": "fit", "fit": {"ckpt_path": None}}) is None
    assert checkpoints.resume_path({"subcommand": "fit", "fit": {"ckpt_path": "a.ckpt"}}) == "a.ckpt"


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory):
    """A full training checkpoint of the tamed-SGD quick config after 3 steps (a second on CPU)."""
    root = tmp_path_factory.mktemp("tamed")
    run_cli("fit", "--config", QUICK, "--trainer.max_steps=3", f"--trainer.default_root_dir={root}", *QUIET,
            "--trainer.enable_checkpointing=true")
    found = sorted(root.rglob("*.ckpt"))
    assert found, "the fit wrote no checkpoint"
    return str(found[-1])


def test_lightning_cli_applies_ckpt_hyperparameters_between_our_check_and_our_report(full_checkpoint, monkeypatch,
                                                                                     caplog):
    """The collection checks ``--ckpt_path`` in the public ``parse_arguments`` and reports replaced values in
    ``before_instantiate_classes``; between the two, LightningCLI 2.6 applies the checkpoint's hyper-parameters in
    its private ``_parse_ckpt_path``. If a Lightning release moves or renames that step, this test fails: re-check
    `icml26.checkpoints` against the new order before lifting the ``lightning<2.7`` pin in setup.cfg."""
    order = []
    original = getattr(LightningCLI, "_parse_ckpt_path", None)
    assert original is not None, "LightningCLI no longer has _parse_ckpt_path: re-check icml26.checkpoints"

    def spy(self):
        order.append("lightning applies hyper-parameters")
        return original(self)

    class Recording(ParseOnlyCLI):
        def parse_arguments(self, parser, args):
            super().parse_arguments(parser, args)
            order.append("collection checks the file")

        def before_instantiate_classes(self):
            order.append("collection reports")
            super().before_instantiate_classes()

    monkeypatch.setattr(LightningCLI, "_parse_ckpt_path", spy)
    with caplog.at_level(logging.WARNING, logger="train"):
        cli = run_cli("fit", "--config", QUICK, f"--ckpt_path={full_checkpoint}", "--model.init_args.sigma_add=0.7",
                      *QUIET, cli_class=Recording)
    assert order == ["collection checks the file", "lightning applies hyper-parameters", "collection reports"]
    assert cli.config["fit"]["model"]["init_args"]["sigma_add"] == 0.1  # the checkpoint's value won
    assert "model.init_args.sigma_add=0.7 (checkpoint: 0.1)" in caplog.text


def test_a_weights_only_file_cannot_resume_a_fit(tmp_path):
    path = tmp_path / "weights.ckpt"
    torch.save({"state_dict": {"x": torch.zeros(2)}}, path)
    with pytest.raises(UserInputError, match="weights-only file"):
        run_cli("fit", "--config", QUICK, f"--ckpt_path={path}", *QUIET, cli_class=ParseOnlyCLI)


def test_collection_commands_are_dispatched_before_the_lightning_cli():
    assert set(commands.COMMANDS) >= {"papers", "claims", "experiment"}
    result = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "fit" in result.stdout
    overview = result.stdout.split("collection commands:")[1]
    assert all(f"  {name} " in overview for name in commands.COMMANDS)
    papers = overview.split("papers (")[1].splitlines()[1:]
    assert len(papers) == 19 and all("configs/" in line for line in papers)
    assert "configs/pclm/quick.yaml  (after configs/pclm/pretrain_quick.yaml" in overview


def test_a_collection_command_that_fails_on_input_prints_one_line():
    result = subprocess.run([sys.executable, "train.py", "sweep", "configs/sweeps/nope.yaml"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.strip().startswith("error: sweep file")
    assert len(result.stderr.strip().splitlines()) == 1
