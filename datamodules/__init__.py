"""One LightningDataModule per data family; importing registers CLI short names."""
from datamodules.images import ImageClassificationDataModule
from datamodules.stochastic_oracle import StochasticOracleDataModule

__all__ = ["ImageClassificationDataModule", "StochasticOracleDataModule"]
