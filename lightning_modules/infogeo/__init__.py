"""InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization (ICML
2026); configs in ``configs/infogeo/``, every file of the paper: ``icml26 papers infogeo``.

- ``infogeo``: InfoGeo.

Import from the files (``lightning_modules.infogeo.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``infogeo.py`` resolved lazily from its folder
    (``lightning_modules.infogeo.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
