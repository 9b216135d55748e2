"""EC-CEM vs CEM vs evi-CEM on correlated concepts (EC-CEM is a RECONSTRUCTION): ``python -m experiments ec_cem``.

Paper: "Evidential Copula Concept Embedding Models" (ICML 2026; only the abstract is public, so the copula part of
``lightning_modules/ec_cem/concept_models.py`` is reconstructed). Its argument: concepts are not independent, and a model
of their dependencies lets an intervention on one concept correct the ones it is correlated with.

The protocol is ``configs/ec_cem/experiment.yaml``, run by `experiments.runner`: per seed (data, initialisation and
training order change with the seed) the arms ``CEM``, ``evi-CEM``, ``EC-CEM``, each its quick config
(``configs/ec_cem/{cem_quick,evi_cem_quick,quick}.yaml``), trained the same way and tested from the checkpoint with
the best validation task accuracy, on

1. **correlated concepts** (``ConceptDataModule`` ``dataset: correlated``: 3 pairs of concepts with latent
   correlation rho, x = tanh(W z) + noise eps, y = c_0 xor c_2) at noise 1.0 (``arms``) and 2.0 (``other_noise``:
   the noisier x, the more concept dependence is left given x);
2. **XOR / Trig / Dot** (the CEM repository's generators; ``synthetic``, the pipeline check).

This module holds what is not configuration. `evaluate`: the test metrics ``task_acc``, ``concept_acc``,
``concept_auroc``, ``concept_ece`` (15 bins), and ``partner_concept_acc``: accuracy of the non-intervened member of
each planted pair after intervening on the other member with its true value (both directions, averaged;
``partner_concept_acc_before``: the same concepts without intervention); for EC-CEM ``rho_pairs`` (mean learned
correlation of the planted pairs) and ``rho_others`` (mean |correlation| of the other pairs); the intervention
curves (random and uncertainty-first order) come from the configs' `callbacks.concept_interventions` callback
during ``trainer.test``. `report` averages the curves over seeds, `plot` draws them (``results/ec_cem.png``).
"""
from __future__ import annotations

import numpy as np
import torch
import torchmetrics

from callbacks.concept_interventions import ConceptInterventions


def evaluate(run) -> dict[str, float]:
    """``trainer.test`` from the best checkpoint (the callbacks' intervention curves), then the metrics above on
    the whole test split in one pass; partner metrics only on the correlated-concept data."""
    run.test()
    model, data = run.model.eval(), run.datamodule
    pairs = data.hparams.pairs if data.hparams.dataset == "correlated" else None
    if run.variant is None:
        callback = next(c for c in run.trainer.callbacks if isinstance(c, ConceptInterventions))
        run.extra["curves"] = callback.curves
    return evaluate_outputs(model, test_outputs(model, data), pairs)


@torch.no_grad()
def test_outputs(model, data) -> dict[str, torch.Tensor]:
    """Concept outputs of the whole test split (one pass), with its x, y and c."""
    x, y, c = (torch.cat(parts) for parts in zip(*data.test_dataloader()))
    return {"x": x, "y": y, "c": c, "out": model.concept_outputs(x)}


@torch.no_grad()
def evaluate_outputs(model, test: dict, pairs: int | None) -> dict[str, float]:
    out, y, c = test["out"], test["y"], test["c"]
    probs = out["probs"]
    metrics = {"task_acc": float((model.task_logits(out, probs).argmax(-1) == y).float().mean()),
               "concept_acc": float(((probs > 0.5).float() == c).float().mean()),
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
    """The intervention curves of the correlated-concept arms, averaged over seeds."""
    return {"curves": mean_curves([{arm: r["curves"] for arm, r in seed[""].items()} for seed in records])}


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
