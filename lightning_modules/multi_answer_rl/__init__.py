"""Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models (ICML 2026); configs in
``configs/multi_answer_rl/``, every file of the paper: ``icml26 papers multi_answer_rl``.

- ``answer_set_metrics``: Set-level evaluation of multi-answer RL.
- ``multi_answer_protocol``: The answer protocol of multi-answer RL.
- ``multi_answer_rl``: Multi-answer RL.

Import from the files (``lightning_modules.multi_answer_rl.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """A name of ``multi_answer_rl.py`` resolved lazily from its folder
    (``lightning_modules.multi_answer_rl.<Name>``): the class paths of the flat layout before the per-paper folders,
    and the ones jsonargparse writes (the shortest)."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
