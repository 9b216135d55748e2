"""Knapsack RL vs uniform GRPO at equal rollouts: ``python -m experiments.knapsack_rl`` (~5 min, 2 cores).

Paper: "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849). Claim
checked: at the same total rollouts per step, allocating them by the knapsack over per-prompt success estimates
raises the response-level effective-gradient ratio (the fraction of rollouts whose group has mixed outcomes),
reported +20-40% relative in the paper (Sec. 4). Asserted target on this toy: knapsack >= uniform + 0.05
absolute, averaged over the second half of training. pass@1 / pass@k are reported only.

Task, SFT warm-up and GRPO runs: `experiments._rlvr` (shared with ``experiments.dars``). Both arms start from
``configs/knapsack_rl/quick.yaml`` (GRPO with the knapsack allocator, Dr. GRPO: Â = r - group mean, the constant
loss normaliser, no KL, Adam) and override only the scale below and the arm: M prompts x N = 8 rollouts per step
(budget 8M), temperature 1, one on-policy Adam step per batch (lr 1e-4). Arms: ``uniform``
(``rollout_allocator=UniformAllocator``) and ``knapsack`` (the config's `KnapsackAllocator`, exact greedy solver,
min_n = negative_n = positive_n = 2, with the paper's max_n 64 at this budget and p valid after 8 rewards, as the
released script; the first epoch is uniform).

Scale (defaults; flags change them): digit tiers {2, 3, 4} (the datamodule's default {2..5} with SFT on 1-3
digits needs ~1500+ SFT steps of batch 128, many minutes per seed on this machine, so the SFT data and the top
tier are one digit shorter), RL pool 256 (85-86 per tier), test pool 256, 32 prompts per step (8 steps per
epoch), 96 GRPO steps (12 epochs), SFT 3000 steps of batch 64 at AdamW lr 3e-3 (grad-norm clip 1) on 1-2-digit
sums plus 20% 3-digit sums (the datamodule's default 5% left the 3-digit tier at p ~ 0.001; 20% gives p ~
0.01-0.04 there, ~0.2-0.95 on 2 digits, 0 on 4 digits), 5 seeds (2 left the claim within seed noise). Measured:
~15 min wall (SFT ~2 min per seed, ~20 s per GRPO arm). "Hard" prompts are those whose success rate under the SFT
policy (32 samples each, measured once per seed before RL) is below 0.1; the same set is used in both arms.

Metrics: per step (from ``GRPO.last_rollouts``) the response- and prompt-level effective ratios, rollouts, and
positive rollouts on hard prompts; after training, on the test pool with 32 samples per prompt at T = 1:
pass@1 per tier, unbiased pass@16 / pass@32 on the two hardest tiers, greedy accuracy. Outputs: a markdown table
(mean ± std over seeds), ``<out>/knapsack_rl.json`` (the kit's schema plus ``claim``, ``timings_s`` and
``sft_pool_histograms``) and ``<out>/knapsack_rl.png`` (allocation vs p̂ in the second half, effective ratio vs
cumulative rollouts).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from experiments import _rlvr as rlvr
from experiments.kit import experiment_parser, markdown_table, progress, quiet_single_thread, summarise, write_result
from lightning_modules.rlvr.rollout_allocation import UniformAllocator

PAPER = "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation (arXiv 2509.25849)"
CONFIG = "configs/knapsack_rl/quick.yaml"
ARMS = {  # arm -> the CLI overrides of CONFIG that make it
    "uniform": [f"--model.init_args.rollout_allocator={UniformAllocator.__module__}.UniformAllocator"],
    "knapsack": ["--model.init_args.rollout_allocator.init_args.max_n=64",
                 "--model.init_args.rollout_allocator.init_args.min_history=8"],
}


def plot(path: Path, allocations: list, curves: dict[str, list[list[dict]]], rollouts_per_prompt: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    data = np.array([(n, p) for n, p in allocations if np.isfinite(p)]) if allocations else np.zeros((0, 2))
    if len(data):
        axes[0].scatter(data[:, 1], data[:, 0], s=6, alpha=0.25, label="prompt visits (2nd half)")
        bins = np.linspace(0, 1, 11)
        centre = (bins[:-1] + bins[1:]) / 2
        which = np.clip(np.digitize(data[:, 1], bins) - 1, 0, 9)
        means = [data[which == b, 0].mean() if (which == b).any() else np.nan for b in range(10)]
        axes[0].plot(centre, means, "r-o", label="mean N per p̂ bin")
    axes[0].axhline(rollouts_per_prompt, color="k", ls="--", lw=1, label=f"uniform N={rollouts_per_prompt}")
    axes[0].set(xlabel="p̂ (knapsack's estimate at plan time)", ylabel="rollouts N_i", yscale="log",
                title="Knapsack allocation vs success estimate")
    axes[0].legend(fontsize=8)
    for arm, runs in curves.items():
        for i, steps in enumerate(runs):
            x = np.cumsum([r["rollouts"] for r in steps])
            width = min(5, len(steps))  # a 5-step mean (shorter only in --smoke runs)
            y = np.convolve([r["effective_ratio_response"] for r in steps], np.ones(width) / width, mode="same")
            axes[1].plot(x, y, color="C0" if arm == "uniform" else "C1", alpha=0.8,
                         label=arm if i == 0 else None)
    axes[1].set(xlabel="cumulative rollouts", ylabel="response-level effective ratio (5-step mean)",
                title="Effective-gradient ratio")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = rlvr.add_rlvr_arguments(experiment_parser(__doc__.splitlines()[0], seeds=5), steps=96)
    args = parser.parse_args(argv)
    if args.smoke:
        rlvr.apply_smoke(args)
    quiet_single_thread()
    start = time.perf_counter()
    per_seed: list[dict[str, dict[str, float]]] = []
    curves: dict[str, list[list[dict]]] = {arm: [] for arm in ARMS}
    allocations, histograms, timings = [], [], {"sft_s": 0.0, "uniform_s": 0.0, "knapsack_s": 0.0}
    tiers = sorted(args.tiers)
    for seed in progress(range(args.seeds), "seeds"):
        t0 = time.perf_counter()
        state = rlvr.warm_up(args, seed)
        timings["sft_s"] += time.perf_counter() - t0
        sft_policy, dm = rlvr.rl_data(args, seed)
        sft_policy.load_state_dict(state)
        ids, tier, p = rlvr.pool_difficulty(args, sft_policy, dm, seed)
        hard = {int(i) for i, q in zip(ids.tolist(), p.tolist()) if q < 0.1}
        histograms.append({f"tier{t}": np.histogram(p[tier == t].numpy(), bins=10, range=(0, 1))[0].tolist()
                           for t in tiers})
        sft_eval = {f"sft_p_tier{t}": float(p[tier == t].mean()) for t in tiers}
        print(f"seed {seed}: SFT pool success {sft_eval}, hard prompts {len(hard)}", flush=True)
        rows = {}
        for arm, overrides in progress(ARMS.items(), f"seed {seed} arms"):
            module, recorder, wall = rlvr.train_grpo(args, seed, state, CONFIG, overrides, hard)
            timings[f"{arm}_s"] += wall
            rows[arm] = {**rlvr.summarise_steps(recorder), **rlvr.evaluate(args, module.policy, dm, seed),
                         "wall_s": wall}
            curves[arm].append(recorder.steps)
            if arm == "knapsack":
                second_half = len(recorder.steps) // 2
                allocations += [(n, q) for step, n, q, _ in recorder.allocations if step >= second_half]
            print(f"  {arm}: eff ratio (2nd half) {rows[arm]['eff_ratio_response_2nd_half']:.3f}, pass@1 "
                  f"{rows[arm]['pass@1']:.3f}, {wall:.0f}s", flush=True)
        per_seed.append(rows)
    arms = summarise(per_seed)
    diffs = [row["knapsack"]["eff_ratio_response_2nd_half"] - row["uniform"]["eff_ratio_response_2nd_half"]
             for row in per_seed]
    claim = {"target": "knapsack effective ratio (response level, 2nd half) >= uniform + 0.05",
             "difference_mean": float(np.mean(diffs)), "difference_per_seed": diffs,
             "held": bool(np.mean(diffs) >= 0.05)}
    keys_train = ["eff_ratio_response_2nd_half", "eff_ratio_prompt_2nd_half", "rollouts_total",
                  "hard_positives_per_visit"]
    wall = time.perf_counter() - start
    print(f"\n## {PAPER}\n\nscale: {args.seeds} seeds, {args.steps} GRPO steps x {args.batch} prompts x "
          f"{args.rollouts} rollouts (budget {args.batch * args.rollouts}/step), pool {args.pool}, tiers {tiers}, "
          f"SFT {args.sft_steps} steps; wall {wall:.0f}s\n")
    print(markdown_table(arms, keys_train) + "\n\n" + markdown_table(arms, rlvr.eval_keys(args)))
    print(f"\nclaim: {claim['target']}: difference {claim['difference_mean']:+.3f} -> "
          f"{'HELD' if claim['held'] else 'NOT HELD'}")
    result = write_result("knapsack_rl", seeds=args.seeds, wall_s=wall, config=rlvr.settings(args), arms=arms,
                          per_seed=per_seed, out=args.out, claim=claim, timings_s=timings,
                          sft_pool_histograms=histograms)
    plot(Path(args.out) / "knapsack_rl.png", allocations, curves, args.rollouts)
    return result


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
