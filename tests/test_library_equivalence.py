"""The collection's own metric, schedule and EMA code next to the library versions people expect.

Each piece is kept on purpose (its docstring says why). These tests pin both halves of that statement: where
the library computes the same thing the numbers agree on random inputs, and where it does not, the difference
the docstring names is shown on a small example.
"""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch import nn

from callbacks.ema import EMAWeights
from lightning_modules.multi_answer_rl.answer_set_metrics import expected_calibration_error, set_brier
from lightning_modules.rna_fm.expression_eval import per_gene_pearson, sample_crps
from lightning_modules.ldarnet.ldarnet import WSDSchedule


# ============================================================================================ EMA
class _TinyRegression(pl.LightningModule):
    """A 3-input linear model trained with SGD on a fixed random regression problem."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self.layer(x) - y).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback, steps: int = 6) -> _TinyRegression:
    torch.manual_seed(0)
    model = _TinyRegression()
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=[callback])
    trainer.fit(model, train_dataloaders=data)
    return model


def test_ema_weights_average_equals_lightning_ema_weight_averaging_with_a_fixed_decay():
    ours = EMAWeights(decay=0.7, start_step=1)
    trained = _fit(ours)
    lightning_ema = EMAWeightAveraging(decay=0.7, use_buffers=False)
    averaged = _fit(lightning_ema)  # Lightning copies its average into the module when fit ends
    for name, value in averaged.named_parameters():
        torch.testing.assert_close(ours.averages[name], value.detach(), rtol=0, atol=1e-6)
    # ours hands the training weights back, which differ from the average
    assert not torch.allclose(trained.layer.weight, ours.averages["layer.weight"])


class _Step:
    """The one trainer attribute the EMA callbacks read after an optimiser step."""

    def __init__(self, global_step: int):
        self.global_step = global_step


def test_lightning_ema_averages_in_the_training_dtype_where_ours_keeps_fp32():
    # bf16-true weights: a (1 - 0.999) share of a 0.01 change is below bf16 resolution at 1.0
    start, moved = torch.ones(1, 3), torch.full((1, 3), 1.01)
    module = _TinyRegression().to(torch.bfloat16)
    with torch.no_grad():
        module.layer.weight.copy_(start)
    lightning_ema = EMAWeightAveraging(decay=0.999, use_buffers=False)
    lightning_ema.setup(None, module, "fit")
    lightning_ema.on_train_batch_end(_Step(1), module, None, None, 0)  # first update: a copy
    ours = EMAWeights(decay=0.999, start_step=1)
    ours.on_fit_start(None, module)
    ours.on_train_batch_end(_Step(1), module, None, None, 0)
    with torch.no_grad():
        module.layer.weight.copy_(moved)
    for step in range(2, 12):
        lightning_ema.on_train_batch_end(_Step(step), module, None, None, 0)
        ours.on_train_batch_end(_Step(step), module, None, None, 0)
    expected = 1.0 + 0.0078125 * (1 - 0.999 ** 10)  # 1.01 is 1.0078125 in bf16
    assert (lightning_ema._average_model.module.layer.weight == 1.0).all()  # stuck at the first copy
    assert ours.averages["layer.weight"].dtype == torch.float32
    torch.testing.assert_close(ours.averages["layer.weight"], torch.full((1, 3), expected), rtol=0, atol=1e-6)


def test_lightning_ema_has_no_decay_warmup_where_ours_ramps():
    ours = EMAWeights(decay=0.999, warmup=True)
    assert ours.current_decay() == pytest.approx(0.1)  # (1 + 0) / (10 + 0): the first updates follow the weights
    assert "warmup" not in EMAWeightAveraging.__init__.__code__.co_varnames


# ============================================================================================ calibration
def test_ece_agrees_with_torchmetrics_binary_calibration_error_below_one():
    from torchmetrics.classification import BinaryCalibrationError

    gen = torch.Generator().manual_seed(0)
    for size in (7, 100, 1000):
        p = torch.rand(size, generator=gen, dtype=torch.float64) * 0.999  # never exactly 1
        y = (torch.rand(size, generator=gen, dtype=torch.float64) < p).double()
        metric = BinaryCalibrationError(n_bins=10, norm="l1")
        metric.update(p, y)
        assert expected_calibration_error(p, y, 10) == pytest.approx(float(metric.compute()), abs=1e-12)


def test_ece_puts_confidence_one_in_the_last_bin_where_torchmetrics_opens_an_eleventh():
    from torchmetrics.classification import BinaryCalibrationError

    p, y = torch.tensor([0.9, 1.0], dtype=torch.float64), torch.tensor([1.0, 0.0], dtype=torch.float64)
    # ours: one bin [0.9, 1] holding both: |1.9 - 1| / 2 = 0.45; torchmetrics: (|0.9 - 1| + |1 - 0|) / 2 = 0.55
    assert expected_calibration_error(p, y, 10) == pytest.approx(0.45)
    metric = BinaryCalibrationError(n_bins=10, norm="l1")
    metric.update(p, y)
    assert float(metric.compute()) == pytest.approx(0.55)


def test_set_brier_is_k_times_the_mean_squared_error():
    from torchmetrics.functional import mean_squared_error

    gen = torch.Generator().manual_seed(0)
    p = torch.rand(20, 3, generator=gen, dtype=torch.float64)
    y = (torch.rand(20, 3, generator=gen) < 0.5).double()
    assert set_brier(p, y) == pytest.approx(3 * float(mean_squared_error(p, y)), abs=1e-12)


# ============================================================================================ expression
def test_per_gene_pearson_agrees_with_torchmetrics_and_scores_a_constant_gene_zero():
    from torchmetrics.regression import PearsonCorrCoef

    gen = torch.Generator().manual_seed(0)
    pred = torch.randn(40, 6, generator=gen, dtype=torch.float64)
    target = pred + torch.randn(40, 6, generator=gen, dtype=torch.float64)
    metric = PearsonCorrCoef(num_outputs=6)
    metric.update(pred[:25], target[:25])  # two batches: torchmetrics merges running moments
    metric.update(pred[25:], target[25:])
    torch.testing.assert_close(per_gene_pearson(pred, target), metric.compute(), rtol=0, atol=1e-12)
    pred[:, 2] = 0.5  # a collapsed gene: torchmetrics says NaN, which would make the gene mean NaN
    metric = PearsonCorrCoef(num_outputs=6)
    metric.update(pred, target)
    assert torch.isnan(metric.compute()[2]) and per_gene_pearson(pred, target)[2] == 0.0


@pytest.mark.parametrize("k", [2, 5, 19])
def test_sample_crps_is_the_fair_form_of_torchmetrics_ensemble_crps(k):
    from torchmetrics.functional.regression import continuous_ranked_probability_score

    gen = torch.Generator().manual_seed(k)
    samples = torch.randn(30, k, 4, generator=gen, dtype=torch.float64)  # [slides, K, genes]
    target = torch.randn(30, 4, generator=gen, dtype=torch.float64)
    ours = sample_crps(samples, target)
    library = torch.stack([continuous_ranked_probability_score(samples[:, :, g], target[:, g]) for g in range(4)])
    error = (samples - target.unsqueeze(1)).abs().mean(1).mean(0)  # E|X - y|, per gene
    # torchmetrics divides the pair term by K^2 (the CRPS of the K-point empirical law); ours by K(K - 1)
    torch.testing.assert_close(error - ours, (k / (k - 1)) * (error - library), rtol=0, atol=1e-12)
    assert (ours < library).all()


# ============================================================================================ WSD schedule
def test_wsd_schedule_matches_transformers_after_warmup_and_differs_in_warmup():
    from transformers import get_wsd_schedule

    total, final = 100, 0.05
    ours = WSDSchedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=total,
                       warmup_fraction=0.1, decay_fraction=0.2, final_ratio=final)
    library = get_wsd_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), num_warmup_steps=10,
                               num_decay_steps=20, num_training_steps=total, decay_type="1-sqrt",
                               min_lr_ratio=final)
    lambda_hf = library.lr_lambdas[0]
    for step in range(10, total + 5):  # stable and 1 - sqrt decay phases, and after the end
        assert ours.factor(step) == pytest.approx(lambda_hf(step), abs=1e-12), step
    # warm-up: ours ramps from LR / warmup_steps, transformers from min_lr_ratio x LR (the decay floor)
    assert ours.factor(0) == pytest.approx(0.1) and lambda_hf(0) == pytest.approx(final)
