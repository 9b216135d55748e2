"""Tamed SGD's paper config: the two-dimensional stochastic-oracle benchmark (``configs/tamed_sgd/paper.yaml``).

The benchmark has no dataset to release: the objective is analytic and each optimizer step draws its oracle noise
``xi ~ N(0, I_3)`` (float64) from a generator seeded with ``data.init_args.seed``
(`datamodules.stochastic_oracle.oracle_noise`), so there are no files to write and no flags to point anywhere. The
run is the published configuration (start (8, 1e-3), ``gamma_n = 0.5 / (n + 10)^0.7``, float64, one oracle call per
step); only its length differs, as for every case (2 steps, resume, 1 more).
"""
from __future__ import annotations

from pathlib import Path

from experiments.paper_steps import Case

FORMAT = "no files: the oracle noise (N x 1 x 3 float64 Gaussians) is drawn from the config's seeded generator"


def no_files(folder: Path) -> list[str]:
    """Nothing to write: `StochasticOracleDataModule` generates its noise table from ``seed``."""
    return []


CASES = {"configs/tamed_sgd/paper.yaml": Case(no_files, release_format=FORMAT)}
