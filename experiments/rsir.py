"""RSIR's central claims at small scale on CPU (``python -m experiments.rsir``, ~10 min on 2 cores).

Data: the embedded clustered-Markov generator (1500 users, 400 items, 8 clusters, lengths U{4..10}) in the
set-like and the Markov regime, leave-one-out. Backbone: SASRec, 1 block, 1 head, d 32, max_len 20, dropout 0.2,
full-softmax CE, Adam 3e-3, batch 64. Every arm is trained from scratch and early-stopped on validation NDCG@10
**by steps** (validation every 50 steps, patience 8 validations, at least 600 and at most 6000 steps; the best
validation weights are restored before testing), because a fixed epoch budget gives the larger RSIR data more
steps and fakes the gain. Evaluation: full ranking over all 400 items, history masked, ties in the target's
favour; test NDCG@10 / Recall@10.

Arms per (regime, seed): base (round 0); RSIR rounds 1 and 2 (tau=20, p=0.5, m=5, min_len=3; a fresh model per
round, generation from the previous round's model and from all current training sequences); no fidelity control
(tau=inf) rounds 1 and 2, starting from the same base model. Weak-to-strong (set-like): a small GRU4Rec (d 16)
generates from the original data (tau=20), a SASRec (d 32) is trained on the enriched data (the GRU4Rec
is capped at 3000 steps).

Every model and the data come from ``configs/rsir/quick.yaml`` (through `experiments.kit.from_config`), with only
the regime, the data seed, the trainer's early stopping and the weak generator's backbone/width overridden.
Writes ``<out>/rsir.json`` (the kit's schema plus ``claims`` and ``protocol``) and ``<out>/rsir.png`` and prints
markdown tables.
"""
from __future__ import annotations

import os
import time

import numpy as np
from lightning.pytorch.callbacks import EarlyStopping

from callbacks.rsir import generate_into
from experiments.kit import (KeepBest, experiment_parser, from_config, progress, quiet_single_thread,
                             quiet_trainer, summarise, write_result)

CONFIG = "configs/rsir/quick.yaml"
REGIMES = ("setlike", "markov")
ORDER = ("base", "rsir_r1", "rsir_r2", "no_fidelity_r1", "no_fidelity_r2", "weak_gru4rec", "weak_to_strong_r1")
GEN = dict(m=5, p=0.5, min_len=3)
# early stopping by steps; the weak generator is capped: it only has to be weaker
DEFAULTS = dict(val_every=50, patience=8, min_steps=600, max_steps=6000, weak_max_steps=3000, users=1500)
SMOKE = dict(val_every=5, patience=1, min_steps=0, max_steps=10, weak_max_steps=10, users=150)


def data_overrides(regime: str, seed: int, scale: dict) -> list[str]:
    return [f"--data.init_args.regime={regime}", f"--data.init_args.seed={seed}",
            f"--data.init_args.synthetic_users={scale['users']}", "--data.init_args.max_total_sequences=1000000"]


def train(datamodule, seed: int, scale: dict | None = None, backbone: str = "sasrec", dim: int = 32,
          max_steps: int | None = None):
    """A fresh model of the config (seeded with ``seed``) trained on ``datamodule``; returns it and its test row."""
    scale = scale or DEFAULTS
    model, _ = from_config(CONFIG, f"--seed_everything={seed}", f"--model.init_args.backbone={backbone}",
                           f"--model.init_args.hidden_dim={dim}", f"--data.init_args.synthetic_users={scale['users']}")
    keep = KeepBest("val/ndcg@10", mode="max")
    trainer = quiet_trainer([keep, EarlyStopping("val/ndcg@10", mode="max", patience=scale["patience"],
                                                 check_on_train_epoch_end=False)],
                            max_steps=max_steps or scale["max_steps"], min_steps=scale["min_steps"], max_epochs=-1,
                            val_check_interval=scale["val_every"], check_val_every_n_epoch=None, deterministic=True)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    fit_s = time.perf_counter() - start
    keep.restore(model)
    test = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    return model, {"ndcg@10": test["test/ndcg@10"], "recall@10": test["test/recall@10"],
                   "val_ndcg@10": keep.best_score, "best_step": keep.best_step, "steps": trainer.global_step,
                   "fit_s": fit_s, "train_sequences": len(datamodule.training_sequences)}


def run_setting(regime: str, seed: int, scale: dict, bar) -> dict[str, dict]:
    out = {}
    _, data = from_config(CONFIG, f"--seed_everything={seed}", *data_overrides(regime, seed, scale))
    base, out["base"] = train(data, 1000 * seed, scale)
    bar.update()
    for name, tau in (("rsir", 20.0), ("no_fidelity", float("inf"))):
        data.reset_training_sequences()
        model = base
        for k in (1, 2):
            gen = generate_into(model, data, tau=tau, seed=seed * 10 + k, **GEN)
            model, out[f"{name}_r{k}"] = train(data, 1000 * seed + k, scale)
            out[f"{name}_r{k}"].update(generated=gen["added"], mean_gen_length=gen["mean_length"],
                                       gen_trajectories_per_s=gen["trajectories_per_s"])
            bar.update()
    if regime == "setlike":  # weak-to-strong: a small GRU4Rec generates, SASRec learns
        data.reset_training_sequences()
        weak, out["weak_gru4rec"] = train(data, 1000 * seed + 7, scale, backbone="gru4rec", dim=16,
                                          max_steps=scale["weak_max_steps"])
        bar.update()
        gen = generate_into(weak, data, tau=20.0, seed=seed * 10 + 7, **GEN)
        _, out["weak_to_strong_r1"] = train(data, 1000 * seed + 8, scale)
        out["weak_to_strong_r1"].update(generated=gen["added"], mean_gen_length=gen["mean_length"])
        bar.update()
    return out


def growth(runs: dict, seeds: range, k: int) -> float:
    """Mean over seeds of (sequences generated without fidelity control) / (with it) at round k."""
    return float(np.mean([runs[s][f"no_fidelity_r{k}"]["generated"] / max(1, runs[s][f"rsir_r{k}"]["generated"])
                          for s in seeds]))


def main(argv: list[str] | None = None) -> dict:
    parser = experiment_parser(__doc__.splitlines()[0], seeds=3)
    args = parser.parse_args(argv)
    scale = dict(SMOKE if args.smoke else DEFAULTS)
    regimes = REGIMES[:1] if args.smoke else REGIMES
    seeds = range(args.seeds)
    quiet_single_thread()
    start = time.perf_counter()
    runs: dict[str, dict[int, dict]] = {r: {} for r in regimes}
    total = len(seeds) * (5 * len(regimes) + 2 * ("setlike" in regimes))
    with progress(None, "RSIR trainings", total=total) as bar:
        for regime in regimes:
            for seed in seeds:
                runs[regime][seed] = run_setting(regime, seed, scale, bar)
    wall = time.perf_counter() - start
    per_seed = []  # per seed: {regime/arm: test row + gain over that seed's base}
    for s in seeds:
        row = {}
        for regime in regimes:
            base = runs[regime][s]["base"]["ndcg@10"]
            for arm in ORDER:
                if arm in runs[regime][s]:
                    cells = runs[regime][s][arm]
                    row[f"{regime}/{arm}"] = {**cells, "rel_gain_ndcg@10_%": 100 * (cells["ndcg@10"] / base - 1)}
        per_seed.append(row)
    arms = summarise(per_seed)
    claims = {}
    for regime in regimes:
        r = runs[regime]
        claims[regime] = {
            "rsir_r1_beats_base_seeds": int(sum(r[s]["rsir_r1"]["ndcg@10"] > r[s]["base"]["ndcg@10"] for s in seeds)),
            "rsir_r1_mean_above_base": bool(arms[f"{regime}/rsir_r1"]["ndcg@10"]["mean"]
                                            > arms[f"{regime}/base"]["ndcg@10"]["mean"]),
            "fidelity_r2_ge_no_fidelity_r2_seeds": int(sum(r[s]["rsir_r2"]["ndcg@10"]
                                                           >= r[s]["no_fidelity_r2"]["ndcg@10"] for s in seeds)),
            "growth_ratio_no_fidelity_over_rsir_r1": growth(r, seeds, 1),
            "growth_ratio_no_fidelity_over_rsir_r2": growth(r, seeds, 2),
        }
    protocol = ("full ranking over all items, history + pad masked, ties optimistic; step-based early stopping on "
                f"val NDCG@10 (every {scale['val_every']} steps, patience {scale['patience']}, "
                f"min {scale['min_steps']}, max {scale['max_steps']} steps)")
    result = write_result("RSIR (arXiv 2602.15659)", seeds=args.seeds, wall_s=wall,
                          config={"config_file": CONFIG, "regimes": list(regimes), **scale, "generation": GEN},
                          arms=arms, per_seed=per_seed, out=args.out, name="rsir", claims=claims, protocol=protocol)
    print_tables(arms, claims, wall, args.seeds)
    plot(arms, os.path.join(args.out, "rsir.png"))
    return result


def print_tables(arms: dict, claims: dict, wall: float, seeds: int) -> None:
    print(f"\nRSIR, {seeds} seeds, mean ± std, {wall:.0f} s. Test metrics: full ranking, history masked.\n")
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
    for regime, c in claims.items():
        print(f"| {regime} | {c['rsir_r1_beats_base_seeds']}/{seeds} | {c['rsir_r1_mean_above_base']} | "
              f"{c['fidelity_r2_ge_no_fidelity_r2_seeds']}/{seeds} | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r1']:.1f}x | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r2']:.1f}x |")


def plot(arms: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


if __name__ == "__main__":
    main()
