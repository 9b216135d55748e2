"""Image classifier shared by the image papers (the model TREW unlearns from, the tamed-SGD network demo).

Backbones by name:

* ``mlp``: flatten -> [Linear -> ReLU] x depth -> Linear (the digits default, 64-128-10 as in the TREW experiment);
* ``cnn``: two 3x3 conv blocks -> global average pool -> Linear (small images, CPU friendly);
* any ``timm`` model name (``resnet18``, ``vit_tiny_patch16_224`` ...), built without pretrained weights
  (nothing is downloaded). ``cifar_stem: true`` replaces a ResNet's 7x7/stride-2 stem and max-pool by a
  3x3/stride-1 conv, the usual ResNet-18 for 32x32 CIFAR images.

Every backbone ends in one ``nn.Linear`` (``self.head``): unlearning methods read its weight matrix.
"""
from __future__ import annotations

import timm
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.data_contract import ImageData
from lightning_modules.shared.errors import UserInputError, check_range

BUILTIN_BACKBONES = ("mlp", "cnn")


def _mlp(in_features: int, hidden_dim: int, depth: int, num_classes: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden_dim), nn.ReLU()]
        width = hidden_dim
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _cnn(in_channels: int, hidden_dim: int, num_classes: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, hidden_dim // 2, 3, padding=1), nn.BatchNorm2d(hidden_dim // 2), nn.ReLU(),
        nn.Conv2d(hidden_dim // 2, hidden_dim, 3, padding=1), nn.BatchNorm2d(hidden_dim), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(hidden_dim, num_classes))


def build_backbone(name: str, num_classes: int, in_channels: int, image_size: int, hidden_dim: int = 128,
                   depth: int = 1, cifar_stem: bool = False) -> nn.Module:
    """Build a classifier network whose last layer is an ``nn.Linear`` producing logits."""
    if name == "mlp":
        return _mlp(in_channels * image_size * image_size, hidden_dim, depth, num_classes)
    if name == "cnn":
        return _cnn(in_channels, hidden_dim, num_classes)
    if not timm.is_model(name):
        close = timm.list_models(f"*{name[:4]}*")[:8]
        raise UserInputError(f"backbone '{name}' is neither {BUILTIN_BACKBONES} nor a timm model name. "
                             f"Similar timm names: {close}.")
    net = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_channels)
    if cifar_stem:
        if not (hasattr(net, "conv1") and hasattr(net, "maxpool")):
            raise UserInputError(f"cifar_stem=true needs a ResNet-style timm model (conv1 + maxpool); "
                                 f"'{name}' has neither. Set cifar_stem: false.")
        net.conv1 = nn.Conv2d(in_channels, net.conv1.out_channels, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    return net


def final_linear(net: nn.Module) -> nn.Linear:
    """The logit layer of a backbone built by `build_backbone`."""
    head = net.get_classifier() if hasattr(net, "get_classifier") else net[-1]
    if not isinstance(head, nn.Linear):
        raise UserInputError(f"the backbone's final layer is {type(head).__name__}, not nn.Linear; "
                             "methods that read the logit weights need a linear head.")
    return head


class ImageClassifier(PaperModule):
    """Cross-entropy image classifier with a configurable backbone.

    Args:
        backbone: ``mlp``, ``cnn`` or a timm model name.
        num_classes / in_channels / image_size: linked from the datamodule by ``train.py``.
        hidden_dim / depth: width and number of hidden layers of the built-in backbones.
        cifar_stem: 3x3 stride-1 stem for timm ResNets on 32x32 images.
        label_smoothing: cross-entropy label smoothing.
    """

    def __init__(self, backbone: str = "mlp", num_classes: int = 10, in_channels: int = 1, image_size: int = 8,
                 hidden_dim: int = 128, depth: int = 1, cifar_stem: bool = False, label_smoothing: float = 0.0,
                 optimizer: OptimizerCallable = torch.optim.Adam, lr_scheduler: LRSchedulerCallable | None = None,
                 init_from: str | None = None, init_from_trusted: bool = False) -> None:
        super().__init__(optimizer=optimizer, lr_scheduler=lr_scheduler, init_from=init_from,
                         init_from_trusted=init_from_trusted)
        check_range("num_classes", num_classes, 2)
        check_range("hidden_dim", hidden_dim, 2)
        check_range("depth", depth, 1)
        check_range("label_smoothing", label_smoothing, 0.0, 1.0, high_inclusive=False)
        self.save_hyperparameters()
        self.net = build_backbone(backbone, num_classes, in_channels, image_size, hidden_dim, depth, cifar_stem)
        self.example_input_array = torch.zeros(2, in_channels, image_size, image_size)
        # torchmetrics accumulate sums and counts, so epoch values are exact under DDP (not a mean of means)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = self.val_acc.clone()
        self.val_loss, self.test_loss = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()

    def setup(self, stage: str) -> None:
        super().setup(stage)  # init_from
        sizes = {name: self.hparams[name] for name in ("num_classes", "in_channels", "image_size")}
        self.check_data_matches(ImageData, sizes, "model.{name}={model} but the data has {name}={data}: set "
                                                  "model.init_args.{name}: {data} (the model is built before the data "
                                                  "is read, so the value must be given).")

    @property
    def head(self) -> nn.Linear:
        return final_linear(self.net)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", (logits.argmax(-1) == labels).float().mean())
        return loss

    def _evaluate(self, batch, stage: str, accuracy: torchmetrics.Metric) -> None:
        images, labels = batch
        logits = self(images)
        loss = getattr(self, f"{stage}_loss")
        loss(F.cross_entropy(logits, labels, reduction="none"))
        self.log(f"{stage}/loss", loss)
        accuracy(logits, labels)
        self.log(f"{stage}/acc", accuracy, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test", self.test_acc)

    def predict_step(self, batch, batch_idx):
        images = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(images).softmax(-1)

    def prediction_fields(self, outputs, batch) -> dict:
        """Class probabilities, written as one CSV row per image with the predicted class."""
        return {"probs": outputs}

