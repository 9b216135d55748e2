"""EC-CEM vs CEM vs evi-CEM on correlated concepts (EC-CEM is a RECONSTRUCTION): ``python -m experiments ec_cem``.

Paper: "Evidential Copula Concept Embedding Models" (ICML 2026; only the abstract is public, so the copula part of
``lightning_modules/ec_cem/concept_models.py`` is reconstructed). Its argument: concepts are not independent, and a
model of their dependencies lets an intervention on one concept correct the ones it is correlated with.

The protocol is ``configs/ec_cem/experiment.yaml``, run by `experiments.runner`: per seed (data, initialisation and
training order change with the seed) the arms ``CEM``, ``evi-CEM``, ``EC-CEM``, each its quick config
(``configs/ec_cem/{cem_quick,evi_cem_quick,quick}.yaml``; the evidential ones with softplus evidence), plus
``evi-CEM (ReLU)`` and ``EC-CEM (ReLU)`` with the evi-CEM code's ReLU evidence, all trained the same way and tested
from the checkpoint with the best validation task accuracy, on

1. **correlated concepts** (``ConceptDataModule`` ``dataset: correlated``: 3 pairs of concepts with latent
   correlation rho, x = tanh(W z) + noise eps, y = c_0 xor c_2) at noise 1.0 (``arms``) and 2.0 (``other_noise``:
   the noisier x, the more concept dependence is left given x);
2. **XOR / Trig / Dot** (the CEM repository's generators; ``synthetic``, the pipeline check).

This module holds what is not configuration. `evaluate`: the test metrics ``task_acc``, ``concept_acc``,
``worst_concept_acc`` (the lowest per-concept accuracy), ``collapsed_concepts`` (how many concepts collapsed, see
below), ``concept_auroc``, ``concept_ece`` (15 bins), and ``partner_concept_acc``: accuracy of the non-intervened
member of each planted pair after intervening on the other member with its true value (both directions, averaged;
``partner_concept_acc_before``: the same concepts without intervention); for EC-CEM ``rho_pairs`` (mean learned
correlation of the planted pairs) and ``rho_others`` (mean |correlation| of the other pairs); the intervention
curves (random and uncertainty-first order) come from the configs' `callbacks.concept_interventions` callback
during ``trainer.test``. `report` averages the curves over seeds, lists every run's concept accuracy (overall and
per concept, every arm, every setting), flags the collapsed runs and adds the paired differences of the XOR /
Trig / Dot and noise-2.0 settings; `plot` draws the curves (``results/ec_cem.png``).

**Collapse rule.** A concept has *collapsed* in a run when its test accuracy is at most its majority-class rate on
the test split (what a constant prediction scores) plus ``collapse_margin`` (experiment.yaml ``settings``; 0.05 by
default): the model learned nothing about it, or inverted it. Unlike a fixed accuracy bar, this flags the
noisy correlated-concept data only when a concept is really lost.
"""
from __future__ import annotations

import numpy as np
import torch
import torchmetrics

from callbacks.concept_interventions import ConceptInterventions
from experiments.runner import paired

COLLAPSE_MARGIN = 0.05   # default of settings.collapse_margin (see the collapse rule above)
MAIN = "main"            # the label of the experiment's own setting (correlated concepts, noise 1.0) in the report


def evaluate(run) -> dict[str, float]:
    """``trainer.test`` from the best checkpoint (the callbacks' intervention curves), then the metrics above on
    the whole test split in one pass; partner metrics only on the correlated-concept data. The per-concept
    accuracies and majority rates go to ``run.extra`` for `report`."""
    run.test()
    model, data = run.model.eval(), run.datamodule
    pairs = data.hparams.pairs if data.hparams.dataset == "correlated" else None
    if run.variant is None:
        callback = next(c for c in run.trainer.callbacks if isinstance(c, ConceptInterventions))
        run.extra["curves"] = callback.curves
    test = test_outputs(model, data)
    margin = float(run.settings.get("collapse_margin", COLLAPSE_MARGIN))
    metrics = evaluate_outputs(model, test, pairs, margin)
    accuracy, majority = per_concept_accuracy(test["out"]["probs"], test["c"])
    run.extra.update(per_concept_acc=accuracy.tolist(), majority_rate=majority.tolist(), collapse_margin=margin)
    return metrics


def per_concept_accuracy(probs: torch.Tensor, concepts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Test accuracy of each concept at threshold 0.5 and its majority-class rate (a constant predictor's)."""
    accuracy = ((probs > 0.5).float() == concepts).float().mean(0)
    positive = concepts.float().mean(0)
    return accuracy, torch.maximum(positive, 1 - positive)


def collapsed(accuracy: torch.Tensor, majority: torch.Tensor, margin: float) -> torch.Tensor:
    """Mask of the collapsed concepts: accuracy <= majority rate + ``margin``."""
    return accuracy <= majority + margin


@torch.no_grad()
def test_outputs(model, data) -> dict[str, torch.Tensor]:
    """Concept outputs of the whole test split (one pass), with its x, y and c."""
    x, y, c = (torch.cat(parts) for parts in zip(*data.test_dataloader()))
    return {"x": x, "y": y, "c": c, "out": model.concept_outputs(x)}


@torch.no_grad()
def evaluate_outputs(model, test: dict, pairs: int | None, margin: float = COLLAPSE_MARGIN) -> dict[str, float]:
    out, y, c = test["out"], test["y"], test["c"]
    probs = out["probs"]
    accuracy, majority = per_concept_accuracy(probs, c)
    metrics = {"task_acc": float((model.task_logits(out, probs).argmax(-1) == y).float().mean()),
               "concept_acc": float(((probs > 0.5).float() == c).float().mean()),
               "worst_concept_acc": float(accuracy.min()),
               "collapsed_concepts": float(collapsed(accuracy, majority, margin).sum()),
               "concept_auroc": float(torchmetrics.functional.classification.binary_auroc(probs.flatten(),
                                                                                          c.flatten().long())),
               "concept_ece": float(torchmetrics.functional.classification.binary_calibration_error(
                   probs.flatten(), c.flatten().long(), n_bins=15))}
    if pairs is None:
        return metrics
    first, second = torch.arange(pairs) * 2, torch.arange(pairs) * 2 + 1
    after, before = [], []
    for known, partner in ((first, second), (second, first)):
        mask = torch.zeros_like(c)
        mask[:, known] = 1.0
        updated = model.intervene(out, mask, c)
        after.append(((updated[:, partner] > 0.5).float() == c[:, partner]).float().mean())
        before.append(((probs[:, partner] > 0.5).float() == c[:, partner]).float().mean())
    metrics["partner_concept_acc"] = float(torch.stack(after).mean())
    metrics["partner_concept_acc_before"] = float(torch.stack(before).mean())
    if hasattr(model, "correlation"):
        corr = model.correlation()
        planted = torch.zeros_like(corr, dtype=torch.bool)
        planted[first, second] = True
        upper = torch.triu(torch.ones_like(planted), diagonal=1)
        metrics["rho_pairs"] = float(corr[planted].mean())
        metrics["rho_others"] = float(corr[upper & ~planted].abs().mean())
    return metrics


def report(result: dict, records: list[dict]) -> dict:
    """The intervention curves of the correlated-concept arms averaged over seeds; every run's concept accuracy
    (``concept_acc_per_seed``, ``per_concept_acc_per_seed``: {setting: {arm: [one entry per seed]}}, setting
    ``main`` or a variant's name); the runs with a collapsed concept (``collapsed_runs``, also printed); and
    ``paired_variants``: {variant: {"<arm> - <baseline>": {metric: {mean, lo, hi, n}}}} for every variant."""
    extra = {"curves": mean_curves([{arm: r["curves"] for arm, r in seed[""].items()} for seed in records])}
    margins = {r["collapse_margin"] for seed in records for runs in seed.values() for r in runs.values()}
    margin = margins.pop() if len(margins) == 1 else COLLAPSE_MARGIN
    extra["collapse_rule"] = (f"a concept has collapsed when its test accuracy <= its majority-class rate + {margin} "
                              "(a constant predictor's accuracy plus the margin)")
    per_seed_acc: dict = {}
    per_concept: dict = {}
    flagged = []
    for seed, settings in enumerate(records):
        for key, runs in settings.items():
            setting = key or MAIN
            for arm, record in runs.items():
                accuracy = torch.tensor(record["per_concept_acc"])
                majority = torch.tensor(record["majority_rate"])
                lost = collapsed(accuracy, majority, margin)
                per_seed_acc.setdefault(setting, {}).setdefault(arm, []).append(float(accuracy.mean()))
                per_concept.setdefault(setting, {}).setdefault(arm, []).append(
                    [round(float(a), 4) for a in accuracy])
                if bool(lost.any()):
                    flagged.append({"setting": setting, "arm": arm, "seed": seed,
                                    "concept_acc": float(accuracy.mean()),
                                    "collapsed": [{"concept": int(i), "acc": float(accuracy[i]),
                                                   "majority_rate": float(majority[i])}
                                                  for i in torch.nonzero(lost).flatten()]})
    extra.update(concept_acc_per_seed=per_seed_acc, per_concept_acc_per_seed=per_concept, collapsed_runs=flagged)
    baselines = {name.split(" - ", 1)[1] for name in result.get("paired", {})}
    if len(baselines) == 1:
        baseline = baselines.pop()
        extra["paired_variants"] = {}
        for key, rows in result.items():
            if not key.startswith("per_seed_"):
                continue
            for variant in dict.fromkeys(v for row in rows for v in row):
                seeds = [row[variant] for row in rows if variant in row]
                metrics = list(dict.fromkeys(m for row in seeds for cells in row.values() for m in cells
                                             if m != "collapsed_concepts"))
                extra["paired_variants"][variant] = paired(seeds, baseline, metrics)
    print(concept_accuracy_table(per_seed_acc, per_concept, flagged, extra["collapse_rule"]))
    return extra


def concept_accuracy_table(per_seed_acc: dict, per_concept: dict, flagged: list[dict], rule: str) -> str:
    """Markdown: one row per setting and arm, one column per seed, ``concept_acc (worst concept)``; a run with a
    collapsed concept is marked ``COLLAPSED`` and listed below the table."""
    seeds = max(len(v) for arms in per_seed_acc.values() for v in arms.values())
    marked = {(f["setting"], f["arm"], f["seed"]) for f in flagged}
    lines = ["per-seed test concept accuracy (worst concept)",
             "| setting | arm | " + " | ".join(f"seed {s}" for s in range(seeds)) + " |",
             "|---|---|" + "---|" * seeds]
    for setting, arms in per_seed_acc.items():
        for arm, values in arms.items():
            cells = [f"{v:.3f} ({min(per_concept[setting][arm][s]):.3f})"
                     + (" COLLAPSED" if (setting, arm, s) in marked else "") for s, v in enumerate(values)]
            lines.append(f"| {setting} | {arm} | " + " | ".join(cells) + " |")
    lines.append(f"collapse rule: {rule}")
    lines += [f"COLLAPSED: {f['setting']} / {f['arm']} / seed {f['seed']}: "
              + ", ".join(f"concept {c['concept']} at {c['acc']:.3f} (majority rate {c['majority_rate']:.3f})"
                          for c in f["collapsed"]) for f in flagged] or ["no collapsed run"]
    return "\n".join(lines)


def mean_curves(per_seed_curves: list[dict]) -> dict:
    """{arm: {policy: [(n, mean accuracy over seeds)]}}."""
    out = {}
    for arm in per_seed_curves[0]:
        for policy, curve in per_seed_curves[0][arm].items():
            values = np.mean([[a for _, a in seed[arm][policy]] for seed in per_seed_curves], axis=0)
            out.setdefault(arm, {})[policy] = [(n, float(v)) for (n, _), v in zip(curve, values)]
    return out


def plot(result: dict, path) -> None:
    """Test task accuracy against the number of intervened concepts, per policy and arm (seed means)."""
    curves = result["curves"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, policy in zip(axes, ("random", "uncertainty")):
        for arm, policies in curves.items():
            ax.plot([n for n, _ in policies[policy]], [a for _, a in policies[policy]], marker="o", ms=3, label=arm)
        ax.set_title(f"{policy} interventions (correlated concepts)")
        ax.set_xlabel("intervened concepts")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test task accuracy")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # the older spelling: python -m experiments.ec_cem [flags]
    import sys

    from experiments.runner import experiment_command

    sys.exit(experiment_command(["ec_cem", *sys.argv[1:]]))
