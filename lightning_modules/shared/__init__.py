"""Building blocks more than one paper uses.

- ``base``: Plumbing shared by every paper module.
- ``classifier``: Image classifier shared by the image papers (the model TREW unlearns from, the tamed-SGD network
  demo).
- ``data_contract``: What each family of modules reads from the attached datamodule.
- ``denoisers``: Small denoising networks shared by the diffusion papers (coupled diffusion, Spectral Guidance,
  TIVDiff).
- ``errors``: The one exception type for bad user input (configs, data files, checkpoints).
- ``ranking_metrics``: Full-ranking recommendation metrics, vectorised in torch and exact under DDP.
- ``tiny_gpt``: Policies for the RLVR modules.

Import from the files (``lightning_modules.shared.<file>``); this package imports nothing eagerly.
"""
