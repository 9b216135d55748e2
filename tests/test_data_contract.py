"""The model-data contract: every datamodule provides what its module family reads, and the helpers check it."""
from __future__ import annotations

import importlib
import types

import pytest

from datamodules.concepts import ConceptDataModule
from datamodules.corrupted_images import CorruptedImageDataModule
from datamodules.emotion_corpus import EmotionCorpusDataModule
from datamodules.genomics import DNAClassificationDataModule
from datamodules.geo_localization import GeoLocalizationDataModule
from datamodules.images import ImageClassificationDataModule
from datamodules.interaction_graph import GraphRecDataModule
from datamodules.many_answer_tasks import ManyAnswerDataModule
from datamodules.offline_rl import OfflineRLDataModule
from datamodules.paralinguistic_speech import ParalinguisticSpeechDataModule
from datamodules.sequences import SequentialRecDataModule
from datamodules.slide_expression import SlideExpressionDataModule
from datamodules.synthetic_faces import FaceDataModule
from datamodules.verifiable_tasks import VerifiableTaskDataModule
from lightning_modules.shared import data_contract as contract
from lightning_modules.shared.base import PaperModule
from lightning_modules.shared.errors import UserInputError
from conftest import REPO

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
    (OfflineRLDataModule, {}, [contract.OfflineRLData]),
    (ConceptDataModule, {}, [contract.ConceptData]),
    (GeoLocalizationDataModule, {}, [contract.GeoRetrievalData]),
    (EmotionCorpusDataModule, {}, [contract.EmotionWordData]),
    (ParalinguisticSpeechDataModule, {"num_train": 16, "num_val": 8, "num_test": 8}, [contract.SpokenQuestionData]),
]
# Datamodules whose module reads nothing from them but their batches (so no contract members to provide)
BATCHES_ONLY = {
    "CausalQueryDataModule": "the agent reads each query dict of a batch (features, table, reference)",
    "DNAPretrainDataModule": "masked-LM pre-training reads token batches; the vocabulary is fixed by the network",
    "HighResolutionVQADataModule": "HiDe reads images, questions and options from each batch",
    "StochasticOracleDataModule": "the tamed-SGD module reads oracle samples from each batch",
    "DiffusionToyDataModule": "the diffusion modules read samples (and labels) from each batch",
}


def test_every_datamodule_has_a_contract_or_says_why_it_needs_none():
    import inspect
    import pkgutil

    import datamodules
    from lightning.pytorch import LightningDataModule

    found = set()
    for info in pkgutil.iter_modules(datamodules.__path__):
        module = importlib.import_module(f"datamodules.{info.name}")
        found |= {name for name, cls in vars(module).items() if inspect.isclass(cls)
                  and issubclass(cls, LightningDataModule) and cls.__module__ == module.__name__
                  and not name.startswith("_")}
    covered = {cls.__name__ for cls, _, _ in FAMILIES} | set(BATCHES_ONLY)
    assert found == covered, f"no contract for {sorted(found - covered)}; stale entries {sorted(covered - found)}"


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


def test_the_typed_view_reads_only_declared_members_and_check_raises_the_given_message():
    data = types.SimpleNamespace(num_classes=10, in_channels=1, image_size=None)
    module = _module_with_data(data)
    assert module.data(contract.ImageData).num_classes == 10
    assert module.data(contract.ImageData).image_size is None  # provided but not known yet
    assert module.data(contract.SequenceData).max_len is None  # not provided by this datamodule
    assert module.attached_data(contract.ImageData) is data
    assert module.attached_data(contract.InteractionGraphData) is None
    with pytest.raises(AttributeError, match="'num_items' is not part of the ImageData contract"):
        module.data(contract.ImageData).num_items
    with pytest.raises(AttributeError, match="read-only"):
        module.data(contract.ImageData).num_classes = 3
    module.check_data_matches(contract.ImageData, {"num_classes": 10, "image_size": 32}, "unused {name}")  # None: skip
    with pytest.raises(UserInputError, match=r"^model.in_channels=3 but data 1$"):
        module.check_data_matches(contract.ImageData, {"in_channels": 3}, "model.{name}={model} but data {data}")
    no_data = PaperModule()
    assert no_data.data(contract.TokenizedData).tokenizer is None
    assert no_data.attached_data(contract.TokenizedData) is None
    assert contract.data_view(contract.ImageData, data).in_channels == 1  # what callbacks use


def test_no_module_or_callback_reads_the_data_by_string_key():
    """Members are read as attributes of a contract view (``self.data(C).name``), so a typo is an AttributeError
    naming the contract, and a type checker sees the member's type."""
    offenders = []
    for path in sorted((REPO / "lightning_modules").rglob("*.py")) + sorted((REPO / "callbacks").glob("*.py")):
        text = path.read_text()
        offenders += [f"{path.relative_to(REPO)}: {pattern}"
                      for pattern in ("data_value(", "getattr(trainer.datamodule") if pattern in text]
    assert not offenders, offenders


def test_a_module_of_one_family_refuses_data_of_another_with_the_existing_message():
    from lightning_modules.nt_ssm.nt_ssm import GraphCollaborativeFiltering

    model = GraphCollaborativeFiltering(embedding_dim=8, num_layers=1)
    model._trainer = types.SimpleNamespace(datamodule=ImageClassificationDataModule(), ckpt_path=None)
    with pytest.raises(UserInputError, match="needs a GraphRecDataModule"):
        model.setup("fit")
