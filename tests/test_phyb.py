"""PhyB (arXiv 2606.00680): the hybrid-belief weights, the PMDB order statistic, the temperature, soft termination,
the environments and loaders, the ensemble -> policy chain, and the errors for bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from conftest import config_path, run_cli
from datamodules.offline_rl import (CurrencyExchangeEnv, OfflineRLDataModule, PendulumEnv, load_d4rl_file,
                                    load_minari_folder)
from lightning_modules.phyb.dynamics_ensemble import done_probability, soft_continue, termination_currency_exchange
from lightning_modules.shared.errors import UserInputError
from lightning_modules.phyb.phyb import (OfflineModelBasedRL, hybrid_belief_weights, kl_temperature,
                                    order_statistic_weights, soft_value)

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
]
ENSEMBLE, POLICY = config_path("configs/phyb/ensemble_quick.yaml"), config_path("configs/phyb/quick.yaml")


def test_hybrid_belief_weights_on_a_hand_computed_example():
    q = torch.tensor([[3.0, 1.0, 2.0, 5.0]])
    # the k = 3 smallest: 1 (slot 1), 2 (slot 2), 3 (slot 0); min-max normalised 0, 0.5, 1; softmax(-3 x)
    e = [1.0, math.exp(-1.5), math.exp(-3.0)]
    soft = [v / sum(e) for v in e]
    expected = torch.tensor([[0.99 * soft[2] + 0.0025, 0.99 * soft[0] + 0.0025, 0.99 * soft[1] + 0.0025, 0.0025]])
    weights = hybrid_belief_weights(q, k=3, lam=-3.0, smoothing=0.01)
    torch.testing.assert_close(weights, expected)
    assert weights.sum().item() == pytest.approx(1.0)
    # shifting or scaling Q within the subset does not change the weights (min-max normalisation)
    torch.testing.assert_close(hybrid_belief_weights(10 * q + 7, 3), weights)


def test_pmdb_order_statistic():
    q = torch.tensor([[4.0, 1.0, 3.0, 2.0], [0.0, -1.0, 5.0, 9.0]])
    torch.testing.assert_close(order_statistic_weights(q, 2), torch.tensor([[0.0, 0, 0, 1], [1.0, 0, 0, 0]]))
    torch.testing.assert_close(order_statistic_weights(q, 1), torch.tensor([[0.0, 1, 0, 0], [0.0, 1, 0, 0]]))


def test_temperature_formula_and_soft_value():
    q, log_w = torch.tensor([[1.0, 2.0, 4.0]]), torch.zeros(1, 3)
    # greedy (softmax with temperature 1e-3) = 4, the proposal average = 7/3, alpha = (4 - 7/3) / 5
    alpha = kl_temperature(q, log_w, target_kl=5.0)
    assert alpha.item() == pytest.approx((4 - 7 / 3) / 5, rel=1e-5)
    assert kl_temperature(q, log_w, target_kl=1e6).item() == pytest.approx(1e-3)  # the lower clip
    # equal Q: the soft value is that Q; and it lies between the mean and the max of Q
    assert soft_value(torch.full((1, 3), 2.5), log_w, alpha).item() == pytest.approx(2.5)
    value = soft_value(q, log_w, alpha).item()
    assert 7 / 3 < value < 4


def test_soft_termination():
    pred_min, pred_max = torch.tensor([0.0]), torch.tensor([1.0])
    pred_min_2, pred_max_2 = torch.tensor([-1.0]), torch.tensor([2.0])
    states = torch.tensor([[0.5], [1.0], [1.5], [5.0], [-5.0]])
    keep = soft_continue(states, pred_min, pred_max, pred_min_2, pred_max_2)
    torch.testing.assert_close(keep[:2], torch.ones(2))                       # inside the plausible range
    assert keep[2].item() == pytest.approx(0.5 / 0.99)                        # halfway to the outer bound
    assert keep[3].item() < 1e-3 and keep[4].item() < 1e-3                    # far outside
    # the known CurrencyExchange termination: t' >= 20 or money' < 0.1
    next_obs = torch.tensor([[20.0, 50.0, 1.0], [5.0, 0.05, 1.0], [5.0, 50.0, 1.0]])
    torch.testing.assert_close(termination_currency_exchange(None, None, next_obs), torch.tensor([1.0, 1.0, 0.0]))


def test_done_probability_is_the_max_of_both():
    class Ranges:
        pred_min, pred_max = torch.zeros(3), torch.tensor([20.0, 100.0, 5.0])
        pred_min_2, pred_max_2 = -torch.ones(3), torch.tensor([21.0, 101.0, 6.0])
    next_obs = torch.tensor([[20.0, 50.0, 1.0], [3.0, 50.0, 1.0], [3.0, 50.0, 9.0]])
    done = done_probability(Ranges, termination_currency_exchange, None, None, next_obs)
    assert done[0].item() == 1.0 and done[1].item() == pytest.approx(0.0) and done[2].item() > 0.99


def test_environments_follow_their_equations():
    rng = np.random.default_rng(0)
    env = PendulumEnv()
    obs = env.reset(2, rng)
    th, thdot = env.th.copy(), env.thdot.copy()
    _, reward, terminal, _ = env.step(np.array([[0.5], [-1.0]]))
    u = np.array([1.0, -2.0])
    new_thdot = np.clip(thdot + (15 * np.sin(th) + 3 * u) * 0.05, -8, 8)
    np.testing.assert_allclose(env.th, th + new_thdot * 0.05)
    angle = ((th + np.pi) % (2 * np.pi)) - np.pi
    np.testing.assert_allclose(reward, -(angle ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2))
    assert obs.shape == (2, 3) and not terminal.any()
    cx = CurrencyExchangeEnv()
    state = cx.reset(2, rng)
    assert (state[:, 0] == 0).all() and (state[:, 1] == 100).all()
    nxt, reward, terminal, _ = cx.step(np.array([[0.25], [-0.5]]))  # exchange 25 % / nothing (clipped to 0)
    np.testing.assert_allclose(reward, [25 * state[0, 2], 0.0])
    np.testing.assert_allclose(nxt[:, 1], [75.0, 100.0])
    cx.state[:, 0] = 19
    assert cx.step(np.zeros((2, 1)))[2].all()  # the 20th step ends the episode


def test_generated_data_is_deterministic_and_split():
    a, b = OfflineRLDataModule(seed=3, num_transitions=500), OfflineRLDataModule(seed=3, num_transitions=500)
    a.setup("fit")
    b.setup("fit")
    torch.testing.assert_close(a.splits["train"]["obs"], b.splits["train"]["obs"])
    assert len(a.splits["train"]["obs"]) + len(a.splits["val"]["obs"]) == 500
    batch = next(iter(a.train_dataloader()))
    assert set(batch) == {"obs", "act", "rew", "next_obs", "done"} and batch["act"].shape == (256, 1)


def _d4rl_arrays(n=6, obs_dim=5):
    rng = np.random.default_rng(0)
    return {"observations": rng.normal(size=(n, obs_dim)), "actions": rng.uniform(-1, 1, (n, 2)),
            "rewards": rng.normal(size=n), "terminals": np.zeros(n), "timeouts": np.array([0, 0, 1, 0, 0, 0.0])}


def test_d4rl_npz_has_qlearning_semantics_and_clear_errors(tmp_path):
    arrays = _d4rl_arrays()
    np.savez(tmp_path / "d.npz", **arrays)
    data = load_d4rl_file(str(tmp_path / "d.npz"))
    # the time-out step (index 2) and the last step have no successor: 4 transitions, next_obs = the next row
    assert len(data["obs"]) == 4
    np.testing.assert_allclose(data["next_obs"][0], arrays["observations"][1].astype(np.float32))
    np.testing.assert_allclose(data["obs"][2], arrays["observations"][3].astype(np.float32))
    np.savez(tmp_path / "missing.npz", **{k: v for k, v in arrays.items() if k != "timeouts"})
    with pytest.raises(UserInputError, match="no 'timeouts'.*max_episode_steps"):  # a v0 file: the episode length
        load_d4rl_file(str(tmp_path / "missing.npz"))
    np.savez(tmp_path / "short.npz", **{**arrays, "rewards": arrays["rewards"][:3]})
    with pytest.raises(UserInputError, match="rewards"):
        load_d4rl_file(str(tmp_path / "short.npz"))
    bad = {**arrays, "rewards": arrays["rewards"].copy()}
    bad["rewards"][0] = np.nan
    np.savez(tmp_path / "nan.npz", **bad)
    with pytest.raises(UserInputError, match="NaN"):
        load_d4rl_file(str(tmp_path / "nan.npz"))
    with pytest.raises(UserInputError, match="does not exist"):
        load_d4rl_file(str(tmp_path / "absent.hdf5"))


def test_minari_folder(tmp_path):
    h5py = pytest.importorskip("h5py")
    (tmp_path / "data").mkdir()
    with h5py.File(tmp_path / "data" / "main_data.hdf5", "w") as f:
        for i, steps in enumerate((3, 2)):
            group = f.create_group(f"episode_{i}")
            group["observations"] = np.arange((steps + 1) * 2, dtype=float).reshape(steps + 1, 2)
            group["actions"] = np.zeros((steps, 1))
            group["rewards"] = np.ones(steps)
            group["terminations"] = np.eye(steps)[-1]
            group["truncations"] = np.zeros(steps)
    data = load_minari_folder(str(tmp_path))
    assert len(data["obs"]) == 5 and data["done"].sum() == 2
    np.testing.assert_allclose(data["next_obs"][0], [2.0, 3.0])
    with pytest.raises(UserInputError, match="Minari"):
        load_minari_folder(str(tmp_path / "nowhere"))


@pytest.fixture(scope="module")
def ensemble_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble")
    cli = run_cli("--config", ENSEMBLE, "--trainer.max_steps=3", "--trainer.limit_val_batches=1",
                  "--data.init_args.num_transitions=2000", *QUIET, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    path = str(out / "ensemble.ckpt")
    cli.trainer.save_checkpoint(path)
    return path, {k: v.clone() for k, v in cli.model.state_dict().items()}


def test_chain_ensemble_checkpoint_to_policy(ensemble_checkpoint, tmp_path):
    path, ensemble_state = ensemble_checkpoint
    cli = run_cli("--config", POLICY, f"--model.init_args.init_from={path}", "--trainer.max_steps=4",
                  "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2",
                  "--data.init_args.num_transitions=2000", *QUIET, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    model = cli.model
    for key, value in ensemble_state.items():
        assert torch.equal(model.state_dict()[key], value), key       # every ensemble tensor came from stage 1
    assert model.ensemble.fitted and not any(p.requires_grad for p in model.ensemble.parameters())
    # one rollout step per training step; global_step counts the steps of both optimisers (critic, actor)
    assert int(model.buffer_count) == 2 * model.hparams.rollout_batch == cli.trainer.global_step // 2 * 32
    assert "eval/return" in cli.trainer.callback_metrics
    # the replay buffer and the rollout states are module state: a checkpoint carries them
    ckpt = tmp_path / "policy.ckpt"
    cli.trainer.save_checkpoint(ckpt)
    reloaded = OfflineModelBasedRL.load_from_checkpoint(ckpt)
    assert torch.equal(reloaded.buffer_obs, model.buffer_obs) and torch.equal(reloaded.rollout_obs, model.rollout_obs)


@pytest.mark.parametrize("target", ["mean", "mopo", "pmdb", "phyb"])
def test_every_belief_target_builds_valid_targets(ensemble_checkpoint, target):
    path, _ = ensemble_checkpoint
    model = OfflineModelBasedRL(ensemble_size=7, ensemble_hidden_dim=64, ensemble_hidden_layers=2,
                                termination="currency_exchange", belief_target=target, num_models=4, k_smallest=2,
                                next_state_samples=2, proposal_actions=3, hidden_dim=16, hidden_layers=1,
                                rollout_batch=8, model_buffer_size=16, init_from=path)
    model.load_initial_weights()
    out = model.rollout_step(torch.randn(10, 3) + torch.tensor([0.0, 100.0, 1.0]))
    torch.testing.assert_close(out["weights"].sum(-1), torch.ones(8))
    assert torch.isfinite(out["target"]).all()
    if target == "pmdb":
        assert ((out["weights"] == 0) | (out["weights"] == 1)).all()


def test_bad_input_is_one_clear_error(ensemble_checkpoint, tmp_path):
    path, _ = ensemble_checkpoint
    with pytest.raises(UserInputError, match="belief_target"):
        OfflineModelBasedRL(belief_target="median")
    with pytest.raises(UserInputError, match="k_smallest"):
        OfflineModelBasedRL(num_models=4, k_smallest=5)
    with pytest.raises(UserInputError, match="pmdb_k"):
        OfflineModelBasedRL(num_models=4, k_smallest=2, pmdb_k=6)
    # a dataset whose observation size (5) disagrees with the model and its ensemble checkpoint (3)
    np.savez(tmp_path / "d.npz", **_d4rl_arrays())
    data = ["--data.init_args.source=d4rl", f"--data.init_args.data_path={tmp_path / 'd.npz'}"]
    with pytest.raises(UserInputError, match="obs_dim is 5"):
        run_cli("fit", "--config", POLICY, f"--model.init_args.init_from={path}", *data, "--trainer.fast_dev_run=1",
                *QUIET)
    # the model sized for the data, but the ensemble checkpoint is not
    with pytest.raises(UserInputError, match="another size"):
        run_cli("fit", "--config", POLICY, f"--model.init_args.init_from={path}", *data,
                "--model.init_args.obs_dim=5", "--model.init_args.action_dim=2", "--trainer.fast_dev_run=1", *QUIET)
    # no ensemble at all
    with pytest.raises(UserInputError, match="untrained"):
        run_cli("fit", "--config", POLICY, "--model.init_args.init_from=null", "--trainer.fast_dev_run=1", *QUIET)


# ============================================================================================ a user's file
def _user_file(path, episodes: int = 8, steps: int = 25, action_bound: float = 1.0) -> list[str]:
    """A D4RL-style NPZ of a 2-D system (obs_dim 2, action_dim 1); the data overrides that read it."""
    rng = np.random.default_rng(0)
    n = episodes * steps
    timeouts = np.zeros(n, dtype=bool)
    timeouts[steps - 1::steps] = True
    np.savez(path, observations=rng.normal(size=(n, 2)), actions=rng.uniform(-action_bound, action_bound, (n, 1)),
             rewards=rng.normal(size=n), terminals=np.zeros(n, dtype=bool), timeouts=timeouts)
    return ["--data.init_args.source=d4rl", f"--data.init_args.data_path={path}", "--model.init_args.obs_dim=2",
            "--model.init_args.action_dim=1"]


def test_a_file_dataset_trains_both_stages_without_an_environment(tmp_path, caplog):
    data = _user_file(tmp_path / "mine.npz")
    steps = ["--trainer.max_steps=4", "--trainer.limit_val_batches=1", "--trainer.val_check_interval=2", *QUIET]
    # the quick configs' CurrencyExchange rule is refused on this data, in either stage, before any step
    currency = r"termination=currency_exchange .* \(source=d4rl, obs_dim=2\)"
    with pytest.raises(UserInputError, match=currency):
        run_cli("fit", "--config", ENSEMBLE, *data, *steps)
    with pytest.raises(UserInputError, match=r"termination=hopper .* 11-dimensional .* obs_dim=2"):
        run_cli("fit", "--config", ENSEMBLE, *data, "--model.init_args.termination=hopper", *steps)
    run_cli("fit", "--config", ENSEMBLE, *data, "--model.init_args.termination=none", *steps)
    with pytest.raises(UserInputError, match=currency):
        run_cli("fit", "--config", POLICY, *data, *steps)
    data.append("--model.init_args.termination=none")
    with caplog.at_level("INFO", logger="callbacks.offline_evaluation"):
        cli = run_cli("fit", "--config", POLICY, *data, *steps)
    assert cli.trainer.global_step == 4 and cli.trainer.datamodule.evaluation_environment is None
    assert "val/td_error" in cli.trainer.callback_metrics
    assert not [key for key in cli.trainer.callback_metrics if key.startswith("eval/")]
    assert [r for r in caplog.records if "no evaluation environment" in r.getMessage()]
    assert (tmp_path / "runs/phyb/checkpoints/quick/latest/best.ckpt").is_file()  # monitored val/td_error


def test_what_stage_two_needs_is_asked_for_at_the_start(tmp_path):
    data = [*_user_file(tmp_path / "mine.npz"), "--model.init_args.termination=none"]
    steps = ["--trainer.max_steps=2", "--trainer.limit_val_batches=1", *QUIET]
    run_cli("fit", "--config", ENSEMBLE, *data, *steps)
    # a checkpoint that monitors an eval/ metric (as the paper configs do) without an environment: refused in setup
    cli = run_cli("--config", POLICY, *data, *steps, run=False)
    cli.trainer.callbacks.append(ModelCheckpoint(dirpath=str(tmp_path), monitor="eval/normalized_score", mode="max"))
    with pytest.raises(UserInputError, match="monitors eval/normalized_score, which only the evaluation environment"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0
    # an environment that cannot be built (no gymnasium here, or an unknown id) stops the run before training
    cli = run_cli("--config", POLICY, *data, "--data.init_args.env_id=NoSuchEnv-v0", *steps, run=False)
    with pytest.raises(UserInputError, match="gymnasium"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0


def test_embedded_sources_refuse_env_id_and_files_refuse_unscaled_actions(tmp_path):
    with pytest.raises(UserInputError, match="env_id='Pendulum-v1' applies to file datasets"):
        OfflineRLDataModule(source="pendulum", env_id="Pendulum-v1")
    _user_file(tmp_path / "big.npz", action_bound=2.0)
    with pytest.raises(UserInputError, match=r"actions reach 1\.9\d*, outside \[-1, 1\]"):
        load_d4rl_file(str(tmp_path / "big.npz"))
