"""Cross-paper tricks that attach to any suitable module; importing registers CLI short names."""
from callbacks.ema import EMAWeights
from callbacks.rollout_allocation import DARSAllocator, KnapsackAllocator, RolloutAllocator, UniformAllocator
from callbacks.rsir import RSIRSelfImprovement
from callbacks.sgd_taming import RobbinsMonroLR, SGDTaming
from callbacks.trew import TREWReweighting

__all__ = ["EMAWeights", "RobbinsMonroLR", "RSIRSelfImprovement", "SGDTaming", "TREWReweighting",
           "RolloutAllocator", "UniformAllocator", "KnapsackAllocator", "DARSAllocator"]
