"""TREW: the reweighted retraining module (``callbacks.trew`` attaches the reweighting).

Import from the module files (``lightning_modules.trew.<file>``); this package imports nothing eagerly."""
