"""InfoGeo vs a MixVPR + InfoNCE baseline under a cross-view domain shift: ``python -m experiments infogeo``.

Paper: "InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization"
(arXiv 2605.07099). Its claim: object-centric concepts selected across views (CACS) and aligned structurally (CSRR),
fused back into the features (FiLM), generalise better to unseen domains than a plain global descriptor.

The protocol is ``configs/infogeo/experiment.yaml``, run by `experiments.runner`: per seed (the generator,
initialisation, batch order and flips change with the seed), on the embedded procedural scenes of
``datamodules/geo_localization.py`` (48 px; 300 training locations x 4 drone views; 100 unseen test locations x 2
drone queries), the arms ``baseline`` (``object_centric: false``: encoder + MixVPR + InfoNCE), ``infogeo``,
``infogeo w/o CACS`` (``use_cacs: false``) and ``infogeo w/o CSRR`` (``use_csrr: false``), each
``configs/infogeo/quick.yaml`` with the experiment's sizes and the arm's switch, trained for the same 500 AdamW steps
on the same batches with no validation.

This module holds what is not configuration. `evaluate` tests the **final** weights (no selection, so no arm sees
validation or test data) on drone -> satellite retrieval at two test levels, which one ``trainer.test`` of the
datamodule cannot give (it scores only its ``test_level``): ``clean`` (the training distribution on unseen
locations) and ``shifted`` (heavy clutter and an unseen dusk + rain weather): ``r1_*``, ``ap_*``, ``r5_*`` (percent)
and ``r1_drop`` = r1_clean - r1_shifted. `plot` draws R@1 and AP per arm and level (``results/infogeo.png``).
"""
from __future__ import annotations

LEVELS = ("clean", "shifted")   # default of settings.levels
KEPT = ("r1", "ap", "r5")       # of the model's test metrics (r10 and r_top1pct are not reported)


def evaluate(run) -> dict[str, float]:
    """``trainer.test`` of the final weights (``ckpt_path=None``: the configs' checkpoints never select) on the
    test set of each level; ``r1_drop`` = r1_clean - r1_shifted."""
    data = run.datamodule
    metrics: dict[str, float] = {}
    for level in run.settings.get("levels", LEVELS):
        outputs = run.trainer.test(run.model, dataloaders=data.eval_loader(data.retrieval_set(level)),
                                   ckpt_path=None, verbose=False)
        values = {k: float(v) for output in outputs for k, v in output.items()}
        metrics.update({f"{name}_{level}": values[f"test/{name}"] for name in KEPT})
    if "r1_clean" in metrics and "r1_shifted" in metrics:
        metrics["r1_drop"] = metrics["r1_clean"] - metrics["r1_shifted"]
    return metrics


def plot(result: dict, path) -> None:
    """R@1 and AP on the clean and shifted test levels per arm (mean ± std over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = result["arms"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = list(arms)
    x = np.arange(len(names))
    for ax, metric in zip(axes, ("r1", "ap")):
        for offset, level in ((-0.18, "clean"), (0.18, "shifted")):
            cells = [arms[n][f"{metric}_{level}"] for n in names]
            ax.bar(x + offset, [c["mean"] for c in cells], 0.36, yerr=[c["std"] for c in cells], capsize=3,
                   label=level)
        ax.set_xticks(x, names, rotation=12)
        ax.set_ylabel(f"{'Recall@1' if metric == 'r1' else 'AP'} (%)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="test level")
    fig.suptitle(f"drone -> satellite retrieval on unseen procedural locations (mean ± std over {result['seeds']} "
                 "seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.infogeo [flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["infogeo", *sys.argv[1:]]))
