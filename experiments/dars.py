"""DARS vs uniform GRPO (and a compute-matched uniform, and breadth): ``python -m experiments.dars``.

Paper: "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration" (DARS,
arXiv 2508.13755). The paper's multi-stage rollout (equal-treatment and hardness-weighted schedules) gives prompts
with stage-1 accuracy < 0.5 extra rollouts; it reports higher pass@k on held-out benchmarks and about 2x the
positive rollouts on hard prompts of a uniform run that consumes the same number of rollouts.

Primary result (the JSON's ``claim``): held-out test pass@1 of DARS-HW minus the compute-matched uniform run, seed
by seed, with its 95% t interval (`icml26.claims.paired_interval`); held only if the interval excludes zero. The
JSON's ``paired`` block gives every DARS arm minus ``uniform_matched`` and minus ``uniform`` (breadth only minus
``uniform``, which it costs the same as) for held-out pass@1, pass@32 on the two hardest test tiers and the
training-time count of positive rollouts on hard prompts. That count shows that DARS' extra rollouts on hard
prompts find more positives during training; it does not by itself show a better policy on held-out prompts.

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
256, 16 prompts per step, 48 steps, 5 seeds. Why this mix: DARS spends extra rollouts only on prompts whose stage-1
accuracy is below 0.5, so its advantage over a uniform run of equal cost depends on hard prompts being a minority
of the pool, as in the paper's training sets. The mix and warm-up were chosen after four earlier runs, using
the training-time hard-positives ratio (a selection effect: the chosen setting's ratio is biased upwards): equal tier
shares and a 3,000-step warm-up gave 1.05x, 0.75x and 0.69x across code revisions (67-71% of the pool hard;
``results/dars_equal_tiers.json``: ``--tier-shares 1 1 1 --sft-steps 3000``), the 6 : 1 : 1 mix with that warm-up
0.95x (61-73% hard, ``results/dars_mix611_sft3000.json``); the 9,000-step warm-up leaves about a quarter hard.
``--paired-from JSON`` prints the paired comparison of a stored result.
Outputs: markdown table, ``<out>/dars.json`` (the kit's schema plus ``paired`` and ``claim``) and ``<out>/dars.png``
(cumulative hard positives vs cumulative rollouts per arm; rollout cost per arm).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from experiments import _rlvr as rlvr
from experiments.kit import experiment_parser, markdown_table, progress, quiet_single_thread, summarise, write_result
from icml26.claims import HELD, paired_interval, paired_verdict
from lightning_modules.rlvr.rollout_allocation import UniformAllocator
from lightning_modules.shared.errors import UserInputError

PAPER = ("Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration "
         "(DARS, arXiv 2508.13755)")
CONFIG = "configs/dars/quick.yaml"
ARMS = ("uniform", "dars_et", "dars_hw", "uniform_matched", "breadth")
UNIFORM = f"--model.init_args.rollout_allocator={UniformAllocator.__module__}.UniformAllocator"
BASELINES = ("uniform_matched", "uniform")  # the compute-matched baseline first: the primary comparison
PRIMARY = ("dars_hw", "uniform_matched", "pass@1")  # held-out pass@1, DARS-HW minus the compute-matched uniform


def held_out_metrics(args) -> list[str]:
    """The paired metrics: held-out pass@1 and pass@32 on the two hardest test tiers, then the training-time count
    of positive rollouts on hard prompts (which measures exploration, not the trained policy)."""
    return ["pass@1"] + [f"pass@32_tier{t}" for t in sorted(args.tiers)[-2:]] + ["hard_positives_total"]


def paired_block(per_seed: list[dict], metrics: list[str]) -> dict:
    """``{"<arm> - <baseline>": {metric: {"mean", "lo", "hi", "n"}}}``: seed-by-seed differences against each of
    `BASELINES` with `icml26.claims.paired_interval` (95% t interval; ``lo``/``hi`` None with one seed)."""
    out = {}
    for baseline in BASELINES:
        for arm in ARMS:
            if arm in BASELINES or (arm == "breadth" and baseline != "uniform"):  # breadth costs what uniform does
                continue
            cells = {}
            for metric in metrics:
                mean, lo, hi, n = paired_interval([row[arm][metric] - row[baseline][metric] for row in per_seed])
                cells[metric] = {"mean": mean, "lo": None if n < 2 else lo, "hi": None if n < 2 else hi, "n": n}
            out[f"{arm} - {baseline}"] = cells
    return out


def paired_table(pairs: dict) -> str:
    """Markdown rows: difference, metric, mean and its 95% interval, seeds."""
    lines = ["| difference | metric | mean | 95% interval | n |", "|---|---|---|---|---|"]
    for name, cells in pairs.items():
        for metric, c in cells.items():
            interval = "-" if c["lo"] is None else f"[{c['lo']:+.4f}, {c['hi']:+.4f}]"
            lines.append(f"| {name} | {metric} | {c['mean']:+.4f} | {interval} | {c['n']} |")
    return "\n".join(lines)


def ratio_interval(per_seed: list[dict], arm: str, baseline: str) -> dict:
    """Per-seed ratio of hard positives (arm / baseline) with its 95% t interval over seeds."""
    ratios = [row[arm]["hard_positives_total"] / max(1.0, row[baseline]["hard_positives_total"]) for row in per_seed]
    mean, lo, hi, n = paired_interval(ratios)
    return {"per_seed": ratios, "mean": mean, "lo": None if n < 2 else lo, "hi": None if n < 2 else hi, "n": n}


def primary_claim(paired: dict, per_seed: list[dict]) -> dict:
    """The JSON's ``claim``: the primary held-out comparison (`PRIMARY`) with its verdict by the collection's rule
    (held only if the 95% interval excludes zero), and the training-time hard-positives ratio beside it, which
    measures how many positives DARS' extra rollouts find, not how good the trained policy is."""
    arm, baseline, metric = PRIMARY
    cell = paired[f"{arm} - {baseline}"][metric]
    interval = (cell["lo"], cell["hi"]) if cell["lo"] is not None else (math.nan, math.nan)
    verdict = paired_verdict(cell["mean"], *interval, cell["n"], "greater")
    ratio = ratio_interval(per_seed, "dars_hw", "uniform_matched")
    return {"target": f"held-out {metric}: DARS-HW - compute-matched uniform > 0 (95% paired t interval over seeds)",
            "primary": {"pair": f"{arm} - {baseline}", "metric": metric, **cell}, "verdict": verdict,
            "held": verdict == HELD, "hard_positives_ratio": ratio,
            "ratio_mean": ratio["mean"], "ratio_per_seed": ratio["per_seed"],
            "dars_et_ratio_mean": ratio_interval(per_seed, "dars_et", "uniform_matched")["mean"]}


def paired_from(path: str) -> dict:
    """The paired block of a stored result (its ``per_seed`` and ``config.tiers``), computed without a run: the
    same comparison for results written before the JSON carried it."""
    file = Path(path)
    try:
        data = json.loads(file.read_text())
        per_seed, tiers = data["per_seed"], data["config"]["tiers"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserInputError(f"--paired-from {path}: not a DARS result JSON with per_seed and config.tiers "
                             f"({type(err).__name__}: {err}); pass a file written by experiments.dars.") from None
    return paired_block(per_seed, held_out_metrics(argparse.Namespace(tiers=tiers)))


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
    parser = rlvr.add_rlvr_arguments(experiment_parser(__doc__.splitlines()[0], seeds=5), steps=48, batch=16)
    parser.add_argument("--name", default="dars", help="name of the JSON and PNG in --out")
    parser.add_argument("--paired-from", metavar="JSON", default=None,
                        help="print the paired comparison of a stored result JSON and exit (no run)")
    parser.set_defaults(tier_shares=[6, 1, 1], sft_steps=9000)  # hard prompts a minority (see the docstring)
    args = parser.parse_args(argv)
    if args.paired_from:
        pairs = paired_from(args.paired_from)
        print(paired_table(pairs))
        return {"paired": pairs}
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
    paired = paired_block(per_seed, held_out_metrics(args))
    claim = {**primary_claim(paired, per_seed), "matched_n": matched_n, "hard_share_of_pool": hard_share,
             "sft_p_below_half_share_of_pool": stage1_hard_share}
    primary, ratio = claim["primary"], claim["hard_positives_ratio"]
    keys_train = ["rollouts_total", "rollout_cost_vs_uniform", "hard_positives_total", "hard_positives_vs_uniform",
                  "hard_positives_per_visit", "eff_ratio_response_2nd_half"]
    wall = time.perf_counter() - start
    print(f"\n## {PAPER}\n\nscale: {args.seeds} seeds, {epochs * steps_per_epoch} steps x {args.batch} prompts, "
          f"N = {args.rollouts}, pool {args.pool}, tiers {sorted(args.tiers)} (shares "
          f"{args.tier_shares or 'equal'}; hard share {np.mean(hard_share):.2f}), SFT {args.sft_steps} steps; "
          f"compute-matched uniform N per seed {matched_n}; wall {wall:.0f}s\n")
    print(markdown_table(arms, keys_train) + "\n\n" + markdown_table(arms, rlvr.eval_keys(args)))
    print("\n" + paired_table(paired))
    fmt = lambda c: "-" if c["lo"] is None else f"{c['mean']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"  # noqa: E731
    print(f"\nprimary: {claim['target']}: {fmt(primary)} -> {claim['verdict']}; "
          f"training-time hard positives DARS-HW / matched uniform {fmt(ratio)} (per seed "
          f"{', '.join(f'{r:.2f}' for r in ratio['per_seed'])})")
    result = write_result("dars", name=args.name, seeds=args.seeds, wall_s=wall, config=rlvr.settings(args), arms=arms,
                          per_seed=per_seed, out=args.out, paired=paired, claim=claim)
    plot(Path(args.out) / f"{args.name}.png", curves, arms)
    return result


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
