"""CauSciBench: the causal-analysis agent, its estimators and the method catalogue.

Import from the module files (``lightning_modules.causcibench.<file>``); this package imports nothing eagerly."""
