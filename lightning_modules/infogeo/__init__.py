"""InfoGeo: cross-view geo-localisation retrieval.

Import from the module files (``lightning_modules.infogeo.<file>``); this package imports nothing eagerly."""
