"""Tamed SGD: the module and its step-size schedules (``callbacks.sgd_taming`` attaches the trick).

Import from the module files (``lightning_modules.tamed_sgd.<file>``); this package imports nothing eagerly."""
