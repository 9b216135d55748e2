"""InfoGeo: Information-Theoretic Object-Centric Learning for Cross-View Generalizable UAV Geo-Localization (ICML
2026); configs in ``configs/infogeo/``, every file of the paper: ``icml26 papers infogeo``.

- ``infogeo``: InfoGeo.

Import from the files (``lightning_modules.infogeo.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.infogeo.<Class>``) keep resolving
    to ``lightning_modules.infogeo.infogeo``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
