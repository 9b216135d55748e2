"""Cross-paper tricks that attach to any suitable module (EMA, RSIR rounds, TREW reweighting, SGD taming).

Import what you need from its module (``from callbacks.ema import EMAWeights``); this package imports nothing
eagerly. ``train.py`` imports every module of the collection, so short names (``class_path: EMAWeights``) work
on the command line. Callbacks sit on the top floor: they may import ``lightning_modules`` and ``datamodules``,
never ``train.py`` or ``experiments`` (``tests/test_layering.py``).
"""
