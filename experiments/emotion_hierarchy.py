"""Emotion hierarchies emerge with model size (arXiv 2507.10599, Figs. 2-3 and Sec. 5) at CPU scale:
``python -m experiments emotion_hierarchy``.

The protocol is ``configs/emotion_hierarchy/experiment.yaml``, run by `experiments.runner`: three TinyGPT language
models (configs/emotion_hierarchy/{quick,lm_medium_quick,lm_large_quick}.yaml: 1x16, 2x32 and 4x128 layers x width)
trained by `SupervisedWarmup` for the same number of steps on the planted-hierarchy corpus (6 Shaver basic emotions
as parents, 4 Shaver children each, surprise 2; label noise leaf .55 / parent .30 / sibling .10 / random .05; two
personas, the "biased" one relabelling 30% of fear-family labels as anger-family), and the large config untrained
(``lm-untrained``, the "no tree" reference: the paper's GPT-2 end of the scale).

This module holds what is not configuration. `evaluate` probes each language model with `EmotionProbe`
(configs/emotion_hierarchy/probe.yaml: the official tree construction, t = 0.3) through ``trainer.test`` on
held-out contexts with the neutral persona; the large model also with the biased persona, giving the arms
``lm-large/persona-neutral`` (the same numbers as ``lm-large``) and ``lm-large/persona-biased``. Metrics:
``total_path_length``, ``avg_depth``, ``edges``, ``group_purity``, ``edge_precision``, ``edge_recall``,
``acc_fine``, ``acc_basic``, ``planted_confusion`` (rate of fear contexts recognised as anger) and
``planted_confusion_mass`` (their mean renormalised probability on anger words). The paper's claims: tree depth
and path length grow with model size; recognition accuracy grows with tree complexity (`report`: the JSON's
``correlation`` holds Pearson's r between total path length and fine accuracy over every trained run); the
persona bias shows up as confusion. `plot` draws the figure.
"""
from __future__ import annotations

import tempfile

import numpy as np

from experiments import kit

SIZES = ("small", "medium", "large")
METRICS = ("total_path_length", "avg_depth", "edges", "group_purity", "edge_precision", "edge_recall", "acc_fine",
           "acc_basic", "planted_confusion", "planted_confusion_mass")


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
    """The neutral-persona probe; for ``settings.persona_arm`` also the biased one (derived arms)."""
    settings, arm = run.settings, run.arm.name
    keep_tree = arm == settings["tree_arm"] and run.seed == 0 and run.variant is None
    metrics = probe(run, "neutral", str(run.out / f"{run.spec.name}_tree") if keep_tree else None)
    if arm == settings["persona_arm"]:
        run.derived[f"{arm}/persona-neutral"] = dict(metrics)
        run.derived[f"{arm}/persona-biased"] = probe(run, "biased")
    return metrics


def report(result: dict, records: list[dict]) -> dict:
    """Pearson's r between total path length and fine accuracy over every trained run."""
    runs = [row[f"lm-{s}"] for row in result["per_seed"] for s in SIZES]
    lengths = [r["total_path_length"] for r in runs]
    accuracy = [r["acc_fine"] for r in runs]
    r_value = float(np.corrcoef(lengths, accuracy)[0, 1]) if np.std(lengths) > 0 and np.std(accuracy) > 0 else 0.0
    return {"correlation": {"total_path_length_vs_acc_fine_pearson_r": r_value, "points": len(lengths)}}


def plot(result: dict, path) -> None:
    """Tree size, depth/purity/accuracy per arm, and accuracy against tree complexity per seed."""
    arms, per_seed = result["arms"], result["per_seed"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["lm-untrained"] + [f"lm-{s}" for s in SIZES]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    x = np.arange(len(names))
    for ax, metrics, title in ((axes[0], ("total_path_length", "edges"), "tree size"),
                               (axes[1], ("avg_depth", "group_purity", "edge_recall", "acc_fine", "acc_basic"),
                                "depth, purity, accuracy")):
        for m in metrics:
            mean = [arms[n][m]["mean"] for n in names]
            std = [arms[n][m]["std"] for n in names]
            ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, label=m)
        ax.set_xticks(x, names, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=7)
    for seed, seed_row in enumerate(per_seed):
        pts = [(seed_row[f"lm-{s}"]["total_path_length"], seed_row[f"lm-{s}"]["acc_fine"]) for s in SIZES]
        axes[2].scatter(*zip(*pts), label=f"seed {seed}")
    axes[2].set_xlabel("total path length")
    axes[2].set_ylabel("fine accuracy")
    axes[2].set_title("accuracy vs tree complexity")
    axes[2].legend(fontsize=7)
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
