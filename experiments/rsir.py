"""RSIR's central claims at small scale on CPU: ``python -m experiments rsir`` (~31 min per seed on 2 cores).

Paper: "Can Recommender Systems Teach Themselves? A Recursive Self-Improving Framework with Fidelity Control"
(Zhang et al., arXiv 2602.15659, ICML 2026). Claim: a sequential recommender that trains a FRESH model on its own
fidelity-filtered generated sequences improves on the base model, with cumulative gains over rounds; without the
fidelity check the generated data grows geometrically and hurts.

The protocol is configuration, ``configs/rsir/experiment.yaml``, run by `experiments.runner` (every model built and
trained as ``python train.py fit --config configs/rsir/quick.yaml`` builds it, trainer and callbacks from the YAML;
one seed S drives the data, seed S, and the models, seed 1000 S + k). Data: the embedded clustered-Markov generator
(1500 users, 400 items, 8 clusters, lengths U{4..10}) in the set-like and the Markov regime, leave-one-out.
Backbone: SASRec, 1 block, 1 head, d 32, max_len 20, dropout 0.2, full-softmax CE, Adam 3e-3, batch 64. Every arm
is trained from scratch and early-stopped on validation NDCG@10 **by steps** (validation every 50 steps, patience 8
validations, at least 600 and at most 6000 steps; the test is of the best validation checkpoint), because a fixed
epoch budget gives the larger RSIR data more steps and fakes the gain. Evaluation: full ranking over all 400 items,
history masked, ties in the target's favour; test NDCG@10 / Recall@10.

Arms per (regime, seed): ``base`` (round 0); ``rsir_r1``, ``rsir_r2`` (tau = 20, p = 0.5, m = 5, min_len = 3; a
fresh model per round, generation from the previous round's model and from all its training sequences);
``no_fidelity_r1``, ``no_fidelity_r2`` (tau = inf) from the same base model. Weak-to-strong (set-like):
``weak_gru4rec`` (``configs/rsir/gru4rec_quick.yaml``, GRU4Rec d 16, capped at 3000 steps) generates from the
original data (tau = 20) and ``weak_to_strong_r1`` (SASRec d 32) trains on the enriched data.

Hooks (what cannot be configuration):

* `prepare`: for a round arm (``settings.rounds``), the best model of its generator arm (an earlier run of the same
  seed) generates from that arm's training sequences with `callbacks.rsir.generate_into` (the code of the
  RSIRSelfImprovement callback; seed 10 S + the round's ``seed_offset``); every synthetic sequence so far is written
  to the round's folder and passed as ``data.init_args.synthetic_from`` (round k's documented command line).
* `evaluate`: the test of the best checkpoint plus the run's own figures (``val_ndcg@10``, ``best_step``, ``steps``,
  ``fit_s``, ``train_sequences``, the generation's ``generated`` / ``mean_gen_length`` / ``gen_trajectories_per_s``)
  and ``rel_gain_ndcg@10_%`` over the same seed's base of the regime.
* `report`: the ``claims`` block per regime, the ``protocol`` line, the pairs of ``settings.paired`` (the runner's
  cross-regime pairs are dropped); prints the tables. `plot`: ``<out>/rsir.png``.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from experiments.runner import ExperimentError, arm_flags
from lightning_modules.shared.errors import UserInputError

BASE = "base"                           # the round-0 arm of each regime (``<regime>/base``)
SYNTHETIC_FILE = "synthetic.txt"        # a round's training data beyond the original, in its run folder
ROUND_KEYS = {"generator", "tau", "seed_offset"}
GENERATION_KEYS = {"m", "p", "min_len", "max_new_sequences"}
COUNTS = ("best_step", "steps", "train_sequences", "generated")  # integers in the JSON, as they were


class SettingError(ExperimentError, UserInputError):
    """A setting of the RSIR protocol (experiment.yaml or ``--set``) that cannot run: one line, the fix included."""


def regime_of(arm: str) -> str:
    """``"<regime>/<arm>"`` -> regime; an arm of experiment.yaml named otherwise is one error line."""
    regime, sep, name = arm.partition("/")
    if not sep or not regime or not name:
        raise SettingError(f"configs/rsir/experiment.yaml: arm {arm!r} must be named <regime>/<arm>, e.g. "
                           "setlike/rsir_r1")
    return regime


def round_of(settings: dict, arm: str) -> dict | None:
    """The arm's entry of ``settings.rounds`` (None: trained on the original data), checked."""
    rounds = settings.get("rounds") or {}
    if not isinstance(rounds, dict):
        raise SettingError("settings.rounds must map a round arm to {generator: ARM, tau: T, seed_offset: K}")
    entry = rounds.get(arm)
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != ROUND_KEYS:
        raise SettingError(f"settings.rounds.{arm}: write {{generator: ARM, tau: T, seed_offset: K}} "
                           f"(got {entry!r})")
    tau, offset = entry["tau"], entry["seed_offset"]
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau >= 1:
        raise SettingError(f"settings.rounds.{arm}.tau={tau!r}: must be a number >= 1 (.inf: no fidelity control)")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise SettingError(f"settings.rounds.{arm}.seed_offset={offset!r}: must be an integer >= 0")
    return entry


def generation(settings: dict) -> dict:
    """``settings.generation``: `callbacks.rsir.generate_into`'s m / p / min_len (/ max_new_sequences), checked."""
    values = settings.get("generation") or {}
    if not isinstance(values, dict) or not {"m", "p", "min_len"} <= set(values) <= GENERATION_KEYS:
        raise SettingError(f"settings.generation: write {{m: M, p: P, min_len: L}} (optional max_new_sequences), "
                           f"got {values!r}")
    return dict(values)


def generation_seed(run, entry: dict) -> int:
    stride = run.settings.get("generation_seed_stride", 10)
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise SettingError(f"settings.generation_seed_stride={stride!r}: must be an integer >= 1")
    return stride * run.seed + entry["seed_offset"]


def prepare(run) -> dict:
    """A round arm: its generator arm's best model generates from that arm's training data (`generate_into`, the
    callback's code); every synthetic sequence so far goes to ``<run folder>/synthetic.txt`` and becomes the round's
    ``data.init_args.synthetic_from``. Other arms: nothing."""
    from callbacks.rsir import generate_into
    from datamodules.sequences import write_sequence_file

    entry = round_of(run.settings, run.arm.name)
    if entry is None:
        return {}
    source = run.earlier.get(entry["generator"])
    if source is None:
        raise SettingError(f"settings.rounds.{run.arm.name}: its generator {entry['generator']!r} is not an earlier "
                           f"arm of this seed (earlier: {list(run.earlier)}); list it before")
    if source.best_checkpoint() is None:
        raise SettingError(f"settings.rounds.{run.arm.name}: the generator arm {entry['generator']!r} saved no best "
                           "checkpoint; keep its ModelCheckpoint (monitor val/ndcg@10) and let it validate")
    source.load_best()
    data = copy.copy(source.datamodule)  # the generator's data stays as it trained; the copy receives the new rows
    data.training_sequences = list(source.datamodule.training_sequences)
    stats = generate_into(source.model, data, tau=float(entry["tau"]), seed=generation_seed(run, entry),
                          **generation(run.settings))
    path = Path(run.root) / SYNTHETIC_FILE
    write_sequence_file(str(path), data.synthetic_sequences)
    run.extra["generation"] = {"generated": stats["added"], "mean_gen_length": stats["mean_length"],
                               "gen_trajectories_per_s": stats["trajectories_per_s"]}
    return {"data.init_args.synthetic_from": str(path)}


def evaluate(run) -> dict[str, float]:
    """The test of the best validation checkpoint (NDCG@10, Recall@10) and the run's figures; the gain is over the
    same seed's base of the regime (the base itself: 0)."""
    from lightning.pytorch.callbacks import Timer

    checkpoint = run.trainer.checkpoint_callback
    best = run.best_checkpoint()
    if checkpoint is None or best is None:
        raise SettingError(f"{run.arm.name}: no best checkpoint (validation never ran?); keep the ModelCheckpoint "
                           "on val/ndcg@10 and a trainer.val_check_interval below trainer.max_steps")
    timers = [c for c in run.trainer.callbacks if isinstance(c, Timer)]
    fit = {"val_ndcg@10": float(checkpoint.best_model_score),
           "best_step": int(torch.load(best, map_location="cpu", weights_only=False)["global_step"]),
           "steps": run.trainer.global_step, "fit_s": timers[0].time_elapsed("train") if timers else float("nan")}
    test = run.test()  # read the fit's figures first: loading the checkpoint restores the callbacks' state
    row = {"ndcg@10": test["ndcg@10"], "recall@10": test["recall@10"], **fit,
           "train_sequences": len(run.datamodule.training_sequences), **run.extra.get("generation", {})}
    regime = regime_of(run.arm.name)
    if run.arm.name == f"{regime}/{BASE}":
        reference = row["ndcg@10"]
    else:  # no base run of the regime (a --set or smoke selection without it): no gain
        base = run.earlier.get(f"{regime}/{BASE}")
        reference = base.metrics.get("ndcg@10") if base is not None else None
    if reference is not None:
        row["rel_gain_ndcg@10_%"] = 100 * (row["ndcg@10"] / reference - 1) if reference else float("nan")
    return row


def growth(rows: list[dict], regime: str, k: int) -> float:
    """Mean over seeds of (sequences generated without fidelity control) / (with it) at round k."""
    return float(np.mean([row[f"{regime}/no_fidelity_r{k}"]["generated"]
                          / max(1, row[f"{regime}/rsir_r{k}"]["generated"]) for row in rows]))


CLAIM_ARMS = ("base", "rsir_r1", "rsir_r2", "no_fidelity_r1", "no_fidelity_r2")


def claims(result: dict) -> dict:
    """Per regime with every arm of `CLAIM_ARMS`: seeds where round 1 beats the base, whether its mean does, seeds
    where fidelity round 2 is at least no-fidelity round 2, and the no-fidelity / fidelity data growth per round."""
    rows, arms = result["per_seed"], result["arms"]
    out = {}
    for regime in dict.fromkeys(a.split("/", 1)[0] for a in arms):
        if not all(f"{regime}/{a}" in row for row in rows for a in CLAIM_ARMS):
            continue

        def ndcg(row, arm):
            return row[f"{regime}/{arm}"]["ndcg@10"]
        out[regime] = {
            "rsir_r1_beats_base_seeds": int(sum(ndcg(r, "rsir_r1") > ndcg(r, "base") for r in rows)),
            "rsir_r1_mean_above_base": bool(arms[f"{regime}/rsir_r1"]["ndcg@10"]["mean"]
                                            > arms[f"{regime}/base"]["ndcg@10"]["mean"]),
            "fidelity_r2_ge_no_fidelity_r2_seeds": int(sum(ndcg(r, "rsir_r2") >= ndcg(r, "no_fidelity_r2")
                                                           for r in rows)),
            "growth_ratio_no_fidelity_over_rsir_r1": growth(rows, regime, 1),
            "growth_ratio_no_fidelity_over_rsir_r2": growth(rows, regime, 2),
        }
    return out


def early_stopping(spec) -> dict:
    """val_every / patience / min_steps / max_steps of the base arm as the runner builds it (every layer of
    experiment.yaml, the smoke overlay and ``--set`` included)."""
    values = {}
    for item in arm_flags(spec, spec.arms[0]):
        key, sep, value = item.removeprefix("--").partition("=")
        if sep and key != "config":
            values[key] = yaml.safe_load(value)
    patience = [c.get("init_args", {}).get("patience") for c in values.get("trainer.callbacks") or []
                if isinstance(c, dict) and str(c.get("class_path", "")).endswith("EarlyStopping")]
    return {"val_every": values.get("trainer.val_check_interval"), "patience": patience[0] if patience else None,
            "min_steps": values.get("trainer.min_steps"), "max_steps": values.get("trainer.max_steps")}


def paired_differences(rows: list[dict], pairs: list, metrics: list[str]) -> dict:
    """``"<arm> - <baseline>"`` over seeds for each ``{baseline, arms}`` of ``pairs`` whose rows were made."""
    from icml26.paired import paired_block

    present = {arm for row in rows for arm in row}
    out: dict = {}
    for entry in pairs or []:
        if not isinstance(entry, dict) or set(entry) != {"baseline", "arms"} or not isinstance(entry["arms"], list):
            raise SettingError(f"settings.paired: write {{baseline: ROW, arms: [ROW, ...]}} (got {entry!r})")
        arms = [arm for arm in entry["arms"] if arm in present]
        if entry["baseline"] in present and arms:
            out.update(paired_block(rows, entry["baseline"], metrics, arms=arms))
    return out


def same_regime(pair: str) -> bool:
    """``"<regime>/<arm> - <regime>/<baseline>"``: both rows of one regime (else the pair compares two data sets)."""
    arm, _, baseline = pair.partition(" - ")
    return arm.split("/", 1)[0] == baseline.split("/", 1)[0]


def report(result: dict, records: list[dict], spec) -> dict:
    """The claims per regime, the protocol line and the pairs of ``settings.paired``, added after the runner's pairs
    of every row minus ``baseline`` (the set-like base), of which the cross-regime ones are dropped (a Markov row
    minus a set-like row compares two data sets); the counts of the per-seed rows are integers again (the runner
    stores every metric as a float)."""
    for row in result["per_seed"]:
        for cells in row.values():
            for key in COUNTS:
                if key in cells and float(cells[key]).is_integer():
                    cells[key] = int(cells[key])
    pairs = paired_differences(result["per_seed"], spec.settings.get("paired"), spec.metrics)
    runner_pairs = result.get("paired")
    if isinstance(runner_pairs, dict):  # the runner adds its block before the report's: drop its cross-regime pairs
        for pair in [p for p in runner_pairs if not same_regime(p)]:
            del runner_pairs[pair]
    found = claims(result)
    scale = early_stopping(spec)
    protocol = ("full ranking over all items, history + pad masked, ties optimistic; step-based early stopping on "
                f"val NDCG@10 (every {scale['val_every']} steps, patience {scale['patience']}, "
                f"min {scale['min_steps']}, max {scale['max_steps']} steps)")
    print_tables(result["arms"], found, len(result["per_seed"]))
    return {"claims": found, "protocol": protocol, "paired": pairs}


def print_tables(arms: dict, found: dict, seeds: int) -> None:
    print(f"\nRSIR, {seeds} seeds, mean ± std. Test metrics: full ranking, history masked.\n")
    print("| regime / arm | test NDCG@10 | test Recall@10 | gain vs base (%) | train sequences | generated | "
          "mean gen. length | best step | fit s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, m in arms.items():
        def f(key, digits=4):
            return f"{m[key]['mean']:.{digits}f} ± {m[key]['std']:.{digits}f}" if key in m else "-"
        print(f"| {arm} | {f('ndcg@10')} | {f('recall@10')} | {f('rel_gain_ndcg@10_%', 1)} | "
              f"{f('train_sequences', 0)} | {f('generated', 0)} | {f('mean_gen_length', 2)} | {f('best_step', 0)} | "
              f"{f('fit_s', 1)} |")
    print("\n| regime | RSIR r1 > base (seeds) | mean r1 > base | RSIR r2 >= no-fid r2 (seeds) | "
          "no-fid / RSIR growth r1 | r2 |")
    print("|---|---|---|---|---|---|")
    for regime, c in found.items():
        print(f"| {regime} | {c['rsir_r1_beats_base_seeds']}/{seeds} | {c['rsir_r1_mean_above_base']} | "
              f"{c['fidelity_r2_ge_no_fidelity_r2_seeds']}/{seeds} | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r1']:.1f}x | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r2']:.1f}x |")


def plot(result: dict, path) -> None:
    """Test NDCG@10 per arm (mean ± std over seeds), one panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = result["arms"]
    regimes = list(dict.fromkeys(a.split("/", 1)[0] for a in arms))
    fig, axes = plt.subplots(1, len(regimes), figsize=(6 * len(regimes), 4))
    for ax, regime in zip(np.atleast_1d(axes), regimes):
        names = [a.split("/", 1)[1] for a in arms if a.startswith(regime + "/")]
        means = [arms[f"{regime}/{n}"]["ndcg@10"]["mean"] for n in names]
        stds = [arms[f"{regime}/{n}"]["ndcg@10"]["std"] for n in names]
        ax.bar(range(len(names)), means, yerr=stds, capsize=3,
               color=["grey" if n == "base" else "tab:blue" if "rsir" in n else "tab:red" if "fidelity" in n
                      else "tab:green" for n in names])
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
        ax.set_ylim(min(means) * 0.85, max(means) * 1.08)
        ax.set_title(f"{regime}: test NDCG@10 (full ranking)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # ``python -m experiments.rsir [--smoke] [--seeds N] [--out DIR] [--check]``
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["rsir", *sys.argv[1:]]))
