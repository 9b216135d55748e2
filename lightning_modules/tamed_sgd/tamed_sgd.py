"""A stochastic first-order oracle on (L0, L1)-smooth test objectives, for tamed SGD.

Paper: "Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance under
(L0, L1)-Smoothness", Vassilis Apidopoulos, Iosif Lytras, Panayotis Mertikopoulos, ICML 2026 (PMLR v306).
No arXiv id and no official code were found; only the abstract was readable.

Method summary. For objectives whose gradients may grow super-linearly (``||Hess f|| <= L0 + L1 ||grad f||``),
plain SGD with Robbins-Monro steps can overflow; tamed SGD bounds each step (``callbacks/sgd_taming.py``) and
converges almost surely while avoiding strict saddles. The paper's contribution is the theory; this module is
the test bench: the "model" is the iterate ``x in R^d`` itself (one ``nn.Parameter``) and the "data" are noise
vectors ``xi`` drawn by ``datamodules/stochastic_oracle.py``, one oracle call per optimizer step.

Objectives (selected by name with ``objective:``; not from the paper, whose test problems are unknown):

* ``exp_saddle`` (default, d = 2): ``f(x, y) = e^x + e^-x + y^4/4 - y^2/2``. Strict saddle at (0, 0), minima
  (0, +-1) with ``f* = 1.75``, gradient growing like ``e^|x|``; (L0, L1)-smooth but not L-smooth.
* ``cosh`` (any d): ``f(x) = sum_i cosh(x_i)``, the canonical (L0=0, L1=1)-smooth function; minimum at 0.

Stochastic oracle (reconstructed, ABC-type multiplicative + additive noise): the sample objective is
``F(x; xi) = (1 + sigma_mult xi_0) f(x) + sigma_add <xi_{1:}, x>`` averaged over the minibatch, so autograd gives
``g = (1 + sigma_mult xi_0) grad f(x) + sigma_add xi_{1:}``, which is unbiased (``E xi = 0``). With
``sigma_mult = 0.5``, ``sigma_add = 0.1`` and Gaussian ``xi`` this is the benchmark protocol used here (a
reconstruction: the paper's own test problems and noise model are unknown).

Evaluation protocol (``configs/tamed_sgd/paper.yaml``, ``experiments/tamed_sgd.py``): start (8, 1e-3),
``gamma_n = 0.5 / (n + 10)^0.7``, 5000 steps; measure divergence (overflow / NaN), final ``||grad f||`` and
whether the run ends within ``near_tol`` of a minimiser or of the saddle.

Logged: ``train/f``, ``train/grad_norm`` (exact ``||grad f(x)||``), ``train/dist_to_min``,
``train/dist_to_saddle`` (objectives with saddles only), ``diverged`` (0/1, every step), the same ``val/*``
metrics on the exact objective. Divergence (non-finite loss or iterate) sets ``diverged = 1``, skips the step
and stops training cleanly through ``trainer.should_stop`` instead of crashing.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError, check_range

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- objectives
class ExpSaddle:
    """``f(x, y) = e^x + e^-x + y^4/4 - y^2/2``: saddle (0, 0), minima (0, +-1), exponential growth in x."""

    name = "exp_saddle"
    dim: int | None = 2

    @staticmethod
    def value(z: Tensor) -> Tensor:
        x, y = z[..., 0], z[..., 1]
        return torch.exp(x) + torch.exp(-x) + y ** 4 / 4 - y ** 2 / 2

    @staticmethod
    def gradient(z: Tensor) -> Tensor:
        x, y = z[..., 0], z[..., 1]
        return torch.stack([torch.exp(x) - torch.exp(-x), y ** 3 - y], dim=-1)

    @staticmethod
    def minimisers(dim: int) -> Tensor:
        return torch.tensor([[0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)

    @staticmethod
    def saddles(dim: int) -> Tensor:
        return torch.zeros(1, 2, dtype=torch.float64)


class CoshBowl:
    """``f(x) = sum_i cosh(x_i)``: (L0=0, L1=1)-smooth, single minimiser 0, no saddle."""

    name = "cosh"
    dim: int | None = None

    @staticmethod
    def value(z: Tensor) -> Tensor:
        return torch.cosh(z).sum(-1)

    @staticmethod
    def gradient(z: Tensor) -> Tensor:
        return torch.sinh(z)

    @staticmethod
    def minimisers(dim: int) -> Tensor:
        return torch.zeros(1, dim, dtype=torch.float64)

    @staticmethod
    def saddles(dim: int) -> Tensor:
        return torch.zeros(0, dim, dtype=torch.float64)


OBJECTIVES = {objective.name: objective for objective in (ExpSaddle, CoshBowl)}


def get_objective(name: str):
    if name not in OBJECTIVES:
        raise UserInputError(f"objective={name!r} is unknown: choose one of {sorted(OBJECTIVES)}.")
    return OBJECTIVES[name]


def sample_objective(objective, x: Tensor, noise: Tensor, sigma_mult: float, sigma_add: float) -> Tensor:
    """Minibatch sample objective ``mean_m [(1 + sigma_mult xi_0) f(x) + sigma_add <xi_{1:}, x>]``.

    ``x``: ``(..., d)``; ``noise``: ``(..., m, d + 1)`` (m oracle samples per run). Returns ``(...)``. Its gradient
    in ``x`` is the stochastic oracle ``(1 + sigma_mult mean xi_0) grad f(x) + sigma_add mean xi_{1:}``.
    """
    multiplicative = 1.0 + sigma_mult * noise[..., 0]                      # (..., m)
    additive = sigma_add * (noise[..., 1:] * x.unsqueeze(-2)).sum(-1)       # (..., m)
    return (multiplicative * objective.value(x).unsqueeze(-1) + additive).mean(-1)


def distance_to_set(x: Tensor, points: Tensor) -> Tensor:
    """Euclidean distance from each ``x`` (``(..., d)``) to the nearest row of ``points`` (``(k, d)``, k >= 1)."""
    return torch.linalg.vector_norm(x.unsqueeze(-2) - points.to(x), dim=-1).min(-1).values


def state_metrics(objective, x: Tensor) -> dict[str, Tensor]:
    """Exact (noise-free) diagnostics of the iterate(s) ``x``: f, ||grad f||, distances to minima / saddles."""
    dim = x.shape[-1]
    metrics = {"f": objective.value(x),
               "grad_norm": torch.linalg.vector_norm(objective.gradient(x), dim=-1),
               "dist_to_min": distance_to_set(x, objective.minimisers(dim))}
    saddles = objective.saddles(dim)
    if len(saddles):
        metrics["dist_to_saddle"] = distance_to_set(x, saddles)
    return metrics


# ----------------------------------------------------------------------------- the module
class StochasticOracleModule(PaperModule):
    """SGD on a named objective through a noisy first-order oracle; pair with `SGDTaming` and `RobbinsMonroLR`.

    Args:
        objective: name of the objective (``exp_saddle`` or ``cosh``, see module doc).
        start: initial iterate ``x_0``; its length is the dimension d (2 for ``exp_saddle``).
        sigma_mult: scale of the multiplicative noise ``(1 + sigma_mult xi_0) grad f``.
        sigma_add: scale of the additive noise ``sigma_add xi_{1:}``.
        optimizer, lr_scheduler, init_from, init_from_trusted: see `PaperModule`. Default optimizer: plain SGD.
    """

    def __init__(self, objective: str = "exp_saddle", start: Sequence[float] = (8.0, 1e-3),
                 sigma_mult: float = 0.5, sigma_add: float = 0.1,
                 optimizer: OptimizerCallable = torch.optim.SGD,
                 lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        self.save_hyperparameters()
        self.objective = get_objective(objective)
        start = [float(v) for v in start]
        if not start:
            raise UserInputError("start is empty: give the initial iterate, e.g. start: [8.0, 0.001].")
        if self.objective.dim is not None and len(start) != self.objective.dim:
            raise UserInputError(f"objective {objective!r} lives in dimension {self.objective.dim} but start has "
                                 f"{len(start)} entries ({start}). Give a start of length {self.objective.dim}.")
        if not all(math.isfinite(v) for v in start):
            raise UserInputError(f"start={start} has non-finite entries.")
        check_range("sigma_mult", sigma_mult, 0.0)
        check_range("sigma_add", sigma_add, 0.0)
        self.sigma_mult = sigma_mult
        self.sigma_add = sigma_add
        self.x = nn.Parameter(torch.tensor(start, dtype=torch.get_default_dtype()))
        self.register_buffer("diverged", torch.tensor(False))
        self.register_buffer("diverged_at_step", torch.tensor(-1))

    @property
    def dim(self) -> int:
        return self.x.numel()

    def forward(self, noise: Tensor) -> Tensor:
        """The minibatch sample objective ``F(x; xi)`` for noise of shape ``(m, d + 1)``."""
        if noise.ndim != 2 or noise.shape[-1] != self.dim + 1:
            raise UserInputError(
                f"the oracle noise has shape {tuple(noise.shape)} but the model has d={self.dim}, so each sample "
                f"must have d + 1 = {self.dim + 1} entries (xi_0 multiplicative, xi_1: additive). Set "
                f"data.init_args.dim: {self.dim}.")
        return sample_objective(self.objective, self.x, noise.to(self.x.dtype), self.sigma_mult, self.sigma_add)

    # ------------------------------------------------------------------ divergence
    def mark_diverged(self, reason: str) -> None:
        """Record divergence once and ask the trainer to stop after this batch."""
        if not bool(self.diverged):
            self.diverged.fill_(True)
            self.diverged_at_step.fill_(self.trainer.global_step)
            log.warning("diverged at step %d (%s); stopping training", self.trainer.global_step, reason)
        self.trainer.should_stop = True

    def iterate_is_finite(self) -> bool:
        return bool(torch.isfinite(self.x).all())

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor | None:
        if bool(self.diverged):
            return None
        loss = self(batch)
        if not (torch.isfinite(loss) and self.iterate_is_finite()):
            self.mark_diverged(f"non-finite sample objective {loss.item()} at x = {self.x.tolist()}")
            return None  # skip backward and the optimizer step
        metrics = state_metrics(self.objective, self.x.detach())
        self.log_dict({f"train/{name}": value for name, value in metrics.items()}, on_step=True, on_epoch=False)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if not bool(self.diverged) and not self.iterate_is_finite():
            self.mark_diverged(f"non-finite iterate x = {self.x.tolist()} after the optimizer step")
        self.log("diverged", self.diverged.float(), on_step=True, on_epoch=False)

    def _evaluate(self, stage: str) -> None:
        metrics = state_metrics(self.objective, self.x.detach())
        metrics["diverged"] = self.diverged.float()
        self.log_dict({f"{stage}/{name}": value for name, value in metrics.items()}, on_step=False, on_epoch=True)

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self._evaluate("val")

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        self._evaluate("test")

    def predict_step(self, batch: Tensor, batch_idx: int) -> dict[str, Tensor]:
        """The iterate and its exact diagnostics (the batch is the datamodule's all-zero noise sample)."""
        return {"x": self.x.detach().clone(), "sample_objective": self(batch).detach(),
                **state_metrics(self.objective, self.x.detach())}

    def prediction_fields(self, outputs, batch) -> dict:
        """One row per predict batch: the iterate's coordinates (``x_0``, ...) and its diagnostics."""
        return {name: value.reshape(1, -1) if name == "x" else value.reshape(1) for name, value in outputs.items()}
