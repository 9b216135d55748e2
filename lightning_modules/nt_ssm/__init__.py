"""Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy (ICML 2026);
configs in ``configs/nt_ssm/``, every file of the paper: ``icml26 papers nt_ssm``.

- ``nt_ssm``: NT-SSM.

Import from the files (``lightning_modules.nt_ssm.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``nt_ssm.py`` resolved lazily from its folder
    (``lightning_modules.nt_ssm.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
