"""Spectral Guidance for Flexible and Efficient Control of Diffusion Models (ICML 2026); configs in
``configs/spectral_guidance/``, every file of the paper: ``icml26 papers spectral_guidance``.

- ``diffusion_denoiser``: The DDPM eps-prediction model that Spectral Guidance (arXiv 2605.28900) steers, and its
  noise schedules.
- ``guided_sampling``: Guided DDIM sampling for Spectral Guidance (arXiv 2605.28900).
- ``spectral_guidance``: Spectral Guidance.

Import from the files (``lightning_modules.spectral_guidance.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``spectral_guidance.py`` resolved lazily from its folder
    (``lightning_modules.spectral_guidance.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
