"""The run's event log: every fault, session action, restoration and violation with its time.

Times are seconds since the run's start (``t0``, wall clock); the log is also written, line
by line, to a file in the run's directory. ``Window``s are the stretches during which a fault
disturbed the system (a process down, Redis away, the API failing, a link down, deliveries
held): the checker grants the system time to recover after them, never during them. A clock
skew is not a disturbance: a worker whose clock is off must behave like one whose clock is not.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    at: float  # wall clock
    kind: str  # fault | restore | session | note | violation
    text: str


@dataclass
class Window:
    """One fault's disturbance, from ``start`` to ``end`` (wall clock; None while it lasts)."""

    what: str
    start: float
    end: float | None = None


class EventLog:
    def __init__(self, path: Path | None = None, t0: float | None = None) -> None:
        self.t0 = time.time() if t0 is None else t0
        self._path = path
        self._lock = threading.Lock()
        self.entries: list[Entry] = []
        self.windows: list[Window] = []

    def add(self, kind: str, text: str, at: float | None = None) -> Entry:
        entry = Entry(time.time() if at is None else at, kind, text)
        with self._lock:
            self.entries.append(entry)
            if self._path is not None:
                with open(self._path, "a") as file:
                    file.write(self.format(entry) + "\n")
        return entry

    def format(self, entry: Entry) -> str:
        return f"  {entry.at - self.t0:+9.2f}s  {entry.kind:<9}  {entry.text}"

    def disturbed(self, what: str) -> Window:
        """A disturbance starts now; set its ``end`` (``ended``) when it is over."""
        window = Window(what, time.time())
        with self._lock:
            self.windows.append(window)
        return window

    def ended(self, window: Window) -> None:
        with self._lock:
            window.end = time.time()

    def quiet_since(self, now: float) -> float | None:
        """When the last disturbance ended, or None while one lasts at ``now``."""
        with self._lock:
            windows = [w for w in self.windows if w.start <= now]
        latest = self.t0
        for window in windows:
            if window.end is None or window.end > now:
                return None
            latest = max(latest, window.end)
        return latest

    def disturbed_between(self, start: float, end: float) -> bool:
        with self._lock:
            windows = list(self.windows)
        return any(w.start <= end and (w.end is None or w.end >= start) for w in windows)

    def text(self, kinds: tuple[str, ...] | None = None) -> str:
        with self._lock:
            entries = list(self.entries)
        return "\n".join(self.format(e) for e in entries if kinds is None or e.kind in kinds)

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for e in self.entries if e.kind == kind)
