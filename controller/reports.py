"""What a round tells: one log line and one count for each thing that happens to a session's
sandbox beside the verdict carried out (a start that failed, a sandbox stopped, one found
unable to start, a refused session, a pre-start the budget had no room for, a crash loop's
back-off, deletions held), and the grace clock's note of a round that could not read the
session (a blind spot). The lines carry the session's ids from the caller's ``logs.bind``."""

from __future__ import annotations

from controller import logs
from controller.decide import Decision, Verdict, unread
from controller.deps import Deps
from controller.model import CannotStart, Handle, Record, Session
from controller.runners.base import Diagnoses
from controller.store.base import Lease

log = logs.get(__name__)


def blind_spot(lease: Lease, deps: Deps) -> None:
    """A round that could not read the session: note the blind spot in the grace clock
    (``decide.unread``), so a link that came back unseen and dropped again is timed from the
    look that next sees it down, not from the first drop."""
    marked = unread(deps.store.record(lease.session_id))
    if marked is not None:
        deps.store.save(lease, marked)  # fenced
        log.info(
            "grace clock blind spot",
            extra={"reason": "the session could not be read while the executor's link was down"},
        )


def budget_used(decision: Decision, deps: Deps) -> Decision:
    """A pre-start the budget has no room for: nothing starts (a connection request later will)."""
    skipped = Decision(
        Verdict.IGNORE,
        f"pre-start skipped: {deps.prestart_max_sandboxes} pre-started sandboxes are waiting to be used",
    )
    log.warning("pre-start skipped", extra={"reason": skipped.reason, "limit": deps.prestart_max_sandboxes})
    deps.on_prestart_skipped()
    return skipped


def crash_loop(decision: Decision, deps: Deps) -> None:
    """A crash loop's back-off begun (``Decision.crash_loop``): one warning line, the count."""
    assert decision.update is not None
    log.warning(
        "crash loop back-off",
        extra={"reason": decision.reason, "restarts": decision.update.crashes, "until": decision.recheck_at},
    )
    deps.on_crash_loop()


def held(decision: Decision, deps: Deps) -> None:
    """A deletion held (``Decision.held``): one error line naming why, the count."""
    log.error("deletions held", extra={"reason": decision.reason, "missing_since": decision.missing_since})
    deps.on_held()


def start_failed(session_id: str, reason: str, permanent: bool, deps: Deps) -> None:
    """One line per failed start (each attempt), counted and noted as the latest decision."""
    log.error(
        "sandbox start failed",
        extra={"reason": reason, "kind": "permanent" if permanent else "transient", "retried": not permanent},
    )
    deps.on_start_failed(session_id, reason, permanent)


def stopped(decision: Decision, session: Session | None, record: Record, deps: Deps) -> None:
    """One line per sandbox stopped, with what the decision saw, and the count by cause."""
    cause = decision.cause.value if decision.cause is not None else "unknown"
    log.info(
        "sandbox stopped",
        extra={
            "sandbox": record.handle.name,
            "cause": cause,
            "reason": decision.reason,
            "last_active_at": session.last_active_at if session else None,
            "idle_timeout_seconds": deps.idle_timeout_seconds,
            "started_at": record.started_at,
        },
    )
    deps.on_stop(cause)


def cannot_start(handle: Handle, found: CannotStart, deps: Deps) -> None:
    """A sandbox first found unable to start: one warning line, an Event on it, the count."""
    log.warning(
        "sandbox cannot start",
        extra={"sandbox": handle.name, "template": found.template, "kind": found.kind, "reason": found.reason},
    )
    if isinstance(deps.runner, Diagnoses):
        deps.runner.tell_cannot_start(handle, found)
    deps.on_cannot_start(found.kind)


def refused(decision: Decision, deps: Deps) -> None:
    assert decision.refused is not None
    log.warning("session refused", extra={"refused": decision.refused, "reason": decision.reason})
    deps.on_refusal(decision.refused)
