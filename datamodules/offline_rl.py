"""Offline reinforcement-learning data: embedded environments, seeded behaviour datasets and local D4RL/Minari files.

* `CurrencyExchangeEnv`: the CurrencyExchange task of the PhyB/PMDB code re-implemented in numpy with its exact
  dynamics (state (t, money, price); action in [-1, 1] clipped to [0, 1] = the fraction of the money exchanged;
  reward = exchanged amount x price; price ``p' = clip(p + 0.05 (1.5 - p) + 0.2 xi, 0, 5)``; start money 100,
  ``p0 ~ N(1, 0.05)``; terminal when ``t' >= 20`` or ``money' < 0.1``).
* `PendulumEnv`: gymnasium's ``Pendulum-v1`` re-implemented in numpy (g = 10, m = l = 1, dt = 0.05, max speed 8,
  max torque 2, 200 steps, reward ``-(angle^2 + 0.1 thdot^2 + 0.001 u^2)``): a few exact lines, so the collection
  needs no gymnasium dependency. Actions are in [-1, 1] and scaled by 2 (the torque limit).
* Both are vectorised over episodes (``reset(n, rng)``, ``step(actions)``): no Python loop over episodes.
* Behaviour datasets, generated deterministically from ``seed`` (and cached per process): ``random`` (uniform
  actions) and ``medium`` (Pendulum: a noisy energy-pumping swing-up controller, with random actions half of the time;
  it reaches roughly half of the gap between random and expert returns, a stand-in for D4RL's half-trained SAC).
* Local files (nothing is downloaded), read as their official readers do:

  - ``d4rl``: an HDF5 (``.hdf5``/``.h5``) or NPZ file with the D4RL keys ``observations, actions, rewards,
    terminals[, timeouts, next_observations]``. Rewards, terminals and time-outs stored as ``(N, 1)`` are flattened
    as ``d4rl.offline_env.OfflineEnv.get_dataset`` does. By default the transitions are exactly those of
    ``d4rl.qlearning_dataset(env, terminate_on_end=False)`` (``d4rl/__init__.py``): the next state is the next row
    (stored ``next_observations`` are ignored, as there), a row at a time-out is dropped and so is the last row.
    Files without ``timeouts`` (the v0 releases) are read like D4RL reads them: the time-outs are inferred from the
    environment's episode length (``max_episode_steps``, required for such files), with D4RL's own step counter
    (`d4rl_inferred_timeouts`; after a terminal row it restarts at 1, so the next inferred time-out comes one row
    early, kept for equal arrays). ``keep_timeouts=True`` keeps every row with the stored ``next_observations``
    instead (a time-out step then is an ordinary transition bootstrapped from its true successor, and terminal rows
    get their true last state). What changes for users: files with ``next_observations`` (the v2 releases) used to be
    read that way; the default now drops their time-out rows (one per timed-out episode) and the last row, and takes
    the next row as the successor of a terminal row, as D4RL does; ``keep_timeouts=True`` restores the old reading.
  - ``minari``: a local Minari dataset folder (``data/main_data.hdf5`` with ``episode_<i>`` groups, as Minari's
    ``HDF5Storage`` writes them). Every step is a transition (Minari stores T + 1 observations per episode, so
    truncated steps have their true successor). A dictionary observation (an HDF5 group, e.g. the point-maze and
    ant-maze ports: ``achieved_goal``, ``desired_goal``, ``observation``) is flattened by concatenating its arrays
    in sorted key order (``gymnasium.spaces.flatten``'s order for a Dict space) or in the order of
    ``observation_keys``; nested groups and tuple observations need ``observation_keys``.

  Evaluation in MuJoCo needs the optional ``gymnasium[mujoco]``; without it `make_env` raises a clear message.

File actions must lie in [-1, 1] (the policy is tanh-squashed; a file with larger actions is refused). A file dataset
without ``env_id`` trains without an environment (`OfflineRLDataModule.evaluation_environment` is None).

Batches are dicts ``obs, act, rew, next_obs, done`` (float32; ``rew`` and ``done`` of shape [B]; ``done`` = true
termination, not a time-out). `OfflineRLDataModule.dataset_identity` names the dataset (the PhyB stages compare it).
"""
from __future__ import annotations

import functools
import logging
import os
import zipfile

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, RandomSampler

from lightning_modules.shared.errors import UserInputError, one_line

D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")
SOURCES = ("currency_exchange", "pendulum", "d4rl", "minari")
log = logging.getLogger(__name__)


class CurrencyExchangeEnv:
    """Vectorised CurrencyExchange (the official code's dynamics); states (t, money, price)."""

    obs_dim, action_dim, horizon = 3, 1, 20

    def reset(self, n: int, rng: np.random.Generator) -> np.ndarray:
        self.rng = rng
        self.state = np.stack([np.zeros(n), np.full(n, 100.0), rng.normal(1.0, 0.05, n)], axis=1)
        return self.state.copy()

    def step(self, action: np.ndarray):
        t, money, price = self.state.T
        amount = money * np.clip(action[:, 0], 0.0, 1.0)
        reward = amount * price
        price_next = np.clip(price + 0.05 * (1.5 - price) + 0.2 * self.rng.standard_normal(len(price)), 0.0, 5.0)
        self.state = np.stack([t + 1, money - amount, price_next], axis=1)
        terminal = (t + 1 >= self.horizon) | (money - amount < 0.1)
        return self.state.copy(), reward, terminal, np.zeros_like(terminal)


class PendulumEnv:
    """Vectorised gymnasium Pendulum-v1 (exact dynamics); observations (cos th, sin th, thdot)."""

    obs_dim, action_dim, horizon = 3, 1, 200

    def reset(self, n: int, rng: np.random.Generator) -> np.ndarray:
        self.rng, self.t = rng, 0
        self.th, self.thdot = rng.uniform(-np.pi, np.pi, n), rng.uniform(-1.0, 1.0, n)
        return self._obs()

    def _obs(self) -> np.ndarray:
        return np.stack([np.cos(self.th), np.sin(self.th), self.thdot], axis=1)

    def step(self, action: np.ndarray):
        u = 2.0 * np.clip(action[:, 0], -1.0, 1.0)
        angle = ((self.th + np.pi) % (2 * np.pi)) - np.pi
        reward = -(angle ** 2 + 0.1 * self.thdot ** 2 + 0.001 * u ** 2)
        self.thdot = np.clip(self.thdot + (3 * 10.0 / 2 * np.sin(self.th) + 3.0 * u) * 0.05, -8.0, 8.0)
        self.th = self.th + self.thdot * 0.05
        self.t += 1
        timeout = np.full(len(u), self.t >= self.horizon)
        return self._obs(), reward, np.zeros(len(u), dtype=bool), timeout


ENVS = {"currency_exchange": CurrencyExchangeEnv, "pendulum": PendulumEnv}


def behaviour_action(source: str, behaviour: str, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The behaviour policy's actions in [-1, 1] (vectorised over states)."""
    n = len(obs)
    random = rng.uniform(-1.0, 1.0, (n, 1))
    if behaviour == "random":
        return random
    if source != "pendulum":
        raise UserInputError(f"behaviour='{behaviour}' exists only for source=pendulum; use behaviour=random.")
    cos, sin, thdot = obs.T
    angle = np.arctan2(sin, cos)
    near_top = cos > 0.8
    energy = 0.5 * thdot ** 2 + 15.0 * cos  # 15 = the energy of resting upright (thdot' = 15 sin th + 3 u)
    swing = np.sign(thdot + 1e-6) * np.where(energy < 15.0, 1.0, -0.5)  # pump energy up to the upright level
    balance = np.clip(-(10.0 * angle + 2.0 * thdot) / 2.0, -1.0, 1.0)
    controller = np.where(near_top, balance, swing) + rng.normal(0.0, 0.3, n)
    return np.where(rng.random((n, 1)) < 0.5, random, np.clip(controller, -1.0, 1.0)[:, None])


@functools.lru_cache(maxsize=8)
def generate_dataset(source: str, behaviour: str, num_transitions: int, seed: int) -> dict[str, np.ndarray]:
    """Roll out the behaviour policy in the embedded environment (episodes in parallel) until `num_transitions`."""
    env = ENVS[source]()
    rng = np.random.default_rng(seed)
    rows, returns, total = [], [], 0
    while total < num_transitions:  # batches of parallel episodes (episodes may end early)
        episodes = -(-(num_transitions - total) // env.horizon)
        obs = env.reset(episodes, rng)
        alive = np.ones(episodes, dtype=bool)
        episode_return = np.zeros(episodes)
        for _ in range(env.horizon):  # a loop over time steps; every episode advances at once
            act = behaviour_action(source, behaviour, obs, rng)
            next_obs, rew, term, timeout = env.step(act)
            rows.append((obs[alive], act[alive], rew[alive], next_obs[alive], term[alive]))
            total += int(alive.sum())
            episode_return += np.where(alive, rew, 0.0)
            alive &= ~term & ~timeout
            obs = next_obs
            if not alive.any():
                break
        returns.append(episode_return)
    data = {key: np.concatenate(part).astype(np.float32)[:num_transitions] for key, part in
            zip(("obs", "act", "rew", "next_obs", "done"), zip(*rows))}
    data["behaviour_return"] = np.array(np.concatenate(returns).mean(), dtype=np.float32)
    return data


def _check(data: dict[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
    n = len(data["obs"])
    for key, value in data.items():
        if len(value) != n:
            raise UserInputError(f"{path}: '{key}' has {len(value)} rows but observations have {n}; "
                                 "every array must have one row per transition.")
        if not np.isfinite(value).all():
            raise UserInputError(f"{path}: '{key}' contains NaN or infinite values; clean the dataset first.")
    if n == 0:
        raise UserInputError(f"{path}: the dataset holds no transitions.")
    data["act"] = data["act"].reshape(n, -1)
    largest = float(np.abs(data["act"]).max())
    if largest > 1.0 + 1e-6:
        raise UserInputError(f"{path}: actions reach {largest:g}, outside [-1, 1]: the policy is tanh-squashed (D4RL's "
                             "MuJoCo actions lie in [-1, 1]); divide the actions by your action bound first.")
    return data


def _column(raw: dict[str, np.ndarray], key: str, n: int, path: str) -> np.ndarray:
    """One value per row: ``(N,)``, or ``(N, 1)`` flattened as ``d4rl.offline_env.OfflineEnv.get_dataset`` does
    for rewards and terminals (``qlearning_dataset`` reads ``timeouts[i]`` per row: ``(N, 1)`` time-outs read alike)."""
    value = np.asarray(raw[key])
    if value.shape == (n, 1):
        return value[:, 0]
    if value.shape != (n,):
        raise UserInputError(f"{path}: '{key}' has shape {value.shape} but {n} observation rows; expected ({n},) "
                             f"or ({n}, 1), one value per row.")
    return value


def d4rl_inferred_timeouts(terminals: np.ndarray, max_episode_steps: int) -> np.ndarray:
    """The rows ``d4rl.qlearning_dataset`` treats as time-outs when a file has no ``timeouts`` (the v0 releases):
    its ``episode_step`` counter over rows 0..N-2, final when it reaches ``max_episode_steps - 1``; it restarts at 0
    after a dropped final step and, as D4RL's loop increments it after the reset, at 1 after a terminal row.
    One iteration per episode, not per row."""
    n = len(terminals)
    final = np.zeros(n, dtype=bool)
    ends = np.flatnonzero(terminals[:n - 1])
    pos, step = 0, 0
    while pos < n - 1:
        k = int(np.searchsorted(ends, pos))
        terminal_at = int(ends[k]) if k < len(ends) else n
        final_at = pos + max_episode_steps - 1 - step if step <= max_episode_steps - 1 else n
        if final_at <= terminal_at and final_at < n - 1:  # the final step wins over a terminal on the same row
            final[final_at] = True
            pos, step = final_at + 1, 0
        elif terminal_at < n - 1:
            pos, step = terminal_at + 1, 1
        else:
            break
    return final


def qlearning_arrays(raw: dict[str, np.ndarray], path: str, max_episode_steps: int | None = None,
                     keep_timeouts: bool = False) -> dict[str, np.ndarray]:
    """D4RL arrays -> transitions.

    ``keep_timeouts=False``: exactly ``d4rl.qlearning_dataset(env, dataset, terminate_on_end=False)``: the next state
    is the next row (stored ``next_observations`` are ignored, as D4RL does), the rows at a time-out and the last row
    are dropped; without ``timeouts`` the time-outs are inferred from ``max_episode_steps`` (`d4rl_inferred_timeouts`).
    ``keep_timeouts=True``: every row, with the stored ``next_observations`` as next state (required)."""
    missing = [key for key in D4RL_KEYS if key != "timeouts" and key not in raw]
    if missing:
        raise UserInputError(f"{path} lacks the D4RL key(s) {missing}; expected {list(D4RL_KEYS)} "
                             "(timeouts and next_observations optional).")
    obs = np.asarray(raw["observations"])
    if obs.ndim != 2:
        raise UserInputError(f"{path}: 'observations' has shape {obs.shape}; expected (N, obs_dim).")
    n = len(obs)
    actions = np.asarray(raw["actions"])
    if len(actions) != n:
        raise UserInputError(f"{path}: 'actions' has {len(actions)} rows but observations have {n}.")
    rewards, terminals = _column(raw, "rewards", n, path), _column(raw, "terminals", n, path).astype(bool)
    if "next_observations" in raw and np.shape(raw["next_observations"]) != obs.shape:
        raise UserInputError(f"{path}: 'next_observations' has shape {np.shape(raw['next_observations'])} but "
                             f"observations have {obs.shape}.")
    if keep_timeouts:
        if "next_observations" not in raw:
            raise UserInputError(f"{path} has no 'next_observations': keep_timeouts=true needs them (the next row "
                                 "of a time-out step is the next episode's start); set data.init_args.keep_timeouts="
                                 "false.")
        keep, next_obs = np.ones(n, dtype=bool), np.asarray(raw["next_observations"])
    else:
        if "timeouts" in raw:
            final = _column(raw, "timeouts", n, path).astype(bool)
        elif max_episode_steps is None:
            raise UserInputError(f"{path} has no 'timeouts' (a D4RL v0 release): D4RL then ends an episode after the "
                                 "environment's max_episode_steps; set data.init_args.max_episode_steps (1000 for the "
                                 "MuJoCo locomotion tasks).")
        else:
            final = d4rl_inferred_timeouts(terminals, max_episode_steps)
        if "timeouts" in raw and max_episode_steps is not None:
            log.warning("%s has timeouts: max_episode_steps=%d is not used (D4RL reads the file's time-outs).", path,
                        max_episode_steps)
        keep = ~final
        keep[-1] = False  # D4RL's loop stops before the last row: it has no next row
        next_obs = np.concatenate([obs[1:], obs[-1:]])
    data = {"obs": obs[keep], "act": actions[keep], "rew": rewards[keep], "next_obs": next_obs[keep],
            "done": terminals[keep]}
    return _check({k: np.asarray(v, dtype=np.float32) for k, v in data.items()}, path)


def _h5py():
    try:
        import h5py
    except ImportError:
        raise UserInputError("reading HDF5 datasets needs h5py: `pip install h5py` (or convert the file to .npz).") \
            from None
    return h5py


def _open_hdf5(h5py, path: str):
    """An HDF5 file opened for reading; a file of another format (or a truncated one) is a `UserInputError`."""
    try:
        return h5py.File(path, "r")
    except OSError as err:  # h5py: "Unable to open file (file signature not found)"
        raise UserInputError(f"'{path}' is not a readable HDF5 file ({one_line(err)}); give the dataset's own "
                             ".hdf5 file, re-copied if it was truncated.") from None


def load_d4rl_file(path: str, max_episode_steps: int | None = None,
                   keep_timeouts: bool = False) -> dict[str, np.ndarray]:
    """A D4RL ``.hdf5``/``.h5`` or ``.npz`` file read with `qlearning_arrays` (only the D4RL keys are read; groups
    such as ``infos/`` and ``metadata/`` are ignored)."""
    if not os.path.isfile(path):
        raise UserInputError(f"data_path '{path}' does not exist; give a D4RL .hdf5/.h5 or .npz file.")
    keys = (*D4RL_KEYS, "next_observations")
    if path.endswith(".npz"):
        try:
            archive = np.load(path, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):  # an .npy array saved under an .npz name
                raise UserInputError(f"data_path '{path}' is a single .npy array, not an .npz archive of the "
                                     f"D4RL keys {list(D4RL_KEYS)}; save the arrays with numpy.savez.")
            with archive as f:
                raw = {key: f[key] for key in keys if key in f.files}
        except UserInputError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:  # numpy's "pickled data", a bad zip
            raise UserInputError(f"data_path '{path}' is not a readable .npz archive ({type(err).__name__}: "
                                 f"{one_line(err)}). Give a D4RL .hdf5/.h5 file or an .npz written by numpy.savez "
                                 "with numeric arrays (object arrays are refused).") from None
    elif path.endswith((".hdf5", ".h5")):
        h5py = _h5py()
        with _open_hdf5(h5py, path) as f:
            raw = {}
            for key in keys:
                if key in f:
                    if not isinstance(f[key], h5py.Dataset):
                        raise UserInputError(f"{path}: '{key}' is an HDF5 group; D4RL stores it as one array.")
                    raw[key] = f[key][()]
    else:
        raise UserInputError(f"data_path '{path}': unknown extension; expected .hdf5, .h5 or .npz.")
    return qlearning_arrays(raw, path, max_episode_steps, keep_timeouts)


def _minari_observations(node, where: str, keys: list[str] | None, h5py) -> np.ndarray:
    """An episode's observations: an array, or a dictionary observation (an HDF5 group, as Minari writes a
    ``gymnasium.spaces.Dict``) flattened to ``[T + 1, sum of sizes]`` over its keys in sorted order (the order of
    ``gymnasium.spaces.flatten`` for a Dict space built from a dict) or in the order of ``keys``."""
    if isinstance(node, h5py.Dataset):
        if keys is not None:
            raise UserInputError(f"{where} is an array, not a dictionary: observation_keys applies only to dictionary "
                                 "observations; set data.init_args.observation_keys=null.")
        value = node[()]
        return value.reshape(len(value), -1)
    if keys is None:
        keys = sorted(node.keys())
        nested = [key for key in keys if not isinstance(node[key], h5py.Dataset)]
        if nested or not keys:
            held = f"the groups {nested}" if nested else "nothing"
            raise UserInputError(f"{where} is a group holding {held}: only a dictionary of arrays is flattened "
                                 "automatically; name the arrays to concatenate with data.init_args.observation_keys "
                                 "(paths inside the group, like 'a/b').")
        if all(key.startswith("_index_") for key in keys):
            raise UserInputError(f"{where} holds a tuple observation (_index_<i> arrays), not a dictionary; name the "
                                 "arrays to concatenate, in order, with data.init_args.observation_keys.")
    parts = []
    for key in keys:
        if key not in node or not isinstance(node[key], h5py.Dataset):
            raise UserInputError(f"{where} has no array '{key}' (it holds {sorted(node.keys())}); fix "
                                 "data.init_args.observation_keys.")
        value = node[key][()]
        parts.append(value.reshape(len(value), -1))
    if len({len(p) for p in parts}) != 1:
        raise UserInputError(f"{where}: the arrays {keys} have different numbers of rows {[len(p) for p in parts]}.")
    return np.concatenate(parts, axis=1)


def load_minari_folder(path: str, observation_keys: list[str] | None = None) -> dict[str, np.ndarray]:
    """A local Minari dataset folder: ``data/main_data.hdf5`` with ``episode_<i>`` groups holding ``observations``
    (T + 1 rows; an array, or a group of arrays for dictionary observations, see `_minari_observations`),
    ``actions``, ``rewards``, ``terminations`` (and ``truncations``) with T rows. Every step is a transition (the
    T + 1 observations give each step its true successor, truncated steps included); ``done`` = ``terminations``."""
    file = os.path.join(path, "data", "main_data.hdf5")
    if not os.path.isfile(file):
        raise UserInputError(f"'{path}' is not a Minari dataset folder: {file} is missing.")
    h5py = _h5py()
    parts = []
    with _open_hdf5(h5py, file) as f:
        episodes = sorted((k for k in f.keys() if k.startswith("episode_") and k[8:].isdigit()),
                          key=lambda k: int(k[8:]))
        if not episodes:
            raise UserInputError(f"{file} holds no episode_<i> groups.")
        for name in episodes:  # one read per stored episode group
            group = f[name]
            missing = [k for k in ("observations", "actions", "rewards", "terminations") if k not in group]
            if missing:
                raise UserInputError(f"{file}/{name} lacks {missing}.")
            if not isinstance(group["actions"], h5py.Dataset):
                raise UserInputError(f"{file}/{name}/actions is a group (a dictionary or tuple action space); only "
                                     "array actions are read.")
            obs = _minari_observations(group["observations"], f"{file}/{name}/observations", observation_keys, h5py)
            actions = group["actions"][()]
            steps = len(actions)
            if len(obs) != steps + 1:
                raise UserInputError(f"{file}/{name}: {len(obs)} observations for {steps} actions "
                                     "(Minari stores T + 1 observations).")
            columns = {key: group[key][()] for key in ("rewards", "terminations")}
            rew, done = (_column(columns, key, steps, f"{file}/{name}") for key in ("rewards", "terminations"))
            act = actions if actions.ndim == 2 else actions.reshape(steps, -1 if steps else 1)
            parts.append({"obs": obs[:-1], "act": act, "rew": rew, "next_obs": obs[1:],
                          "done": done})
    sizes = sorted({p["obs"].shape[1] for p in parts})
    if len(sizes) != 1:
        raise UserInputError(f"{file}: episodes have different observation sizes {sizes}.")
    data = {k: np.concatenate([p[k] for p in parts]).astype(np.float32) for k in parts[0]}
    return _check(data, file)


class TransitionDataset(Dataset):
    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data["obs"])

    def __getitem__(self, i):
        return {key: value[i] for key, value in self.data.items()}


class OfflineRLDataModule(LightningDataModule):
    """Offline RL transitions for the dynamics ensemble and the offline actor-critic.

    Args:
        source: ``currency_exchange`` | ``pendulum`` (embedded, generated) | ``d4rl`` (a local file) | ``minari``.
        behaviour: the embedded behaviour policy, ``random`` or ``medium`` (Pendulum only).
        num_transitions: size of a generated dataset.
        data_path: the local file (``d4rl``) or folder (``minari``).
        env_id: gymnasium id for evaluating a file-based dataset (e.g. ``Hopper-v4``; needs gymnasium[mujoco]); None
            (default) trains a file dataset without an environment (`OfflineEvaluation` skips itself). Refused for
            the embedded sources, which are evaluated in their own environment.
        ref_min_return, ref_max_return: D4RL reference returns (random, expert) for the normalised score.
        val_fraction: held-out transitions (dynamics validation MSE, critic TD error).
        batch_size: transitions per batch; ``steps_per_epoch`` batches are drawn with replacement per epoch.
        seed: data generation and split seed.
        max_episode_steps: ``d4rl`` files without ``timeouts`` only (the v0 releases): the environment's episode
            length (``env._max_episode_steps``, 1000 for the MuJoCo locomotion tasks), from which D4RL's
            ``qlearning_dataset`` infers the time-outs; required for such files, ignored (the file's time-outs win)
            otherwise.
        keep_timeouts: ``d4rl`` files only. False (default): ``d4rl.qlearning_dataset`` exactly, dropping the
            time-out rows and the last row and taking the next row as next state. True: every row, with the file's
            ``next_observations`` (required) as next state: time-out steps become ordinary transitions (done = 0,
            bootstrapped from their true successor) and terminal rows get their true last state.
        observation_keys: ``minari`` folders with dictionary observations only: the arrays of the observation group
            to concatenate, in this order (paths inside the group, like ``observation`` or ``a/b``); by default every
            array of the group in sorted key order (``gymnasium.spaces.flatten``'s order for a Dict space).
    """

    def __init__(self, source: str = "currency_exchange", behaviour: str = "random", num_transitions: int = 20000,
                 data_path: str | None = None, env_id: str | None = None, ref_min_return: float | None = None,
                 ref_max_return: float | None = None, val_fraction: float = 0.1, batch_size: int = 256,
                 steps_per_epoch: int = 100, seed: int = 0, max_episode_steps: int | None = None,
                 keep_timeouts: bool = False, observation_keys: list[str] | None = None) -> None:
        super().__init__()
        if source not in SOURCES:
            raise UserInputError(f"source='{source}' is unknown; choose one of {SOURCES}.")
        if behaviour not in ("random", "medium"):
            raise UserInputError(f"behaviour='{behaviour}' is unknown; choose random or medium.")
        if source in ("d4rl", "minari") and not data_path:
            raise UserInputError(f"source={source} reads a local dataset: set data.init_args.data_path.")
        if not 0.0 < val_fraction < 1.0:
            raise UserInputError(f"val_fraction={val_fraction} must lie in (0, 1).")
        if env_id is not None and source in ENVS:
            raise UserInputError(f"env_id={env_id!r} applies to file datasets (source=d4rl or minari); source={source} "
                                 "is evaluated in its own embedded environment: unset data.init_args.env_id.")
        if source != "d4rl" and (max_episode_steps is not None or keep_timeouts):
            raise UserInputError(f"max_episode_steps and keep_timeouts apply to source=d4rl files only (source="
                                 f"{source} keeps every step with its true successor); unset them.")
        if max_episode_steps is not None and max_episode_steps < 1:
            raise UserInputError(f"max_episode_steps={max_episode_steps} must be at least 1.")
        if observation_keys is not None and (source != "minari" or not observation_keys
                                             or not all(isinstance(k, str) and k for k in observation_keys)):
            raise UserInputError(f"observation_keys={observation_keys!r}: a non-empty list of array names, for "
                                 "source=minari folders with dictionary observations only; unset it otherwise.")
        self.save_hyperparameters()
        self.obs_dim: int | None = ENVS[source].obs_dim if source in ENVS else None
        self.action_dim: int | None = ENVS[source].action_dim if source in ENVS else None
        self.splits: dict[str, dict[str, torch.Tensor]] | None = None
        self.behaviour_return: float | None = None

    def load(self) -> dict[str, np.ndarray]:
        h = self.hparams
        if h.source in ENVS:
            data = dict(generate_dataset(h.source, h.behaviour, h.num_transitions, h.seed))
            self.behaviour_return = float(data.pop("behaviour_return"))
            return data
        if h.source == "minari":
            return load_minari_folder(h.data_path, h.observation_keys)
        return load_d4rl_file(h.data_path, h.max_episode_steps, h.keep_timeouts)

    @property
    def dataset_identity(self) -> dict[str, object]:
        """Which dataset this is (stored in the dynamics-ensemble checkpoint; the policy stage refuses another):
        the source, the behaviour policy or the file/folder name (not its directory, so moved files still match),
        the Minari observation keys and the sizes (None before ``setup`` for files)."""
        h = self.hparams
        name = h.behaviour if h.source in ENVS else os.path.basename(os.path.normpath(h.data_path))
        return {"source": h.source, "dataset": name, "observation_keys": h.observation_keys,
                "obs_dim": self.obs_dim, "action_dim": self.action_dim}

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        data = self.load()
        n = len(data["obs"])
        self.obs_dim, self.action_dim = data["obs"].shape[1], data["act"].shape[1]
        order = np.random.default_rng(self.hparams.seed + 1).permutation(n)
        n_val = max(1, int(round(n * self.hparams.val_fraction)))
        tensors = {key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in data.items()}
        self.splits = {"train": {k: v[order[n_val:]] for k, v in tensors.items()},
                       "val": {k: v[order[:n_val]] for k, v in tensors.items()}}

    def training_transitions(self) -> dict[str, torch.Tensor]:
        """The whole training split (normalisation statistics of the dynamics ensemble come from it)."""
        self.setup("fit")
        return self.splits["train"]

    def train_dataloader(self) -> DataLoader:
        dataset = TransitionDataset(self.training_transitions())
        sampler = RandomSampler(dataset, replacement=True,
                                num_samples=self.hparams.steps_per_epoch * self.hparams.batch_size)
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        self.setup("validate")
        return DataLoader(TransitionDataset(self.splits["val"]), batch_size=max(self.hparams.batch_size, 1024))

    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    @property
    def evaluation_environment(self) -> str | None:
        """The environment `make_env` builds: the embedded source's name, the file dataset's gymnasium ``env_id``, or
        None (a file dataset without ``env_id``: trained without online evaluation, which `OfflineEvaluation` skips)."""
        h = self.hparams
        return h.source if h.source in ENVS else h.env_id

    @property
    def ref_min_return(self) -> float | None:
        """D4RL's random-policy reference return (the 0 of the normalised score), or None."""
        return self.hparams.ref_min_return

    @property
    def ref_max_return(self) -> float | None:
        """D4RL's expert reference return (the 100 of the normalised score), or None."""
        return self.hparams.ref_max_return

    def make_env(self):
        """A vectorised evaluation environment (``reset(n, rng)``, ``step(actions)``)."""
        h = self.hparams
        if h.source in ENVS:
            return ENVS[h.source]()
        if not h.env_id:
            raise UserInputError("evaluating a file dataset needs data.init_args.env_id (e.g. Hopper-v4).")
        return GymnasiumEnv(h.env_id)


class GymnasiumEnv:
    """An optional gymnasium environment (MuJoCo tasks) behind the vectorised interface (episodes run in sequence
    inside gymnasium's own vector env)."""

    def __init__(self, env_id: str) -> None:
        try:
            import gymnasium
        except ImportError:
            raise UserInputError(f"evaluating in {env_id} needs gymnasium with MuJoCo: "
                                 "`pip install 'gymnasium[mujoco]'` (the embedded environments need nothing).") \
                from None
        self.gymnasium, self.env_id = gymnasium, env_id
        try:
            probe = gymnasium.make(env_id)
        except gymnasium.error.Error as err:  # an unknown id, a missing MuJoCo, ...
            raise UserInputError(f"env_id={env_id!r}: gymnasium cannot make it ({one_line(err)}); give a registered "
                                 "id such as Hopper-v4, or unset data.init_args.env_id to train without evaluation.") \
                from None
        self.obs_dim, self.action_dim = probe.observation_space.shape[0], probe.action_space.shape[0]
        self.horizon = probe.spec.max_episode_steps or 1000
        self.high = probe.action_space.high

    def reset(self, n: int, rng: np.random.Generator) -> np.ndarray:
        self.envs = self.gymnasium.vector.SyncVectorEnv([lambda: self.gymnasium.make(self.env_id)] * n)
        obs, _ = self.envs.reset(seed=int(rng.integers(2 ** 31)))
        return obs

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, _ = self.envs.step(action * self.high)
        return obs, reward, terminated, truncated
