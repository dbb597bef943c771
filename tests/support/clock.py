"""A clock that only moves when told to: the tests' ``controller.clock.Clock``."""

from __future__ import annotations


class FakeClock:
    """A clock that only moves when told to (for tests and simulations)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
