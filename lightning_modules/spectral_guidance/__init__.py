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
    """Class paths written before the per-paper folders (``lightning_modules.spectral_guidance.<Class>``) keep resolving
    to ``lightning_modules.spectral_guidance.spectral_guidance``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
