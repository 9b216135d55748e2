"""PhyB's baselines on equal terms: MOPO's penalty in reward units, the absolute Q bias beside the signed one, the
model-free TD3+BC arm (Fujimoto & Gu 2021) and the experiment's paired intervals."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import config_path, run_cli
from experiments.phyb import ARMS, paired_differences, q_metrics
from icml26.claims import paired_interval
from lightning_modules.phyb.phyb import OfflineModelBasedRL
from lightning_modules.phyb.td3_bc import TD3BC, td3_bc_actor_loss
from lightning_modules.shared.errors import UserInputError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
ENSEMBLE, TD3_BC = config_path("configs/phyb/ensemble_quick.yaml"), config_path("configs/phyb/td3_bc_quick.yaml")
PENDULUM = ["--data.init_args.source=pendulum", "--data.init_args.behaviour=medium",
            "--data.init_args.num_transitions=2000"]


@pytest.fixture(scope="module")
def pendulum_ensemble(tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble")
    cli = run_cli("--config", ENSEMBLE, "--trainer.max_steps=3", "--trainer.limit_val_batches=1", *PENDULUM,
                  "--model.init_args.termination=none", *QUIET, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    path = str(out / "ensemble.ckpt")
    cli.trainer.save_checkpoint(path)
    return path


def _one_step_target(path: str, target: str, reward_scale: float, obs: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)  # the same networks for every target and scale
    model = OfflineModelBasedRL(ensemble_size=7, ensemble_hidden_dim=64, ensemble_hidden_layers=2, termination="none",
                                belief_target=target, num_models=4, k_smallest=2, next_state_samples=2,
                                proposal_actions=3, hidden_dim=16, hidden_layers=1, rollout_batch=8,
                                model_buffer_size=16, mopo_lambda=1.0, reward_scale=reward_scale, init_from=path)
    model.load_initial_weights()
    torch.manual_seed(1)  # the same rollout draws
    return model.rollout_step(obs)["target"]


def test_mopo_penalty_is_in_reward_units(pendulum_ensemble):
    """MOPO's r~ = r - lambda u: the penalty is scaled with the reward, so lambda means the same at every
    reward_scale (it used to be subtracted after the scale, 1 / reward_scale times too strong)."""
    obs = torch.nn.functional.normalize(torch.randn(10, 2), dim=-1)
    obs = torch.cat([obs, torch.randn(10, 1)], -1)  # (cos, sin, thdot)
    penalty = {scale: _one_step_target(pendulum_ensemble, "mopo", scale, obs)
               - _one_step_target(pendulum_ensemble, "mean", scale, obs) for scale in (1.0, 0.01)}
    assert (penalty[1.0] < 0).all()  # the uncertainty penalty lowers every target
    torch.testing.assert_close(penalty[0.01], 0.01 * penalty[1.0])


def test_model_reward_penalises_only_mopo(pendulum_ensemble):
    model = OfflineModelBasedRL(ensemble_size=7, ensemble_hidden_dim=64, ensemble_hidden_layers=2,
                                termination="none", belief_target="mopo", num_models=4, k_smallest=2,
                                mopo_lambda=2.0, reward_scale=0.01, init_from=pendulum_ensemble)
    model.load_initial_weights()
    normalised, std = torch.rand(3, 4, 2), torch.rand(3, 4, 4) + 0.1
    raw = model.ensemble.raw_reward(normalised)
    u = (std / model.ensemble.output_std).norm(dim=-1).max(-1).values
    torch.testing.assert_close(model.model_reward(normalised, std), 0.01 * (raw - 2.0 * u[:, None, None]))
    model.hparams.belief_target = "phyb"
    torch.testing.assert_close(model.model_reward(normalised, std), 0.01 * raw)


def test_abs_q_bias_beside_the_signed_bias():
    low = q_metrics({"return": -100.0, "q_overestimation": -60.0, "q_abs_error": 75.0})
    high = q_metrics({"return": -100.0, "q_overestimation": 60.0, "q_abs_error": 75.0})
    assert low["abs_q_bias"] == high["abs_q_bias"] == 60.0  # equally far off, whichever the sign
    assert low["q_overestimation"] == -60.0 and low["q_abs_error"] == 75.0


def test_paired_differences_are_method_minus_baseline_seed_by_seed():
    rows = [{f"pendulum/{arm}": {"return": float(10 * i + j), "q_overestimation": float(i - j),
                                 "abs_q_bias": abs(float(i - j)), "q_abs_error": 1.0}
             for j, arm in enumerate(ARMS)} for i in range(3)]
    rows[1]["pendulum/phyb"]["return"] += 6.0
    pairs = [{"baseline": f"pendulum/{arm}", "arms": ["pendulum/phyb"]} for arm in ARMS if arm != "phyb"]
    paired = paired_differences(rows, pairs)
    assert set(paired) == {f"pendulum/phyb - pendulum/{arm}" for arm in ARMS if arm != "phyb"}
    phyb, mean = ARMS.index("phyb"), ARMS.index("mean")
    diffs = [phyb - mean + (6.0 if i == 1 else 0.0) for i in range(3)]
    cell = paired["pendulum/phyb - pendulum/mean"]["return"]
    assert (cell["mean"], cell["lo"], cell["hi"], cell["n"]) == pytest.approx(paired_interval(diffs))
    one = paired_differences(rows[:1], pairs)["pendulum/phyb - pendulum/mean"]["return"]
    assert one["n"] == 1 and one["lo"] is None and one["hi"] is None  # no interval from one seed


def test_td3_bc_actor_loss_is_the_papers_normalised_objective():
    q = torch.tensor([-2.0, -4.0, 6.0])
    pi, a = torch.tensor([[0.5], [0.0], [-1.0]]), torch.tensor([[0.0], [0.5], [-1.0]])
    loss, lam = td3_bc_actor_loss(q, pi, a, alpha=2.5)
    # lambda = alpha / mean |Q| = 2.5 / 4; loss = -lambda mean Q + mean (pi - a)^2
    assert lam.item() == pytest.approx(2.5 / 4)
    assert loss.item() == pytest.approx(-2.5 / 4 * 0.0 + (0.25 + 0.25) / 3)
    # the normalisation makes the trade-off independent of the scale of Q (of the reward)
    for scale in (0.01, 100.0):
        assert td3_bc_actor_loss(scale * q + scale, pi, a, 2.5)[0].item() == pytest.approx(
            td3_bc_actor_loss(q + 1, pi, a, 2.5)[0].item(), rel=1e-5)
    # lambda is a constant for the gradient: d loss / d Q = -lambda / B
    q = q.clone().requires_grad_(True)
    td3_bc_actor_loss(q, pi, a, 2.5)[0].backward()
    torch.testing.assert_close(q.grad, torch.full((3,), -2.5 / 4 / 3))


def test_td3_bc_trains_and_evaluates_like_the_model_based_arms(tmp_path):
    # 4 batches: critic steps 4, actor (and target) steps 2 (policy_delay 2) = 6 optimiser steps
    cli = run_cli("--config", TD3_BC, *PENDULUM, "--trainer.max_steps=6", "--trainer.limit_val_batches=1",
                  "--trainer.val_check_interval=4", *QUIET, run=False)
    model = cli.model
    actor_before = [p.detach().clone() for p in model.actor.parameters()]
    cli.trainer.fit(model, datamodule=cli.datamodule)
    assert int(model.updates) == 4 and cli.trainer.global_step == 6
    assert any(not torch.equal(p, q) for p, q in zip(model.actor.parameters(), actor_before))
    # states are standardised with the training split's statistics
    obs = cli.datamodule.training_transitions()["obs"]
    torch.testing.assert_close(model.obs_mean, obs.mean(0))
    torch.testing.assert_close(model.obs_std, obs.std(0) + 1e-3)
    for key in ("eval/return", "eval/q_overestimation", "val/td_error", "train/lambda"):
        assert math.isfinite(float(cli.trainer.callback_metrics[key])), key
    action = model.act(obs[:5])
    assert action.shape == (5, 1) and (action.abs() <= 1).all()
    # a checkpoint restores the statistics and the update counter
    path = tmp_path / "td3_bc.ckpt"
    cli.trainer.save_checkpoint(path)
    reloaded = TD3BC.load_from_checkpoint(path)
    assert torch.equal(reloaded.obs_mean, model.obs_mean) and int(reloaded.updates) == 4


def test_td3_bc_bad_settings_are_one_clear_error():
    with pytest.raises(UserInputError, match="policy_delay"):
        TD3BC(policy_delay=0)
    with pytest.raises(UserInputError, match="alpha"):
        TD3BC(alpha=0.0)
