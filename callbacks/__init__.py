"""Cross-paper tricks that attach to any suitable module; importing registers CLI short names."""
__all__: list[str] = []
