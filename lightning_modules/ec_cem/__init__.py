"""EC-CEM: CEM, evi-CEM and the evidential-copula concept embedding model.

Import from the module files (``lightning_modules.ec_cem.<file>``); this package imports nothing eagerly."""
