"""Towards Trustworthy and Identifiable Virtual Face Generation (ICML 2026); configs in ``configs/tivdiff/``, every
file of the paper: ``icml26 papers tivdiff``.

- ``tivdiff``: TIVDiff.

Import from the files (``lightning_modules.tivdiff.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.tivdiff.<Class>``) keep resolving
    to ``lightning_modules.tivdiff.tivdiff``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
