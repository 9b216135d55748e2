"""LDARNet: DNA Adaptive Representation Network with Learnable Tokenization for Genomic Modeling (ICML 2026); configs
in ``configs/ldarnet/``, every file of the paper: ``icml26 papers ldarnet``.

- ``bimamba2``: Pure-PyTorch Mamba-2 (SSD) and the bidirectional BiMamba-2 block used by LDARNet (arXiv 2606.04552).
- ``ldarnet``: LDARNet.
- ``ldarnet_network``: The LDARNet network (arXiv 2606.04552).

Import from the files (``lightning_modules.ldarnet.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``ldarnet.py`` resolved lazily from its folder
    (``lightning_modules.ldarnet.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
