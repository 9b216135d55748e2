"""Spectral guidance: the guided sampler, its module and the denoiser it guides.

Import from the module files (``lightning_modules.spectral_guidance.<file>``); this package imports nothing eagerly."""
