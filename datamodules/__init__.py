"""The data floor: one LightningDataModule per data family, and the readers they share (`datamodules.readers`).

Import what you need from its module (``from datamodules.images import ImageClassificationDataModule``); this
package imports nothing eagerly. ``train.py`` imports every module of the collection, so short names
(``--data ImageClassificationDataModule``) work on the command line. Datamodules import nothing from the models
except the shared, pure modules listed in ``tests/test_layering.py`` (the error type and answer checking), and
nothing from ``callbacks``, ``experiments`` or ``train.py``.
"""
