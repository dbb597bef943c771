"""Time behind a protocol, so decisions can be tested with a fake clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock Unix seconds."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that only moves when told to (for tests and simulations)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
