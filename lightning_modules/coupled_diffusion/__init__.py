"""Joint Enhancement and Classification using Coupled Diffusion Models of Signals and Logits (ICML 2026); configs in
``configs/coupled_diffusion/``, every file of the paper: ``icml26 papers coupled_diffusion``.

- ``coupled_diffusion``: Coupled diffusion of signals and logits.
- ``coupling_strategies``: The coupling strategies of coupled signal/logit diffusion (arXiv 2602.15405) as plain
  functions.

Import from the files (``lightning_modules.coupled_diffusion.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``coupled_diffusion.py`` resolved lazily from its folder
    (``lightning_modules.coupled_diffusion.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
