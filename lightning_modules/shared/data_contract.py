"""What each family of modules reads from the attached datamodule: the model-data contract, one protocol per family.

Some sizes are only known from the data (the number of items of a recommender, the genes and pathways of an
RNA-FM slide set) and some objects belong to the data (the tokenizer, the training graph). A module reads them
from ``trainer.datamodule`` in ``setup`` through the `PaperModule` helpers, never by probing attributes ad hoc:

* ``self.data(Contract).name``: one member of a contract, typed (``self.data(SequenceData).num_items`` is an
  ``int`` to a type checker), or None when no datamodule is attached or the attached one does not provide it (yet);
  reading a name the contract does not declare raises ``AttributeError``. Callbacks use ``data_view(Contract,
  trainer.datamodule)``, the same view;
* ``self.check_data_matches(Contract, {"name": model_value, ...}, message)``: raises `UserInputError` with
  ``message`` when the data's value is known and differs from the model's;
* ``self.attached_data(Contract)``: the datamodule when it provides the whole contract (``isinstance`` on the
  runtime-checkable protocol), else None.

A datamodule satisfies a contract structurally (it does not inherit from the protocol): it only has to provide
the attributes below. ``None`` means "not known yet" (for example before ``setup``), and the checks skip it. The
protocols hold no code, so datamodules and callbacks may import this module without importing any model.
"""
from __future__ import annotations

from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from torch import Tensor
from torch.utils.data import DataLoader

C = TypeVar("C")


def contract_members(contract: type) -> frozenset[str]:
    """The attribute and method names a contract declares (its own and its bases')."""
    names: set[str] = set()
    for base in contract.__mro__:
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        names.update(getattr(base, "__annotations__", {}))
        names.update(name for name, value in vars(base).items() if callable(value) and not name.startswith("_"))
    return frozenset(names)


class _ContractView:
    """The datamodule seen through one contract: declared members read through (None where the datamodule does
    not provide one yet), undeclared ones are an error, nothing can be written."""

    __slots__ = ("_contract", "_datamodule", "_members")

    def __init__(self, contract: type, datamodule: Any) -> None:
        object.__setattr__(self, "_contract", contract)
        object.__setattr__(self, "_datamodule", datamodule)
        object.__setattr__(self, "_members", contract_members(contract))

    def __getattr__(self, name: str) -> Any:
        if name not in self._members:
            raise AttributeError(f"{name!r} is not part of the {self._contract.__name__} contract "
                                 f"({', '.join(sorted(self._members))}); declare it there first.")
        return None if self._datamodule is None else getattr(self._datamodule, name, None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the {self._contract.__name__} view is read-only; set {name!r} on the datamodule.")

    def __repr__(self) -> str:
        return f"<{self._contract.__name__} of {type(self._datamodule).__name__}>"


def data_view(contract: type[C], datamodule: Any) -> C:
    """``datamodule`` (or None) read through ``contract``: ``data_view(SequenceData, dm).num_items``, typed."""
    return cast(C, _ContractView(contract, datamodule))


# ============================================================================================ recommendation
@runtime_checkable
class SequenceData(Protocol):
    """Sequential recommendation (`datamodules.sequences.SequentialRecDataModule`; SASRec / GRU4Rec)."""

    num_items: int       # item ids 1..num_items (0 = padding)
    max_len: int         # window length of the model input


@runtime_checkable
class SelfImprovingSequenceData(SequenceData, Protocol):
    """Sequences that a callback can grow (RSIR's self-improvement rounds)."""

    training_sequences: list[Tensor]     # the current training sequences, original ones first
    synthetic_sequences: list[Tensor]    # the ones added by earlier rounds

    def add_training_sequences(self, sequences: list[Tensor]) -> None: ...


@runtime_checkable
class InteractionGraphData(Protocol):
    """Graph collaborative filtering (`datamodules.interaction_graph.GraphRecDataModule`; LightGCN, NT-SSM)."""

    num_users: int
    num_items: int

    def train_edge_index(self) -> Tensor: ...


# ============================================================================================ images
@runtime_checkable
class ImageData(Protocol):
    """Image classification (`ImageClassificationDataModule`, `CorruptedImageDataModule`)."""

    num_classes: int
    in_channels: int
    image_size: int


@runtime_checkable
class PixelStatisticsData(ImageData, Protocol):
    """Images with the training split's per-channel pixel statistics ([0, 1] range; coupled diffusion)."""

    mean: Tensor | None
    std: Tensor | None


@runtime_checkable
class UnlearningData(Protocol):
    """Class unlearning (TREW; `ImageClassificationDataModule` with ``forget_class``): the class to forget and its
    inputs (the sizes are `ImageData`'s)."""

    forget_class: int | None

    def forget_dataloader(self, split: str) -> DataLoader: ...


@runtime_checkable
class FaceIdentityData(Protocol):
    """Face identities (`datamodules.synthetic_faces.FaceDataModule`; TIVDiff)."""

    num_train_identities: int


@runtime_checkable
class GeoRetrievalData(Protocol):
    """Cross-view retrieval (`datamodules.geo_localization.GeoLocalizationDataModule`; InfoGeo): ``predict`` ranks the
    query images of the predict loader against the gallery this loader yields, whole, on every process."""

    def gallery_dataloader(self) -> DataLoader: ...


# ============================================================================================ sequences of tokens
@runtime_checkable
class TokenizedData(Protocol):
    """Verifiable-reward tasks (RLVR: GRPO, SFT warm-up, multi-answer RL): the tokenizer shared with the policy."""

    tokenizer: Any       # encode/decode, vocab_size, pad_id, eos_id, bos_id


@runtime_checkable
class LabelledSequenceData(Protocol):
    """DNA sequence classification (`datamodules.genomics.DNAClassificationDataModule`; LDARNet)."""

    num_classes: int


@runtime_checkable
class EmotionWordData(Protocol):
    """Emotion words in a text corpus (`datamodules.emotion_corpus.EmotionCorpusDataModule`; `EmotionProbe` and the
    SFT language models of the emotion-hierarchy experiment)."""

    tokenizer: Any                     # encode/decode, vocab_size, pad_id, eos_id, bos_id
    emotion_words: list[str]           # K words
    emotion_categories: list[int]      # basic-category index of each word
    emotion_is_basic: list[bool]       # the word is a basic category itself
    category_names: list[str]          # basic categories
    reference_edges: list | None       # (parent, child) word indices of a planted hierarchy, else None


# ============================================================================================ speech
@runtime_checkable
class SpokenQuestionData(Protocol):
    """Spoken multiple-choice questions (`datamodules.paralinguistic_speech.ParalinguisticSpeechDataModule`; the
    PCLM audio language model and its DPO stage)."""

    vocab_size: int            # prompt and option token ids lie below it
    sample_rate: int           # waveforms' sampling rate
    num_content_classes: int   # sentences of the content pre-training
    task_names: list           # task ids -> names (metrics per task)


# ============================================================================================ expression
@runtime_checkable
class SlideExpressionData(Protocol):
    """Slide features to bulk expression (`datamodules.slide_expression.SlideExpressionDataModule`; RNA-FM)."""

    num_genes: int
    num_clusters: int
    feature_dim: int
    pathways: list[list[int]] | None
    background: list[int] | None
    gene_mean: Any       # [G] training-split mean of log-expression (None before the split)
    gene_std: Any        # [G] training-split std
    bimodal_genes: Any   # bool [G] or None: genes with a bimodal generator (synthetic data only)
    gene_names: list[str]    # [G] (rows of the written expression predictions)
    slide_ids: list[str]     # one per slide, indexed by a batch's "index"


# ============================================================================================ concepts
@runtime_checkable
class ConceptData(Protocol):
    """Concept bottleneck data (`datamodules.concepts.ConceptDataModule`; CEM, evi-CEM, EC-CEM): batches (x, y, c)."""

    num_concepts: int
    num_tasks: int
    input_dim: int | None            # feature size of vector inputs; None for images
    concept_groups: list[list[int]]  # concept indices per group (CUB's 28 attribute groups; singletons elsewhere)
    concept_imbalance: Any           # [k] n_neg / n_pos of the training split (None before setup)


# ============================================================================================ offline RL
@runtime_checkable
class OfflineRLData(Protocol):
    """Offline RL transitions (`datamodules.offline_rl.OfflineRLDataModule`; PhyB's dynamics ensemble and actor-critic):
    batches are dicts obs, act, rew, next_obs, done."""

    obs_dim: int | None
    action_dim: int | None
    dataset_identity: dict[str, Any] | None  # source, dataset name and sizes (checked between the two PhyB stages)
    evaluation_environment: str | None       # the environment the policy is evaluated in; None: no environment
    ref_min_return: float | None             # D4RL reference returns (random, expert) of the normalised score
    ref_max_return: float | None

    def training_transitions(self) -> dict[str, Tensor]: ...

    def make_env(self) -> Any: ...
