"""Emotion hierarchies emerge with model size (arXiv 2507.10599, Figs. 2-3 and Sec. 5) at CPU scale:
``python -m experiments emotion_hierarchy``.

The protocol is ``configs/emotion_hierarchy/experiment.yaml``, run by `experiments.runner`: three TinyGPT language
models (configs/emotion_hierarchy/{quick,lm_medium_quick,lm_large_quick}.yaml: 1x16, 2x32 and 4x128 layers x width)
trained by `SupervisedWarmup` for the same number of steps on the planted-hierarchy corpus (6 Shaver basic emotions
as parents, 4 Shaver children each, surprise 2; label noise leaf .55 / parent .30 / sibling .10 / random .05; two
personas, the "biased" one relabelling 30% of fear-family labels as anger-family), and the large config untrained
(``lm-untrained``, the "no tree" reference: the paper's GPT-2 end of the scale).

Each size trains at its own learning rate, chosen on validation with the same budget for every size: the grid of
``settings.lr_grid`` (one run of the whole experiment per rate on the tuning seed 0, ``--seeds 1 --set
model.init_args.optimizer.init_args.lr=<rate>``, all through the runner), and per size the rate with the lowest
held-out corpus loss; the arms of experiment.yaml carry the chosen rates (`select_lrs`; the JSON's ``lr_tuning``
holds the grid, the losses, the chosen rate and the rate every final run used).

This module holds what is not configuration. `evaluate` measures each language model's held-out corpus loss
(``heldout_loss``: next-token cross-entropy on the validation sentences) and probes it with `EmotionProbe`
(configs/emotion_hierarchy/probe.yaml: the official tree construction, t = 0.3) through ``trainer.test`` on
held-out contexts with the neutral persona; the large model also with the biased persona, giving the arms
``lm-large/persona-neutral`` (the same numbers as ``lm-large``) and ``lm-large/persona-biased``. Metrics:
``total_path_length``, ``avg_depth``, ``edges``, ``group_purity``, ``edge_precision``, ``edge_recall``,
``acc_fine``, ``acc_basic``, ``planted_confusion`` (rate of fear contexts recognised as anger) and
``planted_confusion_mass`` (their mean renormalised probability on anger words). The paper's claims: tree depth
and path length grow with model size (`report`: paired intervals between sizes, seed by seed); recognition accuracy
grows with tree complexity (`report`: Pearson's r between total path length and fine accuracy over every
trained run, and the partial correlation given the held-out loss, since a model that learned the corpus better has
both a larger tree and a better accuracy; Fisher-z intervals and permutation p-values); the persona bias shows up
as confusion (Sec. 5). `plot` draws the figure.
"""
from __future__ import annotations

import json
import math
import tempfile

import numpy as np
import torch

from experiments import kit

NAME = "emotion_hierarchy"
SIZES = ("small", "medium", "large")
TRAINED = tuple(f"lm-{s}" for s in SIZES)
# the comparisons the docs state besides those against lm-untrained, as paired intervals over seeds (arm - other,
# seed by seed): the sizes, and the biased against the neutral persona on the same large LM
ARM_PAIRS = (("lm-medium", "lm-small"), ("lm-large", "lm-medium"), ("lm-large", "lm-small"),
             ("lm-large/persona-biased", "lm-large/persona-neutral"))
PAIRED_METRICS = ("total_path_length", "edges", "avg_depth", "group_purity", "edge_precision", "edge_recall",
                  "acc_fine", "acc_basic", "planted_confusion", "planted_confusion_mass", "heldout_loss")
PERMUTATIONS = 10000
METRICS = ("total_path_length", "avg_depth", "edges", "group_purity", "edge_precision", "edge_recall", "acc_fine",
           "acc_basic", "planted_confusion", "planted_confusion_mass")
LOSS_BATCH = 500


@torch.no_grad()
def heldout_loss(run) -> float:
    """Mean next-token cross-entropy of the run's LM on the validation sentences (held out from training, the
    training mix of personas, the training objective ``loss_on``): how well the LM learned the corpus, read only
    from the validation split, so it can select a learning rate and serve as the control of `report`."""
    from datamodules.emotion_corpus import collate_language_model
    from lightning_modules.rlvr.sft import sft_loss_terms

    datamodule, policy = run.datamodule, run.model.policy
    datamodule.setup("validate")  # a no-op after fit; the untrained arm builds its splits here
    rows, loss_on = datamodule.splits["val"], datamodule.hparams.loss_on
    was_training = policy.training
    policy.eval()
    total = count = 0.0
    for start in range(0, len(rows), LOSS_BATCH):
        batch = collate_language_model(rows[start:start + LOSS_BATCH], datamodule.tokenizer, loss_on)
        loss_sum, targets = sft_loss_terms(policy, batch["input_tokens"], batch["loss_mask"])
        total, count = total + float(loss_sum), count + float(targets)
    policy.train(was_training)
    return total / count


def probe(run, persona: str, plot_dir: str | None = None) -> dict[str, float]:
    """Probe the run's language model (its ``policy``) with the probe config, as ``python train.py test --config
    probe.yaml`` would, on ``settings.probe_num_test`` held-out contexts of ``persona``."""
    settings = run.settings
    cli = run.build(["--config", str(kit.REPO_ROOT / settings["probe_config"]), "--trainer.enable_progress_bar=false",
                     f"--data.init_args.probe_persona={persona}",
                     f"--data.init_args.num_test={settings['probe_num_test']}", "--data.init_args.num_train=1"])
    cli.model.policy = run.model.policy
    with tempfile.TemporaryDirectory() as scratch:  # the tree PNG/JSON of runs not kept go to a scratch folder
        cli.model.hparams.plot_dir = plot_dir or scratch
        cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    return {k: float(v) for k, v in cli.model.results["metrics"].items() if k in METRICS}


def evaluate(run) -> dict[str, float]:
    """The held-out corpus loss and the neutral-persona probe; for ``settings.persona_arm`` also the biased probe
    (derived arms); the learning rate the run trained with, for `report`."""
    settings, arm = run.settings, run.arm.name
    # the tree of the protocol as configured: a --smoke or --set run (the learning-rate grid, an ablation) writes the
    # same folder name, so it keeps none rather than overwrite the experiment's
    keep_tree = (arm == settings["tree_arm"] and run.seed == 0 and run.variant is None
                 and not run.spec.smoke_overrides)
    loss = heldout_loss(run)
    metrics = {**probe(run, "neutral", str(run.out / f"{run.spec.name}_tree") if keep_tree else None),
               "heldout_loss": loss}
    if arm == settings["persona_arm"]:
        run.derived[f"{arm}/persona-neutral"] = dict(metrics)
        run.derived[f"{arm}/persona-biased"] = {**probe(run, "biased"), "heldout_loss": loss}
    if run.fitted:  # the learning rate the optimizer ran with (constant: no scheduler), for `report`
        run.extra["lr"] = float(run.trainer.optimizers[0].param_groups[0]["lr"])
    return metrics


# ------------------------------------------------------------------------------------------- statistics
def pearson(x, y) -> float:
    """Pearson's r (NaN when either side is constant)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def residuals(values, controls) -> np.ndarray:
    """``values`` minus their least-squares fit on ``[1, controls]`` (the part the controls do not explain)."""
    values = np.asarray(values, dtype=float)
    design = np.column_stack([np.ones(len(values)), np.asarray(controls, dtype=float)])
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    return values - design @ coef


def correlation_summary(x, y, controls=None, permutations: int = PERMUTATIONS, seed: int = 0) -> dict:
    """Pearson's r of ``x`` and ``y`` (with ``controls``: the partial correlation, r of both residuals on the
    controls), its 95% Fisher-z interval (standard error 1 / sqrt(n - 3 - number of controls)) and a two-sided
    permutation p-value (the residuals of ``x`` permuted over the runs, ``permutations`` draws). Undefined values
    (a constant side, too few runs for an interval) are None."""
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    k = 0 if controls is None else np.asarray(controls, dtype=float).reshape(len(x), -1).shape[1]
    if k:
        x, y = residuals(x, controls), residuals(y, controls)
    n, r = len(x), pearson(x, y)
    lo = hi = p_value = float("nan")
    if math.isfinite(r):
        if n - 3 - k >= 1 and abs(r) < 1:
            half = float(stats.norm.ppf(0.975)) / math.sqrt(n - 3 - k)
            lo, hi = math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)
        rng = np.random.default_rng(seed)
        shuffled = np.stack([rng.permutation(x) for _ in range(permutations)])
        shuffled = shuffled - shuffled.mean(1, keepdims=True)
        yc = y - y.mean()
        null = shuffled @ yc / (np.linalg.norm(shuffled, axis=1) * np.linalg.norm(yc))
        p_value = float((1 + np.sum(np.abs(null) >= abs(r) - 1e-12)) / (1 + permutations))
    cells = {"r": r, "lo": lo, "hi": hi, "p_permutation": p_value}
    return {**{k: v if math.isfinite(v) else None for k, v in cells.items()}, "n": n, "controls": k}


def arm_pairs(per_seed: list[dict], pairs=ARM_PAIRS, metrics=PAIRED_METRICS) -> dict:
    """``{"<arm> - <other>": {metric: {"mean", "lo", "hi", "n"}}}``: the seed-by-seed differences between LM sizes
    (and personas) with their 95% t interval (`icml26.claims.paired_interval`; ``lo``/``hi`` None with one seed)."""
    from icml26.claims import paired_interval

    out = {}
    for arm, other in pairs:
        cells = {}
        for metric in metrics:
            diffs = [row[arm][metric] - row[other][metric] for row in per_seed
                     if metric in row.get(arm, {}) and metric in row.get(other, {})]
            if diffs:
                mean, lo, hi, n = paired_interval(diffs)
                cells[metric] = {"mean": mean, "lo": lo if n > 1 else None, "hi": hi if n > 1 else None, "n": n}
        if cells:
            out[f"{arm} - {other}"] = cells
    return out


# ------------------------------------------------------------------------------------------- learning rates
def select_lrs(grid: dict[float, dict], arms=TRAINED, metric: str = "heldout_loss") -> dict:
    """Per LM size, the learning rate of the grid with the lowest mean validation ``metric`` over the tuning seeds.

    ``grid`` maps each learning rate to the result JSON of the experiment run at that rate (``--set``); only
    ``per_seed[*][arm][metric]`` is read, never a probe (test) metric. A non-finite loss (a diverged run, shown as
    None) loses; ties go to the smaller rate."""
    lrs = sorted(grid)
    out = {}
    for arm in arms:
        losses = []
        for lr in lrs:
            values = [row[arm][metric] for row in grid[lr]["per_seed"] if metric in row.get(arm, {})]
            losses.append(float(np.mean(values)) if values else float("nan"))
        keys = [loss if math.isfinite(loss) else math.inf for loss in losses]
        best = min(range(len(lrs)), key=lambda i: (keys[i], lrs[i]))
        seeds = {len(grid[lr]["per_seed"]) for lr in lrs}
        out[arm] = {"grid": lrs, metric: [loss if math.isfinite(loss) else None for loss in losses],
                    "chosen_lr": lrs[best], "tuning_seeds": min(seeds),
                    "at_grid_edge": best in (0, len(lrs) - 1)}
    return out


def grid_files(settings: dict) -> dict[float, str]:
    """The result file of each learning rate of ``settings.lr_grid`` (relative to the results folder)."""
    grid = settings["lr_grid"]
    return {float(lr): grid["results"].format(lr=float(lr)) for lr in grid["values"]}


def lr_tuning(settings: dict, records: list[dict], results_dir=None) -> dict:
    """The grid's validation losses and chosen rate per size (`select_lrs` over the committed grid results) next
    to the rate every final run's optimizer used; ``{"missing": [...]}`` until the grid has been run."""
    if "lr_grid" not in settings:
        return {}
    folder = kit.RESULTS if results_dir is None else results_dir
    files = grid_files(settings)
    missing = [name for name in files.values() if not (folder / name).is_file()]
    used: dict[str, list[float]] = {}
    for record in records:
        for arm, extra in record.get("", {}).items():
            if "lr" in extra:
                used.setdefault(arm, []).append(extra["lr"])
    if missing:
        return {"missing": missing, "used_lr": used}
    grid = {lr: json.loads((folder / name).read_text()) for lr, name in files.items()}
    selection = select_lrs(grid, metric=settings["lr_grid"].get("select", "heldout_loss"))
    for arm, cell in selection.items():
        cell["used_lr"] = used.get(arm, [])
        cell["final_runs_use_chosen_lr"] = bool(cell["used_lr"]) and all(
            math.isclose(lr, cell["chosen_lr"]) for lr in cell["used_lr"])
    return {"key": settings["lr_grid"]["key"], "select": settings["lr_grid"].get("select", "heldout_loss"),
            "files": list(files.values()), "sizes": selection}


def report(result: dict, records: list[dict]) -> dict:
    """Tree complexity against fine accuracy over every trained run, raw and given the held-out corpus loss (the
    confound: a model that learned the corpus better has both a larger tree and a better accuracy); the size and
    persona comparisons as paired intervals (``paired_arms``, the schema of ``paired``, whose baseline is
    lm-untrained); the learning-rate selection."""
    runs = [(seed, arm, row[arm]) for seed, row in enumerate(result["per_seed"]) for arm in TRAINED if arm in row]
    length = [r["total_path_length"] for _, _, r in runs]
    accuracy = [r["acc_fine"] for _, _, r in runs]
    loss = [r.get("heldout_loss", float("nan")) for _, _, r in runs]
    correlation = {"runs": [{"seed": seed, "arm": arm, "total_path_length": r["total_path_length"],
                             "acc_fine": r["acc_fine"], "heldout_loss": r.get("heldout_loss")}
                            for seed, arm, r in runs],
                   "points": len(runs),
                   "total_path_length_vs_acc_fine": correlation_summary(length, accuracy)}
    correlation["total_path_length_vs_acc_fine_pearson_r"] = correlation["total_path_length_vs_acc_fine"]["r"]
    if all(math.isfinite(v) for v in loss):
        correlation["heldout_loss_vs_acc_fine"] = correlation_summary(loss, accuracy)
        correlation["heldout_loss_vs_total_path_length"] = correlation_summary(loss, length)
        correlation["total_path_length_vs_acc_fine_given_heldout_loss"] = correlation_summary(length, accuracy, loss)
    out = {"correlation": correlation, "paired_arms": arm_pairs(result["per_seed"])}
    from experiments.runner import load_spec

    tuning = lr_tuning(load_spec(NAME).settings, records)  # the hooks see no spec: read the protocol's settings
    if tuning:
        out["lr_tuning"] = tuning
    return out


def _shown(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def plot(result: dict, path) -> None:
    """Tree size and depth/purity/accuracy per arm, the learning-rate grid, and fine accuracy against tree
    complexity and against held-out loss per run, with the partial-correlation residuals."""
    arms, correlation = result["arms"], result.get("correlation", {})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["lm-untrained", *TRAINED]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.4))
    x = np.arange(len(names))
    for ax, metrics, title in ((axes[0, 0], ("total_path_length", "edges"), "tree size"),
                               (axes[0, 1], ("avg_depth", "group_purity", "edge_recall", "acc_fine", "acc_basic"),
                                "depth, purity, accuracy")):
        for m in metrics:
            mean = [arms[n][m]["mean"] for n in names]
            std = [arms[n][m]["std"] for n in names]
            ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=m)
        ax.set_xticks(x, names, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=7)
    sizes = result.get("lr_tuning", {}).get("sizes", {})
    for arm, cell in sizes.items():
        axes[0, 2].plot(cell["grid"], cell["heldout_loss"], marker="o", label=f"{arm} (chose {cell['chosen_lr']:g})")
    axes[0, 2].set_xscale("log")
    axes[0, 2].set_xlabel("learning rate")
    axes[0, 2].set_ylabel("held-out corpus loss")
    axes[0, 2].set_title("learning-rate grid (tuning seed, validation)" if sizes else "no learning-rate grid")
    if sizes:
        axes[0, 2].legend(fontsize=7)
    runs = correlation.get("runs", [])
    colors = dict(zip(TRAINED, ("tab:blue", "tab:orange", "tab:green")))
    have_loss = "total_path_length_vs_acc_fine_given_heldout_loss" in correlation
    panels = [(axes[1, 0], "total_path_length", "total_path_length_vs_acc_fine")]
    if have_loss:
        panels.append((axes[1, 1], "heldout_loss", "heldout_loss_vs_acc_fine"))
    for ax, xkey, key in panels:
        for arm in TRAINED:
            pts = [(r[xkey], r["acc_fine"]) for r in runs if r["arm"] == arm]
            if pts:
                ax.scatter(*zip(*pts), color=colors[arm], label=arm)
        ax.set_xlabel(xkey.replace("_", " "))
        ax.set_ylabel("fine accuracy")
        ax.set_title(f"r = {_shown(correlation[key]['r'])} over {len(runs)} runs")
        ax.legend(fontsize=7)
    if have_loss:
        partial = correlation["total_path_length_vs_acc_fine_given_heldout_loss"]
        loss = [r["heldout_loss"] for r in runs]
        rx = residuals([r["total_path_length"] for r in runs], loss)
        ry = residuals([r["acc_fine"] for r in runs], loss)
        for arm in TRAINED:
            keep = [i for i, r in enumerate(runs) if r["arm"] == arm]
            axes[1, 2].scatter(rx[keep], ry[keep], color=colors[arm], label=arm)
        axes[1, 2].set_title(f"given held-out loss: partial r = {_shown(partial['r'])} [{_shown(partial['lo'])}, "
                             f"{_shown(partial['hi'])}], p = {_shown(partial['p_permutation'], 3)}", fontsize=9)
        axes[1, 2].set_xlabel("total path length | loss (residual)")
        axes[1, 2].set_ylabel("fine accuracy | loss (residual)")
        axes[1, 2].legend(fontsize=7)
    else:
        axes[1, 1].set_axis_off()
        axes[1, 2].set_axis_off()
    fig.suptitle("Emotion trees of planted-corpus LMs (persona bias: lm-large/persona-biased planted_confusion "
                 f"{arms['lm-large/persona-biased']['planted_confusion']['mean']:.3f} vs neutral "
                 f"{arms['lm-large/persona-neutral']['planted_confusion']['mean']:.3f})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.emotion_hierarchy [flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["emotion_hierarchy", *sys.argv[1:]]))
