"""Reaching Beyond the Mode: RL for Distributional Reasoning in Language Models (ICML 2026); configs in
``configs/multi_answer_rl/``, every file of the paper: ``icml26 papers multi_answer_rl``.

- ``answer_set_metrics``: Set-level evaluation of multi-answer RL.
- ``multi_answer_protocol``: The answer protocol of multi-answer RL.
- ``multi_answer_rl``: Multi-answer RL.

Import from the files (``lightning_modules.multi_answer_rl.<file>``); this package imports nothing eagerly.
"""

import sys


def __getattr__(name: str):
    """Class paths written before the per-paper folders (``lightning_modules.multi_answer_rl.<Class>``) keep resolving
    to ``lightning_modules.multi_answer_rl.multi_answer_rl``, lazily and with a FutureWarning."""
    return sys.modules["lightning_modules"].moved_attribute(__name__, name)
