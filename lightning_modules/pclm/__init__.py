"""Do Audio LLMs Listen or Read? Analyzing and Mitigating Paralinguistic Failures with VoxParadox (ICML 2026); configs
in ``configs/pclm/``, every file of the paper: ``icml26 papers pclm``.

- ``audio_dpo``: DPO on top of a PCLM audio language model (VoxParadox, Pang, Chaubey & Soleymani, arXiv
  2605.27772).
- ``audio_language_model``: Audio language models that answer spoken multiple-choice questions, with PCLM (prompt-
  conditioned layer mixing) as a switch, and the content-only encoder pre-training that makes a small encoder behave
  like a real one.

Import from the files (``lightning_modules.pclm.<file>``); this package imports nothing eagerly.
"""
