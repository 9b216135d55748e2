"""Knapsack RL vs uniform GRPO at equal rollouts: ``python -m experiments knapsack_rl`` (~15 min, 5 seeds, 2 cores).

Paper: "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849). Claim
checked: at the same total rollouts per step, allocating them by the knapsack over per-prompt success estimates
raises the response-level effective-gradient ratio (the fraction of rollouts whose group has mixed outcomes),
reported +20-40% relative in the paper (Sec. 4). Target on this toy: knapsack >= uniform + 0.05 absolute, averaged
over the second half of training (``configs/knapsack_rl/card.yaml`` checks its paired 95% interval). pass@1 /
pass@k are reported only.

The protocol is configuration, ``configs/knapsack_rl/experiment.yaml``, run by `experiments.runner` (every arm built
as ``python train.py fit`` builds it, with its config's callbacks; one seed S drives model and data). Per seed S:

1. ``sft`` (no row): the supervised warm-up of the tiny GPT, ``configs/grpo/sft_quick.yaml``, 3000 AdamW steps
   (lr 3e-3, gradient-norm clip 1) of 64 sums drawn with replacement, on 1-2-digit sums plus 20% 3-digit sums (the
   datamodule's default 5% left the 3-digit tier at p ~ 0.001; 20% gives p ~ 0.01-0.04 there, ~0.2-0.95 on 2
   digits, 0 on 4 digits). Its evaluate hook measures every RL-pool prompt's success rate under the SFT policy
   (32 samples): "hard" prompts are those below 0.1, the same set in both arms.
2. ``uniform`` and ``knapsack``: ``configs/knapsack_rl/quick.yaml`` (GRPO with the knapsack allocator, Dr. GRPO:
   A = r - group mean, the constant loss normaliser, no KL, Adam) from the SFT checkpoint, overriding only the scale
   and the arm: 32 prompts x N = 8 rollouts per step (budget 256), temperature 1, one on-policy Adam step per batch
   (lr 1e-4), 12 epochs of the 256-prompt pool (96 steps). ``uniform``: ``rollout_allocator=UniformAllocator``;
   ``knapsack``: the config's `KnapsackAllocator` (exact greedy solver, min_n = negative_n = positive_n = 2) with the
   paper's max_n 64 and p valid after 8 rewards, as the released script; the first epoch is uniform.

Scale: digit tiers {2, 3, 4} (the datamodule's default {2..5} with SFT on 1-3 digits needs ~1500+ SFT steps of
batch 128, many minutes per seed on this machine, so the SFT data and the top tier are one digit shorter), RL pool
256, test pool 256, 5 seeds (2 left the claim within seed noise). Measured: ~15 min wall (SFT ~2 min per seed,
~20 s per GRPO arm).

Metrics (`experiments._rlvr`): per step (from ``GRPO.last_rollouts``, recorded by `experiments._rlvr.StepRecorder`)
the response- and prompt-level effective ratios, rollouts, and positive rollouts on hard prompts; after training,
on the test pool with 32 samples per prompt at T = 1: pass@1 per tier, unbiased pass@16 / pass@32 on the two
hardest tiers, greedy accuracy. `report` adds ``claim``, ``timings_s``, ``sft_pool_histograms`` (the SFT policy's
p-histogram per tier and seed), ``curves`` (per arm and seed, rollouts and effective ratio per step) and
``knapsack_allocations`` (second-half N_i against the knapsack's plan-time p̂, as counts); `plot` writes
``<out>/knapsack_rl.png`` (allocation vs p̂, effective ratio vs cumulative rollouts).
"""
from __future__ import annotations

import sys

import numpy as np

from experiments import _rlvr as rlvr
from experiments import runner

METHOD, BASELINE, METRIC = "knapsack", "uniform", "eff_ratio_response_2nd_half"


def report(result: dict, records: list[dict], spec) -> dict:
    """The paired differences over every measured metric (the runner's cover the table's columns), the claim (mean
    per-seed difference of the 2nd-half effective ratio against ``settings.claim_margin``), the wall seconds per arm
    summed over seeds, the SFT pool histograms, the per-step curves and the knapsack allocations."""
    margin = float(spec.settings.get("claim_margin", 0.05))
    warm_up = spec.settings["warm_up"]
    diffs = [row[METHOD][METRIC] - row[BASELINE][METRIC] for row in result["per_seed"]
             if METHOD in row and BASELINE in row]
    claim = {"target": f"knapsack effective ratio (response level, 2nd half) >= uniform + {margin:g}",
             "difference_mean": float(np.mean(diffs)), "difference_per_seed": diffs,
             "held": bool(np.mean(diffs) >= margin)}
    arms = [arm.name for arm in spec.arms if arm.row]
    timings = {f"{'sft' if arm == warm_up else arm}_s": float(sum(e["fit_s"] for e in rlvr.seed_records(records, arm)))
               for arm in [warm_up, *arms]}
    sft = rlvr.seed_records(records, warm_up)
    print(f"\nclaim: {claim['target']}: difference {claim['difference_mean']:+.3f} -> "
          f"{'HELD' if claim['held'] else 'NOT HELD'}; hard prompts per seed {[len(e['hard']) for e in sft]}")
    metrics = list(dict.fromkeys(m for row in result["per_seed"] for cells in row.values() for m in cells))
    return {"paired": runner.paired(result["per_seed"], BASELINE, metrics), "claim": claim, "timings_s": timings,
            "sft_pool_histograms": [e["histogram"] for e in sft], "curves": rlvr.curves(records, arms),
            "knapsack_allocations": rlvr.allocation_table(records, METHOD)}


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    table = result.get("knapsack_allocations") or {}
    counts = np.array(table.get("counts") or np.zeros((0, 0)), dtype=float)
    if counts.size:
        edges, n_values = np.array(table["p_edges"]), np.array(table["n_values"], dtype=float)
        centre = (edges[:-1] + edges[1:]) / 2
        n_grid, p_grid = np.meshgrid(n_values, centre, indexing="ij")
        axes[0].scatter(p_grid.ravel(), n_grid.ravel(), s=4 * np.sqrt(counts.ravel()), alpha=0.4,
                        label="prompt visits (2nd half; area ~ count)")
        visits = counts.sum(0)
        mean_n = np.where(visits > 0, (counts * n_values[:, None]).sum(0) / np.maximum(visits, 1), np.nan)
        axes[0].plot(centre, mean_n, "r-o", ms=3, label="mean N per p̂ bin")
    n = result["config"]["arms"][BASELINE] if BASELINE in result.get("config", {}).get("arms", {}) else []
    uniform_n = next((int(f.split("=", 1)[1]) for f in reversed(n) if f.startswith(
        "--model.init_args.rollouts_per_prompt=")), None)
    if uniform_n is not None:
        axes[0].axhline(uniform_n, color="k", ls="--", lw=1, label=f"uniform N={uniform_n}")
    axes[0].set(xlabel="p̂ (knapsack's estimate at plan time)", ylabel="rollouts N_i", yscale="log",
                title="Knapsack allocation vs success estimate")
    axes[0].legend(fontsize=8)
    rlvr.plot_curves(axes[1], result, {BASELINE: "C0", METHOD: "C1"})
    axes[1].set(title="Effective-gradient ratio")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # ``python -m experiments.knapsack_rl [--smoke] [--seeds N] [--out DIR] [--check] ...``
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["knapsack_rl", *sys.argv[1:]]))
