"""Emotion hierarchy: the layer-wise emotion probe over a language model.

Import from the module files (``lightning_modules.emotion_hierarchy.<file>``); this package imports nothing eagerly."""
