"""What a round sees of one session before it decides (``observe``), and the decision made on
it with the policy the round was given (``decide_observed``). Reads only: the session, its
record (or a live sandbox nobody recorded, adopted), the sandbox's health and, when it
matters, its executor's link, the round's one reading of the clock and, for a session that
answered 404, what is known of it and how a few other sessions answer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.decide import Decision, Missing, confirmable, decide
from controller.deps import Deps
from controller.errors import ApiRejected, ApiUnavailable
from controller.model import CannotStart, Health, Link, Record, Session
from controller.runners.base import Diagnoses, Runner


@dataclass(frozen=True)
class Observation:
    """What a round sees of one session before it decides (``observe``)."""

    session: Session | None
    record: Record | None
    adopted: bool
    """``record`` stands for a sandbox found without one (``act`` then records it)."""
    health: Health | None
    connected: bool | None
    link_dropped: bool
    """The API says an executor held the link and lost it (``Link.DROPPED``): it had connected."""
    now: float
    """The round's one reading of the clock, made after its reads: everything it decides and
    stores uses it (only a sandbox adopted without a creation time of its own is stamped by a
    reading made as it is found)."""
    missing: Missing | None = None
    """What is known of a session whose read answered 404 (None: it was found)."""
    cannot_start: CannotStart | None = None
    """Why the sandbox, starting, cannot start, when its runner ``Diagnoses`` it (None: nothing known)."""


def observe(sid: str, deps: Deps) -> Observation:
    """Read the session, its record (or a live sandbox nobody recorded: adopted, not
    duplicated), the sandbox's health and, when it matters, whether its executor is connected:
    while a connection is wanted, and while its grace clock runs (to stop it once the executor
    is seen connected, whatever the session is doing); then the clock, so that the round's time
    is when it saw all that (reads retried through an API incident can take seconds, and a look
    timed from before them would hide that blind spot from the grace clock). For a session
    that answered 404, when its deletion would be confirmed, read a few other mapped sessions
    to compare (``Missing``)."""
    session = deps.sessions.get(sid)
    record = deps.store.record(sid)
    adopted = False
    if record is None:
        found = deps.runner.find(sid)
        if found is not None:
            record = Record(
                sid,
                found.environment_id,
                found,
                found.created_at or deps.clock.now(),
                lineage_started_at=found.lineage_started_at or None,
            )
            adopted = True
    health, cannot_start = _health(record, deps.runner)
    link = None
    if (
        record is not None
        and session is not None
        and not record.stopped
        and health in (Health.RUNNING, Health.STARTING)
        and (session.wants_connection or record.disconnected_at is not None)
    ):
        link = deps.sessions.environment_link(record.environment_id)
    connected = None if link is None else link is Link.UP
    now = deps.clock.now()
    missing = _missing(sid, deps, now) if session is None else None
    return Observation(session, record, adopted, health, connected, link is Link.DROPPED, now, missing, cannot_start)


def _health(record: Record | None, runner: Runner) -> tuple[Health | None, CannotStart | None]:
    """The sandbox's health and, from the same read when the runner can tell, why it cannot start."""
    if record is None:
        return None, None
    if isinstance(runner, Diagnoses):
        return runner.diagnose(record.handle)
    return runner.status(record.handle), None


def _missing(sid: str, deps: Deps, now: float) -> Missing:
    """What is known of a session that answered 404: since when, the 404 reads counted so far,
    whether an operator asked for its release, and, once this read would confirm its deletion,
    how other mapped sessions answer now (reads only; none is changed)."""
    known = deps.store.not_found(sid)
    mark = (
        Missing()
        if known is None
        else Missing(known.since, reads=known.reads, last_read=known.last_read, release_asked=known.release_asked)
    )
    if not confirmable(mark, now, deps.deletion_confirm_seconds) or mark.release_asked is not None:
        return mark
    others = deps.store.others_to_compare(sid, deps.compare_sessions)
    found = not_found = 0
    for other in others:
        try:
            answer = deps.sessions.get(other)
        except (ApiUnavailable, ApiRejected):
            continue  # unknown: counts for neither
        if answer is None:
            not_found += 1
        else:
            found += 1
    return replace(mark, compared=len(others), found=found, not_found=not_found)


def decide_observed(seen: Observation, deps: Deps) -> Decision:
    """``decide`` on an observation, with the policy ``deps`` carries."""
    return decide(
        seen.session,
        seen.record,
        seen.health,
        seen.connected,
        seen.now,
        deps.grace_seconds,
        deps.routing,
        deps.max_lifetime_seconds,
        deps.trust_policy,
        deps.idle_timeout_seconds,
        deps.retention_seconds,
        seen.session is not None and deps.prestarts_agent(seen.session.agent_id),
        seen.missing,
        deps.deletion_confirm_seconds,
        seen.link_dropped,
        seen.cannot_start,
    )
