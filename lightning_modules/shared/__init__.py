"""Pieces several papers share: the ``PaperModule`` base and the user-input error type, the data contract
(what a datamodule promises a module), the image classifier and denoisers, ranking metrics and the tiny GPT.

Import from the module files (``lightning_modules.shared.<file>``); this package imports nothing eagerly."""
