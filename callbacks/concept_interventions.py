"""Test-time concept interventions for CEM, evi-CEM and EC-CEM: task accuracy against the number of intervened
concepts (or concept groups), measured at the end of ``trainer.test`` on the test loader.

For every test batch the module's concept outputs are computed once; then, per policy and per number n of
intervened units, the first n units of the policy's per-example order are set to their true values with the
module's ``intervene`` (CEM / evi-CEM: only those concepts change; EC-CEM: the others follow the conditional
copula) and the task is predicted from the new bottleneck (``task_logits``). Policies:

* ``random``: a random order of units per example (seeded by ``seed``, the same for every module);
* ``uncertainty``: the most uncertain units first (``concept_uncertainty``: 2 / (alpha + beta) for the evidential
  models, 1 - |2p - 1| for CEM; a group's uncertainty is the mean of its concepts').

``level: group`` intervenes on whole groups: ``groups`` (lists of concept indices) or, when null, the datamodule's
``concept_groups`` (CUB's 28 attribute groups; singletons for the synthetic data). The curve is logged as
``intervention/<policy>_acc@<n>``, kept in ``curves`` ({policy: [(n, accuracy), ...]}) and plotted into
``<log_dir>/concept_interventions.png`` (also sent to W&B when that is the logger).
"""
from __future__ import annotations

import os
from typing import Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger

from lightning_modules.shared.data_contract import ConceptData
from lightning_modules.shared.errors import UserInputError, check_range

POLICIES = ("random", "uncertainty")
REQUIRED = ("concept_outputs", "intervene", "task_logits", "concept_uncertainty")


def check_groups(groups: list[list[int]], num_concepts: int) -> None:
    """One error for an empty group or a concept index outside [0, num_concepts)."""
    for g, group in enumerate(groups):
        if not group:
            raise UserInputError(f"ConceptInterventions: group {g} is empty; every group needs a concept index.")
        bad = [i for i in group if not isinstance(i, int) or not 0 <= i < num_concepts]
        if bad:
            raise UserInputError(f"ConceptInterventions: group {g} names concept index {bad[0]}, outside "
                                 f"[0, {num_concepts - 1}] (the model has {num_concepts} concepts). Fix the groups.")


def unit_order(policy: str, uncertainty: torch.Tensor, membership: torch.Tensor,
               generator: torch.Generator) -> torch.Tensor:
    """Per-example order of units [B, U]: random, or by decreasing mean uncertainty of the unit's concepts."""
    batch, units = len(uncertainty), membership.shape[0]
    if policy == "random":
        return torch.rand(batch, units, generator=generator).argsort(1).to(uncertainty.device)
    score = uncertainty @ membership.T.to(uncertainty) / membership.sum(1).to(uncertainty)
    return torch.argsort(score, dim=1, descending=True, stable=True)


class ConceptInterventions(Callback):
    """Args:
        policies: any of ``random``, ``uncertainty``.
        level: ``concept`` (each concept is a unit) or ``group``.
        groups: concept groups for ``level: group`` (null: the datamodule's ``concept_groups``).
        num_points: at most this many values of n, evenly spread over 0..number of units (both ends included).
        seed: seed of the random orders.
        plot: save the PNG.
    """

    def __init__(self, policies: list[str] | None = None, level: Literal["concept", "group"] = "concept",
                 groups: list[list[int]] | None = None, num_points: int = 11, seed: int = 0, plot: bool = True) -> None:
        self.policies = list(policies or ["random", "uncertainty"])
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise UserInputError(f"ConceptInterventions: unknown policy {unknown[0]!r}; choose from {POLICIES}.")
        if level not in ("concept", "group"):
            raise UserInputError(f"ConceptInterventions: level={level!r}; choose concept or group.")
        check_range("ConceptInterventions.num_points", num_points, 2)
        self.level, self.groups, self.num_points, self.seed, self.plot = level, groups, num_points, seed, plot
        self.curves: dict[str, list[tuple[int, float]]] = {}
        self.plot_path: str | None = None

    def _membership(self, trainer: Trainer, num_concepts: int) -> torch.Tensor:
        if self.level == "concept":
            groups = [[i] for i in range(num_concepts)]
        else:
            groups = self.groups
            if groups is None:
                data = trainer.datamodule
                groups = getattr(data, "concept_groups", None) if isinstance(data, ConceptData) else None
            if groups is None:
                raise UserInputError("ConceptInterventions(level='group') needs groups: give init_args.groups or "
                                     "use a datamodule with concept_groups (ConceptDataModule).")
        check_groups(groups, num_concepts)
        membership = torch.zeros(len(groups), num_concepts)
        for g, group in enumerate(groups):
            membership[g, group] = 1.0
        return membership

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        missing = [name for name in REQUIRED if not hasattr(pl_module, name)]
        if missing:
            raise UserInputError(f"ConceptInterventions needs a concept model (CEM, EviCEM, ECCEM); "
                                 f"{type(pl_module).__name__} lacks {', '.join(missing)}. Remove the callback.")
        self._membership(trainer, pl_module.hparams.num_concepts)   # validate before the test loop runs

    @torch.no_grad()
    def evaluate(self, pl_module: LightningModule, loader, membership: torch.Tensor, reduce=None) -> dict:
        """{policy: [(n, accuracy)]} over ``loader`` (batches (x, y, c)); ``reduce`` sums counts over processes."""
        units = membership.shape[0]
        counts = sorted({round(units * i / (self.num_points - 1)) for i in range(self.num_points)})
        correct = {p: torch.zeros(len(counts)) for p in self.policies}
        total = 0
        generator = torch.Generator().manual_seed(self.seed)
        was_training = pl_module.training
        pl_module.eval()
        for x, y, c in loader:
            x, y, c = (t.to(pl_module.device) for t in (x, y, c))
            out = pl_module.concept_outputs(x)
            uncertainty = pl_module.concept_uncertainty(out)
            for policy in self.policies:
                order = unit_order(policy, uncertainty, membership, generator)
                rank = order.argsort(1)                         # position of each unit in the example's order
                for j, n in enumerate(counts):
                    chosen = (rank < n).float()                 # [B, U]
                    mask = (chosen @ membership.to(chosen)).clamp(max=1.0)
                    probs = pl_module.intervene(out, mask, c.float())
                    correct[policy][j] += (pl_module.task_logits(out, probs).argmax(-1) == y).sum().item()
            total += len(y)
        pl_module.train(was_training)
        counts_t = torch.stack([correct[p] for p in self.policies] + [torch.full((len(counts),), float(total))])
        if reduce is not None:   # DDP: every process saw its own shard of the test set
            counts_t = reduce(counts_t.to(pl_module.device)).cpu()
        accuracy = counts_t[:-1] / counts_t[-1].clamp_min(1)
        return {p: [(n, float(accuracy[i, j])) for j, n in enumerate(counts)] for i, p in enumerate(self.policies)}

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        membership = self._membership(trainer, pl_module.hparams.num_concepts)
        loader = trainer.test_dataloaders
        loader = loader[0] if isinstance(loader, (list, tuple)) else loader
        self.curves = self.evaluate(pl_module, loader, membership,
                                    reduce=lambda t: trainer.strategy.reduce(t, reduce_op="sum"))
        for policy, curve in self.curves.items():
            for n, acc in curve:
                pl_module.log(f"intervention/{policy}_acc@{n}", acc)
        if self.plot and trainer.is_global_zero:
            folder = trainer.log_dir or trainer.default_root_dir
            self.plot_path = save_curves({type(pl_module).__name__: self.curves}, os.path.join(
                folder, "concept_interventions.png"), f"intervened {self.level}s")
            if isinstance(trainer.logger, WandbLogger):
                trainer.logger.log_image("intervention/curve", [self.plot_path])


def save_curves(curves: dict[str, dict[str, list[tuple[int, float]]]], path: str, xlabel: str) -> str:
    """One line per (model, policy): task accuracy against the number of intervened units."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for model, policies in curves.items():
        for policy, curve in policies.items():
            ax.plot([n for n, _ in curve], [a for _, a in curve], marker="o", ms=3, label=f"{model} ({policy})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("task accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
