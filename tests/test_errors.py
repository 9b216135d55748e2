"""Bad input fails fast with one message that names the problem and the fix: unknown or misspelt names, values
outside their choices or range, missing or malformed data, truncated or foreign checkpoints, mismatched models."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, config_path, run_cli
from lightning_modules.shared.base import read_checkpoint
from lightning_modules.shared.classifier import ImageClassifier
from lightning_modules.shared.errors import UserInputError

QUICK = config_path("configs/trew/classifier_quick.yaml")
UNLEARN = config_path("configs/trew/quick.yaml")
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def _parse_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(*args, run=False)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_unknown_class_name_is_named(capsys):
    err = _parse_error(capsys, "--config", QUICK, "--model=NoSuchPaperModule")
    assert "NoSuchPaperModule" in err


def test_value_outside_a_literal_choice_lists_the_choices(capsys):
    err = _parse_error(capsys, "--config", UNLEARN, "--model.init_args.method=forget_everything")
    assert "forget_everything" in err and "trew" in err


def test_out_of_range_value_is_rejected_with_the_allowed_range():
    with pytest.raises(UserInputError, match=r"hidden_dim=0 is out of range: it must lie in \[2, inf\]"):
        run_cli("--config", QUICK, "--model.init_args.hidden_dim=0", *QUIET, run=False)


def test_unknown_backbone_is_rejected():
    with pytest.raises(UserInputError, match="backbone 'resnet_that_does_not_exist'"):
        ImageClassifier(backbone="resnet_that_does_not_exist")


def test_missing_data_dir_names_the_expected_files(tmp_path):
    with pytest.raises(UserInputError, match="data_batch_1"):
        run_cli("--config", QUICK, "--data.init_args.dataset=cifar10", f"--data.init_args.data_dir={tmp_path}/nope",
                *QUIET, run=False)


def test_malformed_data_dir_is_rejected(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(b"this is not a pickle")
    with pytest.raises(UserInputError, match="data_batch_1"):
        cli = run_cli("--config", QUICK, "--data.init_args.dataset=cifar10", f"--data.init_args.data_dir={folder}",
                      "--model.init_args.in_channels=3", "--model.init_args.image_size=32", *QUIET, run=False)
        cli.datamodule.setup("fit")


def test_model_and_data_disagreeing_on_the_forget_class_is_caught(prerequisite_checkpoints):
    ckpt = prerequisite_checkpoints("configs/trew/classifier_quick.yaml")
    with pytest.raises(UserInputError, match="forget_class"):
        run_cli("fit", "--config", UNLEARN, f"--model.init_args.init_from={ckpt}", "--data.init_args.forget_class=3",
                "--trainer.fast_dev_run=1", *QUIET)


# --------------------------------------------------------------------------------------------- checkpoints
@pytest.fixture
def classifier_checkpoint(tmp_path):
    path = tmp_path / "classifier.ckpt"
    torch.save({"state_dict": ImageClassifier().state_dict()}, path)
    return str(path)


def test_truncated_checkpoint_is_named_as_truncated(classifier_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(open(classifier_checkpoint, "rb").read()[:300])
    with pytest.raises(UserInputError, match="truncated"):
        read_checkpoint(str(truncated))
    with pytest.raises(UserInputError, match="truncated"):
        run_cli("fit", "--config", QUICK, f"--model.init_args.init_from={truncated}", "--trainer.fast_dev_run=1",
                *QUIET)


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        run_cli("fit", "--config", QUICK, f"--model.init_args.init_from={tmp_path}/none.ckpt",
                "--trainer.fast_dev_run=1", *QUIET)


def test_foreign_checkpoint_shares_no_parameter(tmp_path):
    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": torch.nn.GRU(3, 5).state_dict()}, path)
    with pytest.raises(UserInputError, match="shares no parameter"):
        run_cli("fit", "--config", QUICK, f"--model.init_args.init_from={path}", "--trainer.fast_dev_run=1", *QUIET)


class Payload:
    """An arbitrary pickled object: what weights-only loading must refuse to execute."""

    def __reduce__(self):
        return (os.getcwd, ())


def test_checkpoint_with_pickled_code_is_refused_unless_trusted(tmp_path):
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": ImageClassifier().state_dict(), "extra": Payload()}, path)
    with pytest.raises(UserInputError, match="init_from_trusted"):
        read_checkpoint(str(path))
    assert "state_dict" in read_checkpoint(str(path), trusted=True)


def test_ckpt_path_truncated_or_foreign_or_weights_only_is_refused(classifier_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(b"\x00" * 64)
    with pytest.raises(UserInputError, match="--ckpt_path"):
        run_cli("fit", "--config", QUICK, f"--ckpt_path={truncated}", *QUIET)
    with pytest.raises(UserInputError, match="weights-only file"):
        run_cli("fit", "--config", QUICK, f"--ckpt_path={classifier_checkpoint}", *QUIET)
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": torch.nn.GRU(3, 5).state_dict(), "optimizer_states": [], "loops": {}}, foreign)
    with pytest.raises(UserInputError, match="does not fit ImageClassifier"):
        run_cli("fit", "--config", QUICK, f"--ckpt_path={foreign}", *QUIET)


def test_init_from_skips_mismatched_shapes_and_reports_them(tmp_path):
    source = ImageClassifier(num_classes=10)
    path = tmp_path / "ten_classes.ckpt"
    torch.save({"state_dict": source.state_dict()}, path)
    target = ImageClassifier(num_classes=5, init_from=str(path))
    report = target.load_initial_weights()
    assert any(k.startswith("net.3.weight") for k in report["shape_mismatch"])  # the 10-way head
    assert report["loaded"] == ["net.1.bias", "net.1.weight"]
    torch.testing.assert_close(target.net[1].weight, source.net[1].weight)
    assert not torch.equal(target.net[3].weight[:5], source.net[3].weight[:5])  # fresh head, not a slice


def test_train_py_prints_one_error_line_and_exits_2(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "fit", "--config", QUICK,
                             "--model.init_args.hidden_dim=0"], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: hidden_dim=0 is out of range")
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------- parse errors: one line, close names
@pytest.mark.parametrize("args, expected", [
    (["--model", "ImageClasifier"], "--model: 'ImageClasifier' is not a known class (did you mean ImageClassifier"),
    (["--trainer.max_epochz=3"], "unknown option 'trainer.max_epochz' (did you mean trainer.max_epochs"),
    (["--model.init_args.optimizer.init_args.lrr=0.1"],
     "--model.init_args.optimizer.init_args.lrr: Adam does not accept the argument 'lrr' (did you mean lr?)"),
    (["--trainer.callbacks+=EMAWeight"], "'EMAWeight' is not a known class (did you mean EMAWeights"),
    (["--data", "ImageClassificationDataModul"], "(did you mean ImageClassificationDataModule"),
])
def test_misspelt_names_give_one_line_with_the_closest_valid_ones(capsys, args, expected):
    err = _parse_error(capsys, "--config", QUICK, *args)
    assert err.count("\n") == 1 and err.startswith("error: "), err  # no usage dump
    assert expected in err


def test_misspelt_key_in_a_config_file_gives_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epoch: 3\n")
    err = _parse_error(capsys, "--config", QUICK, "--config", str(bad))
    assert err.count("\n") == 1 and "unknown option 'trainer.max_epoch' (did you mean trainer.max_epochs" in err


def test_help_still_prints_the_full_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli("fit", "--help", run=False)
    assert exit_info.value.code == 0 and "--trainer.max_epochs" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ run-time errors: one line
def test_optimizer_value_refused_by_torch_is_one_error_naming_the_key():
    model = ImageClassifier(optimizer=lambda params: torch.optim.Adam(params, lr=-0.1))
    with pytest.raises(UserInputError, match=r"Invalid learning rate: -0.1\. Fix the value under "
                                             r"model\.init_args\.optimizer\.init_args"):
        model.configure_optimizers()


def test_lightning_refusing_val_check_interval_becomes_one_line(tmp_path, monkeypatch):
    import train

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        run_cli("fit", "--config", QUICK, "--trainer.val_check_interval=500", "--trainer.max_steps=1", *QUIET)
    line = train.explain_run_error(info.value, [])
    assert line is not None and "\n" not in line and line.startswith("trainer: `val_check_interval` (500)")
    assert train.explain_run_error(ValueError("some other bug"), []) is None  # real bugs keep their traceback


def test_missing_prerequisite_checkpoint_names_the_config_that_writes_it(tmp_path, monkeypatch):
    import train

    monkeypatch.chdir(tmp_path)
    argv = ["fit", "--config", config_path("configs/ldarnet/quick.yaml"),
            f"--model.init_args.init_from={tmp_path}/missing.ckpt"]
    with pytest.raises(UserInputError) as info:
        run_cli(*argv, "--trainer.fast_dev_run=1", *QUIET)
    line = train.explain_run_error(info.value, argv)
    assert "does not exist" in line
    assert "run 'python train.py fit --config configs/ldarnet/pretrain_quick.yaml' first" in line


def test_policy_vocabulary_must_fit_the_tokenizer():
    from lightning_modules.shared.tiny_gpt import TinyGPT, check_policy_vocabulary

    check_policy_vocabulary(TinyGPT(vocab_size=15), 15)
    with pytest.raises(UserInputError, match="cannot decode; set --model.init_args.policy.init_args.vocab_size=15"):
        check_policy_vocabulary(TinyGPT(vocab_size=20), 15)
    with pytest.raises(UserInputError, match="the tokenizer has 15 ids but the policy's vocab_size is 12"):
        check_policy_vocabulary(TinyGPT(vocab_size=12), 15)


def test_policy_with_a_larger_vocabulary_than_its_data_fails_at_setup(tmp_path, monkeypatch):
    """A policy that can sample ids the tokenizer cannot decode is refused when the fit starts (it used to end in
    an IndexError while decoding the first validation samples)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError, match="vocab_size=15"):
        run_cli("fit", "--config", config_path("configs/grpo/sft_quick.yaml"),
                "--model.init_args.policy.init_args.vocab_size=20", "--trainer.fast_dev_run=1", *QUIET)
