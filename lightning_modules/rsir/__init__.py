"""Can Recommender Systems Teach Themselves? A Recursive Self-Improving Framework with Fidelity Control (ICML 2026);
configs in ``configs/rsir/``, every file of the paper: ``icml26 papers rsir``.

- ``sequential_rec``: Sequential recommenders (SASRec, GRU4Rec) trained by next-item prediction, with full-ranking
  evaluation.

Import from the files (``lightning_modules.rsir.<file>``); this package imports nothing eagerly.
"""
