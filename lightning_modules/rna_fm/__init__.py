"""RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction (ICML 2026); configs in
``configs/rna_fm/``, every file of the paper: ``icml26 papers rna_fm``.

- ``expression_eval``: Evaluation of slide-to-expression models.
- ``expression_regressors``: The two regression baselines of RNA-FM (arXiv 2605.11622).
- ``rna_fm``: RNA-FM.

Import from the files (``lightning_modules.rna_fm.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.rna_fm.<Class>``) keep resolving
    to ``lightning_modules.rna_fm.rna_fm``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
