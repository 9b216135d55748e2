"""The model-data contract: every datamodule provides what its module family reads, and the helpers check it."""
from __future__ import annotations

import types

import pytest

from datamodules.corrupted_images import CorruptedImageDataModule
from datamodules.genomics import DNAClassificationDataModule
from datamodules.images import ImageClassificationDataModule
from datamodules.interaction_graph import GraphRecDataModule
from datamodules.many_answer_tasks import ManyAnswerDataModule
from datamodules.sequences import SequentialRecDataModule
from datamodules.slide_expression import SlideExpressionDataModule
from datamodules.synthetic_faces import FaceDataModule
from datamodules.verifiable_tasks import VerifiableTaskDataModule
from lightning_modules.shared import data_contract as contract
from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError

# (datamodule, init args, the contracts it must satisfy once set up)
FAMILIES = [
    (SequentialRecDataModule, {}, [contract.SequenceData, contract.SelfImprovingSequenceData]),
    (GraphRecDataModule, {}, [contract.InteractionGraphData]),
    (ImageClassificationDataModule, {"forget_class": 3}, [contract.ImageData, contract.UnlearningData]),
    (CorruptedImageDataModule, {}, [contract.ImageData, contract.PixelStatisticsData]),
    (FaceDataModule, {}, [contract.FaceIdentityData]),
    (VerifiableTaskDataModule, {}, [contract.TokenizedData]),
    (ManyAnswerDataModule, {}, [contract.TokenizedData]),
    (DNAClassificationDataModule, {}, [contract.LabelledSequenceData]),
    (SlideExpressionDataModule, {}, [contract.SlideExpressionData]),
]


@pytest.mark.parametrize("datamodule_cls, kwargs, contracts", FAMILIES, ids=[f[0].__name__ for f in FAMILIES])
def test_every_datamodule_provides_its_family_contract(datamodule_cls, kwargs, contracts):
    datamodule = datamodule_cls(**kwargs)
    datamodule.setup("fit")
    for family in contracts:
        missing = sorted(name for name in contract.contract_members(family) if not hasattr(datamodule, name))
        assert not missing, f"{datamodule_cls.__name__} lacks {missing} of {family.__name__}"
        assert isinstance(datamodule, family)


def test_contract_members_include_bases_and_methods():
    assert contract.contract_members(contract.SelfImprovingSequenceData) == {
        "num_items", "max_len", "training_sequences", "synthetic_sequences", "add_training_sequences"}
    assert contract.contract_members(contract.InteractionGraphData) == {"num_users", "num_items", "train_edge_index"}


def _module_with_data(data) -> PaperModule:
    module = PaperModule()
    module._trainer = types.SimpleNamespace(datamodule=data)
    return module


def test_helpers_read_only_declared_members_and_raise_the_given_message_on_mismatch():
    data = types.SimpleNamespace(num_classes=10, in_channels=1, image_size=None)
    module = _module_with_data(data)
    assert module.data_value(contract.ImageData, "num_classes") == 10
    assert module.data_value(contract.ImageData, "image_size", 8) is None  # provided but not known yet
    assert module.attached_data(contract.ImageData) is data
    assert module.attached_data(contract.InteractionGraphData) is None
    with pytest.raises(TypeError, match="not part of the ImageData contract"):
        module.data_value(contract.ImageData, "num_items")
    module.check_data_matches(contract.ImageData, {"num_classes": 10, "image_size": 32}, "unused {name}")  # None: skip
    with pytest.raises(UserInputError, match=r"^model.in_channels=3 but data 1$"):
        module.check_data_matches(contract.ImageData, {"in_channels": 3}, "model.{name}={model} but data {data}")
    no_data = PaperModule()
    assert no_data.data_value(contract.TokenizedData, "tokenizer", "fallback") == "fallback"
    assert no_data.attached_data(contract.TokenizedData) is None


def test_a_module_of_one_family_refuses_data_of_another_with_the_existing_message():
    from lightning_modules.nt_ssm.nt_ssm import GraphCollaborativeFiltering

    model = GraphCollaborativeFiltering(embedding_dim=8, num_layers=1)
    model._trainer = types.SimpleNamespace(datamodule=ImageClassificationDataModule(), ckpt_path=None)
    with pytest.raises(UserInputError, match="needs a GraphRecDataModule"):
        model.setup("fit")
