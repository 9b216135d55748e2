"""Reproduce RNA-FM's claims at small scale: ``python -m experiments.rna_fm`` (~45 min of one free core).

Paper: "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction" (arXiv 2605.11622). Claims
checked: (1) the flow-matching model predicts expression about as well as MSE regressors (which are optimal
for the conditional mean, so no large Pearson gap is expected), and (2) as a generative model it captures the
heterogeneity the regressors average away: better fit of the bimodal genes' distribution. The pathway-token
ablation (one flat token) tests the structured velocity network.

Setup: every arm starts from its quick config through `experiments.kit.from_config` (``configs/rna_fm/quick.yaml``
for RNA-FM, ``he2rna_quick.yaml``, ``trnasformer_quick.yaml``) and overrides only what the experiment varies:
the data scale, the seed, the width and the arm's switch. Data: the embedded synthetic slides
(`SlideExpressionDataModule` at its default scale: 600 slides, 440 genes in 20 overlapping pathways + 40
background genes, 25% of genes shifted by a hidden subtype the image shows only weakly, cluster features [32, 32]),
a 60/20/20 train/val/test split per data seed (model seed = data seed).

Tuning, the same for every trained arm (`candidate_grid`): the learning rate from ``LR_GRID`` (3e-4, 1e-3, 3e-3,
1e-2, 3e-2; each arm keeps its config's optimiser, AdamW for RNA-FM, Adam for the regressors), EMA of the weights always
on (`callbacks.ema.EMAWeights`, decay 0.999 with warm-up, as in quick.yaml; validation and test read the averaged
weights), a fixed number of epochs with validation every ``--val-every`` epochs, and the weights of the best
validation Pearson kept (`experiments.kit.KeepBest`). The candidate with the best validation Pearson is the arm's
model; only it is tested, once. Selection reads the validation split only, never the test split. The chosen
learning rate and every candidate's validation r are recorded per seed. The top-k gene lists come from validation.
Test metrics (`lightning_modules.rna_fm.expression_eval.expression_metrics`): per-gene Pearson r of the point prediction
(RNA-FM: mean of 19 samples) and of one sample, top-20/100 r on validation-chosen genes, RMSE (log units), BH-FDR
significant genes, 90% rank-interval coverage from 19 samples, energy distance of the pooled samples to the test
targets per gene, and the sample CRPS, all-gene and bimodal-gene. Regressors' samples are Gaussian around their
prediction with a per-gene residual std from validation (without it a point regressor has zero-width intervals and
coverage 0).

Training: 40 epochs of 12 steps (batch 32), validation every 8 epochs, grad-clip 1 for every arm; RNA-FM AdamW
(wd 0.01, betas 0.9/0.99; quick.yaml's), regressors Adam (their configs'); learning rate and EMA as above.

Arms: ``RNA-FM`` (pathway tokens, hidden 64, depth 2, 4 heads, CFG drop 0.1, guidance 2, 19 Euler steps),
``RNA-FM, CFG 1`` (the same trained weights sampled without guidance: evaluation-only), ``RNA-FM, flat token``
(no pathway tokens), ``HE2RNA-lite`` (hidden 64, top-10 cluster pooling) and ``tRNAsformer-lite`` (dim 64, MLP
128, no dropout).

Outputs: a markdown table on stdout and the kit's schema in ``<out>/rna_fm.json`` (``{"paper", "seeds", "wall_s",
"config", "arms": {arm: {metric: {"mean", "std"}}}, "per_seed": [{"seed", "runs": {arm: every test metric, the
validation r, best epoch and training seconds}}], "title"}``) and ``<out>/rna_fm.png``.
"""
from __future__ import annotations

import time
from pathlib import Path

from callbacks.ema import EMAWeights
from experiments.kit import (KeepBest, experiment_parser, from_config, markdown_table, progress, quiet_single_thread,
                             quiet_trainer, summarise, write_result)

PAPER = "rna_fm"
TITLE = "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction (arXiv 2605.11622)"
ARMS = ("RNA-FM", "RNA-FM, CFG 1", "RNA-FM, flat token", "HE2RNA-lite", "tRNAsformer-lite")
TRAINED_ARMS = tuple(arm for arm in ARMS if arm != "RNA-FM, CFG 1")  # CFG 1 re-evaluates RNA-FM's weights
METRICS = ("pearson", "pearson_1sample", "top20", "top100", "rmse", "n_significant", "coverage", "coverage_bimodal",
           "energy", "energy_bimodal", "crps", "crps_bimodal", "val_pearson", "train_s")
MONITOR = "val/pearson"
LR_GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # every trained arm searches the same learning rates
EMA = dict(decay=0.999, warmup=True)  # RNA-FM's EMA (quick.yaml), on for every arm
# the synthetic generator's default scale (the quick configs use a smaller one)
DATA = dict(num_slides=600, num_pathway_genes=400, num_pathways=20, num_background_genes=40, num_clusters=32,
            feature_dim=32, eval_batch_size=128)
SMOKE = dict(num_slides=40, num_clusters=12, epochs=1, val_every=1, hidden=16, lrs=LR_GRID[1:3],
             data=dict(DATA, num_pathway_genes=40, num_pathways=4, num_background_genes=8, feature_dim=8))


def candidate_grid(arm: str, lrs: tuple[float, ...] = LR_GRID) -> list[dict]:
    """The candidates an arm is tuned over: the same for every trained arm (learning rate x EMA on)."""
    if arm not in TRAINED_ARMS:
        raise ValueError(f"{arm!r} is not trained (it re-evaluates RNA-FM's weights)")
    return [dict(lr=float(lr), ema=True) for lr in lrs]


def arm_overrides(arm: str, hidden: int) -> tuple[str, tuple[str, ...]]:
    """(config file, the arm's model overrides)."""
    if arm.startswith("RNA-FM"):
        pathway_tokens = "false" if arm == "RNA-FM, flat token" else "true"
        return "configs/rna_fm/quick.yaml", (f"--model.init_args.hidden_dim={hidden}",
                                             f"--model.init_args.pathway_tokens={pathway_tokens}")
    if arm == "HE2RNA-lite":
        return "configs/rna_fm/he2rna_quick.yaml", (f"--model.init_args.hidden_dim={hidden}",
                                                    "--model.init_args.ks=[10]")
    if arm == "tRNAsformer-lite":
        return "configs/rna_fm/trnasformer_quick.yaml", (f"--model.init_args.dim={hidden}",
                                                         f"--model.init_args.mlp_dim={2 * hidden}",
                                                         "--model.init_args.dropout=0.0")
    raise ValueError(arm)


def small_setup() -> dict:
    """A reduced setting for the slow test (well under 2 minutes): one learning rate, the same for every arm."""
    return dict(num_slides=300, num_clusters=16, epochs=30, val_every=10, hidden=48, lrs=(3e-3,))


def fit_candidate(arm: str, seed: int, lr: float, ema: bool, num_slides: int = 600, num_clusters: int = 32,
                  epochs: int = 40, val_every: int = 8, hidden: int = 64, data: dict | None = None):
    """Train one candidate of one arm on one data seed; keep its best-validation weights (no test data read).

    Returns ``(record, model, datamodule)`` with ``record = {lr, ema, val_pearson, best_epoch, train_s}``.
    """
    data = dict(data or DATA, num_slides=num_slides, num_clusters=num_clusters)
    config, model_overrides = arm_overrides(arm, hidden)
    model, datamodule = from_config(config, f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
                                    *(f"--data.init_args.{k}={v}" for k, v in data.items()), *model_overrides,
                                    f"--model.init_args.optimizer.init_args.lr={lr}")
    keep = KeepBest(MONITOR, mode="max")  # before EMAWeights: it then sees the EMA weights (swapped out after it)
    callbacks = [keep] + ([EMAWeights(**EMA)] if ema else [])
    trainer = quiet_trainer(callbacks, max_epochs=epochs, check_val_every_n_epoch=val_every, gradient_clip_val=1.0)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    train_s = time.perf_counter() - start
    keep.restore(model)
    # validation runs at an epoch end, after that epoch's num_training_batches optimiser steps
    best_epoch = keep.best_step // trainer.num_training_batches - 1
    record = {"lr": float(lr), "ema": bool(ema), "val_pearson": float(keep.best_score), "best_epoch": best_epoch,
              "train_s": train_s}
    return record, model, datamodule


def select(records: list[dict]) -> int:
    """Index of the candidate with the best validation Pearson (ties: the first). Reads ``val_pearson`` only."""
    scores = [r["val_pearson"] for r in records]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def train_arm(arm: str, seed: int, lrs: tuple[float, ...] = LR_GRID, **sizes):
    """Tune one arm over `candidate_grid` on validation, then test the chosen candidate once.

    Returns (test metrics + validation r / best epoch / chosen lr / seconds over the grid / the grid, model,
    datamodule).
    """
    records, best = [], None
    for candidate in candidate_grid(arm, lrs):
        record, model, datamodule = fit_candidate(arm, seed, candidate["lr"], candidate["ema"], **sizes)
        records.append(record)
        if select(records) == len(records) - 1:
            best = (model, datamodule)
        del model, datamodule
    model, datamodule = best
    chosen = records[select(records)]
    evaluator = quiet_trainer()
    evaluator.validate(model, datamodule=datamodule, verbose=False)  # validation r of the kept weights -> top-k genes
    evaluator.test(model, datamodule=datamodule, verbose=False)
    result = {**model.test_metrics, "val_pearson": chosen["val_pearson"], "best_epoch": chosen["best_epoch"],
              "lr": chosen["lr"], "ema": chosen["ema"], "train_s": sum(r["train_s"] for r in records),
              "grid": records}
    return result, model, datamodule


def run_arm(arm: str, seed: int, **sizes) -> dict:
    """`train_arm`'s metrics only."""
    return train_arm(arm, seed, **sizes)[0]


def evaluate_without_guidance(model, datamodule) -> dict:
    """The same trained RNA-FM sampled with cfg_scale 1 (plain conditional velocity)."""
    scale = model.hparams.cfg_scale
    model.hparams.cfg_scale = 1.0
    quiet_trainer().test(model, datamodule=datamodule, verbose=False)
    model.hparams.cfg_scale = scale
    return dict(model.test_metrics)


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
    parser = experiment_parser(__doc__.splitlines()[0], seeds=3)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--val-every", type=int, default=8)
    parser.add_argument("--slides", type=int, default=DATA["num_slides"])
    parser.add_argument("--clusters", type=int, default=DATA["num_clusters"])
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args(argv)
    quiet_single_thread()
    start = time.perf_counter()
    if args.smoke:
        sizes = dict(SMOKE)
    else:
        sizes = dict(num_slides=args.slides, num_clusters=args.clusters, epochs=args.epochs,
                     val_every=args.val_every, hidden=args.hidden, data=DATA, lrs=LR_GRID)
    per_seed = []
    bar = progress(None, desc="rna_fm seeds x arms", total=args.seeds * len(TRAINED_ARMS))
    for seed in range(args.seeds):
        runs = {}
        for arm in TRAINED_ARMS:
            t0 = time.perf_counter()
            result, model, datamodule = train_arm(arm, seed, **sizes)
            runs[arm] = result
            bar.update(1)
            bar.write(f"seed {seed} {arm} (lr {result['lr']:g}): pearson {result['pearson']:.3f} cov_bimodal "
                      f"{result.get('coverage_bimodal', float('nan')):.3f} energy_bimodal "
                      f"{result.get('energy_bimodal', float('nan')):.3f} ({time.perf_counter() - t0:.0f} s)")
            if arm == "RNA-FM":
                runs["RNA-FM, CFG 1"] = {**evaluate_without_guidance(model, datamodule),
                                         "val_pearson": result["val_pearson"], "best_epoch": result["best_epoch"],
                                         "lr": result["lr"], "ema": result["ema"], "train_s": 0.0}
        per_seed.append({"seed": seed, "runs": {arm: runs[arm] for arm in ARMS}})
    bar.close()
    arms = summarise([{arm: {m: r[m] for m in METRICS if m in r} for arm, r in s["runs"].items()}
                      for s in per_seed])
    wall = time.perf_counter() - start
    config = {"configs": {arm: arm_overrides(arm, sizes["hidden"])[0] for arm in ARMS},
              "varied": "data scale, seed, width (hidden_dim / dim, mlp_dim), the arm's switch (pathway_tokens, "
                        "HE2RNA ks [10], tRNAsformer dropout 0)",
              "data": dict(sizes["data"], num_slides=sizes["num_slides"], num_clusters=sizes["num_clusters"]),
              "epochs": sizes["epochs"], "val_every": sizes["val_every"], "hidden": sizes["hidden"],
              "gradient_clip_val": 1.0, "batch_size": 32,
              "grid": {arm: candidate_grid(arm, sizes["lrs"]) for arm in TRAINED_ARMS},
              "optimizer": {arm: "AdamW (wd 0.01, betas 0.9/0.99)" if arm.startswith("RNA-FM") else "Adam"
                            for arm in TRAINED_ARMS},
              "split": "60/20/20 train/val/test", "test_samples": 19, "sampling_steps": 19, "cfg_scale": 2.0,
              "ema": "decay 0.999, warm-up, every arm",
              "selection": f"per arm and seed: the candidate and epoch of best {MONITOR} (validation only); "
                           "train_s sums the grid", "smoke": args.smoke}
    chosen_lr = {arm: [s["runs"][arm]["lr"] for s in per_seed] for arm in ARMS}
    result = write_result(PAPER, seeds=args.seeds, wall_s=wall, config=config, arms=arms, per_seed=per_seed,
                          out=args.out, title=TITLE, chosen_lr=chosen_lr)
    out = Path(args.out)
    plot(arms, out / f"{PAPER}.png")
    print(markdown_table(arms, ("pearson", "pearson_1sample", "top20", "rmse", "n_significant", "coverage",
                                "coverage_bimodal", "energy", "energy_bimodal", "crps", "crps_bimodal")))
    print("\nchosen lr per seed: " + "; ".join(f"{arm} {lrs}" for arm, lrs in chosen_lr.items()))
    print(f"\nwall {wall:.0f} s (measured on a shared 2-core machine); results in {out / (PAPER + '.json')}, "
          f"{out / (PAPER + '.png')}")
    return result


if __name__ == "__main__":
    main()
