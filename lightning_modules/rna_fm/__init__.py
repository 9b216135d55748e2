"""RNA-FM: flow-matching expression prediction, its evaluation and the regression baselines.

Import from the module files (``lightning_modules.rna_fm.<file>``); this package imports nothing eagerly."""
