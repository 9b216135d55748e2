"""Cross-paper tricks that attach to any suitable module; importing registers CLI short names."""
from callbacks.rsir import RSIRSelfImprovement
from callbacks.sgd_taming import RobbinsMonroLR, SGDTaming
from callbacks.trew import TREWReweighting

__all__ = ["RobbinsMonroLR", "RSIRSelfImprovement", "SGDTaming", "TREWReweighting"]
