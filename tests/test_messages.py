"""What a user sees when something goes wrong: bad input ends in ONE ``error:`` line (exit status 2) naming the
problem and the fix, the log keeps only warnings the user can act on, and a run that fails before its first step
leaves no half-made version folder behind."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.loggers import CSVLogger

import train
from conftest import REPO
from icml26.run_folders import RemoveFailedRunFolder, with_failed_run_cleanup
from lightning_modules.shared.base import read_checkpoint
from lightning_modules.shared.errors import UserInputError

OFFLINE_RL = str(REPO / "configs/phyb/ensemble_quick.yaml")
CAUSCIBENCH = str(REPO / "configs/causcibench/quick.yaml")
TAMED_SGD = str(REPO / "configs/tamed_sgd/quick.yaml")
README = str(REPO / "README.md")


def run_train(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``python train.py ARGS`` in-process: (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as info:
        train.console_main()
    return info.value.code, capsys.readouterr().err


def one_error_line(code: int, stderr: str) -> str:
    """The one ``error:`` line of a failed run (exit status 2, no traceback)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


# ------------------------------------------------------------------------------ data files: no traceback left
def _npz_of_another_kind(kind: str, path) -> None:
    if kind == "text":
        path.write_text("observations,actions\n1,2\n")
    elif kind == "pickle":  # a pickled dict (how some D4RL mirrors ship their data) under an .npz name
        with open(path, "wb") as handle:
            pickle.dump({"observations": [[0.0]]}, handle)
    elif kind == "object_arrays":  # a real npz archive whose arrays need pickle
        with open(path, "wb") as handle:
            np.savez(handle, observations=np.array([{"a": 1}], dtype=object))
    elif kind == "npy":  # one array saved under an .npz name
        np.save(path.with_suffix(".tmp.npy"), np.zeros((3, 2), dtype=np.float32))
        os.replace(path.with_suffix(".tmp.npy"), path)


@pytest.mark.parametrize("kind, expected", [
    ("text", "is not a readable .npz archive"), ("pickle", "is not a readable .npz archive"),
    ("object_arrays", "is not a readable .npz archive"), ("npy", "is a single .npy array, not an .npz archive"),
])
def test_a_file_that_is_not_an_npz_archive_is_one_error_line(monkeypatch, capsys, tmp_path, kind, expected):
    path = tmp_path / "dataset.npz"
    _npz_of_another_kind(kind, path)
    code, stderr = run_train(monkeypatch, capsys, "fit", "--config", OFFLINE_RL, "--data.init_args.source=d4rl",
                             f"--data.init_args.data_path={path}", "--trainer.logger=false")
    line = one_error_line(code, stderr)
    assert f"data_path '{path}'" in line and expected in line, line


def test_a_text_file_given_as_hdf5_is_one_error_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("h5py")
    path = tmp_path / "dataset.hdf5"
    path.write_text("not hdf5\n")
    code, stderr = run_train(monkeypatch, capsys, "fit", "--config", OFFLINE_RL, "--data.init_args.source=d4rl",
                             f"--data.init_args.data_path={path}", "--trainer.logger=false")
    assert "is not a readable HDF5 file" in one_error_line(code, stderr)


def test_a_pickled_npz_through_python_train_py_ends_in_one_line(tmp_path):
    path = tmp_path / "dataset.npz"
    _npz_of_another_kind("pickle", path)
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "fit", "--config", OFFLINE_RL,
                             "--data.init_args.source=d4rl", f"--data.init_args.data_path={path}"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    line = one_error_line(result.returncode, result.stderr)
    assert "is not a readable .npz archive (ValueError: This file contains pickled (object) data" in line


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_malformed_query_csv_is_one_error_line_naming_the_line(monkeypatch, capsys, tmp_path, encoding):
    (tmp_path / "bench").mkdir()
    queries = tmp_path / "bench" / "queries.csv"
    # a latin-1 file is read again as latin-1 after the UTF-8 attempt fails: both reads must report the bad row
    queries.write_bytes("id,query,method\n1,café prices,ols\n2,b,c,d,e,f\n".encode(encoding))
    code, stderr = run_train(monkeypatch, capsys, "test", "--config", CAUSCIBENCH,
                             "--data.init_args.test_source=benchmark", f"--data.init_args.data_dir={tmp_path}/bench",
                             "--data.init_args.queries_file=queries.csv", "--trainer.logger=false")
    line = one_error_line(code, stderr)
    assert f"could not read the query file {queries} as CSV (ParserError" in line and "line 3" in line, line


# ------------------------------------------------------------------------------ parse errors: readable lines
def test_a_misspelt_class_path_in_a_config_file_names_the_key_the_path_and_the_closest_class(
        monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  class_path: lightning_modules.nope.CausalInferenceAgent\n")
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", CAUSCIBENCH, "--config", str(bad)))
    assert line.startswith("error: --model: 'lightning_modules.nope.CausalInferenceAgent' is not a known class "
                           "(did you mean lightning_modules.causcibench.causal_agent.CausalInferenceAgent"), line


def test_a_misspelt_class_inside_init_args_of_a_config_file_names_its_own_key(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  init_args:\n    optimizer:\n      class_path: torch.optim.Adamm\n")
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", CAUSCIBENCH, "--config", str(bad)))
    assert "--model.init_args.optimizer: 'torch.optim.Adamm' is not a known class (did you mean torch.optim.Adam" \
        in line, line


def test_a_misspelt_logger_class_suggests_loggers(monkeypatch, capsys):
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", CAUSCIBENCH,
                                     "--trainer.logger.class_path=lightning.pytorch.loggers.CSVLoger"))
    assert "--trainer.logger.class_path: 'lightning.pytorch.loggers.CSVLoger' is not a known class (did you mean " \
           "lightning.pytorch.loggers.CSVLogger" in line, line


@pytest.mark.parametrize("args, expected", [
    (["--trainer.max_epochs=abc"], "--trainer.max_epochs: expected an integer or null, got 'abc'."),
    (["--trainer.max_steps=abc"], "--trainer.max_steps: expected an integer, got 'abc'."),
    (["--model.init_args.hidden_dim=1.5"], "--model.init_args.hidden_dim: expected an integer, got '1.5'."),
    (["--trainer.deterministic=maybe"], "--trainer.deterministic: expected true or false, null or 'warn', got "
                                        "'maybe'."),
])
def test_a_value_of_the_wrong_type_names_the_key_the_type_and_the_value(monkeypatch, capsys, args, expected):
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", CAUSCIBENCH, *args))
    assert line.startswith(f"error: {expected}"), line


def test_a_value_of_the_wrong_type_in_a_config_file_names_the_full_key(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  init_args:\n    hidden_dim: abc\n")
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", CAUSCIBENCH, "--config", str(bad)))
    assert line.startswith("error: --model.init_args.hidden_dim: expected an integer, got 'abc'."), line


# ------------------------------------------------------------------------------ checkpoints: one line
@pytest.mark.parametrize("flag", ["--ckpt_path", "--model.init_args.init_from"])
def test_a_text_file_given_as_a_checkpoint_is_one_line(monkeypatch, capsys, flag):
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", TAMED_SGD, f"{flag}={README}",
                                     "--trainer.logger=false"))
    assert f"'{README}' is not a torch checkpoint: it is a file starting with b'" in line, line


def test_a_pickle_that_weights_only_loading_refuses_is_reported_in_one_line(tmp_path):
    path = tmp_path / "odd.ckpt"
    path.write_bytes(b"\x80\x02#.")  # a pickle header, then an opcode the weights-only unpickler does not support
    with pytest.raises(UserInputError) as info:
        read_checkpoint(str(path))
    message = str(info.value)
    assert "\n" not in message and "is not a readable torch checkpoint (Unsupported operand" in message, message
    assert "Please file an issue" not in message  # torch's advice to its own developers stays out


def test_an_empty_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "empty.ckpt"
    path.write_bytes(b"")
    with pytest.raises(UserInputError, match="is not a torch checkpoint: it is an empty file"):
        read_checkpoint(str(path))


# ------------------------------------------------------------------------------ logs: expected warnings only
class _ProbedEncoder(LightningModule):
    """Two 'layers' of random features, 40 clips, 4 attributes and a 30-way sentence id (more classes than half
    the clips: scikit-learn's note about regression targets)."""

    def layer_states(self, batch):
        generator = torch.Generator().manual_seed(int(batch["content"][0]))
        states = [torch.randn(len(batch["content"]), 3, 6, generator=generator) for _ in range(2)]
        return states, torch.ones(len(batch["content"]), 3, dtype=torch.bool)


def _probe_batches(seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    return [{"attributes": torch.randint(0, 3, (20, 4), generator=generator),
             "content": torch.randint(0, 30, (20,), generator=generator)} for _ in range(2)]


def test_layer_probing_silences_exactly_the_warnings_its_probes_expect(monkeypatch):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    import callbacks.layer_probing as layer_probing

    original_fit = LogisticRegression.fit

    def fit_with_an_unexpected_warning(self, *args, **kwargs):
        warnings.warn("an unexpected note about the features", UserWarning, stacklevel=2)
        return original_fit(self, *args, **kwargs)

    monkeypatch.setattr(layer_probing, "PROBE_MAX_ITER", 1)  # one lbfgs step: the probes cannot converge
    monkeypatch.setattr(LogisticRegression, "fit", fit_with_an_unexpected_warning)
    probing = layer_probing.LayerProbing(max_examples=40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = probing.probe(_ProbedEncoder(), _probe_batches(0), _probe_batches(1))
    assert set(results) == {"pitch", "speed", "gender", "volume", "content"}
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert not [w for w in caught if "unique classes is greater than 50%" in str(w.message)]
    assert [w for w in caught if "an unexpected note" in str(w.message)]  # what the user must see still shows

    # the same fit outside the callback does emit both expected warnings: the silencing above is real
    features = np.random.default_rng(0).normal(size=(40, 6))
    labels = np.arange(40) % 30
    with warnings.catch_warnings(record=True) as direct:
        warnings.simplefilter("always")
        original_fit(LogisticRegression(max_iter=1), features, labels)
    assert {ConvergenceWarning, UserWarning} <= {w.category for w in direct}


def _collinear_query() -> dict:
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=4)
    data = pd.DataFrame({"t": [0.0, 1.0, 0.0, 1.0], "y": rng.normal(size=4), "x": x, "x_twice": 2 * x})
    return {"name": "collinear", "design": "observational", "method": "ols", "effect": 1.0, "data": data,
            "roles": {"treatment": "t", "outcome": "y", "controls": ["x", "x_twice"]}}


def test_forced_ols_silences_statsmodels_singular_design_notes_and_other_agents_keep_them():
    from statsmodels.tools.sm_exceptions import SingularMatrixWarning

    from lightning_modules.causcibench.causal_agent import CausalInferenceAgent

    def statsmodels_warnings(agent: str) -> list:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            record = CausalInferenceAgent(agent=agent).answer(_collinear_query())
        assert record["failure"] is None and record["estimate"] is not None
        return [w for w in caught if issubclass(w.category, SingularMatrixWarning)
                or (issubclass(w.category, RuntimeWarning) and "statsmodels" in w.filename)]

    assert statsmodels_warnings("forced-ols") == []
    assert any(issubclass(w.category, SingularMatrixWarning) for w in statsmodels_warnings("oracle"))


# ------------------------------------------------------------------------------ no half-made version folder
def _version_folders(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("version_*"))


def test_a_run_failing_on_bad_input_before_its_first_step_leaves_no_version_folder(monkeypatch, capsys, tmp_path):
    """The CLI adds `RemoveFailedRunFolder` to every Trainer (`with_failed_run_cleanup` in train.py)."""
    line = one_error_line(*run_train(monkeypatch, capsys, "fit", "--config", TAMED_SGD,
                                     f"--model.init_args.init_from={README}", "--trainer.enable_progress_bar=false"))
    assert "is not a torch checkpoint" in line
    assert _version_folders(tmp_path) == []


def test_the_callback_from_a_config_removes_the_folder_of_a_failed_test_run(monkeypatch, capsys, tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "queries.csv").write_text("id,query,method\n1,a,ols\n2,b,c,d,e\n")
    line = one_error_line(*run_train(monkeypatch, capsys, "test", "--config", CAUSCIBENCH,
                                     "--data.init_args.test_source=benchmark",
                                     f"--data.init_args.data_dir={tmp_path}/bench",
                                     "--data.init_args.queries_file=queries.csv",
                                     "--trainer.callbacks+=icml26.run_folders.RemoveFailedRunFolder"))
    assert "could not read the query file" in line
    assert (tmp_path / "runs" / "causcibench" / "quick").is_dir()  # the logger did make its folders
    assert _version_folders(tmp_path) == []


def _failed_trainer(tmp_path, global_step: int = 0):
    logger = CSVLogger(str(tmp_path), name="logs")
    os.makedirs(logger.log_dir)
    return SimpleNamespace(is_global_zero=True, global_step=global_step, loggers=[logger]), logger.log_dir


def test_only_a_folder_holding_nothing_but_this_runs_start_files_is_removed(tmp_path):
    callback = RemoveFailedRunFolder()
    trainer, folder = _failed_trainer(tmp_path / "a")
    for name in ("config.yaml", "hparams.yaml"):
        open(os.path.join(folder, name), "w").close()
    callback.on_exception(trainer, None, ValueError("bad input"))
    assert not os.path.exists(folder)

    trainer, folder = _failed_trainer(tmp_path / "b")  # something else in it: kept
    open(os.path.join(folder, "config.yaml"), "w").close()
    open(os.path.join(folder, "metrics.csv"), "w").close()
    callback.on_exception(trainer, None, ValueError("bad input"))
    assert os.path.isdir(folder)

    trainer, folder = _failed_trainer(tmp_path / "c")  # a config written before this run started: kept
    open(os.path.join(folder, "config.yaml"), "w").close()
    os.utime(os.path.join(folder, "config.yaml"), (time.time() - 3600, time.time() - 3600))
    callback.on_exception(trainer, None, ValueError("bad input"))
    assert os.path.isdir(folder)

    trainer, folder = _failed_trainer(tmp_path / "d", global_step=5)  # the run had trained: kept
    callback.on_exception(trainer, None, ValueError("bad input"))
    assert os.path.isdir(folder)


def test_with_failed_run_cleanup_adds_the_callback_once():
    trainer = SimpleNamespace(callbacks=[])
    assert with_failed_run_cleanup(with_failed_run_cleanup(trainer)) is trainer
    assert [type(c) for c in trainer.callbacks] == [RemoveFailedRunFolder]
