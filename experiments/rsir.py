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

Writes results/rsir.json and results/rsir.png and prints markdown tables.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import time

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping
from tqdm import tqdm

from callbacks.rsir import generate_into
from datamodules.sequences import SequentialRecDataModule
from lightning_modules.sequential_rec import SequentialRecommender

SEEDS = (0, 1, 2)
REGIMES = ("setlike", "markov")
NUM_USERS, NUM_ITEMS, MAX_LEN = 1500, 400, 20
VAL_EVERY, PATIENCE, MIN_STEPS, MAX_STEPS = 50, 8, 600, 6000
WEAK_MAX_STEPS = 3000  # the weak generator is capped: it only has to be weaker
GEN = dict(m=5, p=0.5, min_len=3)


class KeepBest(Callback):
    """Keep the weights of the best validation NDCG@10 in memory and restore them at the end of fit."""

    def __init__(self, monitor: str = "val/ndcg@10") -> None:
        self.monitor, self.best, self.best_step, self.state = monitor, -1.0, 0, None

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        value = float(trainer.callback_metrics[self.monitor])
        if value > self.best:
            self.best, self.best_step = value, trainer.global_step
            self.state = copy.deepcopy(pl_module.state_dict())

    def on_fit_end(self, trainer, pl_module):
        if self.state is not None:
            pl_module.load_state_dict(self.state)


def make_model(backbone: str = "sasrec", dim: int = 32) -> SequentialRecommender:
    return SequentialRecommender(num_items=NUM_ITEMS, backbone=backbone, hidden_dim=dim, num_blocks=1, num_heads=1,
                                 dropout=0.2, max_len=MAX_LEN, loss="full_softmax", ks=(10, 20),
                                 optimizer=functools.partial(torch.optim.Adam, lr=3e-3))


def train(datamodule, seed: int, backbone: str = "sasrec", dim: int = 32, max_steps: int = MAX_STEPS):
    seed_everything(seed, verbose=False)
    model = make_model(backbone, dim)
    keep = KeepBest()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=max_steps, min_steps=MIN_STEPS, max_epochs=-1,
                      val_check_interval=VAL_EVERY, check_val_every_n_epoch=None, num_sanity_val_steps=0,
                      callbacks=[keep, EarlyStopping("val/ndcg@10", mode="max", patience=PATIENCE,
                                                     check_on_train_epoch_end=False)],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, deterministic=True)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    fit_s = time.perf_counter() - start
    test = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    return model, {"ndcg@10": test["test/ndcg@10"], "recall@10": test["test/recall@10"],
                   "val_ndcg@10": keep.best, "best_step": keep.best_step, "steps": trainer.global_step,
                   "fit_s": fit_s, "train_sequences": len(datamodule.training_sequences)}


def run_setting(regime: str, seed: int, bar) -> dict[str, dict]:
    out = {}
    data = SequentialRecDataModule(regime=regime, synthetic_users=NUM_USERS, synthetic_items=NUM_ITEMS, max_len=MAX_LEN,
                                   batch_size=64, seed=seed, max_total_sequences=10 ** 6)
    base, out["base"] = train(data, 1000 * seed)
    bar.update()
    for name, tau in (("rsir", 20.0), ("no_fidelity", float("inf"))):
        data.reset_training_sequences()
        model = base
        for k in (1, 2):
            gen = generate_into(model, data, tau=tau, seed=seed * 10 + k, **GEN)
            model, out[f"{name}_r{k}"] = train(data, 1000 * seed + k)
            out[f"{name}_r{k}"].update(generated=gen["added"], mean_gen_length=gen["mean_length"],
                                       gen_trajectories_per_s=gen["trajectories_per_s"])
            bar.update()
    if regime == "setlike":  # weak-to-strong: a small GRU4Rec generates, SASRec learns
        data.reset_training_sequences()
        weak, out["weak_gru4rec"] = train(data, 1000 * seed + 7, backbone="gru4rec", dim=16,
                                          max_steps=WEAK_MAX_STEPS)
        bar.update()
        gen = generate_into(weak, data, tau=20.0, seed=seed * 10 + 7, **GEN)
        _, out["weak_to_strong_r1"] = train(data, 1000 * seed + 8)
        out["weak_to_strong_r1"].update(generated=gen["added"], mean_gen_length=gen["mean_length"])
        bar.update()
    return out


def growth(per_seed: dict, k: int) -> float:
    """Mean over seeds of (sequences generated without fidelity control) / (with it) at round k."""
    return float(np.mean([per_seed[s][f"no_fidelity_r{k}"]["generated"] / max(1, per_seed[s][f"rsir_r{k}"]["generated"])
                          for s in SEEDS]))


def summarise(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values))}


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs: dict[str, dict[int, dict]] = {r: {} for r in REGIMES}
    total = len(SEEDS) * (5 * len(REGIMES) + 2)
    with tqdm(total=total, desc="RSIR trainings") as bar:
        for regime in REGIMES:
            for seed in SEEDS:
                runs[regime][seed] = run_setting(regime, seed, bar)
    wall = time.perf_counter() - start
    arms: dict[str, dict] = {}
    order = ["base", "rsir_r1", "rsir_r2", "no_fidelity_r1", "no_fidelity_r2", "weak_gru4rec", "weak_to_strong_r1"]
    for regime in REGIMES:
        for arm in order:
            rows = [runs[regime][s][arm] for s in SEEDS if arm in runs[regime][s]]
            if not rows:
                continue
            arms[f"{regime}/{arm}"] = {key: summarise([r[key] for r in rows]) for key in rows[0]}
            base = [runs[regime][s]["base"]["ndcg@10"] for s in SEEDS]
            arms[f"{regime}/{arm}"]["rel_gain_ndcg@10_%"] = summarise(
                [100 * (r["ndcg@10"] / b - 1) for r, b in zip(rows, base)])
    claims = {}
    for regime in REGIMES:
        per_seed = runs[regime]
        claims[regime] = {
            "rsir_r1_beats_base_seeds": int(sum(per_seed[s]["rsir_r1"]["ndcg@10"] > per_seed[s]["base"]["ndcg@10"]
                                                for s in SEEDS)),
            "rsir_r1_mean_above_base": bool(arms[f"{regime}/rsir_r1"]["ndcg@10"]["mean"]
                                            > arms[f"{regime}/base"]["ndcg@10"]["mean"]),
            "fidelity_r2_ge_no_fidelity_r2_seeds": int(sum(per_seed[s]["rsir_r2"]["ndcg@10"]
                                                           >= per_seed[s]["no_fidelity_r2"]["ndcg@10"] for s in SEEDS)),
            "growth_ratio_no_fidelity_over_rsir_r1": growth(per_seed, 1),
            "growth_ratio_no_fidelity_over_rsir_r2": growth(per_seed, 2),
        }
    result = {"paper": "RSIR (arXiv 2602.15659)", "seeds": len(SEEDS), "wall_s": wall, "arms": arms,
              "claims": claims, "runs": {r: {str(s): v for s, v in d.items()} for r, d in runs.items()},
              "protocol": "full ranking over all items, history + pad masked, ties optimistic; step-based early "
                          f"stopping on val NDCG@10 (every {VAL_EVERY} steps, patience {PATIENCE}, "
                          f"min {MIN_STEPS}, max {MAX_STEPS} steps)"}
    os.makedirs("results", exist_ok=True)
    with open("results/rsir.json", "w") as f:
        json.dump(result, f, indent=1)
    print_tables(arms, claims, wall)
    plot(arms)


def print_tables(arms: dict, claims: dict, wall: float) -> None:
    print(f"\nRSIR, {len(SEEDS)} seeds, mean ± std, {wall:.0f} s. Test metrics: full ranking, history masked.\n")
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
        print(f"| {regime} | {c['rsir_r1_beats_base_seeds']}/{len(SEEDS)} | {c['rsir_r1_mean_above_base']} | "
              f"{c['fidelity_r2_ge_no_fidelity_r2_seeds']}/{len(SEEDS)} | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r1']:.1f}x | "
              f"{c['growth_ratio_no_fidelity_over_rsir_r2']:.1f}x |")


def plot(arms: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(REGIMES), figsize=(6 * len(REGIMES), 4))
    for ax, regime in zip(axes, REGIMES):
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
    fig.savefig("results/rsir.png", dpi=120)


if __name__ == "__main__":
    main()
