"""One LightningDataModule per data family; importing registers CLI short names."""
from datamodules.corrupted_images import CorruptedImageDataModule
from datamodules.genomics import DNAClassificationDataModule, DNAPretrainDataModule
from datamodules.images import ImageClassificationDataModule
from datamodules.interaction_graph import GraphRecDataModule
from datamodules.many_answer_tasks import ManyAnswerDataModule
from datamodules.sequences import SequentialRecDataModule
from datamodules.slide_expression import SlideExpressionDataModule
from datamodules.stochastic_oracle import StochasticOracleDataModule
from datamodules.synthetic_faces import FaceDataModule
from datamodules.toy_distributions import DiffusionToyDataModule
from datamodules.verifiable_tasks import VerifiableTaskDataModule

__all__ = ["ImageClassificationDataModule", "GraphRecDataModule", "SequentialRecDataModule",
           "StochasticOracleDataModule", "VerifiableTaskDataModule", "ManyAnswerDataModule",
           "CorruptedImageDataModule", "DiffusionToyDataModule", "FaceDataModule", "DNAPretrainDataModule",
           "DNAClassificationDataModule", "SlideExpressionDataModule"]
