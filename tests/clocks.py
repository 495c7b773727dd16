"""A clock a test moves by hand, for code that takes a ``clock`` (seconds, monotonic)."""

from __future__ import annotations


class FakeClock:
    """Reads :attr:`now`, which the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
