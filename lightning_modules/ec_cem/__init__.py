"""Evidential Copula Concept Embedding Models (ICML 2026); configs in ``configs/ec_cem/``, every file of the paper:
``icml26 papers ec_cem``.

- ``concept_models``: Concept embedding models.

Import from the files (``lightning_modules.ec_cem.<file>``); this package imports nothing eagerly.
"""
