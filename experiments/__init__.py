"""Reproductions of each paper's central claim at small scale: ``python -m experiments.<paper>``.

The shared pieces (quiet trainer, keep-best, modules from ``configs/``, seed summary, result writer) live in
`experiments.kit`.
"""
from experiments.kit import quiet_single_thread  # noqa: F401  (older scripts import it from here)
