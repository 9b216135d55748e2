"""Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief (ICML 2026); configs in
``configs/phyb/``, every file of the paper: ``icml26 papers phyb``.

- ``dynamics_ensemble``: Stage 1 of PhyB.
- ``phyb``: PhyB.

Import from the files (``lightning_modules.phyb.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.phyb.<Class>``) keep resolving
    to ``lightning_modules.phyb.phyb``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
