"""Reproductions of each paper's central claim at small scale: `python -m experiments.<paper>`."""
