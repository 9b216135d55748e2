"""LDARNet: the slide-expression module, its network and the BiMamba-2 block.

Import from the module files (``lightning_modules.ldarnet.<file>``); this package imports nothing eagerly."""
