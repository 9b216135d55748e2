"""Joint Enhancement and Classification using Coupled Diffusion Models of Signals and Logits (ICML 2026); configs in
``configs/coupled_diffusion/``, every file of the paper: ``icml26 papers coupled_diffusion``.

- ``coupled_diffusion``: Coupled diffusion of signals and logits.
- ``coupling_strategies``: The coupling strategies of coupled signal/logit diffusion (arXiv 2602.15405) as plain
  functions.

Import from the files (``lightning_modules.coupled_diffusion.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.coupled_diffusion.<Class>``) keep resolving
    to ``lightning_modules.coupled_diffusion.coupled_diffusion``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
