"""``python train.py predict`` leaves files a user can open, for every module family.

Each family's quick config is fitted for one step (``fast_dev_run``), its checkpoint is passed to ``predict
--ckpt_path`` (two predict batches) and the files of `callbacks.prediction_writer.PredictionWriter` are read back:
one row per predicted example, the expected columns, and the image / expression files where the family has them.
"""
from __future__ import annotations

import csv
import json
import os
from types import SimpleNamespace

import matplotlib.image
import pytest
import torch

from callbacks.prediction_writer import PredictionWriter, save_image_grid, write_predictions
from conftest import config_path, run_cli

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
NO_INIT = ["--model.init_args.init_from=null"]  # fine-tuning configs: the family's predict path needs no pretraining


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        if path.endswith(".jsonl"):
            return [json.loads(line) for line in f]
        return list(csv.DictReader(f))


def _numbered(prefix: str, count: int) -> list[str]:
    return [f"{prefix}_{j}" for j in range(count)]


def check_probs(rows, files, cli, prefix=""):
    num_classes = cli.model.hparams.num_classes
    assert list(rows[0])[:2 + num_classes] == ["example", f"{prefix}predicted_class",
                                               *_numbered(f"{prefix}probs", num_classes)]
    for row in rows:
        probs = [float(row[f"{prefix}probs_{j}"]) for j in range(num_classes)]
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)
        assert int(row[f"{prefix}predicted_class"]) == max(range(num_classes), key=probs.__getitem__)


def check_top_items(k_of):
    def check(rows, files, cli):
        k = k_of(cli.model)
        assert [c for c in rows[0] if c.startswith("top_items")] == _numbered("top_items", k)
        for row in rows:
            items = [int(row[c]) for c in _numbered("top_items", k)]
            assert len(set(items)) == k  # a ranking, no repeats
    return check


def check_completions(rows, files, cli):
    for row in rows:
        assert {"example", "prompt_id", "prompt", "completion", "answers", "completion_tokens"} <= set(row)
        assert isinstance(row["prompt"], str) and row["prompt"] and isinstance(row["completion"], str)
        assert len(row["completion_tokens"]) == cli.model.hparams.max_new_tokens


def check_tamed_sgd(rows, files, cli):
    assert {"x_0", "x_1", "f", "grad_norm", "dist_to_min"} <= set(rows[0])
    assert float(rows[0]["x_0"]) == pytest.approx(float(cli.model.x[0].detach()))


def check_coupled(rows, files, cli):
    check_probs(rows, files, cli)
    assert "classifier_predicted_class" in rows[0]
    assert matplotlib.image.imread(files["enhanced.png"]).ndim >= 2


def check_columns(prefix, width_of):
    def check(rows, files, cli):
        assert [c for c in rows[0] if c.startswith(prefix)] == _numbered(prefix, width_of(cli))
    return check


def check_tivdiff(rows, files, cli):
    assert all(0.0 <= float(row["watermark_bit_accuracy"]) <= 1.0 for row in rows)
    assert matplotlib.image.imread(files["virtual_face.png"]).ndim >= 2


def check_bases(rows, files, cli):
    assert all(row["predicted_bases"] and set(row["predicted_bases"]) <= set("ACGTN") for row in rows)


def check_expression(rows, files, cli):
    with open(files["expression.csv"]) as f:
        table = list(csv.reader(f))
    assert table[0] == ["gene", *[row["id"] for row in rows]]  # one column per slide, named by its id
    assert [line[0] for line in table[1:]] == cli.datamodule.gene_names
    assert all(len(line) == len(rows) + 1 for line in table)


def check_concepts(rows, files, cli):
    check_probs(rows, files, _TaskSizes(cli), prefix="task_")
    k = cli.model.hparams.num_concepts
    for name in ("concept_probabilities", "concept_uncertainty"):
        assert [c for c in rows[0] if c.startswith(name)] == _numbered(name, k)
        assert all(0.0 <= float(row[f"{name}_{j}"]) <= 1.0 for row in rows for j in range(k))


class _TaskSizes:
    """A concept model's task count under the name `check_probs` reads."""

    def __init__(self, cli):
        self.model = SimpleNamespace(hparams=SimpleNamespace(num_classes=cli.model.hparams.num_tasks))


def _each_output(outputs):
    return len(next(iter(outputs.values()))) if isinstance(outputs, dict) else len(outputs)


# family: (quick config, extra args, table file, check, examples in one predict_step output)
FAMILIES = {
    "classifier": ("configs/trew/classifier_quick.yaml", [], "predictions.csv", check_probs, _each_output),
    "tamed_sgd": ("configs/tamed_sgd/quick.yaml", [], "predictions.csv", check_tamed_sgd, lambda outputs: 1),
    "sequential_rec": ("configs/rsir/quick.yaml", [], "predictions.csv",
                       check_top_items(lambda m: m.hparams.predict_top_k), _each_output),
    "nt_ssm": ("configs/nt_ssm/quick.yaml", [], "predictions.csv", check_top_items(lambda m: max(m.ks)), _each_output),
    "sft": ("configs/grpo/sft_quick.yaml", [], "predictions.jsonl", check_completions, _each_output),
    "grpo": ("configs/grpo/quick.yaml", NO_INIT, "predictions.jsonl", check_completions, _each_output),
    "multi_answer_rl": ("configs/multi_answer_rl/quick.yaml", NO_INIT, "predictions.jsonl", check_completions,
                        _each_output),
    "coupled_diffusion": ("configs/coupled_diffusion/quick.yaml", None, "predictions.csv", check_coupled,
                          _each_output),
    "spectral_guidance": ("configs/spectral_guidance/quick.yaml", [], "predictions.csv",
                          check_columns("features", lambda cli: cli.trainer.predict_loop.predictions[0].shape[1]),
                          _each_output),
    "diffusion_denoiser": ("configs/spectral_guidance/denoiser_quick.yaml", [], "predictions.csv",
                           check_columns("samples", lambda cli: 2), _each_output),
    "tivdiff": ("configs/tivdiff/quick.yaml", NO_INIT, "predictions.csv", check_tivdiff, _each_output),
    "ldarnet_pretraining": ("configs/ldarnet/pretrain_quick.yaml", [], "predictions.jsonl", check_bases,
                            _each_output),
    "ldarnet": ("configs/ldarnet/quick.yaml", NO_INIT, "predictions.csv", check_probs, _each_output),
    "rna_fm": ("configs/rna_fm/quick.yaml", [], "predictions.jsonl", check_expression, _each_output),
    "concept_models": ("configs/ec_cem/quick.yaml", [], "predictions.csv", check_concepts, _each_output),
    "dynamics_ensemble": ("configs/phyb/ensemble_quick.yaml", [], "predictions.csv",
                          check_columns("next_obs", lambda cli: cli.model.hparams.obs_dim), _each_output),
    "offline_rl": ("configs/phyb/quick.yaml", None, "predictions.csv",
                   check_columns("action", lambda cli: cli.model.hparams.action_dim), _each_output),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_predict_writes_one_entry_per_example(family, tmp_path, prerequisite_args):
    config, extra, table, check, examples_in = FAMILIES[family]
    extra = prerequisite_args(config) if extra is None else extra  # the frozen classifier of coupled diffusion
    common = ["--config", config_path(config), *extra, *QUIET]
    fit = run_cli(*common, "--trainer.fast_dev_run=1", "--trainer.logger=false", run=False)
    fit.trainer.fit(fit.model, datamodule=fit.datamodule)
    ckpt = str(tmp_path / "fit.ckpt")
    fit.trainer.save_checkpoint(ckpt)

    cli = run_cli("predict", *common, f"--ckpt_path={ckpt}", "--trainer.limit_predict_batches=2")
    writer = next(c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter))
    assert writer.resolved_dir == os.path.join(cli.trainer.log_dir, "predictions")  # the run's own folder
    expected = sum(examples_in(outputs) for outputs in cli.trainer.predict_loop.predictions)
    files = {name: os.path.join(writer.resolved_dir, name) for name in os.listdir(writer.resolved_dir)}
    rows = _rows(files[table])
    assert len(rows) == expected > 0
    assert sorted(int(row["example"]) for row in rows) == list(range(expected))  # dataset positions, each once
    saved = torch.load(files["predictions.pt"], weights_only=True)
    assert all(len(value) == expected for value in saved.values())
    check(rows, files, cli)


def test_with_a_wandb_logger_each_run_writes_into_its_own_wandb_files_folder(tmp_path, monkeypatch):
    """W&B's ``log_dir`` is the ``save_dir`` every W&B run shares; predictions go to the run's own files folder
    (which ``wandb sync`` uploads), so two predict runs never overwrite each other."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    import wandb

    config = ["--config", config_path("configs/tamed_sgd/quick.yaml"), *QUIET]
    fit = run_cli(*config, "--trainer.fast_dev_run=1", "--trainer.logger=false", run=False)
    fit.trainer.fit(fit.model, datamodule=fit.datamodule)
    ckpt = str(tmp_path / "fit.ckpt")
    fit.trainer.save_checkpoint(ckpt)
    folders = []
    for _ in range(2):
        cli = run_cli("predict", *config, "--config", config_path("configs/logger/wandb.yaml"),
                      f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", f"--ckpt_path={ckpt}",
                      "--trainer.limit_predict_batches=1")
        writer = next(c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter))
        run_dir = cli.trainer.logger.experiment.dir
        wandb.finish()
        assert writer.resolved_dir == os.path.join(run_dir, "predictions")
        assert run_dir.startswith(str(tmp_path / "runs")) and run_dir != cli.trainer.log_dir
        assert {"predictions.csv", "predictions.pt"} <= set(os.listdir(writer.resolved_dir))
        folders.append(writer.resolved_dir)
    assert folders[0] != folders[1]


def test_ranks_write_their_own_part_and_a_rerun_replaces_the_other_table(tmp_path):
    """Under DDP each process writes files with its rank; a text table replaces an older numeric one."""
    writer = PredictionWriter(output_dir=str(tmp_path))
    writer.resolved_dir = str(tmp_path)
    module = SimpleNamespace(prediction_fields=lambda outputs, batch: {"score": outputs, "name": batch})
    trainer = SimpleNamespace(global_rank=1, world_size=2, datamodule=None)
    (tmp_path / "predictions_rank1.csv").write_text("stale\n")
    writer.write_on_batch_end(trainer, module, torch.tensor([0.5, 0.25]), [4, 6], ["a", "b"], 0, 0)
    writer.write_on_batch_end(trainer, module, torch.tensor([1.0]), [8], ["c"], 1, 0)
    writer.write_on_epoch_end(trainer, module, [], [])
    assert sorted(os.listdir(tmp_path)) == ["predictions_rank1.jsonl", "predictions_rank1.pt"]
    assert _rows(str(tmp_path / "predictions_rank1.jsonl")) == [
        {"example": 4, "score": 0.5, "name": "a"}, {"example": 6, "score": 0.25, "name": "b"},
        {"example": 8, "score": 1.0, "name": "c"}]


def test_fields_of_different_lengths_are_refused():
    writer = PredictionWriter(output_dir="unused")
    module = SimpleNamespace(prediction_fields=lambda outputs, batch: {"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match="one length"):
        writer.write_on_batch_end(SimpleNamespace(), module, None, None, None, 0, 0)


def test_wide_fields_stay_in_the_pt_file_and_images_become_a_grid(tmp_path):
    images = torch.zeros(5, 1, 4, 4)
    images[3] = 1.0  # the 4th image is white: second row, first column of a 3-column grid
    fields = {"example": torch.arange(5), "wide": torch.zeros(5, 9), "narrow": torch.ones(5, 2), "images": images}
    written = write_predictions(fields, str(tmp_path), max_columns=8)
    assert sorted(os.path.basename(p) for p in written) == ["images.png", "predictions.csv", "predictions.pt"]
    assert list(_rows(str(tmp_path / "predictions.csv"))[0]) == ["example", "narrow_0", "narrow_1"]
    grid = matplotlib.image.imread(str(tmp_path / "images.png"))[..., 0]
    assert grid.shape == (2 + 2 * 6, 2 + 3 * 6)
    assert grid[8:12, 2:6].min() == 1.0 and grid[2:6, 2:6].max() == 0.0


def test_save_image_grid_keeps_colour(tmp_path):
    images = torch.zeros(2, 3, 2, 2)
    images[1, 0] = 1.0  # red
    save_image_grid(images, str(tmp_path / "grid.png"), padding=0)
    grid = matplotlib.image.imread(str(tmp_path / "grid.png"))
    assert grid.shape[:2] == (2, 4)
    assert grid[0, 3, :3].tolist() == [1.0, 0.0, 0.0]
