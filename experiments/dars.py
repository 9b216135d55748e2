"""DARS vs uniform GRPO (and a compute-matched uniform, and breadth): ``python -m experiments.dars`` (~2-4 min).

Paper: "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration" (DARS,
arXiv 2508.13755). Claim checked (method card sections 2.5 and 4): DARS' second-stage rollouts on prompts with
stage-1 accuracy < 0.5 collect many more positive rollouts on hard prompts than uniform GRPO, about 2x a
uniform run that consumes the same number of rollouts. Asserted target: DARS-HW's positive rollouts on hard
prompts >= 2 x the compute-matched uniform's, per seed on average. Hard-tier pass@16/32 and pass@1 are
reported; the card expects a few points on pass@k and a flat pass@1, i.e. noise at this scale.

Same task, SFT warm-up (the cached per-seed checkpoint of ``experiments.knapsack_rl``) and GRPO as
``experiments.knapsack_rl``: Â = r - group mean (no std, as DARS), the constant loss normaliser (so extra
rollouts add gradient mass, as DARS' Σ ℓ m / L_max), one on-policy Adam step per batch, zero-variance groups
dropped in every arm (with no std and a constant normaliser such groups have zero advantage, so the filter does
not change any gradient here; it is set for parity with the DARS trainer). "Hard" = success rate < 0.1 under
the SFT policy (32 samples, measured once per seed).

Arms (per seed, same prompts in the same order):
* ``uniform``: N = 8.
* ``dars_et``: N = 8, equal treatment, N_max = 32.  * ``dars_hw``: N = 8, hardness weighted, N_max = 64.
* ``uniform_matched``: uniform with N = round(DARS-HW's mean rollouts per prompt) of the same seed.
* ``breadth``: uniform N = 8 on the WHOLE pool per step, one full-batch optimiser step per PPO epoch and
  2 PPO epochs (DARS-Breadth's update without DARS' rollouts), for the same total rollouts as ``uniform``.

Scale (defaults): tiers {2, 3, 4}, RL pool 256, test pool 256, 16 prompts per step, 48 steps, 2 seeds
(DARS-HW costs several times the uniform rollouts when most prompts are unsolved, which bounds the scale).
Measured: ~1.7 min with the SFT checkpoints cached by ``experiments.knapsack_rl``, plus ~2 min per seed without.
Outputs: markdown table, ``results/dars.json``, ``results/dars.png`` (cumulative hard positives vs cumulative
rollouts per arm; rollout cost per arm).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from experiments import quiet_single_thread
from experiments.knapsack_rl import (aggregate, common_arguments, evaluate, markdown, pool_difficulty,
                                     summarise_steps, train_grpo, warm_up)
from lightning_modules.rollout_allocation import DARSAllocator, UniformAllocator

PAPER = ("Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration "
         "(DARS, arXiv 2508.13755)")
ARMS = ("uniform", "dars_et", "dars_hw", "uniform_matched", "breadth")


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


def run(args) -> dict:
    quiet_single_thread()
    start = time.perf_counter()
    per_seed: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    curves: dict[str, list[list[dict]]] = {arm: [] for arm in ARMS}
    matched_n = []
    steps_per_epoch = -(-args.pool // args.batch)
    epochs = max(1, args.steps // steps_per_epoch)
    for seed in range(args.seeds):
        state = warm_up(args, seed)
        ids, tier, p = pool_difficulty(args, state, seed)
        hard = {int(i) for i, q in zip(ids.tolist(), p.tolist()) if q < 0.1}
        print(f"seed {seed}: hard prompts {len(hard)} / {len(ids)}", flush=True)
        results = {}
        for arm in ARMS:
            kwargs = {"drop_zero_variance": True, "epochs": epochs}
            if arm == "uniform":
                allocator = UniformAllocator()
            elif arm == "dars_et":
                allocator = DARSAllocator("equal_treatment", max_rollouts=32)
            elif arm == "dars_hw":
                allocator = DARSAllocator("hardness_weighted", max_rollouts=64)
            elif arm == "uniform_matched":
                hw = results["dars_hw"]
                n = max(args.rollouts, int(round(hw["rollouts_total"] / (epochs * args.pool))))
                matched_n.append(n)
                allocator, kwargs["rollouts"] = UniformAllocator(), n
            else:  # breadth: the whole pool per step, 2 full-batch PPO epochs, same rollouts as uniform
                allocator = UniformAllocator()
                kwargs.update(batch=args.pool, ppo_epochs=2)
            module, recorder, wall = train_grpo(args, seed, state, allocator, hard, **kwargs)
            row = {**summarise_steps(recorder), **evaluate(args, module.policy, seed), "wall_s": wall}
            results[arm] = row
            curves[arm].append(recorder.steps)
            print(f"  {arm}: rollouts {row['rollouts_total']:.0f}, hard positives {row['hard_positives_total']:.0f}, "
                  f"pass@1 {row['pass@1']:.3f}, {wall:.0f}s", flush=True)
        for arm in ARMS:
            results[arm]["rollout_cost_vs_uniform"] = results[arm]["rollouts_total"] / results["uniform"][
                "rollouts_total"]
            results[arm]["hard_positives_vs_uniform"] = results[arm]["hard_positives_total"] / max(
                1.0, results["uniform"]["hard_positives_total"])
            per_seed[arm].append(results[arm])
    arms = aggregate(per_seed)
    ratios = [hw["hard_positives_total"] / max(1.0, m["hard_positives_total"])
              for hw, m in zip(per_seed["dars_hw"], per_seed["uniform_matched"])]
    ratios_et = [et["hard_positives_total"] / max(1.0, m["hard_positives_total"])
                 for et, m in zip(per_seed["dars_et"], per_seed["uniform_matched"])]
    claim = {"target": "DARS-HW positive rollouts on hard prompts >= 2 x compute-matched uniform",
             "ratio_mean": float(np.mean(ratios)), "ratio_per_seed": ratios,
             "dars_et_ratio_mean": float(np.mean(ratios_et)), "matched_n": matched_n,
             "held": bool(np.mean(ratios) >= 2.0)}
    tiers = sorted(args.tiers)
    keys_train = ["rollouts_total", "rollout_cost_vs_uniform", "hard_positives_total", "hard_positives_vs_uniform",
                  "eff_ratio_response_2nd_half"]
    keys_eval = ["pass@1", "greedy"] + [f"pass@1_tier{t}" for t in tiers] + [
        f"pass@{k}_tier{t}" for t in tiers[-2:] for k in (16, 32)]
    wall = time.perf_counter() - start
    print(f"\n## {PAPER}\n\nscale: {args.seeds} seeds, {epochs * steps_per_epoch} steps x {args.batch} prompts, "
          f"N = {args.rollouts}, pool {args.pool}, tiers {tiers}, SFT {args.sft_steps} steps; compute-matched "
          f"uniform N per seed {matched_n}; wall {wall:.0f}s\n")
    print(markdown(arms, keys_train) + "\n\n" + markdown(arms, keys_eval))
    print(f"\nclaim: {claim['target']}: ratio {claim['ratio_mean']:.2f} (per seed "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; DARS-ET {claim['dars_et_ratio_mean']:.2f}) -> "
          f"{'HELD' if claim['held'] else 'NOT HELD'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"paper": "dars", "seeds": args.seeds, "wall_s": wall, "arms": arms, "claim": claim,
              "scale": {k: v for k, v in vars(args).items() if k != "out"}, "per_seed": per_seed}
    (out / "dars.json").write_text(json.dumps(result, indent=1))
    plot(out / "dars.png", curves, arms)
    return result


def main() -> None:
    parser = common_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]), seeds=2, steps=48)
    parser.set_defaults(batch=16)
    run(parser.parse_args())


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
