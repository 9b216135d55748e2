"""Taming Stochastic Gradient Descent: Almost Sure Convergence and Saddle-Point Avoidance under (L0, L1)-Smoothness
(ICML 2026); configs in ``configs/tamed_sgd/``, every file of the paper: ``icml26 papers tamed_sgd``.

- ``schedulers``: Learning-rate schedules shared by the collection's papers (injected through ``lr_scheduler:`` in
  the configs).
- ``tamed_sgd``: A stochastic first-order oracle on (L0, L1)-smooth test objectives, for tamed SGD.

Import from the files (``lightning_modules.tamed_sgd.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.tamed_sgd.<Class>``) keep resolving
    to ``lightning_modules.tamed_sgd.tamed_sgd``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
