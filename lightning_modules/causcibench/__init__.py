"""CauSciBench: Can LLMs Automate Causal Inference in Real-World Scientific Research? (ICML 2026); configs in
``configs/causcibench/``, every file of the paper: ``icml26 papers causcibench``.

- ``causal_agent``: CauSciBench agents as a LightningModule.
- ``causal_estimators``: Treatment-effect estimators of the CauSciBench agents, on statsmodels and linearmodels,
  behind one closed set of method labels.
- ``causal_methods``: CauSciBench's closed set of method labels and the mapping of the benchmark's raw labels onto
  it.

Import from the files (``lightning_modules.causcibench.<file>``); this package imports nothing eagerly.
"""
