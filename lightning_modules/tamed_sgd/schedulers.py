"""Learning-rate schedules shared by the collection's papers (injected through ``lr_scheduler:`` in the configs).

* `RobbinsMonroLR`: ``lr_n = lr_0 (n + n0)^(-power)``, the step-size rule of stochastic approximation
  (Robbins & Monro, 1951): ``sum lr_n = inf`` and ``sum lr_n^2 < inf`` for ``power`` in (0.5, 1]. Used by the
  tamed-SGD paper ("Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance
  under (L0, L1)-Smoothness", Apidopoulos, Lytras, Mertikopoulos, ICML 2026), whose almost-sure convergence
  results assume such steps; see `callbacks.sgd_taming.SGDTaming` and `lightning_modules.tamed_sgd.tamed_sgd`.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LRScheduler

from lightning_modules.shared.errors import UserInputError


class RobbinsMonroLR(LRScheduler):
    """``lr_n = base_lr * (n + n0) ** (-power)``, ``n = 0, 1, ...`` counted in scheduler steps.

    ``power`` must lie in (0.5, 1] so that ``sum lr_n = inf`` and ``sum lr_n^2 < inf`` (Robbins-Monro); ``n0 >= 1``
    delays the decay. With the optimizer's ``lr = 0.5``, ``n0 = 10``, ``power = 0.7`` this is the benchmark's
    ``gamma_n = 0.5 / (n + 10)^0.7``. Step it once per optimizer step (``interval: step``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, n0: float = 10.0, power: float = 0.7,
                 last_epoch: int = -1) -> None:
        if not 0.5 < power <= 1.0:
            raise UserInputError(
                f"RobbinsMonroLR power={power!r} is out of range: it must lie in (0.5, 1] so that the steps "
                "satisfy sum lr = inf and sum lr^2 < inf (e.g. power: 0.7).")
        if not n0 >= 1:
            raise UserInputError(f"RobbinsMonroLR n0={n0!r} is out of range: it must be >= 1 "
                                 "(lr_n = base_lr * (n + n0)^-power is undefined or infinite at n = 0 otherwise).")
        self.n0 = float(n0)
        self.power = float(power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float | Tensor]:
        return self._get_closed_form_lr()

    def _get_closed_form_lr(self) -> list[float | Tensor]:
        return [base_lr * (self.last_epoch + self.n0) ** (-self.power) for base_lr in self.base_lrs]
