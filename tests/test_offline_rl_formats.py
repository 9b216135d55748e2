"""Offline RL release formats read as their official readers read them (`datamodules.offline_rl`).

D4RL files are written the way the D4RL releases store them ((N, 1) columns, v0 files without ``timeouts``,
``infos/`` and ``metadata/`` groups) and every expected array is worked out by hand from
``d4rl.qlearning_dataset`` (``d4rl/__init__.py``): the next state is the next row, a time-out row and the last row
are dropped, and without ``timeouts`` an episode ends when D4RL's step counter reaches ``max_episode_steps - 1``.
Minari folders are written as Minari's ``HDF5Storage`` writes ``data/main_data.hdf5`` (``episode_<i>`` groups; a
dictionary observation is a group of arrays). Last, the PhyB stage-2 check that the ensemble was fitted on the same
dataset, and the batch-shape guard of both PhyB modules.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import config_path, run_cli
from datamodules.offline_rl import (OfflineRLDataModule, d4rl_inferred_timeouts, load_d4rl_file,
                                    load_minari_folder)
from lightning_modules.phyb.dynamics_ensemble import DynamicsEnsemble, check_dataset_identity
from lightning_modules.shared.errors import UserInputError
from lightning_modules.phyb.phyb import OfflineModelBasedRL

h5py = pytest.importorskip("h5py")

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
ENSEMBLE, POLICY = config_path("configs/phyb/ensemble_quick.yaml"), config_path("configs/phyb/quick.yaml")


# ============================================================================================ D4RL files
def _release(n: int = 7) -> dict[str, np.ndarray]:
    """A D4RL-v2-like release: rewards, terminals and timeouts as (N, 1) columns, a terminal at row 2, a time-out
    at row 4, and stored next_observations that differ from the next row (obs + 100) so that using them shows."""
    obs = np.arange(2 * n, dtype=np.float64).reshape(n, 2)
    return {"observations": obs, "actions": 0.1 * np.arange(n, dtype=np.float64)[:, None],
            "rewards": (10.0 + np.arange(n))[:, None], "terminals": np.array([[0], [0], [1], [0], [0], [0], [0]], bool),
            "timeouts": np.array([[0], [0], [0], [0], [1], [0], [0]], bool), "next_observations": obs + 100.0}


def _write_hdf5(path, arrays: dict[str, np.ndarray]) -> str:
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)
        f.create_dataset("infos/qpos", data=np.zeros((len(arrays["observations"]), 3)))  # ignored, as by D4RL
        f.create_dataset("metadata/algorithm", data="SAC")
    return str(path)


def test_column_shaped_hdf5_release_is_read_as_qlearning_dataset(tmp_path):
    arrays = _release()
    path = _write_hdf5(tmp_path / "hopper-medium-v2.hdf5", arrays)
    data = load_d4rl_file(path)
    # d4rl.qlearning_dataset visits rows 0..5 and skips the time-out row 4: rows 0, 1, 2, 3, 5
    kept = [0, 1, 2, 3, 5]
    np.testing.assert_array_equal(data["obs"], arrays["observations"][kept])
    np.testing.assert_array_equal(data["next_obs"], arrays["observations"][[1, 2, 3, 4, 6]])  # the next row
    np.testing.assert_array_equal(data["rew"], [10.0, 11.0, 12.0, 13.0, 15.0])
    np.testing.assert_array_equal(data["done"], [0.0, 0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(data["act"], [[0.0], [0.1], [0.2], [0.3], [0.5]], rtol=1e-6)
    assert data["rew"].shape == (5,) and data["done"].shape == (5,)  # flattened, as get_dataset does


def test_keep_timeouts_keeps_every_row_with_the_stored_next_observations(tmp_path):
    arrays = _release()
    path = _write_hdf5(tmp_path / "d.hdf5", arrays)
    data = load_d4rl_file(path, keep_timeouts=True)
    np.testing.assert_array_equal(data["obs"], arrays["observations"])
    np.testing.assert_array_equal(data["next_obs"], arrays["observations"] + 100.0)
    np.testing.assert_array_equal(data["done"], [0, 0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(data["rew"], 10.0 + np.arange(7))
    del arrays["next_observations"]
    with pytest.raises(UserInputError, match="keep_timeouts=true needs them"):
        load_d4rl_file(_write_hdf5(tmp_path / "no_next.hdf5", arrays), keep_timeouts=True)


def test_npz_with_timeouts_in_the_middle_through_the_datamodule(tmp_path):
    arrays = _release()
    arrays["rewards"] = arrays["rewards"][:, 0]  # one (N,) and one (N, 1) column in the same file
    np.savez(tmp_path / "d.npz", **arrays)
    datamodule = OfflineRLDataModule(source="d4rl", data_path=str(tmp_path / "d.npz"), val_fraction=0.2,
                                     batch_size=2, steps_per_epoch=3)
    data = datamodule.load()
    np.testing.assert_array_equal(data["obs"], arrays["observations"][[0, 1, 2, 3, 5]])
    np.testing.assert_array_equal(data["done"], [0, 0, 1, 0, 0])
    datamodule.setup("fit")
    assert (datamodule.obs_dim, datamodule.action_dim) == (2, 1)
    assert len(datamodule.splits["train"]["obs"]) + len(datamodule.splits["val"]["obs"]) == 5
    for batch in datamodule.train_dataloader():
        assert batch["rew"].shape == (2,) and batch["done"].shape == (2,) and batch["obs"].shape == (2, 2)


def test_v0_release_without_timeouts_uses_the_episode_length_like_d4rl(tmp_path):
    n = 8
    obs = np.arange(n, dtype=np.float64)[:, None] * np.ones((1, 3))
    arrays = {"observations": obs, "actions": np.zeros((n, 1)), "rewards": np.arange(n, dtype=np.float64)[:, None],
              "terminals": np.array([0, 1, 0, 0, 0, 0, 0, 0], bool)[:, None]}
    path = _write_hdf5(tmp_path / "hopper-medium-v0.hdf5", arrays)
    with pytest.raises(UserInputError, match="no 'timeouts'.*set data.init_args.max_episode_steps"):
        load_d4rl_file(path)
    # D4RL's counter with _max_episode_steps = 3: row 0 (step 0), row 1 (step 1, terminal: the counter resets to 0
    # and is then incremented), row 2 (step 1), row 3 (step 2 = final: dropped, reset to 0), rows 4, 5 (steps 0, 1),
    # row 6 (step 2: dropped); row 7 has no next row.
    data = load_d4rl_file(path, max_episode_steps=3)
    np.testing.assert_array_equal(data["obs"][:, 0], [0, 1, 2, 4, 5])
    np.testing.assert_array_equal(data["next_obs"][:, 0], [1, 2, 3, 5, 6])
    np.testing.assert_array_equal(data["rew"], [0, 1, 2, 4, 5])
    np.testing.assert_array_equal(data["done"], [0, 1, 0, 0, 0])
    datamodule = OfflineRLDataModule(source="d4rl", data_path=path, max_episode_steps=3, val_fraction=0.2)
    np.testing.assert_array_equal(datamodule.load()["rew"], [0, 1, 2, 4, 5])
    # a file with timeouts ignores max_episode_steps (D4RL reads the file's time-outs)
    with_timeouts = _write_hdf5(tmp_path / "v2.hdf5", _release())
    np.testing.assert_array_equal(load_d4rl_file(with_timeouts, max_episode_steps=2)["rew"],
                                  load_d4rl_file(with_timeouts)["rew"])


def _d4rl_kept_rows(terminals: np.ndarray, max_episode_steps: int) -> list[int]:
    """The rows d4rl.qlearning_dataset keeps for a file without timeouts (its per-row loop, restated)."""
    kept, step = [], 0
    for i in range(len(terminals) - 1):
        if step == max_episode_steps - 1:
            step = 0
            continue
        if terminals[i]:
            step = 0
        kept.append(i)
        step += 1
    return kept


def test_inferred_timeouts_equal_d4rls_loop_on_random_episodes():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n, length = int(rng.integers(1, 60)), int(rng.integers(1, 9))
        terminals = rng.random(n) < rng.uniform(0.0, 0.4)
        keep = ~d4rl_inferred_timeouts(terminals, length)
        keep[-1] = False
        assert np.flatnonzero(keep).tolist() == _d4rl_kept_rows(terminals, length), (terminals, length)


def test_malformed_d4rl_columns_are_one_clear_error(tmp_path):
    arrays = _release()
    np.savez(tmp_path / "wide.npz", **{**arrays, "terminals": np.zeros((7, 2))})
    with pytest.raises(UserInputError, match=r"'terminals' has shape \(7, 2\).*expected \(7,\) or \(7, 1\)"):
        load_d4rl_file(str(tmp_path / "wide.npz"))
    np.savez(tmp_path / "flat_obs.npz", **{**arrays, "observations": np.zeros(7)})
    with pytest.raises(UserInputError, match="expected \\(N, obs_dim\\)"):
        load_d4rl_file(str(tmp_path / "flat_obs.npz"))
    np.savez(tmp_path / "no_actions.npz", **{k: v for k, v in arrays.items() if k != "actions"})
    with pytest.raises(UserInputError, match=r"lacks the D4RL key\(s\) \['actions'\]"):
        load_d4rl_file(str(tmp_path / "no_actions.npz"))
    with pytest.raises(UserInputError, match="max_episode_steps and keep_timeouts apply to source=d4rl"):
        OfflineRLDataModule(source="pendulum", max_episode_steps=200)
    with pytest.raises(UserInputError, match="max_episode_steps=0"):
        OfflineRLDataModule(source="d4rl", data_path="x.hdf5", max_episode_steps=0)
    with pytest.raises(UserInputError, match="observation_keys"):
        OfflineRLDataModule(source="d4rl", data_path="x.hdf5", observation_keys=["observation"])


# ============================================================================================ Minari folders
def _minari_episode(f, index: int, steps: int, rng, observation=None):
    """One episode group as Minari's HDF5Storage writes it (a dictionary observation is a group of arrays)."""
    group = f.create_group(f"episode_{index}")
    group.attrs.update({"id": index, "total_steps": steps, "seed": index})
    if observation is None:
        observation = {"observation": rng.normal(size=(steps + 1, 4)),
                       "achieved_goal": rng.normal(size=(steps + 1, 2)),
                       "desired_goal": rng.normal(size=(steps + 1, 2))}
    obs_group = group.create_group("observations", track_order=True)  # stored in this (unsorted) order
    for key, value in observation.items():
        obs_group.create_dataset(key, data=value)
    group.create_dataset("actions", data=rng.uniform(-1, 1, (steps, 2)))
    group.create_dataset("rewards", data=np.arange(steps, dtype=np.float64) + 10 * index)
    group.create_dataset("terminations", data=np.eye(steps, dtype=bool)[-1] if index == 0 else np.zeros(steps, bool))
    group.create_dataset("truncations", data=np.zeros(steps, bool) if index == 0 else np.eye(steps, dtype=bool)[-1])
    group.create_dataset("infos/success", data=np.zeros(steps + 1, bool))
    return observation, group["actions"][()]


def _minari_folder(root, episodes):
    (root / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    with h5py.File(root / "data" / "main_data.hdf5", "w", track_order=True) as f:
        return [_minari_episode(f, i, steps, rng, obs) for i, (steps, obs) in enumerate(episodes)]


def test_minari_dictionary_observations_are_flattened_in_sorted_key_order(tmp_path):
    written = _minari_folder(tmp_path / "umaze-v2", [(3, None), (2, None)])
    data = load_minari_folder(str(tmp_path / "umaze-v2"))
    flat = [np.concatenate([o["achieved_goal"], o["desired_goal"], o["observation"]], 1) for o, _ in written]
    np.testing.assert_allclose(data["obs"], np.concatenate([f[:-1] for f in flat]), rtol=1e-6)
    np.testing.assert_allclose(data["next_obs"], np.concatenate([f[1:] for f in flat]), rtol=1e-6)
    np.testing.assert_allclose(data["act"], np.concatenate([a for _, a in written]), rtol=1e-6)
    np.testing.assert_array_equal(data["rew"], [0, 1, 2, 10, 11])
    np.testing.assert_array_equal(data["done"], [0, 0, 1, 0, 0])  # terminations only; the truncation is kept
    # the user's keys, in the user's order
    data = load_minari_folder(str(tmp_path / "umaze-v2"), ["observation", "desired_goal"])
    expected = [np.concatenate([o["observation"], o["desired_goal"]], 1)[:-1] for o, _ in written]
    np.testing.assert_allclose(data["obs"], np.concatenate(expected), rtol=1e-6)
    datamodule = OfflineRLDataModule(source="minari", data_path=str(tmp_path / "umaze-v2"), val_fraction=0.2,
                                     observation_keys=["observation"])
    datamodule.setup("fit")
    assert (datamodule.obs_dim, datamodule.action_dim) == (4, 2)
    assert datamodule.dataset_identity == {"source": "minari", "dataset": "umaze-v2",
                                           "observation_keys": ["observation"], "obs_dim": 4, "action_dim": 2}
    with pytest.raises(UserInputError, match="has no array 'goal'"):
        load_minari_folder(str(tmp_path / "umaze-v2"), ["observation", "goal"])


def test_minari_other_nested_layouts_are_one_clear_error(tmp_path):
    rng = np.random.default_rng(1)
    nested = {"observation/qpos": rng.normal(size=(3, 2)), "observation/qvel": rng.normal(size=(3, 2)),
              "desired_goal": rng.normal(size=(3, 2))}
    _minari_folder(tmp_path / "nested", [(2, nested)])
    with pytest.raises(UserInputError, match=r"holding the groups \['observation'\].*observation_keys"):
        load_minari_folder(str(tmp_path / "nested"))
    data = load_minari_folder(str(tmp_path / "nested"), ["observation/qvel", "desired_goal"])
    np.testing.assert_allclose(data["obs"], np.concatenate([nested["observation/qvel"], nested["desired_goal"]], 1)[:2],
                               rtol=1e-6)
    _minari_folder(tmp_path / "tuple", [(2, {"_index_0": np.zeros((3, 1)), "_index_1": np.ones((3, 2))})])
    with pytest.raises(UserInputError, match="tuple observation"):
        load_minari_folder(str(tmp_path / "tuple"))
    _minari_folder(tmp_path / "flat", [])
    with h5py.File(tmp_path / "flat" / "data" / "main_data.hdf5", "a") as f:
        group = f.create_group("episode_0")
        group["observations"], group["actions"] = np.zeros((3, 2)), np.zeros((2, 1))
        group["rewards"], group["terminations"] = np.zeros(2), np.zeros(2, bool)
    assert load_minari_folder(str(tmp_path / "flat"))["obs"].shape == (2, 2)
    with pytest.raises(UserInputError, match="is an array, not a dictionary"):
        load_minari_folder(str(tmp_path / "flat"), ["observation"])


# ============================================================================================ PhyB stages
def test_dataset_identity_compares_names_and_known_sizes():
    recorded = {"source": "d4rl", "dataset": "hopper-medium-v2.hdf5", "observation_keys": None, "obs_dim": 11,
                "action_dim": 3}
    moved = OfflineRLDataModule(source="d4rl", data_path="/elsewhere/hopper-medium-v2.hdf5").dataset_identity
    check_dataset_identity(recorded, moved, "e.ckpt")  # another directory, sizes not known yet: the same dataset
    check_dataset_identity(None, moved, "e.ckpt")  # a checkpoint that records nothing is not checked
    other = OfflineRLDataModule(source="d4rl", data_path="hopper-medium-replay-v2.hdf5").dataset_identity
    with pytest.raises(UserInputError, match="fitted on d4rl:hopper-medium-v2.hdf5 .* the data is "
                                             "d4rl:hopper-medium-replay-v2.hdf5"):
        check_dataset_identity(recorded, other, "e.ckpt")
    with pytest.raises(UserInputError, match="obs_dim=12"):
        check_dataset_identity(recorded, {**recorded, "obs_dim": 12}, "e.ckpt")


@pytest.fixture(scope="module")
def currency_ensemble(tmp_path_factory):
    cli = run_cli("--config", ENSEMBLE, "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                  "--data.init_args.num_transitions=1000", *QUIET, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    path = str(tmp_path_factory.mktemp("ensemble") / "ensemble.ckpt")
    cli.trainer.save_checkpoint(path)
    return path


def test_stage_one_records_the_dataset_and_stage_two_refuses_another(currency_ensemble):
    recorded = torch.load(currency_ensemble, map_location="cpu", weights_only=True)["offline_rl_dataset"]
    assert recorded == {"source": "currency_exchange", "dataset": "random", "observation_keys": None, "obs_dim": 3,
                        "action_dim": 1}
    pendulum = ["--data.init_args.source=pendulum", "--data.init_args.num_transitions=1000"]
    # Pendulum has CurrencyExchange's sizes (3, 1): only the recorded dataset tells them apart
    with pytest.raises(UserInputError, match=r"fitted on currency_exchange:random \(obs_dim=3, action_dim=1\) but "
                                             r"the data is pendulum:random"):
        run_cli("fit", "--config", POLICY, f"--model.init_args.init_from={currency_ensemble}", *pendulum,
                "--trainer.fast_dev_run=1", *QUIET)
    # the override is the user's statement that it is the same data: the fit runs
    cli = run_cli("fit", "--config", POLICY, f"--model.init_args.init_from={currency_ensemble}", *pendulum,
                  "--model.init_args.allow_other_dataset=true", "--model.init_args.termination=none",
                  "--trainer.fast_dev_run=1", *QUIET)
    assert cli.model.dataset_identity["source"] == "pendulum"


def _batch(size: int = 4, obs_dim: int = 3, action_dim: int = 1) -> dict[str, torch.Tensor]:
    return {"obs": torch.randn(size, obs_dim), "act": torch.rand(size, action_dim) * 2 - 1, "rew": torch.randn(size),
            "next_obs": torch.randn(size, obs_dim), "done": torch.zeros(size)}


def test_column_shaped_rewards_or_done_in_a_batch_are_an_error_not_a_broadcast():
    ensemble = DynamicsEnsemble(ensemble_size=2, num_elites=1, hidden_dim=8, hidden_layers=1)
    assert torch.isfinite(ensemble.training_step(_batch(), 0))  # the right shapes pass
    with pytest.raises(UserInputError, match=r"'rew' has shape \[4, 1\], expected \[B\] with B = 4"):
        ensemble.training_step({**_batch(), "rew": torch.randn(4, 1)}, 0)
    policy = OfflineModelBasedRL(ensemble_size=2, ensemble_hidden_dim=8, ensemble_hidden_layers=1, num_models=2,
                                 k_smallest=1, pmdb_k=1, hidden_dim=8, hidden_layers=1, rollout_batch=4,
                                 model_buffer_size=8)
    with pytest.raises(UserInputError, match=r"'done' has shape \[4, 1\]"):
        policy.training_step({**_batch(), "done": torch.zeros(4, 1)}, 0)
    with pytest.raises(UserInputError, match=r"'rew' has shape \[4, 1\]"):
        policy.validation_step({**_batch(), "rew": torch.zeros(4, 1)}, 0)
