"""RNA-FM: Flow-Matching Generative Model for Genome-wide RNA-Seq Prediction (ICML 2026); configs in
``configs/rna_fm/``, every file of the paper: ``icml26 papers rna_fm``.

- ``expression_eval``: Evaluation of slide-to-expression models.
- ``expression_regressors``: The two regression baselines of RNA-FM (arXiv 2605.11622).
- ``rna_fm``: RNA-FM.

Import from the files (``lightning_modules.rna_fm.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``rna_fm.py`` resolved lazily from its folder
    (``lightning_modules.rna_fm.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
