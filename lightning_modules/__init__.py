"""One LightningModule per paper (plus shared building blocks); importing registers CLI short names."""
from lightning_modules.base import PaperModule
from lightning_modules.classifier import ImageClassifier
from lightning_modules.nt_ssm import GraphCollaborativeFiltering, LightGCN
from lightning_modules.sequential_rec import GRU4Rec, SASRec, SequentialRecommender
from lightning_modules.tamed_sgd import StochasticOracleModule
from lightning_modules.trew import ClassUnlearning

__all__ = ["PaperModule", "ImageClassifier", "ClassUnlearning", "StochasticOracleModule", "GraphCollaborativeFiltering",
           "LightGCN", "SequentialRecommender", "SASRec", "GRU4Rec"]
