"""RNA-FM vs two MSE regressors on synthetic slides: ``python -m experiments rna_fm`` (~26 min per seed on 2 cores).

Paper: "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction" (arXiv 2605.11622). Claims
checked: (1) the flow-matching model predicts expression about as well as MSE regressors (which are optimal for the
conditional mean, so no large Pearson gap is expected), and (2) as a generative model it captures the heterogeneity
the regressors average away: better fit of the bimodal genes' distribution. The pathway-token ablation (one flat
token) tests the structured velocity network.

The protocol is configuration, ``configs/rna_fm/experiment.yaml``, run by `experiments.runner`: every model is built
and trained as ``python train.py fit`` builds it (trainer and callbacks from the YAML; one seed S drives model and
data). Data: the embedded synthetic slides (`SlideExpressionDataModule` at its default scale: 600 slides, 440 genes
in 20 overlapping pathways + 40 background genes, 25% of genes shifted by a hidden subtype the image shows only
weakly, cluster features [32, 32]), a 60/20/20 train/val/test split per seed.

Tuning, the same for every trained row: arms named ``"<row> @ lr=<lr>"`` (``row: false``) fit the row's config at
each learning rate of one grid (3e-4, 1e-3, 3e-3, 1e-2, 3e-2; each keeps its config's optimiser, AdamW for RNA-FM,
Adam for the regressors), with EMA weights always on (`callbacks.ema.EMAWeights`, decay 0.999 with warm-up: quick.yaml's
callback for RNA-FM, appended in experiment.yaml for the regressors; validation and test read the averaged
weights), 40 epochs of 12 steps (batch 32), validation every 8 epochs, grad-clip 1, and the config's ModelCheckpoint
keeping the best validation Pearson. `evaluate` records each grid point (``lr``, ``ema``, ``val_pearson``,
``best_epoch``, ``train_s``: Lightning's Timer over the fit). The row itself (``fit: false``) tests, once, the
checkpoint with the best validation Pearson among its grid (`select`: ties to the earlier, smaller learning rate;
the test split is read only here), with its trainer's EMA callback restoring the checkpoint's averaged weights. The
top-k gene lists (RNA-FM) and the per-gene residual std (regressors) come from that checkpoint's validation pass.

Test metrics (`lightning_modules.rna_fm.expression_eval.expression_metrics`): per-gene Pearson r of the point
prediction (RNA-FM: mean of 19 samples) and of one sample, top-20/100 r on validation-chosen genes, RMSE (log units),
BH-FDR significant genes, 90% rank-interval coverage from 19 samples, energy distance of the pooled samples to the
test targets per gene, and the sample CRPS, all-gene, bimodal-gene and unimodal-gene. Regressors' samples are
Gaussian around their prediction with a per-gene residual std from validation (without it a point regressor has
zero-width intervals and coverage 0). Evaluation noise comes from per-slide generators (the module's
``sample_seed`` and the slide index), so a checkpoint's test metrics do not depend on what ran before.

Rows: ``RNA-FM`` (pathway tokens, hidden 64, depth 2, 4 heads, CFG drop 0.1, guidance 2, 19 Euler steps),
``RNA-FM, CFG 1`` (RNA-FM's chosen checkpoint sampled without guidance: ``settings.checkpoint_from``, no training),
``RNA-FM, flat token`` (no pathway tokens), ``HE2RNA-lite`` (hidden 64, top-10 cluster pooling) and
``tRNAsformer-lite`` (dim 64, MLP 128, no dropout), the baseline of the runner's pairs.

Outputs: the runner's table, ``<out>/rna_fm.json`` (``{"paper": "rna_fm", "seeds", "wall_s", "config", "arms":
{row: {metric: {"mean", "std"}}}, "per_seed": [{"seed", "runs": {row: every test metric, the validation r, best
epoch, chosen lr, ema, training seconds summed over the grid, and the grid's records}}], "paired", "title",
"chosen_lr", "machine"}``; `report` builds ``per_seed``, ``chosen_lr`` and the pairs of ``settings.paired``) and
``<out>/rna_fm.png`` (`plot`). Reduced runs are ``--set`` overrides (docs/rna_fm.md).
"""
from __future__ import annotations

import sys

import torch
from lightning.pytorch.callbacks import Timer

from callbacks.ema import EMAWeights
from experiments.runner import ExperimentError, arm_flags
from lightning_modules.shared.errors import UserInputError

TITLE = "RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction (arXiv 2605.11622)"
GRID = " @ lr="      # a grid arm is named "<row> @ lr=<lr>"
LR_KEY = "model.init_args.optimizer.init_args.lr"
ROW_METRICS = ("val_pearson", "train_s")  # beside the test metrics in the runner's table (the rest: per_seed)
PANELS = (("pearson", "test Pearson r (all genes)"), ("coverage_bimodal", "90% coverage, bimodal genes"),
          ("energy_bimodal", "energy distance, bimodal genes (lower = better)"),
          ("crps_bimodal", "CRPS, bimodal genes (lower = better)"))


class SettingError(ExperimentError, UserInputError):
    """A setting of the RNA-FM protocol (experiment.yaml or ``--set``) that cannot run: one line, the fix included."""


def grid_of(name: str) -> str | None:
    """The row a grid arm ``"<row> @ lr=<lr>"`` tunes; None for a row."""
    row, sep, _ = name.partition(GRID)
    return row if sep else None


def checkpoint_source(run) -> str:
    """The grid a test-only row reads its checkpoint from: ``settings.checkpoint_from[row]``, else its own name."""
    mapping = run.settings.get("checkpoint_from") or {}
    if not isinstance(mapping, dict):
        raise SettingError(f"settings.checkpoint_from must map a row to the row whose grid it tests, e.g. "
                           f"{{'RNA-FM, CFG 1': RNA-FM}}; got {mapping!r}")
    return str(mapping.get(run.arm.name, run.arm.name))


def grid_runs(run) -> list:
    """The same seed's earlier runs of the grid this row tests, in run order; one error line when there are none."""
    source = checkpoint_source(run)
    runs = [earlier for name, earlier in run.earlier.items() if grid_of(name) == source]
    if not runs:
        raise SettingError(f"row {run.arm.name!r} tests the checkpoint chosen among the arms '{source}{GRID}...', "
                           f"none of which ran before it on seed {run.seed}: list them before it in "
                           "configs/rna_fm/experiment.yaml")
    return runs


def learning_rate(run) -> float:
    """The grid arm's ``model.init_args.optimizer.init_args.lr`` as given (experiment.yaml, smoke, ``--set``)."""
    given = [f.partition("=")[2] for f in arm_flags(run.spec, run.arm, run.variant) if f.startswith(f"--{LR_KEY}=")]
    try:
        return float(given[-1])
    except (IndexError, ValueError):
        raise SettingError(f"grid arm {run.arm.name!r} must set {LR_KEY} (a number) in its overrides") from None


def prepare(run) -> dict:
    """No computed overrides; checks the arm before it is built: a grid arm sets its learning rate and is fitted, a
    row is test-only (``fit: false``) and comes after its grid."""
    if grid_of(run.arm.name) is not None:
        learning_rate(run)
        if not run.arm.fit or run.arm.row:
            raise SettingError(f"grid arm {run.arm.name!r} must be fitted and say row: false (its row reports the "
                               "checkpoint validation chose)")
        return {}
    if run.arm.fit:
        raise SettingError(f"row {run.arm.name!r} must say fit: false: it tests the checkpoint chosen among its grid "
                           f"'{checkpoint_source(run)}{GRID}...'")
    grid_runs(run)
    return {}


def candidate(run) -> dict:
    """A fitted grid point: ``{lr, ema, val_pearson, best_epoch, train_s}`` from its trainer (the best score and
    epoch of the ModelCheckpoint that monitors validation, Timer's training seconds, whether EMAWeights ran)."""
    callbacks = run.trainer.callbacks
    monitored = [c for c in run.trainer.checkpoint_callbacks if getattr(c, "monitor", None)]
    timers = [c for c in callbacks if isinstance(c, Timer)]
    if not monitored or not timers or monitored[0].best_model_score is None:
        raise SettingError(f"grid arm {run.arm.name!r} needs a ModelCheckpoint monitoring val/pearson with a "
                           "validation during the fit, and a lightning.pytorch.callbacks.Timer in trainer.callbacks")
    epoch = torch.load(monitored[0].best_model_path, map_location="cpu", weights_only=False)["epoch"]
    return {"lr": learning_rate(run), "ema": any(isinstance(c, EMAWeights) for c in callbacks),
            "val_pearson": float(monitored[0].best_model_score), "best_epoch": int(epoch),
            "train_s": float(timers[0].time_elapsed("train"))}


def select(records: list[dict]) -> int:
    """Index of the grid point with the best validation Pearson (ties: the first). Reads ``val_pearson`` only."""
    scores = [r["val_pearson"] for r in records]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def evaluate(run) -> dict[str, float]:
    """A grid arm: its record (kept in ``run.extra`` for the row). A row: the test of the checkpoint `select` chose
    among its grid, from its own trainer (its EMA callback restores the checkpoint's averaged weights); the full
    record (test metrics, validation r, best epoch, lr, ema, train_s summed over the grid, the grid) goes to
    ``run.extra`` for `report`, the test metrics with ``val_pearson`` and ``train_s`` to the runner's table."""
    if grid_of(run.arm.name) is not None:
        run.extra["candidate"] = candidate(run)
        return {k: float(v) for k, v in run.extra["candidate"].items()}
    grid = grid_runs(run)
    records = [g.extra["candidate"] for g in grid]
    best = select(records)
    chosen = records[best]
    run.trainer.test(run.model, datamodule=run.datamodule, ckpt_path=grid[best].best_checkpoint(), verbose=False)
    trained = checkpoint_source(run) == run.arm.name  # else the same weights evaluated otherwise: no training
    record = {**run.model.test_metrics, "val_pearson": chosen["val_pearson"], "best_epoch": chosen["best_epoch"],
              "lr": chosen["lr"], "ema": chosen["ema"],
              "train_s": sum(r["train_s"] for r in records) if trained else 0.0,
              **({"grid": records} if trained else {})}
    run.extra.update(seed=run.seed, record=record)
    return {**run.model.test_metrics, **{k: record[k] for k in ROW_METRICS}}


def report(result: dict, records: list[dict], spec) -> dict:
    """``per_seed`` as ``[{"seed", "runs": {row: record}}]``, ``chosen_lr`` (row -> lr per seed), ``title`` and the
    pairs of ``settings.paired`` (baseline -> rows) after the runner's pairs against ``baseline``."""
    from icml26.paired import paired_block

    per_seed = [{"seed": seed, "runs": {arm: extra["record"] for arm, extra in kept.get("", {}).items()
                                        if "record" in extra}} for seed, kept in enumerate(records)]
    rows = [s["runs"] for s in per_seed]
    chosen_lr = {arm: [s["runs"][arm]["lr"] for s in per_seed if arm in s["runs"]] for arm in rows[0]}
    pairs = spec.settings.get("paired") or {}
    if not isinstance(pairs, dict) or not all(isinstance(v, list) for v in pairs.values()):
        raise SettingError("settings.paired must map a baseline row to a list of rows, e.g. "
                           "{'RNA-FM, flat token': [RNA-FM]}")
    block = {}
    for baseline, arms in pairs.items():
        arms = [arm for arm in arms if any(arm in r for r in rows)]
        if arms and any(baseline in r for r in rows):
            measured = {m for r in rows for a in (baseline, *arms) for m in r.get(a, {})}
            block.update(paired_block(rows, baseline, [m for m in spec.metrics if m in measured], arms=arms))
    print("\nchosen lr per seed: " + "; ".join(f"{arm} {lrs}" for arm, lrs in chosen_lr.items()))
    return {"per_seed": per_seed, "title": TITLE, "chosen_lr": chosen_lr, "paired": block}


def plot(result: dict, path) -> None:
    """Pearson r, bimodal coverage, energy distance and CRPS per row (mean ± std over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = result["arms"]
    names = list(arms)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (key, title) in zip(axes, PANELS):
        means = [arms[a][key]["mean"] if key in arms[a] else float("nan") for a in names]
        stds = [arms[a][key]["std"] if key in arms[a] else 0.0 for a in names]
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


if __name__ == "__main__":  # the older spelling: python -m experiments.rna_fm [--smoke] [--seeds N] [--check] ...
    from experiments.runner import experiment_command

    sys.exit(experiment_command(["rna_fm", *sys.argv[1:]]))
