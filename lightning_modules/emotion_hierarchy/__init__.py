"""Emergence of Hierarchical Emotion Organization in Large Language Models (ICML 2026); configs in
``configs/emotion_hierarchy/``, every file of the paper: ``icml26 papers emotion_hierarchy``.

- ``emotion_probe``: Emotion hierarchies read out of a causal language model's next-token distribution.

Import from the files (``lightning_modules.emotion_hierarchy.<file>``); this package imports nothing eagerly.
"""
