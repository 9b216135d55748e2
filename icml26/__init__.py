"""The ``icml26`` command's support code: the paper registry, the claim checks, the experiment runner's entry, and
what ``train.py`` needs beyond the LightningCLI class (error translation, checkpoint checks, W&B config saving).

Top floor, beside ``train.py`` and ``experiments``: it may import every package of the collection; nothing below
imports it. Importing the package imports nothing else.
"""
