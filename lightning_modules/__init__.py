"""The ground floor: one LightningModule per paper, its losses, samplers and injected strategy objects
(rollout allocators, rewards, schedulers), plus building blocks shared by several papers.

Import what you need from its module (``from lightning_modules.rlvr.grpo import GRPO``); this package imports
nothing eagerly, so loading one module (or the shared error type and answer checking that the datamodules use)
does not load every model, diffusers or timm. ``train.py`` imports every module of the collection, so short
names (``--model ImageClassifier``) work on the command line. Nothing here imports ``datamodules``,
``callbacks``, ``experiments`` or ``train.py`` (``tests/test_layering.py``).
"""
