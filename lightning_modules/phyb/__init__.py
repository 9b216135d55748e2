"""PhyB: the physics-belief offline actor-critic and its dynamics ensemble.

Import from the module files (``lightning_modules.phyb.<file>``); this package imports nothing eagerly."""
