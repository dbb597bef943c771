"""Time behind a protocol, so decisions can be tested with a fake clock (tests/support/clock.py)."""

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
