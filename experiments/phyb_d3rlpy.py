"""PhyB beside d3rlpy's IQL and TD3+BC on the same Pendulum data and evaluation: ``python -m experiments.phyb_d3rlpy``.

Paper: "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief" (ICML 2026, arXiv
2606.00680). An offline RL user runs a standard library first; this puts d3rlpy 2.8.1 (Seno & Imai, JMLR 2022;
``pip install d3rlpy==2.8.1``, an optional extra) beside the PhyB experiment's primary result
(``results/phyb_pendulum_10000_steps.json``, written by the earlier ``experiments/phyb.py`` script with
``--envs pendulum --steps 10000``; a result of ``python -m experiments phyb`` is read as well).

Per seed S (the seeds of that result, 0 .. ``--seeds`` - 1):

1. data: the training split ``experiments/phyb.py`` trains on for seed S (``OfflineRLDataModule``, Pendulum with the
   ``medium`` behaviour, the reference's ``transitions`` and data seed S, built from ``configs/phyb/td3_bc_quick.yaml``
   with the same overrides). Its SHA-256 over (obs, act, rew, next_obs, done) must equal that of the split built from
   ``configs/phyb/quick.yaml`` (the model-based arms' config) and that of the transitions d3rlpy reads back from the
   converted dataset (`to_episodes`: each transition is its own 2-row episode, so d3rlpy's transition picker returns
   exactly (s, a, r, s', done)); a mismatch stops the run.
2. arms ``d3rlpy_iql`` (Kostrikov et al., ICLR 2022) and ``d3rlpy_td3_bc`` (Fujimoto & Gu, NeurIPS 2021): library
   defaults (256 x 2 MLPs, Adam 3e-4, tau 5e-3, IQL expectile 0.7 / beta 3 / max weight 100, TD3+BC alpha 2.5 /
   smoothing 0.2 clipped 0.5 / actor every 2 critic steps) except what the PhyB experiment shares: batch 64,
   gamma 0.99, the reference's ``steps`` (10,000) gradient steps, and states standardised on the training split
   (``StandardObservationScaler``: the TD3+BC paper's and the project TD3+BC's setting, used for both). Rewards
   are raw, d3rlpy's default (the project scales them by 0.01 inside its critics; ``--reward-scale 0.01`` does the
   same here, as a check of that one difference).
3. evaluation: `callbacks.offline_evaluation.evaluate` with the reference's episodes (20) and seed 10,000 + S, the
   same initial states as every arm of the reference; the final policy, d3rlpy's deterministic ``predict``. The Q bias
   uses the min of d3rlpy's twin critics at (s0, a0), as the project's ``q_min``.
4. ``per_seed`` holds both library arms and, read from the reference JSON (not re-run), ``phyb``, ``pmdb``, ``mean``
   and the project's ``td3_bc``; ``paired`` (`icml26.paired.paired_block`): phyb - d3rlpy_iql,
   phyb - d3rlpy_td3_bc and td3_bc - d3rlpy_td3_bc (the project's TD3+BC against the library's).

Output: ``results/phyb_d3rlpy.json`` (rewritten after every seed). Run it with an interpreter that has d3rlpy.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from experiments import kit
from lightning_modules.shared.errors import UserInputError

MODEL_FREE, POLICY = "configs/phyb/td3_bc_quick.yaml", "configs/phyb/quick.yaml"
REFERENCE = kit.RESULTS / "phyb_pendulum_10000_steps.json"
ENV = "pendulum"
DATA = ["--data.init_args.source=pendulum", "--data.init_args.behaviour=medium"]  # experiments/phyb.py DATASETS
KEYS = ("obs", "act", "rew", "next_obs", "done")
REFERENCE_ARMS = ("phyb", "pmdb", "mean", "td3_bc")
LIBRARY_ARMS = ("d3rlpy_iql", "d3rlpy_td3_bc")
METRICS = ("return", "q_overestimation", "abs_q_bias", "q_abs_error")
BATCH, GAMMA = 64, 0.99  # configs/phyb/quick.yaml and td3_bc_quick.yaml
PAPER = "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief (PhyB, ICML 2026)"
REQUIRES = ("d3rlpy",)  # the optional ``offline_rl`` extra: runs without it stop with the install line


def checksum(arrays: dict) -> str:
    """SHA-256 of the transitions (float32, in the order of ``KEYS``, shapes included): equal iff the data are."""
    digest = hashlib.sha256()
    for key in KEYS:
        value = np.ascontiguousarray(np.asarray(arrays[key], dtype=np.float32))
        digest.update(f"{key}{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def as_numpy(split: dict) -> dict[str, np.ndarray]:
    """A datamodule split (torch tensors) as float32 numpy arrays, ``act`` [N, A], ``rew``/``done`` [N]."""
    return {key: np.asarray(split[key].numpy() if hasattr(split[key], "numpy") else split[key], dtype=np.float32)
            for key in KEYS}


def to_episodes(arrays: dict) -> dict[str, np.ndarray]:
    """Transitions -> the row arrays of a d3rlpy ``MDPDataset`` whose transitions are exactly these.

    d3rlpy builds transitions from episodes (next state = next row; a timed-out episode's last row has no
    transition; a terminated episode's last row is terminal with a zero next state). The split is shuffled, so
    each non-terminal transition becomes the 2-row episode (s, a, r), (s', a, 0) ending in a time-out (one
    transition: (s, a, r, s', 0)), and a terminal one the 1-row terminated episode (s, a, r) (its next state is
    unused: done = 1)."""
    obs, act, rew, next_obs = (np.asarray(arrays[k], dtype=np.float32) for k in ("obs", "act", "rew", "next_obs"))
    done = np.asarray(arrays["done"]) > 0.5
    n = len(obs)
    if not all(len(np.asarray(arrays[k])) == n for k in KEYS) or n == 0:
        raise UserInputError(f"the transitions have {[len(np.asarray(arrays[k])) for k in KEYS]} rows for {KEYS}; "
                             "pass a non-empty split with one row per transition in every array.")
    act = act.reshape(n, -1)
    rows = np.where(done, 1, 2)
    first = np.concatenate([[0], np.cumsum(rows)[:-1]])
    total = int(rows.sum())
    out = {"observations": np.zeros((total, obs.shape[1]), np.float32),
           "actions": np.zeros((total, act.shape[1]), np.float32), "rewards": np.zeros((total, 1), np.float32),
           "terminals": np.zeros(total, np.float32), "timeouts": np.zeros(total, np.float32)}
    out["observations"][first], out["actions"][first], out["rewards"][first, 0] = obs, act, rew
    out["terminals"][first[done]] = 1.0
    second = first[~done] + 1
    out["observations"][second], out["actions"][second] = next_obs[~done], act[~done]
    out["timeouts"][second] = 1.0
    return out


def from_episodes(rows: dict) -> dict[str, np.ndarray]:
    """The inverse of `to_episodes` on its row arrays (the fast test's round trip); `library_transitions` reads the
    same from a built d3rlpy dataset."""
    ends = np.flatnonzero((rows["terminals"] > 0.5) | (rows["timeouts"] > 0.5))
    starts = np.concatenate([[0], ends[:-1] + 1])
    terminal = rows["terminals"][ends] > 0.5
    successor = rows["observations"][np.minimum(starts + 1, len(rows["observations"]) - 1)]
    next_obs = np.where(terminal[:, None], 0.0, successor)
    return {"obs": rows["observations"][starts], "act": rows["actions"][starts], "rew": rows["rewards"][starts, 0],
            "next_obs": next_obs.astype(np.float32), "done": terminal.astype(np.float32)}


def library_transitions(dataset) -> dict[str, np.ndarray]:
    """Every transition of a d3rlpy dataset as its own transition picker returns it (what training samples)."""
    picker = dataset.transition_picker
    items = [picker(episode, i) for episode in dataset.episodes for i in range(episode.transition_count)]
    return {"obs": np.stack([t.observation for t in items]), "act": np.stack([t.action for t in items]),
            "rew": np.array([float(t.reward[0]) for t in items], np.float32),
            "next_obs": np.stack([t.next_observation for t in items]),
            "done": np.array([t.terminal for t in items], np.float32)}


def _runner_config(config: dict) -> dict:
    """``transitions``, ``steps`` and ``episodes`` of a result written by ``python -m experiments phyb``: its
    ``pendulum/phyb`` arm's overrides (``trainer.max_steps`` counts a critic and an actor step per training step)."""
    overrides = dict(item.lstrip("-").split("=", 1) for item in config["arms"][f"{ENV}/phyb"] if "=" in item)
    return {"envs": [ENV], "transitions": int(overrides["data.init_args.num_transitions"]),
            "steps": int(overrides["trainer.max_steps"]) // 2, "episodes": int(config["settings"]["episodes"])}


def load_reference(path: Path, seeds: int) -> tuple[dict, list[dict]]:
    """The PhyB experiment's settings and its per-seed rows for the seeds 0 .. seeds - 1 (refused when absent).
    Reads the landed file of the earlier script (``config.envs``) and the runner's schema (``config.arms``)."""
    if not path.is_file():
        raise UserInputError(f"no reference result {path}; run `python -m experiments phyb --seeds 5 --set "
                             "trainer.max_steps=20000 --name phyb_10000_steps` first and pass --reference "
                             "results/phyb_10000_steps.json.")
    result = json.loads(path.read_text())
    config, seed_ids = result["config"], result.get("seed_ids") or list(range(len(result["per_seed"])))
    if "arms" in config and "envs" not in config:
        if f"{ENV}/phyb" not in config["arms"]:
            raise UserInputError(f"{path} has no {ENV}/phyb arm (arms {sorted(config['arms'])}); pass a result of "
                                 "`python -m experiments phyb` that ran Pendulum.")
        config = _runner_config(config)
    if ENV not in config.get("envs", []):
        raise UserInputError(f"{path} has no {ENV} runs (envs {config.get('envs')}); pass the Pendulum result.")
    rows = dict(zip(seed_ids, result["per_seed"]))
    missing = [s for s in range(seeds) if s not in rows]
    if missing:
        available = next(s for s in range(len(rows) + 1) if s not in rows)  # the seeds 0 .. available - 1 exist
        raise UserInputError(f"--seeds {seeds} needs seeds {missing}, which {path.name} lacks (it has {seed_ids}); "
                             f"use --seeds {available} or fewer.")
    return config, [rows[s] for s in range(seeds)]


def reference_arms(row: dict) -> dict[str, dict[str, float]]:
    """The reference's PhyB, PMDB, mean and project TD3+BC metrics of one seed (as written there)."""
    return {arm: {m: float(row[f"{ENV}/{arm}"][m]) for m in METRICS if m in row[f"{ENV}/{arm}"]}
            for arm in REFERENCE_ARMS if f"{ENV}/{arm}" in row}


def split_for_seed(seed: int, transitions: int, steps: int):
    """The datamodule the PhyB experiment's ``pendulum/td3_bc`` arm trains on for this seed, its training split as
    numpy, and the checksum; the split built from the model-based arms' config must match."""
    import yaml

    from datamodules.offline_rl import OfflineRLDataModule

    common = [f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
              f"--data.init_args.num_transitions={transitions}", *DATA]
    _, datamodule = kit.from_config(MODEL_FREE, *common, f"--data.init_args.steps_per_epoch={steps}")
    arrays = as_numpy(datamodule.training_transitions())
    digest = checksum(arrays)
    init = yaml.safe_load((kit.REPO_ROOT / POLICY).read_text())["data"]["init_args"]
    init.update(source="pendulum", behaviour="medium", num_transitions=transitions, seed=seed)
    policy_digest = checksum(as_numpy(OfflineRLDataModule(**init).training_transitions()))
    if policy_digest != digest:
        raise RuntimeError(f"seed {seed}: the training split of {POLICY} ({policy_digest[:12]}) differs from that of "
                           f"{MODEL_FREE} ({digest[:12]}); the PhyB arms and TD3+BC did not see the same data.")
    return datamodule, arrays, digest


def d3rlpy_dataset(arrays: dict):
    """A d3rlpy ``MDPDataset`` with exactly these transitions (checked by checksum)."""
    import d3rlpy

    rows = to_episodes(arrays)
    dataset = d3rlpy.dataset.MDPDataset(rows["observations"], rows["actions"], rows["rewards"], rows["terminals"],
                                        timeouts=rows["timeouts"], action_space=d3rlpy.ActionSpace.CONTINUOUS,
                                        action_size=rows["actions"].shape[1])
    if checksum(library_transitions(dataset)) != checksum(arrays):
        raise RuntimeError("the d3rlpy dataset's transitions differ from the datamodule's training split.")
    return dataset


def make_algo(arm: str, reward_scale: float | None = None):
    """d3rlpy's algorithm for an arm: library defaults plus the settings the PhyB experiment shares; ``reward_scale``
    (``--reward-scale``) multiplies the rewards as the project's critics do (``MultiplyRewardScaler``)."""
    import d3rlpy

    shared = dict(batch_size=BATCH, gamma=GAMMA, observation_scaler=d3rlpy.preprocessing.StandardObservationScaler())
    if reward_scale is not None:
        shared["reward_scaler"] = d3rlpy.preprocessing.MultiplyRewardScaler(reward_scale)
    if arm == "d3rlpy_iql":
        return d3rlpy.algos.IQLConfig(**shared).create(device="cpu:0")
    return d3rlpy.algos.TD3PlusBCConfig(**shared).create(device="cpu:0")


class LibraryPolicy:
    """A trained d3rlpy algorithm behind the interface `evaluate` uses (``act``, ``q_min``, ``hparams``, ...):
    the deterministic ``predict`` acts; Q(s0, a0) is the min of the twin critics (the project's ``q_min``) on
    d3rlpy's scaled states; ``reward_scale`` is the factor d3rlpy multiplied the rewards with (1 by default), so
    Q / reward_scale is a return."""

    def __init__(self, algo, reward_scale: float | None = None) -> None:
        self.algo, self.critic, self.training, self.device = algo, None, False, torch.device("cpu")
        self.hparams = SimpleNamespace(gamma=algo.config.gamma, reward_scale=reward_scale or 1.0)

    def eval(self) -> LibraryPolicy:
        return self

    def train(self, mode: bool = True) -> LibraryPolicy:
        return self

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        return torch.as_tensor(self.algo.predict(obs.cpu().numpy().astype(np.float32)))

    @torch.no_grad()
    def q_min(self, critic, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        scaler = self.algo.config.observation_scaler
        if scaler is not None:
            x = scaler.transform(x)
        return torch.stack([q(x, action.float()).q_value.reshape(-1) for q in self.algo.impl.q_function]).min(0).values


def train_library_arm(arm: str, seed: int, dataset, steps: int, reward_scale: float | None = None):
    import d3rlpy

    d3rlpy.seed(seed)
    algo = make_algo(arm, reward_scale)
    algo.fit(dataset, n_steps=steps, n_steps_per_epoch=steps, logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
             show_progress=False, save_interval=10 ** 9)
    return LibraryPolicy(algo, reward_scale)


def run_seed(seed: int, args, reference_row: dict) -> tuple[dict, dict]:
    from callbacks.offline_evaluation import evaluate
    from experiments.phyb import q_metrics

    datamodule, arrays, digest = split_for_seed(seed, args.transitions, args.steps)
    dataset = d3rlpy_dataset(arrays)
    arms, facts = {}, {"seed": seed, "train_sha256": digest, "train_transitions": len(arrays["obs"])}
    for arm in LIBRARY_ARMS:
        start = time.time()
        policy = train_library_arm(arm, seed, dataset, args.steps, args.reward_scale)
        facts[f"{arm}_train_s"] = round(time.time() - start, 1)
        arms[arm] = q_metrics(evaluate(policy, datamodule.make_env(), args.episodes, seed=10_000 + seed))
    arms.update(reference_arms(reference_row))
    return arms, facts


def paired(per_seed: list[dict]) -> dict:
    from icml26.paired import paired_block

    metrics = ["return", "q_overestimation", "abs_q_bias"]
    block = paired_block(per_seed, "d3rlpy_iql", metrics=metrics, arms=["phyb"])
    block.update(paired_block(per_seed, "d3rlpy_td3_bc", metrics=metrics, arms=["phyb", "td3_bc"]))
    return block


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=5)
    parser.add_argument("--steps", type=int, default=None,
                        help="gradient steps per library arm (default: the reference's, 10,000)")
    parser.add_argument("--reference", default=str(REFERENCE), help="the PhyB experiment's Pendulum result JSON")
    parser.add_argument("--reward-scale", type=float, default=None,
                        help="multiply d3rlpy's rewards by this (the project's critics use 0.01); default raw")
    parser.add_argument("--name", default="phyb_d3rlpy", help="name of the JSON in --out")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        raise UserInputError(f"--seeds {args.seeds} must be at least 1.")
    if args.reward_scale is not None and not args.reward_scale > 0:
        raise UserInputError(f"--reward-scale {args.reward_scale} must be positive (e.g. 0.01, the project's).")
    if args.steps is not None and args.steps < 1:
        raise UserInputError(f"--steps {args.steps} must be at least 1.")
    reference, rows = load_reference(Path(args.reference), args.seeds)
    args.transitions, args.episodes = int(reference["transitions"]), int(reference["episodes"])
    if args.smoke:
        args.steps, args.episodes = 20, 2
    elif args.steps is None:
        args.steps = int(reference["steps"])
    elif args.steps != int(reference["steps"]):
        raise UserInputError(f"--steps {args.steps} differs from the {reference['steps']} steps of {args.reference}, "
                             "whose PhyB and TD3+BC returns it is paired with; drop --steps (or use --smoke).")
    try:
        import d3rlpy
    except ImportError:
        raise UserInputError("d3rlpy is not installed: `pip install d3rlpy==2.8.1` (an optional extra), or run "
                             "with an interpreter that has it.") from None
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    import structlog  # d3rlpy's logger: one line per build and epoch otherwise

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    config = {"smoke": args.smoke, "env": ENV, "transitions": args.transitions, "steps": args.steps,
              "batch_size": BATCH, "gamma": GAMMA, "episodes": args.episodes, "eval_seed": "10000 + seed",
              "d3rlpy": d3rlpy.__version__, "observation_scaler": "standard (training split)",
              "reward_multiplier": args.reward_scale, "reference": Path(args.reference).name, "data_config": MODEL_FREE,
              "reference_arms_read_not_rerun": list(REFERENCE_ARMS)}
    start, per_seed, facts = time.time(), [], []
    for seed in kit.progress(range(args.seeds), "seeds"):
        arms, seed_facts = run_seed(seed, args, rows[seed])
        per_seed.append(arms)
        facts.append(seed_facts)
        result = kit.write_result(PAPER, seeds=len(per_seed), wall_s=time.time() - start, config=config,
                                  arms=kit.summarise(per_seed), per_seed=per_seed, out=args.out, name=args.name,
                                  seed_ids=list(range(len(per_seed))), seed_facts=facts, paired=paired(per_seed))
        print(f"seed {seed}: " + ", ".join(f"{arm} {arms[arm]['return']:.1f}" for arm in arms), flush=True)
    print(kit.markdown_table(result["arms"], list(METRICS), digits=1))
    from icml26.paired import paired_table

    print(paired_table(result["paired"], digits=1))
    print(f"wall {result['wall_s']:.0f} s ({len(per_seed)} seeds)")
    return result


if __name__ == "__main__":
    main()
