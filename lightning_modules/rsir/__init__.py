"""RSIR: the sequential recommender that RSIR's self-improvement rounds (``callbacks.rsir``) train.

Import from the module files (``lightning_modules.rsir.<file>``); this package imports nothing eagerly."""
