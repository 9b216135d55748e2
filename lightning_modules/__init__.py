"""One LightningModule per paper (plus shared building blocks); importing registers CLI short names."""
from lightning_modules.base import PaperModule
from lightning_modules.classifier import ImageClassifier

__all__ = ["PaperModule", "ImageClassifier"]
