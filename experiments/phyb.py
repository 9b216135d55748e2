"""PhyB vs PMDB vs MOPO vs the mean-ensemble target, and TD3+BC, offline, on CPU: ``python -m experiments.phyb``.

Paper: "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief" (ICML 2026, arXiv
2606.00680). Its claim: a Bellman target from a convex combination of the k most pessimistic of N sampled models
(softmax of their normalised values, lambda = -3) is pessimistic enough to avoid the overestimation of a plain model
ensemble and less brittle than PMDB's single order statistic.

Per seed and dataset (the data seed, the ensemble and the policy initialisation change with the seed):

1. data: ``currency_exchange`` = CurrencyExchange with a uniform-random behaviour policy; ``pendulum`` = Pendulum
   with the noisy medium controller (`datamodules.offline_rl`), ``--transitions`` transitions each.
2. one dynamics ensemble (``configs/phyb/ensemble_quick.yaml``: 7 members, 5 elites), shared by the four targets.
3. arms ``<env>/mean``, ``<env>/mopo``, ``<env>/pmdb``, ``<env>/phyb``: ``configs/phyb/quick.yaml`` from that
   ensemble, only ``belief_target`` changed (same actor-critic, same ``--steps`` training steps); ``<env>/td3_bc``:
   the model-free TD3+BC (Fujimoto & Gu 2021, ``configs/phyb/td3_bc_quick.yaml``: the same critic sizes, batch,
   optimiser and ``--steps`` batches, no ensemble). Every arm keeps its paper's settings (PhyB lambda = -3, MOPO
   lambda = 1, PMDB k = 2, TD3+BC alpha = 2.5): no arm is tuned here and the last policy is evaluated, so nothing is
   selected on the evaluation episodes.
4. metrics over ``--episodes`` real-environment episodes (the code's acting rule; TD3+BC's deterministic actor):
   ``return`` (mean undiscounted return), ``q_overestimation`` (critic Q(s0, a0) / reward_scale minus the discounted
   Monte-Carlo return of the same episodes, signed), ``abs_q_bias`` (its absolute value: how far the critic is off on
   average, whichever the sign) and ``q_abs_error`` (the mean of the per-episode absolute differences); the reference
   row ``<env>/behaviour`` holds ``behaviour_return`` (the data-collecting policy).
5. ``paired``: per metric, PhyB minus every other arm seed by seed, the mean and 95% t interval
   (`icml26.claims.paired_interval`).

``--seed-ids`` runs chosen seeds (e.g. one process per seed) and ``--merge`` joins such JSONs (same settings) into one.
Outputs: a markdown table per environment (mean ± std over seeds), ``results/<name>.json`` and ``results/<name>.png``.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time

from callbacks.offline_evaluation import evaluate
from experiments import kit

ENSEMBLE, POLICY = "configs/phyb/ensemble_quick.yaml", "configs/phyb/quick.yaml"
MODEL_FREE = "configs/phyb/td3_bc_quick.yaml"
TARGETS = ("mean", "mopo", "pmdb", "phyb")
ARMS = (*TARGETS, "td3_bc")
METRICS = ("return", "q_overestimation", "abs_q_bias", "q_abs_error")
# environment -> (data overrides, model overrides shared by both model-based stages)
DATASETS = {
    "currency_exchange": (["--data.init_args.source=currency_exchange", "--data.init_args.behaviour=random"],
                          ["--model.init_args.termination=currency_exchange"]),
    "pendulum": (["--data.init_args.source=pendulum", "--data.init_args.behaviour=medium"],
                 ["--model.init_args.termination=none"]),
}
PAPER = "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief (PhyB, ICML 2026)"


def q_metrics(result: dict[str, float]) -> dict[str, float]:
    """An `evaluate` result -> the reported metrics: the return, the signed Q bias, its absolute value (the bias
    whichever its sign: a critic 60 below the return is as far off as one 60 above) and the per-episode abs error."""
    return {"return": result["return"], "q_overestimation": result["q_overestimation"],
            "abs_q_bias": abs(result["q_overestimation"]), "q_abs_error": result["q_abs_error"]}


def train_ensemble(env: str, seed: int, args, folder: str) -> str:
    data, shared = DATASETS[env]
    model, datamodule = kit.from_config(ENSEMBLE, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                        f"--data.init_args.num_transitions={args.transitions}", *data, *shared)
    trainer = kit.quiet_trainer(max_epochs=args.ensemble_epochs, gradient_clip_val=10.0, deterministic=True,
                                limit_train_batches=args.ensemble_steps)
    trainer.fit(model, datamodule=datamodule)
    path = os.path.join(folder, f"ensemble_{env}_{seed}.ckpt")
    trainer.save_checkpoint(path)
    return path


def train_policy(env: str, target: str, seed: int, checkpoint: str, args) -> tuple[dict[str, float], object]:
    data, shared = DATASETS[env]
    model, datamodule = kit.from_config(
        POLICY, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
        f"--data.init_args.num_transitions={args.transitions}", *data, *shared,
        f"--model.init_args.belief_target={target}", f"--model.init_args.init_from={checkpoint}")
    # max_steps counts optimiser steps: critic + actor per training step
    kit.quiet_trainer(max_steps=2 * args.steps, limit_val_batches=0, deterministic=True).fit(model,
                                                                                             datamodule=datamodule)
    return q_metrics(evaluate(model, datamodule.make_env(), args.episodes, seed=10_000 + seed)), datamodule


def train_td3_bc(env: str, seed: int, args) -> dict[str, float]:
    """TD3+BC on the same data split for ``--steps`` batches (one epoch of that many: its actor steps every second
    batch, so the optimiser-step count is not the batch count), evaluated on the same episodes."""
    data, _ = DATASETS[env]
    model, datamodule = kit.from_config(
        MODEL_FREE, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
        f"--data.init_args.num_transitions={args.transitions}", *data,
        f"--data.init_args.steps_per_epoch={args.steps}")
    kit.quiet_trainer(max_epochs=1, limit_val_batches=0, deterministic=True).fit(model, datamodule=datamodule)
    return q_metrics(evaluate(model, datamodule.make_env(), args.episodes, seed=10_000 + seed))


def run_seed(seed: int, args, folder: str) -> dict:
    arms = {}
    targets = [t for t in TARGETS if t in args.arms]
    bar = kit.progress(None, f"seed {seed}: ensembles and arms", total=len(args.envs) * (2 + len(targets)))
    for env in args.envs:
        if targets:
            checkpoint = train_ensemble(env, seed, args, folder)
        bar.update()
        for target in targets:
            arms[f"{env}/{target}"], datamodule = train_policy(env, target, seed, checkpoint, args)
            bar.update()
        if "td3_bc" in args.arms:
            arms[f"{env}/td3_bc"] = train_td3_bc(env, seed, args)
        bar.update()
        if targets:
            arms[f"{env}/behaviour"] = {"behaviour_return": datamodule.behaviour_return}
    bar.close()
    return arms


def paired_differences(per_seed: list[dict], envs: list[str], method: str = "phyb") -> dict:
    """``{"<env>/phyb - <env>/<arm>": {metric: {mean, lo, hi, n}}}``: method minus each other arm, seed by seed,
    with the 95% t interval of `icml26.claims.paired_interval` (lo = hi = NaN -> null for one seed)."""
    from icml26.claims import paired_interval

    paired = {}
    for env in envs:
        for baseline in ARMS:
            if baseline == method:
                continue
            a, b = f"{env}/{method}", f"{env}/{baseline}"
            cells = {}
            for metric in METRICS:
                diffs = [row[a][metric] - row[b][metric] for row in per_seed
                         if metric in row.get(a, {}) and metric in row.get(b, {})]
                if diffs:
                    mean, lo, hi, n = paired_interval(diffs)
                    cells[metric] = {"mean": mean, "lo": None if lo != lo else lo, "hi": None if hi != hi else hi,
                                     "n": n}
            if cells:
                paired[f"{a} - {b}"] = cells
    return paired


def plot(arms: dict, envs: list[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("return", "q_overestimation", "abs_q_bias")
    fig, axes = plt.subplots(len(metrics), len(envs), figsize=(5 * len(envs), 8.5), squeeze=False)
    for col, env in enumerate(envs):
        names = [t for t in ARMS if f"{env}/{t}" in arms]
        for row, metric in enumerate(metrics):
            cells = [arms[f"{env}/{t}"][metric] for t in names]
            axes[row, col].bar(names, [c["mean"] for c in cells], yerr=[c["std"] for c in cells], capsize=3)
            if metric == "return" and f"{env}/behaviour" in arms:
                axes[row, col].axhline(arms[f"{env}/behaviour"]["behaviour_return"]["mean"], color="k", ls="--",
                                       lw=1, label="behaviour")
                axes[row, col].legend()
            axes[row, col].set_title(f"{env}: {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def finish(per_seed: list[dict], seed_ids: list[int], config: dict, wall_s: float, out: str, name: str) -> dict:
    """Summarise, pair and write ``<out>/<name>.json`` and ``.png``; print the tables."""
    arms = kit.summarise(per_seed)
    envs = config["envs"]
    result = kit.write_result(PAPER, seeds=len(per_seed), wall_s=wall_s, config=config, arms=arms,
                              per_seed=per_seed, out=out, name=name, seed_ids=seed_ids,
                              paired=paired_differences(per_seed, envs))
    plot(arms, envs, os.path.join(out, f"{name}.png"))
    for env in envs:
        table = {arm: cells for arm, cells in arms.items() if arm.startswith(env + "/")}
        print(f"\n{env}\n{kit.markdown_table(table, [*METRICS, 'behaviour_return'])}")
        for pair, cells in result["paired"].items():
            if pair.startswith(env + "/"):
                print(pair, "; ".join(f"{m} {c['mean']:.1f} [{c['lo'] or float('nan'):.1f}, "
                                      f"{c['hi'] or float('nan'):.1f}]" for m, c in cells.items()))
    print(f"\nwall {wall_s:.0f} s ({len(per_seed)} seeds)")
    return result


# the settings two runs must share to be merged (the rest names files, seeds or arms)
SETTINGS = ("smoke", "envs", "transitions", "ensemble_epochs", "ensemble_steps", "steps", "episodes")


def merge(paths: list[str], out: str, name: str, drop: dict[str, list[str]] | None = None) -> dict:
    """Join result JSONs run with the same settings into one: other seeds (``--seed-ids``) or, for the same seed,
    other arms (``--arms``; every run of a seed trains the same ensemble from that seed). An arm present twice for
    one seed is refused. A JSON without ``seed_ids`` holds the seeds 0, 1, ... in order. ``drop`` maps a file to
    the arms left out of it (an arm re-run in another file after a fix); the result records them."""
    drop = drop or {}
    parts = [json.loads(open(path).read()) for path in paths]
    config = dict(parts[0]["config"])
    for path, part in zip(paths, parts):
        if any(part["config"].get(key) != config.get(key) for key in SETTINGS):
            raise SystemExit(f"{path} was run with other settings than {paths[0]} ({', '.join(SETTINGS)}); only "
                             "equal runs can be merged.")
    rows: dict[int, dict] = {}
    for path, part in zip(paths, parts):
        for seed, row in zip(part.get("seed_ids") or range(len(part["per_seed"])), part["per_seed"]):
            merged = rows.setdefault(seed, {})
            for arm, metrics in row.items():
                if arm.split("/")[-1] in drop.get(path, []):
                    continue
                if arm in merged and not arm.endswith("/behaviour"):
                    raise SystemExit(f"seed {seed} has the arm {arm} in two files; merge disjoint arms or seeds.")
                cells = dict(metrics)
                if "q_overestimation" in cells:  # files written before abs_q_bias was reported
                    cells.setdefault("abs_q_bias", abs(cells["q_overestimation"]))
                merged[arm] = cells
    seed_ids = sorted(rows)
    order = [f"{env}/{arm}" for env in config["envs"] for arm in (*ARMS, "behaviour")]
    per_seed = [{arm: rows[seed][arm] for arm in order if arm in rows[seed]} for seed in seed_ids]
    config["arms"] = sorted({arm.split("/")[1] for row in per_seed for arm in row} - {"behaviour"}, key=str)
    config["merged_from"] = [os.path.basename(path) + (f" without {', '.join(drop[path])}" if drop.get(path) else "")
                             for path in paths]
    return finish(per_seed, seed_ids, config, sum(p["wall_s"] for p in parts), out, name)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--envs", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--transitions", type=int, default=20000, help="behaviour transitions per dataset")
    parser.add_argument("--ensemble-epochs", type=int, default=5)
    parser.add_argument("--ensemble-steps", type=int, default=60, help="ensemble batches per epoch")
    parser.add_argument("--steps", type=int, default=500, help="actor-critic training steps per arm")
    parser.add_argument("--episodes", type=int, default=20, help="real-environment evaluation episodes")
    parser.add_argument("--name", default="phyb", help="name of the JSON and PNG in --out")
    parser.add_argument("--seed-ids", type=int, nargs="+", default=None,
                        help="run these seeds instead of 0 .. --seeds - 1 (to split a run over processes)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                        help="the arms to train (the ensemble is trained when a model-based target is among them)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="join result JSONs of the same settings (other seeds or other arms) into --out/--name")
    parser.add_argument("--merge-drop", nargs="+", default=None, metavar="JSON:ARM,ARM",
                        help="with --merge: leave these arms of that file out (an arm re-run in another file)")
    args = parser.parse_args(argv)
    if args.merge:
        drop = {}
        for item in args.merge_drop or []:
            path, _, arms = item.rpartition(":")
            drop[path] = arms.split(",")
        return merge(args.merge, args.out, args.name, drop)
    if args.smoke:
        args.transitions, args.ensemble_epochs, args.ensemble_steps, args.steps, args.episodes = 500, 1, 3, 3, 2
    seed_ids = args.seed_ids if args.seed_ids is not None else list(range(args.seeds))
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    config = {key: value for key, value in vars(args).items()
              if key not in ("seeds", "out", "name", "seed_ids", "merge")}
    config["configs"] = {"ensemble": ENSEMBLE, "policy": POLICY, "model_free": MODEL_FREE}
    start, per_seed = time.time(), []
    with tempfile.TemporaryDirectory() as folder:
        for seed in kit.progress(seed_ids, "seeds"):  # the JSON is rewritten after every seed: a cut run keeps them
            per_seed.append(run_seed(seed, args, folder))
            result = finish(per_seed, seed_ids[:len(per_seed)], config, time.time() - start, args.out, args.name)
    return result


if __name__ == "__main__":
    main()
