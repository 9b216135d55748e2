"""The shared image classifier: every backbone family builds, ends in a linear head, and validates its input."""
from __future__ import annotations

import pytest
import torch

from lightning_modules.shared.classifier import ImageClassifier, build_backbone, final_linear
from lightning_modules.shared.errors import UserInputError


@pytest.mark.parametrize("backbone, channels, size, kwargs", [
    ("mlp", 1, 8, {}), ("cnn", 3, 16, {}), ("resnet18", 3, 32, {"cifar_stem": True}), ("resnet18", 3, 32, {})])
def test_backbones_build_and_end_in_a_linear_head(backbone, channels, size, kwargs):
    net = build_backbone(backbone, num_classes=7, in_channels=channels, image_size=size, hidden_dim=16, **kwargs)
    logits = net(torch.randn(2, channels, size, size))
    assert logits.shape == (2, 7)
    assert final_linear(net).out_features == 7


def test_cifar_stem_keeps_the_spatial_resolution_of_small_images():
    net = build_backbone("resnet18", 10, 3, 32, cifar_stem=True)
    assert net.conv1.stride == (1, 1) and net.conv1.kernel_size == (3, 3)
    assert isinstance(net.maxpool, torch.nn.Identity)


def test_cifar_stem_on_a_non_resnet_is_refused():
    with pytest.raises(UserInputError, match="cifar_stem"):
        build_backbone("vit_tiny_patch16_224", 10, 3, 32, cifar_stem=True)


def test_out_of_range_arguments_are_refused():
    with pytest.raises(UserInputError, match="num_classes=1"):
        ImageClassifier(num_classes=1)
    with pytest.raises(UserInputError, match="label_smoothing=1.0"):
        ImageClassifier(label_smoothing=1.0)
