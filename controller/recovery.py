"""The recovery pass: wanted work that no job is going to do is enqueued again.

The store counts, per session, the work wanted (one per delivery or sweep) and the work
done; that count, not the queue, is the source of truth. A job can vanish between the two:
a task's retry is a new message, and if the broker is down at that moment Celery drops the
job; a whole worker dies holding a lease; a task runs out of retries. The session then stays
wanted-but-not-done with nobody coming for it.

``recover`` asks the store for such sessions (work wanted beyond done, lease free, and the
last enqueue older than the store's grace period, so a job merely waiting in the queue is
not duplicated) and enqueues each once more. A duplicate that does slip through is
harmless: the worker's ``acquire`` coalesces it (nothing wanted → nothing done).

The active scheduler runs it every few seconds (``CONTROLLER_RECOVERY_INTERVAL_SECONDS``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from controller import logs, timers
from controller.store.base import SessionStore

log = logs.get(__name__)

BATCH = 500


class Backlog(Protocol):
    def take_overdue(self, limit: int) -> list[str]:
        """Up to ``limit`` sessions owed work that no queued job is expected to do, each marked
        as enqueued now (so the next call does not return it again before the grace period)."""
        ...


class RecoverableStore(SessionStore, Backlog, Protocol):
    """The store as the scheduler needs it: leases and mappings, plus the pending-work index."""


@dataclass(frozen=True)
class Recovered:
    enqueued: int


def recover(
    backlog: Backlog, enqueue: Callable[[Sequence[str]], None], batch: int = BATCH, max_batches: int = 20
) -> Recovered:
    """Enqueue every overdue session, a batch at a time (at most ``batch * max_batches`` per pass)."""
    enqueued = timers.drain(backlog.take_overdue, enqueue, batch, max_batches)
    if enqueued:
        log.warning("wanted work re-enqueued: no job was going to do it", extra={"enqueued": enqueued})
    return Recovered(enqueued=enqueued)
