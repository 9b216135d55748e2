"""Seeded noise for a stochastic first-order oracle: one minibatch of ``xi`` vectors per optimizer step.

Used by the tamed-SGD benchmark (paper: "Taming Stochastic Gradient Descent: Almost Sure Convergence and
Saddle-Point Avoidance under (L0, L1)-Smoothness", Apidopoulos, Lytras, Mertikopoulos, ICML 2026; see
``lightning_modules/tamed_sgd/tamed_sgd.py``). There is no dataset: each training "batch" is a tensor of shape
``(batch_size, dim + 1)`` of standard Gaussian samples ``xi = (xi_0, xi_1, ..., xi_dim)``; ``xi_0`` drives the
multiplicative noise and ``xi_{1:}`` the additive noise of the oracle. ``batch_size > 1`` averages that many
oracle samples per step (minibatching). The whole table of ``num_steps`` minibatches is drawn up front from a
``torch.Generator`` seeded with ``seed`` (float64), so a run is reproducible and ``experiments/tamed_sgd.py``
can feed the very same noise to its vectorised simulation through `oracle_noise`.

One epoch is ``num_steps`` optimizer steps. Training longer replays the same noise (the samples are then no
longer independent), so a warning is issued; set ``num_steps >= trainer.max_steps``. The validation, test and
predict loaders yield a single all-zero sample, on which the sample objective equals the exact objective.
"""
from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_modules.shared.errors import UserInputError


def oracle_noise(seed: int, num_steps: int, batch_size: int, dim: int) -> Tensor:
    """The noise table ``(num_steps, batch_size, dim + 1)`` of standard Gaussians for `seed` (float64)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_steps, batch_size, dim + 1, generator=generator, dtype=torch.float64)


class StepTable(Dataset):
    """Item ``n`` is the whole minibatch of step ``n`` (used with ``DataLoader(batch_size=None)``)."""

    def __init__(self, table: Tensor) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, step: int) -> Tensor:
        return self.table[step]


class StochasticOracleDataModule(LightningDataModule):
    """Noise vectors for `StochasticOracleModule`.

    Args:
        dim: dimension d of the iterate (each sample has d + 1 entries); must match the model's ``start``.
        num_steps: number of training steps (minibatches) in one epoch.
        batch_size: oracle samples averaged per step (1 = one oracle call per step).
        seed: seed of the noise table; the same seed gives the same noise.
    """

    def __init__(self, dim: int = 2, num_steps: int = 5000, batch_size: int = 1, seed: int = 0) -> None:
        super().__init__()
        for name, value, low in (("dim", dim, 1), ("num_steps", num_steps, 1), ("batch_size", batch_size, 1),
                                 ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserInputError(f"StochasticOracleDataModule {name}={value!r} must be an integer >= {low}.")
        self.save_hyperparameters()
        self.dim, self.num_steps, self.batch_size, self.seed = dim, num_steps, batch_size, seed
        self.train_table: Tensor | None = None

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.train_table is None:
            self.train_table = oracle_noise(self.seed, self.num_steps, self.batch_size, self.dim)
        trainer = self.trainer
        if stage == "fit" and trainer is not None and not trainer.fast_dev_run:
            unbounded = trainer.max_steps == -1 and (trainer.max_epochs is None or trainer.max_epochs > 1)
            if unbounded or trainer.max_steps > self.num_steps:
                rank_zero_warn(
                    f"trainer.max_steps={trainer.max_steps} (max_epochs={trainer.max_epochs}) exceeds the "
                    f"{self.num_steps} noise samples of data.init_args.num_steps: later epochs replay the same "
                    "noise. Set num_steps >= max_steps for independent oracle calls.")

    def train_dataloader(self) -> DataLoader:
        if self.train_table is None:
            self.setup("fit")
        return DataLoader(StepTable(self.train_table), batch_size=None, shuffle=False)

    def _exact_loader(self) -> DataLoader:
        return DataLoader(StepTable(torch.zeros(1, 1, self.dim + 1, dtype=torch.float64)), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._exact_loader()

    def test_dataloader(self) -> DataLoader:
        return self._exact_loader()

    def predict_dataloader(self) -> DataLoader:
        return self._exact_loader()
