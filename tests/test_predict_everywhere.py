"""``python train.py predict`` writes a readable prediction file for every quick config, and a stage that a config
cannot serve ends in one ``error:`` line naming the stage to use.

* Every quick config runs ``predict`` in-process (two predict batches, no logger, its prerequisite's checkpoint as
  ``init_from`` where it fine-tunes another config's result); the table `callbacks.prediction_writer` writes is read
  back: one row per predicted example, each example once, and more than the ``example`` column. The configs whose
  ``predict`` used to write nothing get their paper's fields checked (retrieval rankings, chosen options, causal
  estimates, emotion-word summaries, the toy MLLM's answers). The families already read field by field in
  ``tests/test_prediction_writer.py`` (after a fit) run here only in the slow suite.
* Every module a quick config builds has a validation, test and predict step, so Lightning never ends a stage in
  a "no ..._step" traceback; the modules without a test stage refuse it in ``setup("test")`` with one line.
"""
from __future__ import annotations

import csv
import importlib
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml
from lightning.pytorch import LightningModule

from callbacks.prediction_writer import PredictionWriter
from conftest import QUICK_CONFIGS, REPO, config_path, run_cli
from lightning_modules.causcibench.causal_estimators import METHODS
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.logger=false"]


def check_infogeo(rows, cli):
    k = cli.model.hparams.predict_top_k
    for row in rows:
        locations = [int(row[f"top_locations_{j}"]) for j in range(k)]
        scores = [float(row[f"top_scores_{j}"]) for j in range(k)]
        assert scores == sorted(scores, reverse=True) and all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)
        rank = int(row["match_rank"])
        assert rank >= 0  # every synthetic query location has gallery images
        assert (rank < k) == (int(row["location"]) in locations)


def check_pclm(rows, cli):
    for row in rows:
        probs = row["option_probs"]
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)
        assert row["chosen"] == max(range(len(probs)), key=probs.__getitem__)
        assert row["chosen_prob"] == pytest.approx(probs[row["chosen"]])
        assert row["task"] in cli.model.task_names
        assert row["correct"] == int(row["chosen"] == row["label"])
        assert row["follows_transcript"] == int(row["chosen"] == row["adv_label"])


def check_content(rows, cli):
    assert {"content", "content_predicted_class", "content_probs_0"} <= set(rows[0])


def check_causal(rows, cli):
    methods = {"", *METHODS}
    for row in rows:
        assert row["query"] and row["design"] and row["method"] in methods and row["reference_method"] in methods
        assert (row["estimate"] is None) == bool(row["failure"])
        if row["estimate"] is not None and row["failure"] == "":
            assert math.isfinite(row["estimate"]) and math.isfinite(row["reference"])
        assert 0.0 <= row["error"] <= cli.model.hparams.error_cap
        assert sum(row["method_probs"]) == pytest.approx(1.0, abs=1e-4)


def check_emotion_lm(rows, cli):
    words = set(cli.datamodule.emotion_words)
    for row in rows:
        assert row["prompt"].endswith("the emotion is") and isinstance(row["completion"], str)
        assert [w for w in row["emotion_top_words"] if w] and set(row["emotion_top_words"]) <= words | {""}
        top = row["emotion_top_p"]
        assert top == sorted(top, reverse=True) and 0.0 <= sum(top) <= 1.0 + 1e-5
        assert row["label"] in words and 0.0 <= row["label_prob"] <= 1.0


def check_toy_mllm(rows, cli):
    for row in rows:
        assert row["question"] and row["predicted"] in row["options"] and row["answer"] in row["options"]
        assert row["correct"] == int(row["predicted"] == row["answer"])
        assert sum(row["probs"]) == pytest.approx(1.0, abs=1e-4)


# the quick configs whose `predict` wrote nothing before (their fields are checked); every other quick config is
# read field by field in tests/test_prediction_writer.py, so here it only runs in the slow suite
FIXED = {
    "configs/infogeo/quick.yaml": ("predictions.csv", check_infogeo),
    "configs/pclm/pretrain_quick.yaml": ("predictions.csv", check_content),
    "configs/pclm/sft_quick.yaml": ("predictions.jsonl", check_pclm),
    "configs/pclm/quick.yaml": ("predictions.jsonl", check_pclm),
    "configs/pclm/stage2_quick.yaml": ("predictions.jsonl", check_pclm),
    "configs/pclm/dpo_quick.yaml": ("predictions.jsonl", check_pclm),
    "configs/emotion_hierarchy/quick.yaml": ("predictions.jsonl", check_emotion_lm),
    "configs/emotion_hierarchy/lm_medium_quick.yaml": ("predictions.jsonl", check_emotion_lm),
    "configs/emotion_hierarchy/lm_large_quick.yaml": ("predictions.jsonl", check_emotion_lm),
    "configs/hide/toy_mllm_quick.yaml": ("predictions.jsonl", check_toy_mllm),
    "configs/causcibench/quick.yaml": ("predictions.jsonl", check_causal),
    "configs/causcibench/selector_quick.yaml": ("predictions.jsonl", check_causal),
}
PREDICT_CASES = [pytest.param(c, marks=() if c in FIXED else pytest.mark.slow) for c in QUICK_CONFIGS]


def _read_table(folder: str) -> tuple[str, list[dict]]:
    tables = [name for name in os.listdir(folder) if name in ("predictions.csv", "predictions.jsonl")]
    assert len(tables) == 1, f"expected one prediction table in {folder}, found {sorted(os.listdir(folder))}"
    path = os.path.join(folder, tables[0])
    with open(path) as f:
        rows = [json.loads(line) for line in f] if path.endswith(".jsonl") else list(csv.DictReader(f))
    return tables[0], rows


def test_the_fixed_configs_are_quick_configs():
    assert set(FIXED) <= set(QUICK_CONFIGS)


@pytest.mark.parametrize("config", PREDICT_CASES)
def test_predict_writes_a_readable_table(config, prerequisite_args):
    cli = run_cli("predict", "--config", config_path(config), *prerequisite_args(config), *QUIET,
                  "--trainer.limit_predict_batches=2")
    writer = next(c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter))
    table, rows = _read_table(writer.resolved_dir)
    saved = torch.load(os.path.join(writer.resolved_dir, "predictions.pt"), weights_only=True)
    assert len(rows) == len(saved["example"]) >= len(cli.trainer.predict_loop.predictions) > 0  # a row per example
    assert all(len(value) == len(rows) for value in saved.values())
    assert sorted(int(row["example"]) for row in rows) == sorted(set(int(row["example"]) for row in rows))
    assert all(len(row) > 1 for row in rows)  # more than the example index
    if config in FIXED:
        want, check = FIXED[config]
        assert table == want
        check(rows, cli)


def test_infogeo_rankings_agree_with_the_test_recall():
    """The written rankings are the evaluation's: Recall@k over all queries from ``match_rank`` equals ``test/r{k}``
    of the same weights and data."""
    cli = run_cli("predict", "--config", config_path("configs/infogeo/quick.yaml"), *QUIET)
    writer = next(c for c in cli.trainer.callbacks if isinstance(c, PredictionWriter))
    _, rows = _read_table(writer.resolved_dir)
    assert len(rows) == cli.datamodule.hparams.test_locations * cli.datamodule.hparams.eval_views
    ranks = [int(row["match_rank"]) for row in rows]
    cli.trainer.test(cli.model, datamodule=cli.datamodule)
    for k in (1, 5, 10):
        recall = 100.0 * sum(r < k for r in ranks) / len(ranks)
        assert recall == pytest.approx(float(cli.trainer.callback_metrics[f"test/r{k}"]), abs=1e-4)


# ------------------------------------------------------------------------------------------ stages
def _module_classes() -> dict[str, str]:
    """Model class path -> the first quick config that builds it."""
    found: dict[str, str] = {}
    for config in QUICK_CONFIGS:
        model = yaml.safe_load((REPO / config).read_text())["model"]
        found.setdefault(model["class_path"], config)
    return found


@pytest.mark.parametrize("class_path", sorted(_module_classes()))
def test_every_module_has_a_step_for_every_stage(class_path):
    """Lightning refuses a stage whose step is missing with a traceback; every module defines all three (a stage
    it cannot serve is refused by the module itself, in one line)."""
    module, name = class_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    missing = [step for step in ("validation_step", "test_step", "predict_step")
               if getattr(cls, step) is getattr(LightningModule, step)]
    assert missing == [], f"{class_path} lacks {missing}"


NO_TEST = ["configs/phyb/ensemble_quick.yaml", "configs/spectral_guidance/denoiser_quick.yaml",
           "configs/spectral_guidance/quick.yaml", "configs/spectral_guidance/digits_quick.yaml",
           "configs/tivdiff/encoder_quick.yaml"]


@pytest.mark.parametrize("config", NO_TEST)
def test_a_module_without_a_test_stage_says_to_validate(config):
    cli = run_cli("--config", config_path(config), *QUIET, "--model.init_args.init_from=null",
                  "--trainer.limit_test_batches=1", run=False)
    with pytest.raises(UserInputError) as caught:
        cli.trainer.test(cli.model, datamodule=cli.datamodule)
    message = str(caught.value)
    assert "\n" not in message
    assert re.match(rf"{type(cli.model).__name__} has no test stage: .*use `validate`", message)


def test_phyb_test_ends_in_one_error_line_and_exit_code_2(tmp_path):
    """The user's report: `train.py test` on PhyB ended in a traceback (no test_step)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "test", "--config",
                             config_path("configs/phyb/quick.yaml"), "--model.init_args.init_from=null", *QUIET],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: OfflineModelBasedRL has no test stage: its evaluation is online (the OfflineEvaluation "
                      "callback during fit/validate); use `validate` (or `predict` for the policy's actions)."]
