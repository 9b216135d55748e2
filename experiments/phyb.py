"""PhyB vs PMDB vs MOPO vs the mean-ensemble target, offline, on CPU: ``python -m experiments.phyb``.

Paper: "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief" (ICML 2026, arXiv
2606.00680). Its claim: a Bellman target from a convex combination of the k most pessimistic of N sampled models
(softmax of their normalised values, lambda = -3) is pessimistic enough to avoid the overestimation of a plain model
ensemble and less brittle than PMDB's single order statistic.

Per seed and dataset (the data seed, the ensemble and the policy initialisation change with the seed):

1. data: ``currency_exchange`` = CurrencyExchange with a uniform-random behaviour policy; ``pendulum`` = Pendulum
   with the noisy medium controller (`datamodules.offline_rl`), ``--transitions`` transitions each.
2. one dynamics ensemble (``configs/phyb/ensemble_quick.yaml``: 7 members, 5 elites), shared by the four arms.
3. arms ``<env>/mean``, ``<env>/mopo``, ``<env>/pmdb``, ``<env>/phyb``: ``configs/phyb/quick.yaml`` from that
   ensemble, only ``belief_target`` changed (same actor-critic, same ``--steps`` training steps, no tuning for any
   arm, the last policy evaluated: nothing is selected).
4. metrics over ``--episodes`` real-environment episodes with the code's acting rule: ``return`` (mean undiscounted
   return) and ``q_overestimation`` (critic Q(s0, a0) / reward_scale minus the discounted Monte-Carlo return of the same
   episodes); the reference row ``<env>/behaviour`` holds ``behaviour_return`` (the data-collecting policy).

Outputs: a markdown table per environment (mean ± std over seeds), ``results/phyb.json`` and ``results/phyb.png``.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time

from callbacks.offline_evaluation import evaluate
from experiments import kit

ENSEMBLE, POLICY = "configs/phyb/ensemble_quick.yaml", "configs/phyb/quick.yaml"
TARGETS = ("mean", "mopo", "pmdb", "phyb")
# environment -> (data overrides, model overrides shared by both stages)
DATASETS = {
    "currency_exchange": (["--data.init_args.source=currency_exchange", "--data.init_args.behaviour=random"],
                          ["--model.init_args.termination=currency_exchange"]),
    "pendulum": (["--data.init_args.source=pendulum", "--data.init_args.behaviour=medium"],
                 ["--model.init_args.termination=none"]),
}
PAPER = "Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief (PhyB, ICML 2026)"


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


def train_policy(env: str, target: str, seed: int, checkpoint: str, args) -> dict[str, float]:
    data, shared = DATASETS[env]
    model, datamodule = kit.from_config(
        POLICY, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
        f"--data.init_args.num_transitions={args.transitions}", *data, *shared,
        f"--model.init_args.belief_target={target}", f"--model.init_args.init_from={checkpoint}")
    # max_steps counts optimiser steps: critic + actor per training step
    kit.quiet_trainer(max_steps=2 * args.steps, limit_val_batches=0, deterministic=True).fit(model,
                                                                                             datamodule=datamodule)
    result = evaluate(model, datamodule.make_env(), args.episodes, seed=10_000 + seed)
    return {"return": result["return"], "q_overestimation": result["q_overestimation"]}, datamodule


def run_seed(seed: int, args, folder: str) -> dict:
    arms = {}
    bar = kit.progress(None, f"seed {seed}: ensembles and belief targets", total=len(args.envs) * (1 + len(TARGETS)))
    for env in args.envs:
        checkpoint = train_ensemble(env, seed, args, folder)
        bar.update()
        for target in TARGETS:
            arms[f"{env}/{target}"], datamodule = train_policy(env, target, seed, checkpoint, args)
            bar.update()
        arms[f"{env}/behaviour"] = {"behaviour_return": datamodule.behaviour_return}
    bar.close()
    return arms


def plot(arms: dict, envs: list[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(envs), figsize=(4.5 * len(envs), 6), squeeze=False)
    for col, env in enumerate(envs):
        for row, metric in enumerate(("return", "q_overestimation")):
            cells = [arms[f"{env}/{t}"][metric] for t in TARGETS]
            axes[row, col].bar(TARGETS, [c["mean"] for c in cells], yerr=[c["std"] for c in cells], capsize=3)
            if metric == "return":
                axes[row, col].axhline(arms[f"{env}/behaviour"]["behaviour_return"]["mean"], color="k", ls="--",
                                       lw=1, label="behaviour")
                axes[row, col].legend()
            axes[row, col].set_title(f"{env}: {metric}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = kit.experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--envs", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--transitions", type=int, default=20000, help="behaviour transitions per dataset")
    parser.add_argument("--ensemble-epochs", type=int, default=5)
    parser.add_argument("--ensemble-steps", type=int, default=60, help="ensemble batches per epoch")
    parser.add_argument("--steps", type=int, default=500, help="actor-critic training steps per arm")
    parser.add_argument("--episodes", type=int, default=20, help="real-environment evaluation episodes")
    parser.add_argument("--name", default="phyb", help="name of the JSON and PNG in --out")
    args = parser.parse_args(argv)
    if args.smoke:
        args.transitions, args.ensemble_epochs, args.ensemble_steps, args.steps, args.episodes = 500, 1, 3, 3, 2
    kit.quiet_single_thread()
    logging.getLogger("lightning_modules").setLevel(logging.ERROR)
    start = time.time()
    with tempfile.TemporaryDirectory() as folder:
        per_seed = [run_seed(seed, args, folder) for seed in kit.progress(range(args.seeds), "seeds")]
    arms = kit.summarise(per_seed)
    config = {key: value for key, value in vars(args).items() if key not in ("seeds", "out", "name")}
    config["configs"] = {"ensemble": ENSEMBLE, "policy": POLICY}
    result = kit.write_result(PAPER, seeds=args.seeds, wall_s=time.time() - start, config=config, arms=arms,
                              per_seed=per_seed, out=args.out, name=args.name)
    plot(arms, args.envs, os.path.join(args.out, f"{args.name}.png"))
    for env in args.envs:
        table = {arm: cells for arm, cells in arms.items() if arm.startswith(env + "/")}
        print(f"\n{env}\n{kit.markdown_table(table, ['return', 'q_overestimation', 'behaviour_return'])}")
    print(f"\nwall {result['wall_s']:.0f} s ({args.seeds} seeds)")
    return result


if __name__ == "__main__":
    main()
