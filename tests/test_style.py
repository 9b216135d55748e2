"""The whole tree passes ruff with the repository's ruff.toml (pyflakes errors, pycodestyle, 120 columns), so an
unused import, an undefined name or an overlong line fails here instead of accumulating."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise",
                             str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, f"ruff check reports problems (fix them, or configure ruff.toml):\n{result.stdout}"
