"""What each family of modules reads from the attached datamodule: the model-data contract, one protocol per family.

Some sizes are only known from the data (the number of items of a recommender, the genes and pathways of an
RNA-FM slide set) and some objects belong to the data (the tokenizer, the training graph). A module reads them
from ``trainer.datamodule`` in ``setup`` through the `PaperModule` helpers, never by probing attributes ad hoc:

* ``self.data_value(Contract, "name")``: one member of a contract, or a default when no datamodule is attached or
  the attached one does not provide it (yet); reading a name the contract does not declare is a programming error;
* ``self.check_data_matches(Contract, {"name": model_value, ...}, message)``: raises `UserInputError` with
  ``message`` when the data's value is known and differs from the model's;
* ``self.attached_data(Contract)``: the datamodule when it provides the whole contract (``isinstance`` on the
  runtime-checkable protocol), else None.

A datamodule satisfies a contract structurally (it does not inherit from the protocol): it only has to provide
the attributes below. ``None`` means "not known yet" (for example before ``setup``), and the checks skip it. The
protocols hold no code, so datamodules and callbacks may import this module without importing any model.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor
from torch.utils.data import DataLoader


def contract_members(contract: type) -> frozenset[str]:
    """The attribute and method names a contract declares (its own and its bases')."""
    names: set[str] = set()
    for base in contract.__mro__:
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        names.update(getattr(base, "__annotations__", {}))
        names.update(name for name, value in vars(base).items() if callable(value) and not name.startswith("_"))
    return frozenset(names)


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

    def training_transitions(self) -> dict[str, Tensor]: ...
