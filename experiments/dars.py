"""DARS vs uniform GRPO (and a compute-matched uniform, and breadth): ``python -m experiments.dars``.

Paper: "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration" (DARS,
arXiv 2508.13755). Claim checked (the paper's multi-stage rollout with its equal-treatment and hardness-weighted
schedules): DARS' second-stage rollouts on prompts with stage-1 accuracy < 0.5 collect many more positive
rollouts on hard prompts than uniform GRPO, about 2x a uniform run that consumes the same number of rollouts.
Asserted target: DARS-HW's positive rollouts on hard prompts >= 2 x the compute-matched uniform's, per seed on
average. Hard-tier pass@16/32 and pass@1 are reported only (the paper reports higher pass@k; differences of a
few points are noise at this scale).

Same task, SFT warm-up (a per-seed checkpoint cached on disk) and GRPO runs as ``experiments.knapsack_rl``,
from `experiments._rlvr`; every arm starts from ``configs/dars/quick.yaml`` and overrides only the scale and the
arm: Â = r - group mean (no std, as DARS), the constant loss normaliser (so extra rollouts add gradient mass, as
DARS' Σ ℓ m / L_max), one on-policy Adam step per batch, zero-variance groups
dropped in every arm (with no std and a constant normaliser such groups have zero advantage, so the filter does
not change any gradient here; it is set for parity with the DARS trainer). "Hard" = success rate < 0.1 under
the SFT policy (32 samples, measured once per seed).

Arms (per seed, same prompts in the same order):
* ``uniform``: N = 8.
* ``dars_et``: N = 8, equal treatment, N_max = 32.  * ``dars_hw``: N = 8, hardness weighted, N_max = 64.
* ``uniform_matched``: uniform with N = round(DARS-HW's mean rollouts per prompt) of the same seed.
* ``breadth``: uniform N = 8 on the WHOLE pool per step, one full-batch optimiser step per PPO epoch and
  2 PPO epochs (DARS-Breadth's update without DARS' rollouts), for the same total rollouts as ``uniform``.

Scale (defaults): tiers {2, 3, 4} with pool shares 6 : 1 : 1, SFT warm-up of 9,000 steps, RL pool 256, test pool
256, 16 prompts per step, 48 steps, 2 seeds. Why this mix: DARS spends extra rollouts only on prompts whose stage-1
accuracy is below 0.5, so its advantage over a uniform run of equal cost depends on hard prompts being a minority
of the pool, as in the paper's training sets. With equal tier shares and the 3,000-step warm-up of
``experiments.knapsack_rl``, 67-71% of the pool had SFT p < 0.1 and DARS-HW got 0.69x the compute-matched run's
hard positives (``results/dars_equal_tiers.json``: ``--tier-shares 1 1 1 --sft-steps 3000``); the 6 : 1 : 1 mix
with that warm-up still left 61-73% hard (0.95x, ``results/dars_mix611_sft3000.json``); with the 9,000-step
warm-up the mix has 24-27% hard prompts and DARS-HW gets 1.59x (``results/dars.json``).
Outputs: markdown table, ``<out>/dars.json`` (the kit's schema plus ``claim``) and ``<out>/dars.png``
(cumulative hard positives vs cumulative rollouts per arm; rollout cost per arm).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from experiments import _rlvr as rlvr
from experiments.kit import experiment_parser, markdown_table, progress, quiet_single_thread, summarise, write_result
from lightning_modules.rlvr.rollout_allocation import UniformAllocator

PAPER = ("Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration "
         "(DARS, arXiv 2508.13755)")
CONFIG = "configs/dars/quick.yaml"
ARMS = ("uniform", "dars_et", "dars_hw", "uniform_matched", "breadth")
UNIFORM = f"--model.init_args.rollout_allocator={UniformAllocator.__module__}.UniformAllocator"


def plot(path: Path, curves: dict[str, list[list[dict]]], arms: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for colour, (arm, runs) in enumerate(curves.items()):
        for i, steps in enumerate(runs):
            x = np.cumsum([r["rollouts"] for r in steps])
            y = np.cumsum([r["hard_positives"] for r in steps])
            axes[0].plot(x, y, color=f"C{colour}", alpha=0.8, label=arm if i == 0 else None)
    axes[0].set(xlabel="cumulative rollouts", ylabel="cumulative positive rollouts on hard prompts",
                title="Positives on hard prompts (SFT p < 0.1)")
    axes[0].legend(fontsize=8)
    names = list(arms)
    cost = [arms[a]["rollout_cost_vs_uniform"]["mean"] for a in names]
    err = [arms[a]["rollout_cost_vs_uniform"]["std"] for a in names]
    axes[1].bar(names, cost, yerr=err, color=[f"C{i}" for i in range(len(names))])
    axes[1].set(ylabel="rollouts / uniform rollouts", title="Rollout cost")
    axes[1].tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = rlvr.add_rlvr_arguments(experiment_parser(__doc__.splitlines()[0], seeds=2), steps=48, batch=16)
    parser.add_argument("--name", default="dars", help="name of the JSON and PNG in --out")
    parser.set_defaults(tier_shares=[6, 1, 1], sft_steps=9000)  # hard prompts a minority (see the docstring)
    args = parser.parse_args(argv)
    if args.smoke:
        rlvr.apply_smoke(args)
    quiet_single_thread()
    start = time.perf_counter()
    per_seed: list[dict[str, dict[str, float]]] = []
    curves: dict[str, list[list[dict]]] = {arm: [] for arm in ARMS}
    matched_n, hard_share, stage1_hard_share = [], [], []
    steps_per_epoch = -(-args.pool // args.batch)
    epochs = max(1, args.steps // steps_per_epoch)
    for seed in progress(range(args.seeds), "seeds"):
        state = rlvr.warm_up(args, seed)
        sft_policy, dm = rlvr.rl_data(args, seed)
        sft_policy.load_state_dict(state)
        ids, tier, p = rlvr.pool_difficulty(args, sft_policy, dm, seed)
        hard = {int(i) for i, q in zip(ids.tolist(), p.tolist()) if q < 0.1}
        hard_share.append(len(hard) / len(ids))
        stage1_hard_share.append(float((p < 0.5).float().mean()))  # what DARS' stage 1 (a < 0.5) would call hard
        print(f"seed {seed}: hard prompts {len(hard)} / {len(ids)}; SFT p < 0.5: {stage1_hard_share[-1]:.2f}",
              flush=True)
        results = {}
        for arm in progress(ARMS, f"seed {seed} arms"):
            batch = None
            if arm == "uniform":
                overrides = [UNIFORM]
            elif arm == "dars_et":
                overrides = ["--model.init_args.rollout_allocator.init_args.schedule=equal_treatment",
                             "--model.init_args.rollout_allocator.init_args.max_rollouts=32"]
            elif arm == "dars_hw":  # the config's schedule
                overrides = ["--model.init_args.rollout_allocator.init_args.schedule=hardness_weighted",
                             "--model.init_args.rollout_allocator.init_args.max_rollouts=64"]
            elif arm == "uniform_matched":
                hw = results["dars_hw"]
                n = max(args.rollouts, int(round(hw["rollouts_total"] / (epochs * args.pool))))
                matched_n.append(n)
                overrides = [UNIFORM, f"--model.init_args.rollouts_per_prompt={n}"]
            else:  # breadth: the whole pool per step, 2 full-batch PPO epochs, same rollouts as uniform
                overrides, batch = [UNIFORM, "--model.init_args.ppo_epochs=2"], args.pool
            module, recorder, wall = rlvr.train_grpo(args, seed, state, CONFIG, overrides, hard, batch=batch,
                                                     epochs=epochs)
            row = {**rlvr.summarise_steps(recorder), **rlvr.evaluate(args, module.policy, dm, seed), "wall_s": wall}
            results[arm] = row
            curves[arm].append(recorder.steps)
            print(f"  {arm}: rollouts {row['rollouts_total']:.0f}, hard positives {row['hard_positives_total']:.0f}, "
                  f"pass@1 {row['pass@1']:.3f}, {wall:.0f}s", flush=True)
        for arm in ARMS:
            results[arm]["rollout_cost_vs_uniform"] = results[arm]["rollouts_total"] / results["uniform"][
                "rollouts_total"]
            results[arm]["hard_positives_vs_uniform"] = results[arm]["hard_positives_total"] / max(
                1.0, results["uniform"]["hard_positives_total"])
        per_seed.append(results)
    arms = summarise(per_seed)
    ratios = [row["dars_hw"]["hard_positives_total"] / max(1.0, row["uniform_matched"]["hard_positives_total"])
              for row in per_seed]
    ratios_et = [row["dars_et"]["hard_positives_total"] / max(1.0, row["uniform_matched"]["hard_positives_total"])
                 for row in per_seed]
    claim = {"target": "DARS-HW positive rollouts on hard prompts >= 2 x compute-matched uniform",
             "ratio_mean": float(np.mean(ratios)), "ratio_per_seed": ratios,
             "dars_et_ratio_mean": float(np.mean(ratios_et)), "matched_n": matched_n,
             "hard_share_of_pool": hard_share, "sft_p_below_half_share_of_pool": stage1_hard_share,
             "held": bool(np.mean(ratios) >= 2.0)}
    keys_train = ["rollouts_total", "rollout_cost_vs_uniform", "hard_positives_total", "hard_positives_vs_uniform",
                  "hard_positives_per_visit", "eff_ratio_response_2nd_half"]
    wall = time.perf_counter() - start
    print(f"\n## {PAPER}\n\nscale: {args.seeds} seeds, {epochs * steps_per_epoch} steps x {args.batch} prompts, "
          f"N = {args.rollouts}, pool {args.pool}, tiers {sorted(args.tiers)} (shares "
          f"{args.tier_shares or 'equal'}; hard share {np.mean(hard_share):.2f}), SFT {args.sft_steps} steps; "
          f"compute-matched uniform N per seed {matched_n}; wall {wall:.0f}s\n")
    print(markdown_table(arms, keys_train) + "\n\n" + markdown_table(arms, rlvr.eval_keys(args)))
    print(f"\nclaim: {claim['target']}: ratio {claim['ratio_mean']:.2f} (per seed "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; DARS-ET {claim['dars_et_ratio_mean']:.2f}) -> "
          f"{'HELD' if claim['held'] else 'NOT HELD'}")
    result = write_result("dars", name=args.name, seeds=args.seeds, wall_s=wall, config=rlvr.settings(args), arms=arms,
                          per_seed=per_seed, out=args.out, claim=claim)
    plot(Path(args.out) / f"{args.name}.png", curves, arms)
    return result


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
