"""What the harness did to sessions, as the checker needs to know it: which schedule name is
which session, when it was deleted or failed, the turns it was given (with the marker token
each one writes), and the executors the chaos killed (so their end is not blamed on anyone)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Turn:
    id: str
    token: str
    posted_at: float


@dataclass
class Session:
    name: str
    id: str
    environment_id: str
    created_at: float
    prestart: bool = False
    deleted_at: float | None = None
    failed_at: float | None = None
    turns: list[Turn] = field(default_factory=list)
    memory_turns: list[str] = field(default_factory=list)
    """Turns whose second command asked the background process of its first turn for its token
    (``suspend-cycles``: invariant 13 checks they all got the same one)."""
    lineage_turns: list[str] = field(default_factory=list)
    """Turns that asked the same, across the maximum lifetime (``lifetime-cycles``: invariant 16
    checks that none posted well past it got the first lineage's token)."""

    @property
    def ended_at(self) -> float | None:
        """When the harness deleted or failed it."""
        times = [t for t in (self.deleted_at, self.failed_at) if t is not None]
        return min(times) if times else None


class Book:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.killed: dict[tuple[str, int], float] = {}
        """Executors (environment id, process session) the chaos SIGKILLed, and when."""

    def add(self, session: Session) -> None:
        with self._lock:
            self.sessions[session.name] = session

    def get(self, name: str) -> Session | None:
        with self._lock:
            return self.sessions.get(name)

    def all(self) -> list[Session]:
        with self._lock:
            return list(self.sessions.values())

    def by_environment(self, environment_id: str) -> Session | None:
        with self._lock:
            return next((s for s in self.sessions.values() if s.environment_id == environment_id), None)

    def by_id(self, session_id: str) -> Session | None:
        with self._lock:
            return next((s for s in self.sessions.values() if s.id == session_id), None)

    def kill(self, environment_id: str, sid: int, at: float) -> None:
        with self._lock:
            self.killed[(environment_id, sid)] = at

    def was_killed(self, environment_id: str, sid: int) -> bool:
        with self._lock:
            return (environment_id, sid) in self.killed
