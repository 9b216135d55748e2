"""Towards Trustworthy and Identifiable Virtual Face Generation (ICML 2026); configs in ``configs/tivdiff/``, every
file of the paper: ``icml26 papers tivdiff``.

- ``tivdiff``: TIVDiff.

Import from the files (``lightning_modules.tivdiff.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``tivdiff.py`` resolved lazily from its folder
    (``lightning_modules.tivdiff.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
