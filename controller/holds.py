"""Sessions whose reads answer 404, and the hold an operator ends: ``status`` and ``release``.

A session whose reads answer 404 is not deleted until every read of it over
``CONTROLLER_DELETION_CONFIRM_SECONDS`` answered 404 (``decide.SPREAD_READS`` reads spread
over the period), and not even then while no other session read to compare answers (a wrong
API key or base URL makes every read answer 404, however few sessions are mapped): the
deletion is *held*, and its sandbox and workspace stay. It is collected once a look finds
other sessions that answer (held deletions are looked at again after as long as they have
answered 404, at most hourly), or when an operator says it was deleted:
``sandbox-controller release SESSION_ID --yes`` notes the release (``SessionStore.ask_release``)
and queues a round; the worker, under the session's lease, releases it if it still answers
404 (``decide.Missing.release_asked``). Without ``--yes`` the command only says, in one line,
what it would destroy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.errors import UsageError
from controller.inbox import Job
from controller.model import LastDecision, NotFound
from controller.runners.base import Runner
from controller.store.base import SessionStore

RELEASE_EVENT = "operator.release"
"""The event type of the job ``release`` queues (logged with the round it starts)."""


class HoldLog(Protocol):
    def missing(self) -> dict[str, float]: ...

    def not_found(self, session_id: str) -> NotFound | None: ...

    def last_decision(self, session_id: str) -> LastDecision | None: ...


@dataclass(frozen=True)
class Held:
    """A session answering 404 whose deletion a worker held (``decide.Decision.held``)."""

    session_id: str
    not_found_since: float
    held_seconds: float
    """About how long its deletion has been held: since the confirmation period ended."""

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "not_found_since": self.not_found_since,
            "held_seconds": round(self.held_seconds, 1),
        }


def held(log: HoldLog, now: float, confirm_seconds: float) -> list[Held]:
    """Every session whose last decision held its deletion, with how long it has been held."""
    found = []
    for session_id, since in sorted(log.missing().items()):
        last = log.last_decision(session_id)
        if last is not None and last.held:
            found.append(Held(session_id, since, max(0.0, now - since - confirm_seconds)))
    return found


def describe(session_id: str, store: SessionStore, runner: Runner, now: float) -> str:
    """One line: what releasing the session destroys. ``UsageError`` when the session is not
    known to answer 404 (a session that answers is never released this way)."""
    known = store.not_found(session_id)
    if known is None:
        raise UsageError(
            f"session {session_id} is not known to answer 404 (no deletion pending or held); nothing to release"
        )
    record = store.record(session_id)
    parts = []
    if record is not None and not record.stopped:
        parts.append(f"stop sandbox {record.handle.name} (generation {record.handle.generation})")
    if record is not None or runner.keeps_workspace(session_id):
        parts.append("discard its workspace and files")
    if record is not None:
        parts.append("forget its mapping")
    what = ", ".join(parts) or "nothing left to destroy (no sandbox, no workspace)"
    return f"release {session_id} (answers 404 for {now - known.since:.0f}s): {what}"


def release(session_id: str, store: SessionStore, now: float, publish: Callable[[Sequence[Job]], None]) -> None:
    """Note the operator's release and queue a round for the session (its work wanted first, as
    for a webhook): the worker releases it under its lease if it still answers 404."""
    if not store.ask_release(session_id, now):
        raise UsageError(f"session {session_id} no longer answers 404 (found again, or already released)")
    store.want(session_id)
    publish([Job(session_id=session_id, webhook_id="", event_type=RELEASE_EVENT)])
