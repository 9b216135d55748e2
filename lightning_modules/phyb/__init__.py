"""Regularized Offline Policy Optimization with Posterior Hybrid Bayesian Belief (ICML 2026); configs in
``configs/phyb/``, every file of the paper: ``icml26 papers phyb``.

- ``dynamics_ensemble``: Stage 1 of PhyB.
- ``phyb``: PhyB.
- ``td3_bc``: TD3+BC, the model-free baseline.

Import from the files (``lightning_modules.phyb.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``phyb.py`` resolved lazily from its folder
    (``lightning_modules.phyb.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
