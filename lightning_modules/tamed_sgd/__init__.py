"""Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance under (L0, L1)-Smoothness
(ICML 2026); configs in ``configs/tamed_sgd/``, every file of the paper: ``icml26 papers tamed_sgd``.

- ``schedulers``: Learning-rate schedules shared by the collection's papers (injected through ``lr_scheduler:`` in
  the configs).
- ``tamed_sgd``: A stochastic first-order oracle on (L0, L1)-smooth test objectives, for tamed SGD.

Import from the files (``lightning_modules.tamed_sgd.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``tamed_sgd.py`` resolved lazily from its folder
    (``lightning_modules.tamed_sgd.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
