"""PCLM: the audio language model (pre-training, SFT, paralinguistic stage 2) and its DPO stage.

Import from the module files (``lightning_modules.pclm.<file>``); this package imports nothing eagerly."""
