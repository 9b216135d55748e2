"""Reproductions of each paper's central claim at small scale: `python -m experiments.<paper>`."""
import logging
import warnings

import torch


def quiet_single_thread() -> None:
    """The experiments' common set-up: one torch thread (2-core machines, stable timings) and no Lightning chatter."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
