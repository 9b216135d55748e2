"""One RNA-FM-family fit outside the runner, for ``experiments/rna_fm_coverage.py`` (still an argparse script).

The RNA-FM experiment itself is ``configs/rna_fm/experiment.yaml`` (run by `experiments.runner`, hooks in
`experiments.rna_fm`); the coverage study trains RNA-FM and the regressors once per seed at the learning rate that
experiment chose, with or without EMA weights, and reads the best-validation weights in memory. These are its
fits, kept as they were so that its numbers stay comparable: ``DATA`` and ``SMOKE`` (the experiment's data scale
and smoke sizes, also in experiment.yaml) and `fit_candidate`. `experiments.rna_fm` re-exports them, the names the
coverage script imports.
"""
from __future__ import annotations

import time

from callbacks.ema import EMAWeights
from experiments.kit import KeepBest, from_config, quiet_trainer

MONITOR = "val/pearson"
LR_GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # configs/rna_fm/experiment.yaml's grid
EMA = dict(decay=0.999, warmup=True)  # RNA-FM's EMA (quick.yaml)
# the synthetic generator's default scale (the quick configs use a smaller one)
DATA = dict(num_slides=600, num_pathway_genes=400, num_pathways=20, num_background_genes=40, num_clusters=32,
            feature_dim=32, eval_batch_size=128)
SMOKE = dict(num_slides=40, num_clusters=12, epochs=1, val_every=1, hidden=16, lrs=LR_GRID[1:3],
             data=dict(DATA, num_pathway_genes=40, num_pathways=4, num_background_genes=8, feature_dim=8))


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
