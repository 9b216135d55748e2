"""DARS vs uniform GRPO (and a compute-matched uniform, and breadth): ``python -m experiments dars`` (~1 h, 2 cores).

Paper: "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains with Adaptive Exploration" (DARS,
arXiv 2508.13755). The paper's multi-stage rollout (equal-treatment and hardness-weighted schedules) gives prompts
with stage-1 accuracy < 0.5 extra rollouts; it reports higher pass@k on held-out benchmarks and about 2x the
positive rollouts on hard prompts of a uniform run that consumes the same number of rollouts.

Primary result (the JSON's ``claim``): held-out test pass@1 of DARS-HW minus the compute-matched uniform run, seed
by seed, with its 95% t interval (`icml26.claims.paired_interval`); held only if the interval excludes zero. The
JSON's ``paired`` block gives every DARS arm minus ``uniform_matched`` and minus ``uniform`` (breadth only minus
``uniform``, which it costs the same as) for held-out pass@1, pass@32 on the two hardest test tiers and the
training-time count of positive rollouts on hard prompts (``settings.paired``), after the runner's pairs of every
arm minus ``uniform_matched`` on the table's metrics. The count of hard positives shows that DARS' extra rollouts
on hard prompts find more positives during training; it does not by itself show a better policy on held-out
prompts.

The protocol is configuration, ``configs/dars/experiment.yaml``, run by `experiments.runner` (every arm built as
``python train.py fit`` builds it, with its config's callbacks; one seed S drives model and data). Same task, SFT
warm-up and GRPO runs as the knapsack_rl experiment (`experiments._rlvr`): per seed the SFT warm-up
(``configs/grpo/sft_quick.yaml``, 9000 AdamW steps, no row), then every arm from ``configs/dars/quick.yaml`` and its
checkpoint, overriding only the scale and the arm: Â = r - group mean (no std, as DARS), the constant loss
normaliser (so extra rollouts add gradient mass, as DARS' Σ ℓ m / L_max), one on-policy Adam step per batch,
zero-variance groups dropped in every arm (with no std and a constant normaliser such groups have zero advantage,
so the filter does not change any gradient here; it is set for parity with the DARS trainer). "Hard" = success
rate < 0.1 under the SFT policy (32 samples, measured once per seed).

Arms (per seed, same prompts in the same order):
* ``uniform``: N = 8.
* ``dars_et``: N = 8, equal treatment, N_max = 32.  * ``dars_hw``: N = 8, hardness weighted, N_max = 64.
* ``uniform_matched``: uniform with N = round(DARS-HW's mean rollouts per prompt visit) of the same seed
  (`prepare`, ``settings.matched``).
* ``breadth``: uniform N = 8 on the WHOLE pool per step (`prepare`, ``settings.whole_pool``), one full-batch
  optimiser step per PPO epoch and 2 PPO epochs (DARS-Breadth's update without DARS' rollouts), for the same total
  rollouts as ``uniform``.

Scale: tiers {2, 3, 4} with pool shares 6 : 1 : 1, SFT warm-up of 9,000 steps, RL pool 256, test pool 256, 16
prompts per step, 48 steps, 5 seeds. Why this mix: DARS spends extra rollouts only on prompts whose stage-1
accuracy is below 0.5, so its advantage over a uniform run of equal cost depends on hard prompts being a minority
of the pool, as in the paper's training sets. The mix and warm-up were chosen after four earlier runs, using
the training-time hard-positives ratio (a selection effect: the chosen setting's ratio is biased upwards): equal tier
shares and a 3,000-step warm-up gave 1.05x, 0.75x and 0.69x across code revisions (67-71% of the pool hard;
``results/dars_equal_tiers.json``), the 6 : 1 : 1 mix with that warm-up 0.95x (61-73% hard,
``results/dars_mix611_sft3000.json``); the 9,000-step warm-up leaves about a quarter hard (docs/rlvr.md gives the
runner commands of those settings).

`evaluate` adds ``rollout_cost_vs_uniform`` and ``hard_positives_vs_uniform`` (against ``settings.cost_baseline``)
to every arm's row; `report` adds the held-out pairs and ``claim`` (with ``matched_n``, ``hard_share_of_pool``
and ``sft_p_below_half_share_of_pool`` per seed) and ``curves``; `plot` writes ``<out>/dars.png`` (cumulative hard
positives vs cumulative rollouts per arm; rollout cost per arm).
"""
from __future__ import annotations

import math
import sys

import numpy as np

from experiments import _rlvr as rlvr
from icml26.claims import HELD, paired_interval, paired_verdict

PAIRS = {"uniform_matched": ["dars_et", "dars_hw"], "uniform": ["dars_et", "dars_hw", "breadth"]}
PRIMARY = ("dars_hw", "uniform_matched", "pass@1")  # held-out pass@1, DARS-HW minus the compute-matched uniform


def held_out_metrics(tiers: list[int]) -> list[str]:
    """The paired metrics: held-out pass@1 and pass@32 on the two hardest test tiers, then the training-time count
    of positive rollouts on hard prompts (which measures exploration, not the trained policy)."""
    return ["pass@1"] + [f"pass@32_tier{t}" for t in sorted(set(tiers))[-2:]] + ["hard_positives_total"]


def paired_block(per_seed: list[dict], metrics: list[str], pairs: dict[str, list[str]] | None = None) -> dict:
    """``{"<arm> - <baseline>": {metric: {"mean", "lo", "hi", "n"}}}`` for every baseline -> arms of ``pairs``
    (default `PAIRS`): seed-by-seed differences with `icml26.claims.paired_interval` (95% t interval; ``lo``/``hi``
    None with one seed)."""
    out = {}
    for baseline, arms in (pairs or PAIRS).items():
        for arm in arms:
            cells = {}
            for metric in metrics:
                mean, lo, hi, n = paired_interval([row[arm][metric] - row[baseline][metric] for row in per_seed])
                cells[metric] = {"mean": mean, "lo": None if n < 2 else lo, "hi": None if n < 2 else hi, "n": n}
            out[f"{arm} - {baseline}"] = cells
    return out


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


# --------------------------------------------------------------------------------------------- hooks
def prepare(run) -> dict:
    """`experiments._rlvr.prepare` (init_from the warm-up, max_new_tokens), plus: the matched arm's rollouts per
    prompt = max(N, round(rollouts of ``settings.matched.to`` / its prompt visits)) of this seed; the arms of
    ``settings.whole_pool`` take the whole RL pool as one batch."""
    from experiments.runner import ExperimentError

    overrides = rlvr.prepare(run)
    matched = run.settings.get("matched") or {}
    if run.arm.name == matched.get("arm"):
        source = run.earlier.get(matched.get("to"))
        if source is None or "prompt_visits" not in source.extra:
            raise ExperimentError(f"settings.matched: arm {run.arm.name!r} matches {matched.get('to')!r}, which is "
                                  f"not an earlier GRPO arm of this seed (earlier: {list(run.earlier)}); list it "
                                  "before")
        base = int(source.model.hparams.rollouts_per_prompt)
        per_visit = source.metrics["rollouts_total"] / source.extra["prompt_visits"]
        overrides["model.init_args.rollouts_per_prompt"] = max(base, int(round(per_visit)))
    if run.arm.name in (run.settings.get("whole_pool") or []):
        warm_up = run.earlier[rlvr.warm_up_arm(run)]
        overrides["data.init_args.batch_size"] = len(warm_up.datamodule.train_examples)
    return overrides


def evaluate(run) -> dict[str, float]:
    """`experiments._rlvr.evaluate`, plus for GRPO arms the rollout cost and the hard positives relative to
    ``settings.cost_baseline`` (an earlier arm of the seed, or this one), and the rollouts per prompt in
    ``run.extra``."""
    metrics = rlvr.evaluate(run)
    if run.arm.name == rlvr.warm_up_arm(run):
        return metrics
    run.extra["rollouts_per_prompt"] = int(run.model.hparams.rollouts_per_prompt)
    run.extra["prompt_visits"] = sum(len(step["prompt_ids"]) for step in rlvr.recorder(run).steps)
    name = run.settings.get("cost_baseline", "uniform")
    base = metrics if run.arm.name == name else run.earlier[name].metrics
    metrics["rollout_cost_vs_uniform"] = metrics["rollouts_total"] / base["rollouts_total"]
    metrics["hard_positives_vs_uniform"] = metrics["hard_positives_total"] / max(1.0, base["hard_positives_total"])
    return metrics


def report(result: dict, records: list[dict], spec) -> dict:
    """The held-out pairs of ``settings.paired`` (added after the runner's), the claim with the matched N, the hard
    share of the pool and the share of pool prompts below p = 0.5 per seed, and the per-step curves."""
    per_seed = result["per_seed"]
    sft = rlvr.seed_records(records, spec.settings["warm_up"])
    pairs = {b: [a for a in arms if all(a in row and b in row for row in per_seed)]
             for b, arms in (spec.settings.get("paired") or PAIRS).items()}
    paired = paired_block(per_seed, held_out_metrics(sft[0]["tiers"]), {b: a for b, a in pairs.items() if a})
    matched = (spec.settings.get("matched") or {}).get("arm", "uniform_matched")
    claim = {**primary_claim(paired, per_seed),
             "matched_n": [e["rollouts_per_prompt"] for e in rlvr.seed_records(records, matched)],
             "hard_share_of_pool": [len(e["hard"]) / e["pool_size"] for e in sft],
             "sft_p_below_half_share_of_pool": [e["p_below_half_share"] for e in sft]}
    primary, ratio = claim["primary"], claim["hard_positives_ratio"]
    fmt = lambda c: "-" if c["lo"] is None else f"{c['mean']:+.4f} [{c['lo']:+.4f}, {c['hi']:+.4f}]"  # noqa: E731
    print(f"\nprimary: {claim['target']}: {fmt(primary)} -> {claim['verdict']}; training-time hard positives "
          f"DARS-HW / matched uniform {fmt(ratio)} (per seed {', '.join(f'{r:.2f}' for r in ratio['per_seed'])}); "
          f"matched N per seed {claim['matched_n']}")
    arms = [arm.name for arm in spec.arms if arm.row]
    return {"paired": paired, "claim": claim, "curves": rlvr.curves(records, arms)}


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for colour, (arm, runs) in enumerate((result.get("curves") or {}).items()):
        for i, curve in enumerate(runs):
            axes[0].plot(np.cumsum(curve["rollouts"]), np.cumsum(curve["hard_positives"]), color=f"C{colour}",
                         alpha=0.8, label=arm if i == 0 else None)
    axes[0].set(xlabel="cumulative rollouts", ylabel="cumulative positive rollouts on hard prompts",
                title="Positives on hard prompts (SFT p < 0.1)")
    axes[0].legend(fontsize=8)
    arms = result["arms"]
    names = list(arms)
    cost = [arms[a]["rollout_cost_vs_uniform"]["mean"] for a in names]
    err = [arms[a]["rollout_cost_vs_uniform"]["std"] for a in names]
    axes[1].bar(names, cost, yerr=err, color=[f"C{i}" for i in range(len(names))])
    axes[1].set(ylabel="rollouts / uniform rollouts", title="Rollout cost")
    axes[1].tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # ``python -m experiments.dars [--smoke] [--seeds N] [--out DIR] [--check] ...``
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["dars", *sys.argv[1:]]))
