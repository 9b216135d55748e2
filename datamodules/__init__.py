"""One LightningDataModule per data family; importing registers CLI short names."""
__all__: list[str] = []
