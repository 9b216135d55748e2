"""Tamed SGD (Apidopoulos, Lytras, Mertikopoulos, ICML 2026): the math, the callback, the oracle, the claim."""
from __future__ import annotations

import functools
import pickle

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader

from callbacks.sgd_taming import SGDTaming, clipped_direction, dissipative_direction, tamed_direction
from datamodules.stochastic_oracle import StochasticOracleDataModule, oracle_noise
from lightning_modules.shared.errors import UserInputError
from lightning_modules.tamed_sgd.schedulers import RobbinsMonroLR
from lightning_modules.tamed_sgd.tamed_sgd import OBJECTIVES, StochasticOracleModule, get_objective, sample_objective

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1, num_sanity_val_steps=0)


# ----------------------------------------------------------------------------- the direction functions
def test_tamed_direction_hand_values():
    grad = torch.tensor([3.0, 4.0], dtype=torch.float64)                   # ||g|| = 5
    # lr = 0.25, q = 1: g / (1 + 0.25 * 5) = g / 2.25
    torch.testing.assert_close(tamed_direction(grad, 0.25), torch.tensor([4 / 3, 16 / 9], dtype=torch.float64))
    # q = 0.5: g / (1 + 0.5 * 5) = g / 3.5
    torch.testing.assert_close(tamed_direction(grad, 0.25, lr_power=0.5),
                               torch.tensor([6 / 7, 8 / 7], dtype=torch.float64))


def test_tamed_direction_uses_one_norm_per_run():
    grads = torch.tensor([[3.0, 4.0], [0.0, 0.5]], dtype=torch.float64)    # norms 5 and 0.5
    expected = torch.tensor([[3 / 2.25, 4 / 2.25], [0.0, 0.5 / 1.125]], dtype=torch.float64)
    torch.testing.assert_close(tamed_direction(grads, 0.25), expected)


def test_dissipative_direction_hand_values():
    grad = torch.tensor([[1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
    params = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    # run 0: ||x||^4 = 4, sqrt(0.04) = 0.2 -> divide by 1.8; a x = (0.5, 0.5); (g - a x) = (0.5, 1.5)
    #        -> (0.5 + 0.5/1.8, 0.5 + 1.5/1.8) = (7/9, 4/3).   run 1: x = 0 -> plain gradient.
    out = dissipative_direction(grad, params, 0.04, restoring_coef=0.5, iterate_power=2.0)
    torch.testing.assert_close(out, torch.tensor([[7 / 9, 4 / 3], [1.0, 2.0]], dtype=torch.float64))
    # r = 1: ||x||^2 = 2 -> divide by 1.4 -> (0.5 + 0.5/1.4, 0.5 + 1.5/1.4) = (6/7, 11/7)
    out = dissipative_direction(grad[0], params[0], 0.04, restoring_coef=0.5, iterate_power=1.0)
    torch.testing.assert_close(out, torch.tensor([6 / 7, 11 / 7], dtype=torch.float64))


def test_clipped_direction_hand_values():
    grads = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    torch.testing.assert_close(clipped_direction(grads, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


# ----------------------------------------------------------------------------- Robbins-Monro schedule
def test_robbins_monro_lr_values():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    scheduler = RobbinsMonroLR(optimizer, n0=10, power=0.7)
    seen = []
    for _ in range(11):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # 0.5 / 10^0.7, 0.5 / 11^0.7, 0.5 / 20^0.7
    assert seen[0] == pytest.approx(0.099763115748444, rel=1e-12)
    assert seen[1] == pytest.approx(0.09332438243903837, rel=1e-12)
    assert seen[10] == pytest.approx(0.06141140130578952, rel=1e-12)


@pytest.mark.parametrize("kwargs, word", [({"power": 0.5}, "power"), ({"power": 1.2}, "power"),
                                          ({"n0": 0.5}, "n0")])
def test_robbins_monro_rejects_bad_settings(kwargs, word):
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    with pytest.raises(UserInputError, match=word) as info:
        RobbinsMonroLR(optimizer, **kwargs)
    assert "must" in str(info.value)


# ----------------------------------------------------------------------------- the callback in a real Trainer
class TwoTensorModel(LightningModule):
    """loss = <c, a> + |b|^2 / 2 + a_0 b_1 on fixed tensors: grads are known, one batch, plain SGD."""

    def __init__(self, optimizer_factory=None):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor([0.5, 3.0, -1.0], dtype=torch.float64))
        self.optimizer_factory = optimizer_factory or functools.partial(torch.optim.SGD, lr=0.3)

    def loss(self):
        c = torch.tensor([4.0, -1.0], dtype=torch.float64)
        return (c * self.a).sum() + 0.5 * (self.b ** 2).sum() + self.a[0] * self.b[1]

    def training_step(self, batch, batch_idx):
        return self.loss()

    def train_dataloader(self):
        return DataLoader(torch.zeros(4, 1), batch_size=1)

    def configure_optimizers(self):
        return self.optimizer_factory(self.parameters())


def _expected_after_one_step(model, direction, lr):
    start = torch.cat([model.a.detach(), model.b.detach()]).clone()
    grads = torch.autograd.grad(model.loss(), [model.a, model.b])
    return start - lr * direction(torch.cat(grads), start)


@pytest.mark.parametrize("scheme, direction", [
    ("tamed", lambda g, x: tamed_direction(g, 0.3)),
    ("dissipative", lambda g, x: dissipative_direction(g, x, 0.3, restoring_coef=0.7, iterate_power=2.0)),
])
def test_callback_rewrites_gradients_like_the_function(scheme, direction):
    model = TwoTensorModel()
    expected = _expected_after_one_step(model, direction, lr=0.3)
    untamed = _expected_after_one_step(model, lambda g, x: g, lr=0.3)
    trainer = Trainer(max_steps=1, callbacks=[SGDTaming(scheme=scheme, restoring_coef=0.7)], **QUIET)
    trainer.fit(model)
    after = torch.cat([model.a.detach(), model.b.detach()])
    torch.testing.assert_close(after, expected, rtol=1e-12, atol=1e-12)
    assert (after - untamed).abs().max() > 0.1            # taming changed the step noticeably
    assert 0 < trainer.callback_metrics["taming/scale"] < 1


def test_callback_uses_each_groups_lr_with_one_global_norm():
    def two_groups(params):
        a, b = list(params)
        return torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.4}], lr=0.1)

    model = TwoTensorModel(optimizer_factory=two_groups)
    start_a, start_b = model.a.detach().clone(), model.b.detach().clone()
    grad_a, grad_b = torch.autograd.grad(model.loss(), [model.a, model.b])
    norm = torch.cat([grad_a, grad_b]).norm()
    Trainer(max_steps=1, callbacks=[SGDTaming()], **QUIET).fit(model)
    torch.testing.assert_close(model.a.detach(), start_a - 0.1 * grad_a / (1 + 0.1 * norm))
    torch.testing.assert_close(model.b.detach(), start_b - 0.4 * grad_b / (1 + 0.4 * norm))


@pytest.mark.parametrize("trainer_kwargs, optimizer, word", [
    ({"gradient_clip_val": 1.0}, functools.partial(torch.optim.SGD, lr=0.1), "gradient_clip_val"),
    ({}, functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), "momentum"),
    ({}, functools.partial(torch.optim.SGD, lr=0.1, weight_decay=1e-4), "weight_decay"),
    ({}, functools.partial(torch.optim.Adam, lr=0.1), "Adam"),
])
def test_callback_refuses_double_control_and_other_optimizers(trainer_kwargs, optimizer, word):
    trainer = Trainer(max_steps=1, callbacks=[SGDTaming()], **QUIET, **trainer_kwargs)
    with pytest.raises(UserInputError, match=word) as info:
        trainer.fit(TwoTensorModel(optimizer))
    assert "SGDTaming" in str(info.value)


def test_callback_opt_out_allows_momentum():
    trainer = Trainer(max_steps=1, callbacks=[SGDTaming(allow_any_optimizer=True)], **QUIET)
    trainer.fit(TwoTensorModel(functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)))
    assert trainer.global_step == 1


def test_two_tamers_are_refused():
    trainer = Trainer(max_steps=1, callbacks=[SGDTaming(), SGDTaming(scheme="dissipative")], **QUIET)
    with pytest.raises(UserInputError, match="2 SGDTaming"):
        trainer.fit(TwoTensorModel())


@pytest.mark.parametrize("kwargs, word", [({"scheme": "clip"}, "scheme"), ({"lr_power": 0.0}, "lr_power"),
                                          ({"restoring_coef": -1.0}, "restoring_coef"),
                                          ({"iterate_power": 0.0}, "iterate_power")])
def test_callback_rejects_bad_arguments(kwargs, word):
    with pytest.raises(UserInputError, match=word):
        SGDTaming(**kwargs)


def test_callback_is_picklable_and_state_keys_differ():
    tamer = pickle.loads(pickle.dumps(SGDTaming(scheme="dissipative", iterate_power=1.0)))
    assert tamer.scheme == "dissipative" and tamer.iterate_power == 1.0
    assert SGDTaming().state_key != SGDTaming(lr_power=0.5).state_key


# ----------------------------------------------------------------------------- objectives and oracle
@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_analytic_gradient_matches_autograd(name):
    objective = get_objective(name)
    x = torch.tensor([[0.7, -1.3], [-2.0, 0.2]], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(objective.value(x).sum(), x)
    torch.testing.assert_close(objective.gradient(x.detach()), grad)


def test_exp_saddle_landscape():
    objective = get_objective("exp_saddle")
    points = torch.tensor([[0.0, 1.0], [0.0, -1.0], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(objective.gradient(points), torch.zeros(3, 2, dtype=torch.float64))
    torch.testing.assert_close(objective.value(points), torch.tensor([1.75, 1.75, 2.0], dtype=torch.float64))


def test_oracle_is_unbiased():
    objective = get_objective("exp_saddle")
    samples = 20_000
    x = torch.tensor([0.5, -0.3], dtype=torch.float64).expand(samples, 2).clone().requires_grad_(True)
    noise = oracle_noise(seed=3, num_steps=samples, batch_size=1, dim=2)    # (samples, 1, 3)
    (grads,) = torch.autograd.grad(sample_objective(objective, x, noise, 0.5, 0.1).sum(), x)
    true = objective.gradient(x[0].detach())
    # per sample g = (1 + 0.5 xi_0) grad f + 0.1 xi', so its std per coordinate is sqrt(0.25 grad f^2 + 0.01)
    standard_error = (0.25 * true ** 2 + 0.01).sqrt() / samples ** 0.5
    assert ((grads.mean(0) - true).abs() < 4 * standard_error).all()
    assert (grads.std(0) - (0.25 * true ** 2 + 0.01).sqrt()).abs().max() < 0.02   # the noise is really there


def test_module_checks_its_inputs():
    with pytest.raises(UserInputError, match="objective"):
        StochasticOracleModule(objective="rosenbrock")
    with pytest.raises(UserInputError, match="dimension 2"):
        StochasticOracleModule(start=[1.0, 2.0, 3.0])
    with pytest.raises(UserInputError, match="data.init_args.dim"):
        StochasticOracleModule()(torch.zeros(1, 5))
    with pytest.raises(UserInputError, match="num_steps"):
        StochasticOracleDataModule(num_steps=0)


def test_noise_is_seeded():
    torch.testing.assert_close(oracle_noise(4, 10, 2, 2), oracle_noise(4, 10, 2, 2))
    assert not torch.equal(oracle_noise(4, 10, 2, 2), oracle_noise(5, 10, 2, 2))
    data = StochasticOracleDataModule(dim=3, num_steps=7, batch_size=5, seed=1)
    data.setup("fit")
    batches = list(data.train_dataloader())
    assert len(batches) == 7 and batches[0].shape == (5, 4)


def test_divergence_stops_training_without_a_crash():
    model = StochasticOracleModule(start=[8.0, 1e-3], optimizer=functools.partial(torch.optim.SGD, lr=0.5))
    trainer = Trainer(max_steps=50, limit_val_batches=0, **QUIET)
    trainer.fit(model, StochasticOracleDataModule(num_steps=50, seed=0))
    assert bool(model.diverged) and trainer.callback_metrics["diverged"] == 1
    assert 0 < int(model.diverged_at_step) < 10 and trainer.global_step < 50


def test_tamed_run_converges_and_does_not_diverge():
    model = StochasticOracleModule(start=[8.0, 1e-3], optimizer=functools.partial(torch.optim.SGD, lr=0.5),
                                   lr_scheduler=functools.partial(RobbinsMonroLR, n0=10, power=0.7))
    trainer = Trainer(max_steps=300, callbacks=[SGDTaming()], **QUIET)
    trainer.fit(model, StochasticOracleDataModule(num_steps=300, seed=0))
    assert not bool(model.diverged) and trainer.callback_metrics["diverged"] == 0
    assert trainer.callback_metrics["val/dist_to_min"] < 0.2


def test_lightning_path_matches_vectorised_path():
    from experiments.tamed_sgd import run_lightning_check

    rows = run_lightning_check(seeds=(0, 1), num_steps=40, arms=("tamed", "dissipative_r2", "plain_sgd"))
    for arm, row in rows.items():
        assert row["max_abs_diff"] < 1e-12, arm
        assert row["diverged_steps_lightning"] == row["diverged_steps_vectorised"], arm
    assert rows["plain_sgd"]["diverged_steps_lightning"] == [2, 2]


# ----------------------------------------------------------------------------- the claim, reduced
@pytest.mark.slow
def test_claim_plain_sgd_diverges_tamed_schemes_converge():
    from experiments.tamed_sgd import run_synthetic, synthetic_metrics

    results = run_synthetic(num_seeds=20, num_steps=2000, arms=("plain_sgd", "tamed", "dissipative_r2"),
                            progress=False)
    metrics = {arm: synthetic_metrics(result) for arm, result in results.items()}
    assert metrics["plain_sgd"]["diverged"]["mean"] >= 0.8
    for arm in ("tamed", "dissipative_r2"):
        assert metrics[arm]["diverged"]["mean"] == 0.0, arm
        assert metrics[arm]["near_minimiser"]["mean"] >= 0.9, arm
        assert metrics[arm]["near_saddle"]["mean"] == 0.0, arm


# ----------------------------------------------------------------------------- (c) the digits MLP through Lightning
def test_digits_runs_record_losses_and_survive_a_nan_run():
    import math

    from experiments.tamed_sgd import digits_run

    epochs, lr = 2, "model.init_args.optimizer.init_args.lr"
    results = {"plain_sgd_lr0.5": digits_run("plain_sgd_lr0.5", overrides={"trainer.max_epochs": epochs}),
               "plain_sgd_lr1e+30": digits_run("plain_sgd_lr50", overrides={"trainer.max_epochs": epochs, lr: 1e30}),
               "tamed_lr1e+30": digits_run("tamed_lr50", overrides={"trainer.max_epochs": epochs, lr: 1e30})}
    for arm, (metrics, curve) in results.items():
        assert len(curve) % epochs == 0, arm
        # the final train loss is the mean minibatch loss of the last epoch
        last_epoch = torch.tensor(curve[-len(curve) // epochs:])
        torch.testing.assert_close(torch.tensor(metrics["train_loss"]), last_epoch.mean(), equal_nan=True)
        assert set(metrics) >= {"test_accuracy", "val_accuracy", "nonfinite", "failed"}
        assert 0.0 <= metrics["test_accuracy"] <= 1.0
    plain_huge, curve = results["plain_sgd_lr1e+30"]    # overflows to NaN within a step or two, and keeps going
    assert plain_huge["nonfinite"] == 1.0 and plain_huge["failed"] == 1.0 and math.isnan(curve[-1])
    for arm in ("plain_sgd_lr0.5", "tamed_lr1e+30"):     # the tamed step is at most 1 whatever the lr
        metrics = results[arm][0]
        assert metrics["nonfinite"] == 0.0 and metrics["failed"] == 0.0, arm
        assert metrics["train_loss"] < math.log(10.0) and metrics["test_accuracy"] > 0.8, arm


@pytest.mark.slow
def test_claim_on_digits_plain_and_clipped_sgd_fail_tamed_sgd_trains():
    from experiments.tamed_sgd import digits_run

    results = {arm: digits_run(arm)[0] for arm in ("plain_sgd_lr0.5", "plain_sgd_lr50", "clipped_sgd_lr50",
                                                   "tamed_lr50", "dissipative_r1_a0_lr50")}
    for arm in ("plain_sgd_lr50", "clipped_sgd_lr50"):
        assert results[arm]["failed"] == 1.0 and results[arm]["test_accuracy"] < 0.2, arm
    for arm in ("plain_sgd_lr0.5", "tamed_lr50", "dissipative_r1_a0_lr50"):
        assert results[arm]["failed"] == 0.0 and results[arm]["test_accuracy"] > 0.9, arm
