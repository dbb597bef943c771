"""The store protocol: leases with fencing, coalesced work, the session→sandbox mapping.

Work on one session is coalesced with two counters: every delivery bumps ``wanted``; a
worker holding the session's lease works, then ``complete``s up to the ``wanted`` value it
started from. If more was wanted meanwhile, ``complete`` keeps the lease and hands back a
fresh ``Lease`` to go round again; nothing that arrives while a session is being worked is
lost, and two workers never act on one session at once.

A lease carries a fencing ``token``: strictly increasing per session and never handed out
twice, even after the store lost its data. Every write checks that the token still holds the
lease; a worker whose lease expired gets ``Fenced``. A worker renews its lease (``check``)
while it works, so the TTL can be short and a dead worker's sessions are free again soon.

Wanted work is never dropped: ``want`` > done stays recorded until a ``complete`` catches up,
whatever happens to the job that was queued for it; the scheduler's recovery pass
(``controller.recovery``) enqueues such sessions again.

Each session may also have one durable timer (``arm``): when it falls due, the active
scheduler wants work on the session the same way (``controller.timers``). Beside it, the time
its reads began answering 404 (``missing_since``), until its deletion is confirmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from controller.model import NotFound, Record


@dataclass(frozen=True)
class Lease:
    session_id: str
    token: int
    wanted: int
    """The work generation this round covers."""


@dataclass(frozen=True)
class Busy:
    """Another worker holds the session; try again after ``retry_after`` seconds."""

    retry_after: float


class SessionStore(Protocol):
    def want(self, session_id: str) -> int:
        """Ask for (more) work on a session; returns the new work generation."""
        ...

    def want_many(self, session_ids: Sequence[str]) -> None:
        """``want`` each session, in as few round trips as the store can (the sweep's batches)."""
        ...

    def acquire(self, session_id: str) -> Lease | Busy | None:
        """Take the session's lease. None: nothing is wanted beyond what was done."""
        ...

    def complete(self, lease: Lease) -> Lease | None:
        """Mark ``lease.wanted`` done. Returns a new round's lease if more is wanted, else releases."""
        ...

    def abandon(self, lease: Lease) -> None:
        """Release without marking done: the work stays wanted (a retry or the recovery pass does it)."""
        ...

    def check(self, lease: Lease) -> None:
        """Raise Fenced unless the lease is still held; extends it."""
        ...

    def record(self, session_id: str) -> Record | None: ...

    def save(self, lease: Lease, record: Record) -> None:
        """Fenced write of the mapping."""
        ...

    def forget(self, lease: Lease) -> None:
        """Fenced delete of the mapping."""
        ...

    def session_ids(self) -> list[str]:
        """Every session with a mapping (for reconciliation)."""
        ...

    def arm(
        self,
        lease: Lease,
        due_at: float | None,
        missing_since: float | None = None,
        missing_reads: tuple[int, float] | None = None,
    ) -> None:
        """Fenced: set the session's one timer to ``due_at`` (Unix seconds), replacing any
        earlier one; None removes it (``controller.timers``). ``missing_since``: when the
        session's reads began answering 404 (kept until its deletion is confirmed), with
        ``missing_reads``, the 404 reads counted and when the last was made; None forgets all
        of it, an operator's release asked included (the session was found, or is gone)."""
        ...

    def found(self, lease: Lease) -> None:
        """Fenced: forget that the session's reads answered 404 (what ``arm`` keeps of them, an
        operator's release asked included): a read found it. A round that found the session
        does this before it acts, so a round that then fails (a start that fails) cannot leave
        the marks for a later 404 to count on."""
        ...

    def missing_since(self, session_id: str) -> float | None:
        """When the session's reads began answering 404 (``arm``), or None."""
        ...

    def not_found(self, session_id: str) -> NotFound | None:
        """What is kept of a session whose reads answer 404 (``arm``, ``ask_release``), or None."""
        ...

    def ask_release(self, session_id: str, at: float) -> bool:
        """An operator asks for the release of a session whose reads answer 404 (a held
        deletion): noted for the worker's next round, which releases it if it still answers
        404. False (nothing noted) when the session is not known to answer 404."""
        ...

    def others_to_compare(self, session_id: str, count: int) -> list[str]:
        """Up to ``count`` other mapped sessions, picked at random among those not known to answer
        404 (among those that are, only when there is no other): the sessions read to confirm
        that this one was deleted, not lost to a wrong key, project or base URL."""
        ...

    def reserve_prestart(self, lease: Lease, limit: int) -> bool:
        """Fenced: take room for one pre-started sandbox for the session, unless ``limit``
        pre-started sandboxes not yet used (records with ``prestarted``, and reservations made
        in the last minute whose start has not been recorded) are there already."""
        ...

    def timer(self, session_id: str) -> float | None:
        """When the session's timer is due, or None when it has none."""
        ...

    def armed(self) -> set[str]:
        """Every session with a timer (one read: the sweep leaves these to their timers)."""
        ...


@runtime_checkable
class StartLog(Protocol):
    """Where a session's last start is noted (``controller.start_stages``), for ``explain``: a
    store that keeps it (the Redis one) also offers this; it reports and decides nothing."""

    def begin_start(self, session_id: str, sandbox: str, fields: Mapping[str, str]) -> None: ...

    def add_to_start(self, session_id: str, sandbox: str, fields: Mapping[str, str]) -> bool: ...

    def last_start(self, session_id: str) -> dict[str, str]: ...
