"""Rethinking Contrastive Learning for Graph Collaborative Filtering: Limitations and a Simple Remedy (ICML 2026);
configs in ``configs/nt_ssm/``, every file of the paper: ``icml26 papers nt_ssm``.

- ``nt_ssm``: NT-SSM.

Import from the files (``lightning_modules.nt_ssm.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.nt_ssm.<Class>``) keep resolving
    to ``lightning_modules.nt_ssm.nt_ssm``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
