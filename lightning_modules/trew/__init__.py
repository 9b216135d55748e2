"""Unlearning Isn't Forgetting: Revealing Hidden Leakage in Class Unlearning Evaluations (ICML 2026); configs in
``configs/trew/``, every file of the paper: ``icml26 papers trew``.

- ``trew``: TREW class unlearning and the CMIA attack.

Import from the files (``lightning_modules.trew.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``trew.py`` resolved lazily from its folder
    (``lightning_modules.trew.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
