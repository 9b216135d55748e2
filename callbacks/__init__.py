"""Cross-paper tricks that attach to any suitable module; importing registers CLI short names."""
from callbacks.trew import TREWReweighting

__all__ = ["TREWReweighting"]
