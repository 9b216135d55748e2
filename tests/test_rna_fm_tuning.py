"""`experiments/rna_fm.py` tunes every trained arm the same way: one learning-rate grid, EMA on, validation-only
selection, and only the chosen candidate is tested (fast: no training)."""
from __future__ import annotations

import pytest
import torch

from callbacks.ema import EMAWeights
from experiments import rna_fm
from experiments.kit import from_config

TINY = dict(num_slides=40, num_clusters=8, hidden=16,
            data=dict(rna_fm.DATA, num_pathway_genes=40, num_pathways=4, num_background_genes=8, feature_dim=8))


def test_every_trained_arm_gets_the_same_candidate_grid():
    grids = {arm: rna_fm.candidate_grid(arm) for arm in rna_fm.TRAINED_ARMS}
    assert set(grids) == {"RNA-FM", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite"}
    reference = grids["RNA-FM"]
    assert len(reference) >= 3
    for arm, grid in grids.items():
        assert grid == reference, arm
        assert all(candidate["ema"] is True for candidate in grid), arm
    lrs = [candidate["lr"] for candidate in reference]
    # the grid brackets both configs' own learning rates (RNA-FM's 3e-3, the regressors' 1e-3) on each side
    assert min(lrs) < 1e-3 and 3e-3 < max(lrs) and {1e-3, 3e-3} <= set(lrs)
    with pytest.raises(ValueError):
        rna_fm.candidate_grid("RNA-FM, CFG 1")  # evaluation-only: it reuses RNA-FM's tuned weights


@pytest.mark.parametrize("arm", rna_fm.TRAINED_ARMS)
def test_the_candidate_learning_rate_reaches_the_optimizer(arm):
    config, overrides = rna_fm.arm_overrides(arm, hidden=16)
    for lr in (3e-4, 1e-2):
        model, _ = from_config(config, *overrides, f"--model.init_args.optimizer.init_args.lr={lr}")
        optimizer = model.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])  # the modules build lazily
        assert [group["lr"] for group in optimizer.param_groups] == [lr] * len(optimizer.param_groups)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("arm", rna_fm.TRAINED_ARMS)
def test_every_arm_trains_with_ema(arm, monkeypatch):
    seen = {}

    def capture(callbacks=(), **kwargs):
        seen["callbacks"] = list(callbacks)
        raise _Stop

    monkeypatch.setattr(rna_fm, "quiet_trainer", capture)
    with pytest.raises(_Stop):
        rna_fm.fit_candidate(arm, 0, lr=1e-3, ema=True, **TINY)
    kinds = [type(c) for c in seen["callbacks"]]
    assert EMAWeights in kinds and kinds.index(rna_fm.KeepBest) < kinds.index(EMAWeights), kinds
    ema = seen["callbacks"][kinds.index(EMAWeights)]
    assert (ema.decay, ema.warmup) == (0.999, True)


class _FakeModel:
    def __init__(self, lr):
        self.lr, self.test_metrics, self.tested = lr, {}, 0


class _FakeTrainer:
    def validate(self, model, datamodule=None, verbose=False):
        pass

    def test(self, model, datamodule=None, verbose=False):
        model.tested += 1
        model.test_metrics = {"pearson": model.lr}  # a test score that would pick another candidate


def test_selection_reads_validation_only_and_tests_the_chosen_candidate_once(monkeypatch):
    val = {3e-4: 0.5, 1e-3: 0.7, 3e-3: 0.7, 1e-2: 0.6, 3e-2: 0.4}  # a tie: the first (smaller lr) wins
    calls, models = [], {}

    def fake_fit(arm, seed, lr, ema, **sizes):
        calls.append((arm, lr, ema))
        models[lr] = _FakeModel(lr)
        record = {"lr": lr, "ema": ema, "val_pearson": val[lr], "best_epoch": 1, "train_s": 1.0}
        return record, models[lr], object()

    monkeypatch.setattr(rna_fm, "fit_candidate", fake_fit)
    monkeypatch.setattr(rna_fm, "quiet_trainer", lambda *a, **k: _FakeTrainer())
    for arm in rna_fm.TRAINED_ARMS:
        calls.clear()
        result, model, _ = rna_fm.train_arm(arm, 0)
        assert calls == [(arm, lr, True) for lr in rna_fm.LR_GRID]
        assert model is models[1e-3] and result["lr"] == 1e-3 and result["val_pearson"] == 0.7
        assert [m.tested for m in models.values()] == [0, 1, 0, 0, 0]
        assert result["train_s"] == 5.0 and [r["lr"] for r in result["grid"]] == list(rna_fm.LR_GRID)
