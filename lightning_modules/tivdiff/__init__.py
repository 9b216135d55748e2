"""TIVDiff: the diffusion module.

Import from the module files (``lightning_modules.tivdiff.<file>``); this package imports nothing eagerly."""
