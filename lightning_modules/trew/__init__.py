"""Unlearning Isn't Forgetting: Revealing Hidden Leakage in Class Unlearning Evaluations (ICML 2026); configs in
``configs/trew/``, every file of the paper: ``icml26 papers trew``.

- ``trew``: TREW class unlearning and the CMIA attack.

Import from the files (``lightning_modules.trew.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.trew.<Class>``) keep resolving
    to ``lightning_modules.trew.trew``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
