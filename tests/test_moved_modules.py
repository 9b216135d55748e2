"""Paths from before the per-paper folders of ``lightning_modules`` keep resolving, so configs, scripts and
checkpoints written then (a checkpoint stores ``hyper_parameters["_class_path"]``) still work, with a warning."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest
import torch

import lightning_modules
from conftest import REPO

SAME_NAME_FOLDERS = sorted(p.name for p in (REPO / "lightning_modules").iterdir()
                           if (p / f"{p.name}.py").is_file())


@pytest.mark.parametrize("old", sorted(lightning_modules.MOVED_MODULES))
def test_an_old_module_path_is_the_module_at_its_new_path(old):
    new = f"lightning_modules.{lightning_modules.MOVED_MODULES[old]}.{old}"
    sys.modules.pop(f"lightning_modules.{old}", None)
    with pytest.warns(FutureWarning, match=f"lightning_modules.{old} moved to {new}"):
        module = importlib.import_module(f"lightning_modules.{old}")
    assert module is importlib.import_module(new)


@pytest.mark.parametrize("folder", SAME_NAME_FOLDERS)
def test_a_class_path_of_a_module_that_is_now_a_folder_resolves_without_a_warning(folder):
    package = importlib.import_module(f"lightning_modules.{folder}")
    module = importlib.import_module(f"lightning_modules.{folder}.{folder}")
    name = next(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported short path, not a deprecated one
        assert getattr(package, name) is getattr(module, name)
        assert not hasattr(package, "NoSuchClass") and not hasattr(package, "__wrapped__")


@pytest.mark.slow
def test_a_checkpoint_written_before_the_move_tests_with_the_new_config(tmp_path):
    """A checkpoint whose saved class path is the old one (``lightning_modules.classifier.ImageClassifier``):
    ``test --ckpt_path`` with today's config reads it (LightningCLI parses the saved class path)."""
    root = tmp_path / "run"
    config = "configs/trew/classifier_quick.yaml"
    common = ["--config", config, f"--trainer.default_root_dir={root}", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false"]
    fit = subprocess.run([sys.executable, "train.py", "fit", *common, "--trainer.max_steps=2",
                          "--trainer.max_epochs=1", "--trainer.limit_val_batches=1"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = next(root.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert checkpoint["hyper_parameters"]["_class_path"] == "lightning_modules.shared.classifier.ImageClassifier"
    checkpoint["hyper_parameters"]["_class_path"] = "lightning_modules.classifier.ImageClassifier"
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    test = subprocess.run([sys.executable, "train.py", "test", *common, f"--ckpt_path={old}",
                           "--trainer.limit_test_batches=1"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert test.returncode == 0, test.stderr[-3000:]
