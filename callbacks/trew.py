"""TREW reweighting as a callback: computes the class-similarity tilt once from the original model.

Attach to any module that exposes ``original`` (the frozen model being unlearned, whose last layer is an
``nn.Linear``), ``forget_class`` and a ``forget_logit_offset`` buffer, such as
`lightning_modules.trew.trew.ClassUnlearning` with ``method: trew``. At the start of fit it computes
s = softmax_{j != f}(cos(PCA(W)_f, PCA(W)_j) / T) from the original final-layer weights W and stores
``beta * s`` in the module, which then uses q ∝ p_original · exp(beta s) as the target on forget inputs.
``beta = 0`` gives the "forget class removed and renormalised" ablation. ``similarity: confusion`` replaces
the weight similarity by the original model's mean confusions on the forget-class training inputs (read
through the datamodule's ``forget_dataloader("train")``), a documented alternative that is not the paper's.
See the module docstring of `lightning_modules/trew/trew.py` for the paper and for what is reconstructed.
"""
from __future__ import annotations

import logging
from typing import Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_modules.shared.classifier import final_linear
from lightning_modules.shared.data_contract import UnlearningData
from lightning_modules.shared.errors import UserInputError, check_range
from lightning_modules.trew.trew import class_similarity, confusion_similarity, predict_probabilities

log = logging.getLogger(__name__)


class TREWReweighting(Callback):
    """Args:
        beta: tilt strength (paper default 10; choose on validation, see the README).
        temperature: softmax temperature T of the class similarity (small = sharp).
        pca_dim: number of principal directions of the weight rows kept (None: K - 1).
        similarity: ``weights`` (the paper's: PCA-projected final-layer weights) or ``confusion`` (the original
            model's mean predictions on forget-class training inputs; an alternative, see the module docstring).
    """

    def __init__(self, beta: float = 10.0, temperature: float = 0.1, pca_dim: int | None = None,
                 similarity: Literal["weights", "confusion"] = "weights") -> None:
        check_range("TREWReweighting.beta", beta, 0.0)
        check_range("TREWReweighting.temperature", temperature, 0.0, low_inclusive=False)
        if pca_dim is not None:
            check_range("TREWReweighting.pca_dim", pca_dim, 1)
        self.beta, self.temperature, self.pca_dim, self.similarity_source = beta, temperature, pca_dim, similarity
        self.similarity: torch.Tensor | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not all(hasattr(pl_module, name) for name in ("original", "forget_class", "forget_logit_offset")):
            raise UserInputError(f"TREWReweighting attaches to an unlearning module with a frozen `original` "
                                 f"model (ClassUnlearning with method: trew); got {type(pl_module).__name__} "
                                 "without one. Remove the callback or set model.init_args.method: trew.")
        if self.similarity_source == "weights":
            weight = final_linear(pl_module.original).weight.detach()
            self.similarity = class_similarity(weight, pl_module.forget_class, self.temperature, self.pca_dim)
        else:
            datamodule = trainer.datamodule
            if not isinstance(datamodule, UnlearningData):
                raise UserInputError("TREWReweighting(similarity='confusion') reads the forget-class training "
                                     "inputs through the datamodule's forget_dataloader('train'), which "
                                     f"{type(datamodule).__name__} lacks. Use similarity: weights.")
            probs, _ = predict_probabilities(pl_module.original, datamodule.forget_dataloader("train"))
            self.similarity = confusion_similarity(probs.mean(0), pl_module.forget_class, self.temperature)
        pl_module.forget_logit_offset.copy_(self.beta * self.similarity.to(pl_module.forget_logit_offset))
        top = self.similarity.topk(3)
        log.info("TREW: forget class %d is most similar to classes %s (s = %s), beta = %g",
                 pl_module.forget_class, top.indices.tolist(), [round(v, 3) for v in top.values.tolist()],
                 self.beta)
