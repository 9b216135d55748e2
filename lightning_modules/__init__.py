"""One LightningModule per paper (plus shared building blocks); importing registers CLI short names."""
from lightning_modules.base import PaperModule
from lightning_modules.classifier import ImageClassifier
from lightning_modules.coupled_diffusion import CoupledDiffusion
from lightning_modules.denoisers import MLPDenoiser, UNet
from lightning_modules.grpo import GRPO, ExactMatchReward, RewardFunction
from lightning_modules.ldarnet import LDARNetClassifier, LDARNetPretraining
from lightning_modules.multi_answer_rl import MultiAnswerGRPO, MultiAnswerReward
from lightning_modules.nt_ssm import GraphCollaborativeFiltering, LightGCN
from lightning_modules.rna_fm import RNAFM, HE2RNARegressor, TRNAsformerRegressor
from lightning_modules.sequential_rec import GRU4Rec, SASRec, SequentialRecommender
from lightning_modules.sft import SupervisedWarmup
from lightning_modules.spectral_guidance import (DiffusionDenoiser, SpectralGuidanceEncoder,
                                                 TimeConditionedConvEncoder, TimeConditionedMLPEncoder)
from lightning_modules.tamed_sgd import StochasticOracleModule
from lightning_modules.tiny_gpt import HFCausalLM, TinyGPT
from lightning_modules.tivdiff import TIVDiff
from lightning_modules.trew import ClassUnlearning

__all__ = ["PaperModule", "ImageClassifier", "ClassUnlearning", "StochasticOracleModule", "GraphCollaborativeFiltering",
           "LightGCN", "SequentialRecommender", "SASRec", "GRU4Rec",
           "GRPO", "RewardFunction", "ExactMatchReward", "SupervisedWarmup", "TinyGPT", "HFCausalLM",
           "MultiAnswerGRPO", "MultiAnswerReward",
           "MLPDenoiser", "UNet", "CoupledDiffusion", "DiffusionDenoiser", "SpectralGuidanceEncoder",
           "TimeConditionedMLPEncoder", "TimeConditionedConvEncoder", "TIVDiff",
           "LDARNetPretraining", "LDARNetClassifier", "RNAFM", "HE2RNARegressor", "TRNAsformerRegressor"]
