"""Multi-answer RL: the module, the answer-set format and its metrics.

Import from the module files (``lightning_modules.multi_answer_rl.<file>``); this package imports nothing eagerly."""
