"""Coupled diffusion: the module and its coupling strategies.

Import from the module files (``lightning_modules.coupled_diffusion.<file>``); this package imports nothing eagerly."""
