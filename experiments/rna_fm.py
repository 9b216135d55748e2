"""Reproduce RNA-FM's claims at small scale: ``python -m experiments.rna_fm`` (a few minutes on 2 cores).

Paper: "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction" (arXiv 2605.11622). Claims
checked: (1) the flow-matching model predicts expression about as well as MSE regressors (which are optimal
for the conditional mean, so no large Pearson gap is expected), and (2) as a generative model it captures the
heterogeneity the regressors average away: better fit of the bimodal genes' distribution. The pathway-token
ablation (one flat token) tests the structured velocity network.

Setup: the embedded synthetic slides (`SlideExpressionDataModule`, 600 slides, 440 genes in 20 overlapping
pathways + 40 background genes, 25% of genes shifted by a hidden subtype the image shows only weakly, cluster
features [C, 32]), a 60/20/20 train/val/test split per data seed (model seed = data seed). Every arm trains for
a fixed number of epochs with validation every ``--val-every`` epochs; the weights of the best validation
Pearson are kept (RNA-FM: the EMA weights, `callbacks.ema.EMAWeights` with warm-up) and the top-k gene lists
come from validation. Test metrics (`lightning_modules.expression_eval.expression_metrics`): per-gene Pearson r of the
point prediction (RNA-FM: mean of 19 samples) and of one sample, top-20/100 r on validation-chosen genes, RMSE
(log units), BH-FDR significant genes, 90% rank-interval coverage from 19 samples, energy distance of the pooled
samples to the test targets per gene, and the sample CRPS, all-gene and bimodal-gene. Regressors' samples are
Gaussian around their prediction with a per-gene residual std from validation (without it a point regressor
has zero-width intervals and coverage 0).

Training: 40 epochs of 12 steps (batch 32), validation every 8 epochs; RNA-FM AdamW lr 3e-3 (wd 0.01, betas
0.9/0.99; 1e-3 converged too slowly for the budget), grad-clip 1, EMA; regressors Adam lr 1e-3.

Arms: ``RNA-FM`` (pathway tokens, hidden 64, depth 2, 4 heads, CFG drop 0.1, guidance 2, 19 Euler steps),
``RNA-FM, CFG 1`` (the same trained weights sampled without guidance: evaluation-only), ``RNA-FM, flat token``
(no pathway tokens), ``HE2RNA-lite`` and ``tRNAsformer-lite``.

Outputs: a markdown table on stdout, ``results/rna_fm.json`` ({"paper", "seeds", "wall_s", "arms": {arm: {metric:
{"mean", "std"}}}, "settings", "runs"}) and ``results/rna_fm.png``.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from callbacks.ema import EMAWeights
from datamodules.slide_expression import SlideExpressionDataModule
from experiments import quiet_single_thread
from lightning_modules.expression_regressors import HE2RNARegressor, TRNAsformerRegressor
from lightning_modules.rna_fm import RNAFM

PAPER = "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction (arXiv 2605.11622)"
ARMS = ("RNA-FM", "RNA-FM, CFG 1", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite")
METRICS = ("pearson", "pearson_1sample", "top20", "top100", "rmse", "n_significant", "coverage", "coverage_bimodal",
           "energy", "energy_bimodal", "crps", "crps_bimodal", "val_pearson", "train_s")


class KeepBest(Callback):
    """Keeps the weights of the validation epoch with the best val/pearson (put before EMAWeights: it then sees
    the EMA weights, which EMAWeights swaps out in its own on_validation_end)."""

    def __init__(self):
        self.best, self.state, self.epoch = -float("inf"), None, -1

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        value = float(trainer.callback_metrics["val/pearson"])
        if value > self.best:
            self.best, self.epoch = value, trainer.current_epoch
            self.state = copy.deepcopy(pl_module.state_dict())


def quiet_trainer(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def make_model(arm: str, hidden: int, lr: float):
    common = dict(test_samples=19, eval_samples=1, top_ks=(20, 100))
    if arm.startswith("RNA-FM"):
        return RNAFM(hidden_dim=hidden, depth=2, num_heads=4, graph_heads=4, cond_layers=2, cond_heads=4, dropout=0.0,
                     pathway_tokens=arm != "RNA-FM, flat token", cfg_drop_prob=0.1, cfg_scale=2.0, sampling_steps=19,
                     optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.01, betas=(0.9, 0.99)),
                     **common)
    if arm == "HE2RNA-lite":
        return HE2RNARegressor(hidden_dim=hidden, ks=(10,), dropout=0.25,
                               optimizer=functools.partial(torch.optim.Adam, lr=1e-3), **common)
    if arm == "tRNAsformer-lite":
        return TRNAsformerRegressor(dim=hidden, depth=2, num_heads=4, mlp_dim=2 * hidden, dropout=0.0,
                                    optimizer=functools.partial(torch.optim.Adam, lr=1e-3), **common)
    raise ValueError(arm)


def small_setup() -> dict:
    """A reduced setting for the slow test (well under 2 minutes)."""
    return dict(num_slides=300, num_clusters=16, epochs=30, val_every=10, hidden=48)


def run_arm(arm: str, seed: int, num_slides: int = 600, num_clusters: int = 32, epochs: int = 40,
            val_every: int = 8, hidden: int = 64, lr: float = 3e-3, datamodule=None) -> dict:
    """Train one arm on one data seed; returns its test metrics (and, for RNA-FM, the model for re-evaluation)."""
    datamodule = datamodule or SlideExpressionDataModule(num_slides=num_slides, num_clusters=num_clusters, seed=seed,
                                                         batch_size=32, eval_batch_size=128)
    seed_everything(seed, verbose=False)
    model = make_model(arm, hidden, lr)
    keep = KeepBest()
    callbacks = [keep] + ([EMAWeights(decay=0.999, warmup=True)] if arm.startswith("RNA-FM") else [])
    trainer = quiet_trainer(max_epochs=epochs, check_val_every_n_epoch=val_every, gradient_clip_val=1.0,
                            callbacks=callbacks)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    train_s = time.perf_counter() - start
    model.load_state_dict(keep.state)
    evaluator = quiet_trainer()
    evaluator.validate(model, datamodule=datamodule, verbose=False)  # validation r of the kept weights -> top-k genes
    evaluator.test(model, datamodule=datamodule, verbose=False)
    result = {**model.test_metrics, "val_pearson": keep.best, "best_epoch": keep.epoch, "train_s": train_s}
    result["_model"], result["_datamodule"] = model, datamodule
    return result


def evaluate_without_guidance(model: RNAFM, datamodule) -> dict:
    """The same trained RNA-FM sampled with cfg_scale 1 (plain conditional velocity)."""
    model.hparams.cfg_scale = 1.0
    quiet_trainer().test(model, datamodule=datamodule, verbose=False)
    model.hparams.cfg_scale = 2.0
    return dict(model.test_metrics)


def summarise(runs: dict[str, list[dict]]) -> dict:
    return {arm: {m: {"mean": float(np.mean([r[m] for r in rs])), "std": float(np.std([r[m] for r in rs]))}
                  for m in METRICS if all(m in r for r in rs)} for arm, rs in runs.items()}


def markdown(arms: dict) -> str:
    cols = [("pearson", "Pearson r"), ("pearson_1sample", "r (1 sample)"), ("top20", "top-20 r"),
            ("rmse", "RMSE"), ("n_significant", "FDR genes"), ("coverage", "cov90 all"),
            ("coverage_bimodal", "cov90 bimodal"), ("energy", "energy all"), ("energy_bimodal", "energy bimodal"),
            ("crps", "CRPS all"), ("crps_bimodal", "CRPS bimodal")]
    lines = ["| arm | " + " | ".join(c[1] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for arm, m in arms.items():
        cells = []
        for key, _ in cols:
            digits = 0 if key == "n_significant" else 3
            cells.append(f"{m[key]['mean']:.{digits}f} ± {m[key]['std']:.{digits}f}" if key in m else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(arms: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("pearson", "test Pearson r (all genes)"), ("coverage_bimodal", "90% coverage, bimodal genes"),
              ("energy_bimodal", "energy distance, bimodal genes (lower = better)"),
              ("crps_bimodal", "CRPS, bimodal genes (lower = better)")]
    names = list(arms)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title) in zip(axes, panels):
        means = [arms[a][key]["mean"] for a in names]
        stds = [arms[a][key]["std"] for a in names]
        colors = ["#37a" if n.startswith("RNA-FM") else "#999" for n in names]
        ax.barh(range(len(names)), means, xerr=stds, color=colors)
        ax.set_yticks(range(len(names)), names if ax is axes[0] else [""] * len(names), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
        if key.startswith("coverage"):
            ax.axvline(0.9, color="k", lw=0.8, ls="--")
    fig.suptitle("RNA-FM vs regressors on synthetic slides (mean ± std over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--val-every", type=int, default=8)
    parser.add_argument("--slides", type=int, default=600)
    parser.add_argument("--clusters", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    quiet_single_thread()
    start = time.perf_counter()
    settings = dict(num_slides=args.slides, num_clusters=args.clusters, epochs=args.epochs, val_every=args.val_every,
                    hidden=args.hidden)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for seed in range(args.seeds):
        datamodule = SlideExpressionDataModule(num_slides=args.slides, num_clusters=args.clusters, seed=seed,
                                               batch_size=32, eval_batch_size=128)
        for arm in ARMS:
            if arm == "RNA-FM, CFG 1":
                continue
            t0 = time.perf_counter()
            result = run_arm(arm, seed, datamodule=datamodule, **settings)
            model = result.pop("_model")
            result.pop("_datamodule")
            runs[arm].append(result)
            print(f"seed {seed} {arm}: pearson {result['pearson']:.3f} cov_bimodal "
                  f"{result.get('coverage_bimodal', float('nan')):.3f} energy_bimodal "
                  f"{result.get('energy_bimodal', float('nan')):.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
            if arm == "RNA-FM":
                unguided = evaluate_without_guidance(model, datamodule)
                runs["RNA-FM, CFG 1"].append({**unguided, "val_pearson": result["val_pearson"],
                                              "best_epoch": result["best_epoch"], "train_s": 0.0})
    arms = summarise(runs)
    wall = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"paper": PAPER, "seeds": args.seeds, "wall_s": wall, "arms": arms,
              "settings": {**settings, "lr_rna_fm": 3e-3, "lr_regressors": 1e-3, "batch_size": 32,
                           "split": "60/20/20 train/val/test",
                           "test_samples": 19, "sampling_steps": 19, "cfg_scale": 2.0, "ema": "decay 0.999, warm-up"},
              "runs": {arm: rs for arm, rs in runs.items()}}
    (out / "rna_fm.json").write_text(json.dumps(result, indent=1))
    plot(arms, out / "rna_fm.png")
    print(markdown(arms))
    print(f"\nwall {wall:.0f} s (measured on a shared 2-core machine); results in {out / 'rna_fm.json'}, "
          f"{out / 'rna_fm.png'}")
    return result


if __name__ == "__main__":
    main()
