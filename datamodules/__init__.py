"""One LightningDataModule per data family; importing registers CLI short names."""
from datamodules.images import ImageClassificationDataModule

__all__ = ["ImageClassificationDataModule"]
