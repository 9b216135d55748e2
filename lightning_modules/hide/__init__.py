"""HiDe: Rethinking the Zoom-IN Method in High Resolution MLLMs via Hierarchical Decoupling (ICML 2026); configs in
``configs/hide/``, every file of the paper: ``icml26 papers hide``.

- ``hide``: HiDe.
- ``hide_zoom``: HiDe's zoom-in algorithm as plain functions on arrays.
- ``toy_mllm``: A toy multimodal LLM for HiDe's CPU experiment (arXiv 2510.00054 evaluates Qwen2.5-VL / InternVL3;
  this is a stand-in with the same interface, small enough to train on a CPU in a minute).

Import from the files (``lightning_modules.hide.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``hide.py`` resolved lazily from its folder
    (``lightning_modules.hide.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
