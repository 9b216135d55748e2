"""RNA-FM's experiment (configs/rna_fm/experiment.yaml) tunes every trained row the same way: one learning-rate grid,
EMA on for every arm from the YAML, validation-only selection, and only the chosen checkpoint is tested (fast: no
training; the CLI builds only)."""
from __future__ import annotations

import pytest
import torch

from callbacks.ema import EMAWeights
from experiments import rna_fm, runner

ROWS = ("RNA-FM", "RNA-FM, CFG 1", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite")
TRAINED = ("RNA-FM", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite")
GRID = [0.0003, 0.001, 0.003, 0.01, 0.03]


def _lr(spec, arm) -> float:
    return arm.overrides.get(rna_fm.LR_KEY)


def test_every_trained_row_gets_the_same_learning_rate_grid():
    spec = runner.load_spec("rna_fm")
    grids = {row: [_lr(spec, arm) for arm in spec.arms if rna_fm.grid_of(arm.name) == row] for row in ROWS}
    assert {row: grid for row, grid in grids.items() if grid} == {row: GRID for row in TRAINED}
    assert grids["RNA-FM, CFG 1"] == []  # evaluation-only: it tests RNA-FM's chosen checkpoint
    # the grid brackets both configs' own learning rates (RNA-FM's 3e-3, the regressors' 1e-3) on each side
    assert min(GRID) < 1e-3 and 3e-3 < max(GRID) and {1e-3, 3e-3} <= set(GRID)
    for arm in spec.arms:
        row = rna_fm.grid_of(arm.name)
        if row is not None:  # a grid point: the row's overrides plus its learning rate only
            assert arm.name == f"{row} @ lr={_lr(spec, arm)}" and arm.fit and not arm.row
            base = next(a for a in spec.arms if a.name == row)
            assert arm.configs == base.configs
            assert {k: v for k, v in arm.overrides.items() if k != rna_fm.LR_KEY} == base.overrides
        else:  # a row tests a checkpoint: never fitted, never tuned
            assert not arm.fit and arm.row and rna_fm.LR_KEY not in arm.overrides


@pytest.mark.parametrize("row", ("RNA-FM", "HE2RNA-lite", "tRNAsformer-lite"))
def test_every_arm_trains_with_ema_from_the_yaml_and_the_lr_reaches_the_optimizer(row, tmp_path):
    spec = runner.load_spec("rna_fm", smoke=True)
    arm = next(a for a in spec.arms if a.name == f"{row} @ lr=0.003")
    cli = runner.build_cli(runner.arm_flags(spec, arm), 0, tmp_path)
    emas = [c for c in cli.trainer.callbacks if isinstance(c, EMAWeights)]
    assert len(emas) == 1 and (emas[0].decay, emas[0].warmup) == (0.999, True)
    monitored = [c for c in cli.trainer.checkpoint_callbacks if c.monitor]
    assert [(c.monitor, c.mode) for c in monitored] == [("val/pearson", "max")]
    assert cli.trainer.num_sanity_val_steps == 0 and cli.trainer.gradient_clip_val == 1.0
    optimizer = cli.model.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])  # the modules build lazily
    assert [group["lr"] for group in optimizer.param_groups] == [0.003] * len(optimizer.param_groups)


def test_selection_reads_validation_only_and_ties_go_to_the_smaller_learning_rate():
    records = [{"lr": lr, "val_pearson": v, "test_pearson": 1.0 - v}
               for lr, v in zip(GRID, (0.5, 0.7, 0.7, 0.6, 0.4))]
    assert rna_fm.select(records) == 1
    records[4]["val_pearson"] = 0.71
    assert rna_fm.select(records) == 4


class _Callback:
    def __init__(self, score=None, path=""):
        self.monitor, self.best_model_score, self.best_model_path = "val/pearson", score, path


class _Trainer:
    def __init__(self):
        self.tested = []

    def test(self, model, datamodule=None, ckpt_path=None, verbose=False):
        self.tested.append(ckpt_path)
        model.test_metrics = {"pearson": {"a.ckpt": 0.1, "b.ckpt": 0.2, "c.ckpt": 0.3}[ckpt_path]}


class _Run:
    """A stand-in for `experiments.runner.Run` after its fit (grid) or build (row)."""

    def __init__(self, spec, name, earlier=None, record=None, checkpoint=None):
        self.spec, self.arm, self.variant, self.seed = spec, next(a for a in spec.arms if a.name == name), None, 0
        self.earlier, self.extra, self.trainer = dict(earlier or {}), {}, _Trainer()
        self.model, self.datamodule, self.checkpoint = type("M", (), {"test_metrics": {}})(), None, checkpoint
        if record is not None:
            self.extra["candidate"] = record

    @property
    def settings(self):
        return self.spec.settings

    def best_checkpoint(self):
        return self.checkpoint


def test_a_row_tests_only_the_checkpoint_chosen_on_validation():
    spec = runner.load_spec("rna_fm", smoke=True)
    val = {"RNA-FM @ lr=0.001": (0.6, "a.ckpt"), "RNA-FM @ lr=0.003": (0.5, "b.ckpt")}
    grid = {name: _Run(spec, name, record={"lr": float(name.split("=")[1]), "ema": True, "val_pearson": v,
                                           "best_epoch": 0, "train_s": 2.0}, checkpoint=path)
            for name, (v, path) in val.items()}
    row = _Run(spec, "RNA-FM", earlier=grid)
    metrics = rna_fm.evaluate(row)
    assert row.trainer.tested == ["a.ckpt"] and metrics == {"pearson": 0.1, "val_pearson": 0.6, "train_s": 4.0}
    record = row.extra["record"]
    assert record["lr"] == 0.001 and record["train_s"] == 4.0 and [r["lr"] for r in record["grid"]] == [0.001, 0.003]
    cfg1 = _Run(spec, "RNA-FM, CFG 1", earlier={**grid, "RNA-FM": row})
    rna_fm.evaluate(cfg1)  # RNA-FM's grid (settings.checkpoint_from): the same checkpoint, no training of its own
    assert cfg1.trainer.tested == ["a.ckpt"] and cfg1.extra["record"]["train_s"] == 0.0
    assert "grid" not in cfg1.extra["record"] and cfg1.extra["record"]["lr"] == 0.001
    assert all(not g.trainer.tested for g in grid.values())  # the other candidate is never tested
