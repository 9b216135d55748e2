"""One LightningDataModule per data family; importing registers CLI short names."""
from datamodules.images import ImageClassificationDataModule
from datamodules.interaction_graph import GraphRecDataModule
from datamodules.sequences import SequentialRecDataModule
from datamodules.stochastic_oracle import StochasticOracleDataModule

__all__ = ["ImageClassificationDataModule", "GraphRecDataModule", "SequentialRecDataModule",
           "StochasticOracleDataModule"]
