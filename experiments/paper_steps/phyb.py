"""PhyB's two paper configs on D4RL's ``hopper-medium-v2.hdf5``: the 100-member dynamics ensemble (stage 1) and the
offline actor-critic that starts from its checkpoint (stage 2).

The file is written as D4RL's own generator writes the MuJoCo v2 releases (``scripts/generation/mujoco/
collect_data.py`` of github.com/Farama-Foundation/D4RL): gzip-compressed HDF5 datasets ``observations`` (N x 11),
``next_observations`` (N x 11), ``actions`` (N x 3), ``rewards`` (N,) float32, ``terminals`` / ``timeouts`` (N,)
bool, ``infos/action_log_probs`` (N,), ``infos/qpos`` (N x 6), ``infos/qvel`` (N x 6) float32, and the behaviour
policy under ``metadata/`` (``algorithm`` b"SAC", ``iteration``, ``policy/{fc0,fc1,last_fc,last_fc_log_std}/{weight,
bias}`` of rlkit's 256-256 tanh-Gaussian policy, ``policy/nonlinearity``, ``policy/output_distribution``). The rows
are two episodes, as the generator lays them out: one that falls after 200 steps (``terminals`` on its last row, the
Hopper health check failing on its next state) and one that runs to the 1000-step time-out.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.paper_steps import Case

OBS_DIM, ACT_DIM, QPOS, QVEL, HIDDEN = 11, 3, 6, 6, 256      # Hopper-v2 and rlkit's SAC policy
FORMAT = ("D4RL hopper-medium-v2.hdf5 (gzip HDF5: observations/next_observations N x 11, actions N x 3 float32, "
          "rewards float32, terminals/timeouts bool, infos/{action_log_probs,qpos,qvel}, metadata/policy/*); "
          "1,200 rows: a 200-step terminated episode and a 1000-step timed-out one")


def hopper_episode(rng: np.random.Generator, length: int, falls: bool) -> dict[str, np.ndarray]:
    """One Hopper episode of ``length`` steps: ``(observations, next_observations, ...)`` with the next state of
    each row the observation of the next row (healthy: height > 0.7, |angle| < 0.2), and, when ``falls``, a last
    next state below the health threshold (the step D4RL marks ``terminals``)."""
    states = np.empty((length + 1, OBS_DIM))
    states[:, 0] = 1.25 + 0.05 * np.sin(np.arange(length + 1) / 7)            # torso height
    states[:, 1] = 0.05 * np.sin(np.arange(length + 1) / 11)                   # torso angle
    states[:, 2:5] = 0.3 * np.sin(np.arange(length + 1)[:, None] / 5 + np.arange(3))   # joint angles
    states[:, 5:] = rng.normal(0.0, 1.0, (length + 1, OBS_DIM - 5))            # velocities
    if falls:
        states[-1, 0], states[-1, 1] = 0.65, 0.3
    actions = np.tanh(rng.normal(0.0, 0.8, (length, ACT_DIM)))                  # tanh-Gaussian, inside (-1, 1)
    qpos = np.concatenate([np.cumsum(np.full(length, 0.008))[:, None], states[:-1, :5]], 1)   # x, then obs[:5]
    return {"observations": states[:-1], "next_observations": states[1:], "actions": actions,
            "rewards": 1.0 + states[1:, 5] * 0.1 + 2.0 - 1e-3 * (actions ** 2).sum(1),
            "terminals": np.arange(length) == length - 1 if falls else np.zeros(length, bool),
            "timeouts": np.zeros(length, bool) if falls else np.arange(length) == length - 1,
            "infos/action_log_probs": rng.normal(-1.0, 0.5, length), "infos/qpos": qpos,
            "infos/qvel": states[:-1, 5:]}


def d4rl_hopper_v2(path: Path, lengths: tuple[int, ...] = (200, 1000), seed: int = 0) -> Path:
    """``hopper-medium-v2.hdf5`` as D4RL's ``collect_data.py`` writes it (module docstring): episodes of ``lengths``
    steps, the first one terminated, the others timed out at their last step."""
    import h5py

    rng = np.random.default_rng(seed)
    episodes = [hopper_episode(rng, n, falls=i == 0) for i, n in enumerate(lengths)]
    data = {key: np.concatenate([e[key] for e in episodes]) for key in episodes[0]}
    dtypes = {"terminals": bool, "timeouts": bool}
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, value in data.items():
            f.create_dataset(key, data=value.astype(dtypes.get(key, np.float32)), compression="gzip")
        f["metadata/algorithm"] = np.bytes_("SAC")
        f["metadata/iteration"] = np.array([1000], dtype=np.int32)[0]
        f["metadata/policy/nonlinearity"] = np.bytes_("relu")
        f["metadata/policy/output_distribution"] = np.bytes_("tanh_gaussian")
        shapes = {"fc0": (HIDDEN, OBS_DIM), "fc1": (HIDDEN, HIDDEN), "last_fc": (ACT_DIM, HIDDEN),
                  "last_fc_log_std": (ACT_DIM, HIDDEN)}
        for layer, shape in shapes.items():
            f[f"metadata/policy/{layer}/weight"] = rng.normal(0, 0.05, shape).astype(np.float32)
            f[f"metadata/policy/{layer}/bias"] = np.zeros(shape[0], np.float32)
    return path


def hopper_medium(folder: Path) -> list[str]:
    """The config's ``data/d4rl/hopper-medium-v2.hdf5`` under ``folder`` (the run's working folder)."""
    path = d4rl_hopper_v2(folder / "data" / "d4rl" / "hopper-medium-v2.hdf5")
    return [f"--data.init_args.data_path={path}"]


def _checkpoint(filename: str, monitor: str = "") -> str:
    """One of the config's two ModelCheckpoint entries, as a YAML flow mapping (``monitor`` minimised if given)."""
    watch = f", monitor: {monitor}, mode: min" if monitor else ", save_on_train_epoch_end: true"
    return ("{class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {dirpath: "
            f"runs/phyb/checkpoints/paper, filename: {filename}{watch}, save_top_k: 1, "
            "enable_version_counter: false}}")


# Stage 2 without an evaluation environment: Hopper-v4 needs the optional gymnasium[mujoco], which the collection does
# not install; without ``env_id`` `OfflineEvaluation` skips itself, and the best checkpoint monitors the critic's
# held-out TD error (eval/normalized_score is then never logged). The config's other callbacks stay as they are.
NO_ENVIRONMENT = (
    "--data.init_args.env_id=null",
    "--trainer.callbacks=[{class_path: callbacks.prediction_writer.PredictionWriter}, "
    "{class_path: callbacks.offline_evaluation.OfflineEvaluation, init_args: {episodes: 10, seed: 12345, "
    f"deterministic: false}}}}, {_checkpoint('best', 'val/td_error')}, {_checkpoint('last')}]")
ENSEMBLE = "configs/phyb/ensemble_paper.yaml"
CASES = {
    ENSEMBLE: Case(hopper_medium, release_format=FORMAT, test_args=("--data.init_args.batch_size=64",)),
    "configs/phyb/paper.yaml": Case(optimizer_steps_per_batch=2, write=
        hopper_medium, args=NO_ENVIRONMENT, release_format=FORMAT, after=(ENSEMBLE,),
        test_args=("--data.init_args.batch_size=64", "--model.init_args.rollout_batch=64"),
        note="no evaluation environment (data.init_args.env_id unset: Hopper-v4 needs the optional gymnasium[mujoco]); "
             "the best checkpoint monitors val/td_error (min) instead of eval/normalized_score"),
}
