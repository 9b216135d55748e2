"""The one exception type for bad user input (configs, data files, checkpoints).

Everything a user controls is validated where it enters the program and, when it is wrong, raises
`UserInputError` with a message that names the problem and the fix. `train.py` prints such errors as one
line and exits with status 2 instead of showing a traceback from inside a library.
"""
from __future__ import annotations


class UserInputError(ValueError):
    """A config value, data file or checkpoint supplied by the user is missing or invalid."""


def one_line(err: BaseException | str) -> str:
    """A library's message quoted whole on one line (its lines joined), for embedding in a `UserInputError`."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip())


def check_range(name: str, value: float, low: float | None = None, high: float | None = None,
                low_inclusive: bool = True, high_inclusive: bool = True) -> None:
    """Raise `UserInputError` unless `low <= value <= high` (bounds optional, inclusivity configurable)."""
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = f"{'[' if low_inclusive else '('}{lo}, {hi}{']' if high_inclusive else ')'}"
        raise UserInputError(f"{name}={value!r} is out of range: it must lie in {interval}.")
