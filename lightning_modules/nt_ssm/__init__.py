"""NT-SSM: the graph state-space recommender.

Import from the module files (``lightning_modules.nt_ssm.<file>``); this package imports nothing eagerly."""
