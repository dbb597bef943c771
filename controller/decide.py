"""The decisions about one session's sandbox, as plain functions of what was observed.

``decide(session, record, health, connected, now, …)`` returns a ``Decision``: a ``Verdict``
(start, replace, keep, stop, release, discard, ignore), the reason in words, and when to look
again (``recheck_at``). It reads nothing and changes nothing: ``lifecycle`` observes (the
session, its record, the sandbox's health and link, one reading of Redis's clock), asks
``decide``, and carries the verdict out under the session's lease. An import contract
(``.importlinter``) keeps every I/O library, the store, the runners, the sessions adapter and
logging out of this module.

The rules are stated once, in docs/lifecycle.md (L1–L18); here, which rule gives which verdict:

- START: only an ``environment_connection`` action starts compute (L7, L9, L10), for a session
  that is ours (L6) and whose ``remote_url`` may get the executor key (L2, ``trust``); or a
  pre-start at a session's creation, within ``PRESTART_WINDOW_SECONDS`` (L9).
- KEEP or REPLACE: a healthy sandbox is kept; one gone, failed, terminating, serving another
  environment, past its maximum lifetime, or whose executor's link has been down past the
  grace period while a connection is wanted, is replaced by exactly one (L1, L14). How the
  grace period is counted is L14; the looks that time it are ``FIRST_LOOK_SECONDS`` and
  ``OUTAGE_LOOKS``, and blind spots delay a replacement by at most ``BLIND_SPOT_GRACES``
  graces. An executor that exits again and again backs off (``crash_backoff``): the sandbox is
  kept, dead, until its back-off is over.
  A sandbox its runner says cannot start (``CannotStart``: a pod whose node lacks its seccomp
  profile) is kept and reported, not replaced: a new one could not start either, and the
  scheduler or the kubelet starts it by itself once the profile is there; the first look that
  finds it able to start gives its executor a whole grace period from then.
- STOP: idle for the idle timeout with no connection wanted (L11–L13), the workspace kept
  (L16); DISCARD once its retention is over.
- RELEASE: a failed session (L7); a session answering 404 only once its deletion is confirmed
  (L7, L17: ``Missing``, ``confirmable``, ``SPREAD_READS``); while the other sessions compared
  cannot confirm it, it is held, until they do or an operator releases it. Until then nothing
  of it is destroyed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol

from controller import trust
from controller.model import CannotStart, Health, Record, Session, SessionStatus


class Verdict(StrEnum):
    START = "start"  # no sandbox yet (or a stopped one): start one
    REPLACE = "replace"  # sandbox gone, failed, terminating, never connected or too old: exactly one new one
    KEEP = "keep"  # healthy sandbox: its executor reconnects by itself (L14); or idle within the timeout
    STOP = "stop"  # idle past the timeout (or too old, or dead) with no connection wanted: stop, keep the workspace
    RELEASE = "release"  # failed or deleted session: free its compute and its workspace
    DISCARD = "discard"  # a stopped session's workspace is past its retention: delete it
    IGNORE = "ignore"  # nothing to do (deleted without compute, action resolved, not ours)


class Cause(StrEnum):
    """Why a sandbox stopped (the ``reason`` label of ``controller_sandboxes_stopped_total``)."""

    IDLE = "idle"
    LIFETIME = "lifetime"
    FAILED = "failed"
    DELETED = "deleted"
    REPLACED = "replaced"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    refused: str | None = None
    """Set when the session was refused (L2): the ``trust.Refusal`` kind, a fixed word."""
    recheck_at: float | None = None
    """When to look at the session again (Unix seconds; ``controller.timers``); None: only on
    the next event or sweep. "Requeue, don't wait for the next event"."""
    cause: Cause | None = None
    """Why a sandbox stops (STOP, RELEASE, REPLACE)."""
    update: Record | None = None
    """The record as it should be stored after this decision, when it changed (KEEP, IGNORE); for a
    REPLACE, the old record as decided (its crash count, carried to the new sandbox's record)."""
    missing_since: float | None = None
    """When the session's reads began answering 404, kept until its deletion is confirmed (or
    it is found again: None clears it)."""
    missing_reads: tuple[int, float] | None = None
    """With ``missing_since``: the 404 reads counted toward the confirmation, and when the last
    was made (``counted``)."""
    gone: bool = False
    """The session is deleted (confirmed) or failed: its workspace is of no use any more (L16)."""
    held: bool = False
    """A deletion that would be confirmed was held because most sessions read answer 404, or
    there was no other session to compare with (a wrong API key, project or base URL): nothing
    is released while that lasts, until an operator releases it."""
    prestart: bool = False
    """A START before anything asked for the sandbox (L9's pre-start): it needs room in the
    pre-start budget (``CONTROLLER_PRESTART_MAX_SANDBOXES``), taken when it is carried out."""
    crash_loop: bool = False
    """A crash loop's back-off begins: the executor exited again, and its replacement waits
    (``crash_backoff``; counted in ``controller_sandbox_crash_loops_total``)."""
    cannot_start: CannotStart | None = None
    """Set by the look that first finds the sandbox unable to start (``_unstartable``): it is
    reported then (a warning line, an Event on the sandbox, ``controller_sandboxes_cannot_start_total``)."""


@dataclass(frozen=True)
class Missing:
    """What a round knows of a session whose read answered 404 (L7, L17)."""

    since: float | None = None
    """When its reads began answering 404 (noted by an earlier round); None: this is the first."""
    compared: int = 0
    """Other mapped sessions read to confirm the deletion (0: none to compare with)."""
    found: int = 0
    """Of those, how many were found (their read answered)."""
    not_found: int = 0
    """Of those, how many answered 404 too."""
    reads: int = 0
    """404 reads counted so far toward the confirmation (``counted``): reads spread over the
    period, each at least a ``SPREAD_READS``-th of it after the one counted before. 0 with a
    ``since``: a mark from before reads were counted (the first read only)."""
    last_read: float | None = None
    """When the last counted 404 read was made."""
    release_asked: float | None = None
    """When an operator asked for the session's release (``sandbox-controller release``): the
    deletion is acted on then, held or not, as long as the session still answers 404."""


SPREAD_READS = 3
"""A deletion is confirmed by at least this many 404 reads spread over the confirmation period
(each at least a third of the period after the one counted before, the last at or after its
end): two reads that happen to land on two short outages are not a deletion."""


def counted(missing: Missing, now: float, confirm_seconds: float) -> tuple[float, int, float]:
    """(since, reads, last read) once this round's 404 read is counted: it counts when it comes at
    least ``confirm_seconds / SPREAD_READS`` after the last counted one (a read sooner than that,
    a second delivery say, leaves the count as it was)."""
    if missing.since is None:
        return now, 1, now
    reads = max(missing.reads, 1)
    last = missing.since if missing.last_read is None else missing.last_read
    if now - last >= confirm_seconds / SPREAD_READS:
        return missing.since, reads + 1, now
    return missing.since, reads, last


def confirmable(missing: Missing, now: float, confirm_seconds: float) -> bool:
    """Whether this round's 404 read would confirm the deletion (then other sessions are read to
    compare, ``Missing.compared``): 404s for the whole period, by enough reads spread over it."""
    if confirm_seconds <= 0:
        return True
    since, reads, _ = counted(missing, now, confirm_seconds)
    return now - since >= confirm_seconds and reads >= SPREAD_READS


def refusal(found: trust.Refusal) -> Decision:
    """Leave a session alone that must not get a sandbox (L2)."""
    return Decision(Verdict.IGNORE, f"refused: {found.reason}", refused=found.kind)


class Routing(Protocol):
    """Which sessions this controller serves (L6): what ``config.RoutingSettings`` holds."""

    @property
    def workspace_directory(self) -> str: ...

    @property
    def agent_ids(self) -> tuple[str, ...]: ...

    @property
    def metadata_key(self) -> str | None: ...

    @property
    def metadata_value(self) -> str | None: ...


def not_ours(session: Session, routing: Routing) -> str | None:
    """Why a session is not this controller's business, or None when it is (L6)."""
    env = session.environment
    if not env.self_hosted:
        return f"environment type {env.type!r} is not self_hosted"
    if env.workspace_directory != routing.workspace_directory:
        return "workspace directory does not match"
    if routing.agent_ids and session.agent_id not in routing.agent_ids:
        return "agent is not one of the configured agent ids"
    if routing.metadata_key is not None and session.metadata.get(routing.metadata_key) != routing.metadata_value:
        return "metadata route does not match"
    return None


MARGIN_SECONDS = 1.0
"""Rechecks of "past a limit" deadlines look one timer resolution (``timers.RESOLUTION_SECONDS``)
after it: past it, not at it."""
PRESTART_WINDOW_SECONDS = 300
"""How new a session must be to be pre-started: a creation's job that waited longer (a backlog,
the sender's retries) is too late to be worth a sandbox nobody asked for yet."""
HELD_RECHECK_MAX_SECONDS = 3600.0
"""A held deletion is looked at again after as long as its session has answered 404, at most this."""
OUTAGE_LOOKS = 4
"""While the grace clock of an executor that had connected runs, its link is looked at this many
times per grace period (``_outage_look``): a reconnection between two drops is seen."""
CRASH_BACKOFF_SECONDS = 2.0
"""The crash loop's first back-off: a sandbox whose executor exited, the second time in a row, is
replaced this long after the look that found it exited; each exit in a row after that doubles it."""
CRASH_BACKOFF_MAX_SECONDS = 60.0
"""The crash loop's back-off at most: a loop whose cause passed (a key restored, the API back)
gets its executor within a minute of it, well inside the five minutes the API waits (L15); a
looping session costs one start a minute."""
CRASH_LOOP_RESET_SECONDS = 120.0
"""An executor seen connected that had been up this long is no longer in a crash loop: its next
exit is replaced at once (twice the longest back-off, as Kubernetes resets its own)."""
BLIND_SPOT_GRACES = 2
"""Blind spots (looks that could not read the link) restart an executor's grace clock, but an
outage first seen ``since`` is replaced by the first look that sees its link down at or after
``since + BLIND_SPOT_GRACES × grace``, whatever failed in between (L14): a wedged executor is
replaced within two graces and a look, well inside L15's five minutes for the default grace."""
FIRST_LOOK_SECONDS = 1.0
"""A new sandbox is looked at again this long after its start, then each time as long again as
its age, until a look sees its executor connected or its grace period is over."""


def decide(
    session: Session | None,
    record: Record | None,
    health: Health | None,
    connected: bool | None,
    now: float,
    grace_seconds: float,
    routing: Routing,
    max_lifetime_seconds: float | None = None,
    policy: trust.Policy = trust.DEFAULT_POLICY,
    idle_timeout_seconds: float = 0.0,
    retention_seconds: float = 0.0,
    prestart: bool = False,
    missing: Missing | None = None,
    deletion_confirm_seconds: float = 0.0,
    link_dropped: bool = False,
    cannot_start: CannotStart | None = None,
) -> Decision:
    """What to do about one session, from what was observed (pure).

    ``connected``: whether the executor holds its link (None: not looked at, or unknown);
    ``link_dropped``: the API reports the link ``disconnected`` (an executor held it and lost it).
    ``idle_timeout_seconds``: stop an idle session's sandbox this long after its last activity
    (0: keep warm). ``retention_seconds``: discard a stopped session's workspace this long
    after the stop (0: keep it until the session is deleted or fails). ``prestart``: the
    session's agent is one configured to pre-start (L9's eager mode): a session created less
    than ``PRESTART_WINDOW_SECONDS`` ago with no sandbox yet gets one before it asks.
    ``missing``: what is known of a session whose read answered 404 (``session`` is None);
    ``deletion_confirm_seconds``: how long its reads must answer 404 before it counts as deleted.
    ``cannot_start``: why the sandbox, still starting, cannot start, as its runner reads it (None:
    nothing known against it).
    """
    if session is None:
        gone = _deleted(record, missing or Missing(), now, deletion_confirm_seconds)
        if gone.verdict in (Verdict.KEEP, Verdict.IGNORE) and record is not None and _clock_runs(record):
            # A look that read no link (the session answered 404): a blind spot for the grace.
            gone = replace(gone, update=replace(record, link_unknown=True))
        return gone
    reason = not_ours(session, routing)
    if reason is not None:
        return Decision(Verdict.IGNORE, f"not ours: {reason}")
    if session.status is SessionStatus.FAILED:
        if record is not None:
            return Decision(Verdict.RELEASE, "session failed", cause=Cause.FAILED, gone=True)
        return Decision(Verdict.IGNORE, "session failed; no compute to release", gone=True)
    if record is not None and record.stopped:
        return _stopped(session, record, now, grace_seconds, retention_seconds, policy)
    deadline = (  # a restored sandbox's lifetime counts from its lineage's first start
        record.lifetime_started_at + max_lifetime_seconds if record is not None and max_lifetime_seconds else None
    )
    past_lifetime = deadline is not None and now > deadline
    lifetime_check = deadline + MARGIN_SECONDS if deadline is not None else None
    if not session.wants_connection:
        if record is None:
            if prestart and session.created_at and now - session.created_at <= PRESTART_WINDOW_SECONDS:
                return _cannot_start(session, policy) or Decision(
                    Verdict.START,
                    "pre-start: session just created; no sandbox",
                    recheck_at=now + FIRST_LOOK_SECONDS,
                    prestart=True,
                )
            return Decision(Verdict.IGNORE, "no environment_connection action pending")
        if health in (Health.GONE, Health.FAILED):
            decision = Decision(Verdict.STOP, f"sandbox is {health.value}; workspace kept", cause=Cause.FAILED)
        elif past_lifetime:
            decision = Decision(Verdict.STOP, "sandbox is past its maximum lifetime", cause=Cause.LIFETIME)
        else:
            looked = _looked(record, connected, now, grace_seconds, link_dropped)
            if record.prestarted and _used(session):
                looked = replace(looked or record, prestarted=False)
            current = looked or record
            decision = _idle(session, current, now, idle_timeout_seconds, lifetime_check)
            if decision.verdict is not Verdict.STOP:
                return replace(
                    decision,
                    update=looked,
                    recheck_at=earliest(
                        decision.recheck_at,
                        _first_look(current, now, grace_seconds),
                        _outage_look(current, now, grace_seconds),
                    ),
                )
        if retention_seconds > 0:  # a STOP's next look: the end of retention
            decision = replace(decision, recheck_at=now + retention_seconds)
        return decision
    cannot = _cannot_start(session, policy)
    if cannot is not None:
        return cannot
    first_look = now + FIRST_LOOK_SECONDS  # a new sandbox is looked at again soon (``_first_look``)
    if record is None:
        return Decision(Verdict.START, "connection requested; no sandbox", recheck_at=first_look)
    replaced = Cause.REPLACED
    if record.environment_id != session.environment.id:
        return Decision(Verdict.REPLACE, "sandbox serves another environment id", cause=replaced, recheck_at=first_look)
    if health in (Health.GONE, Health.FAILED):
        return _exited(record, health, now)
    if health in (Health.TERMINATING, None):
        return Decision(
            Verdict.REPLACE,
            f"sandbox is {health.value if health else 'unknown'}",
            cause=replaced,
            recheck_at=first_look,
        )
    if past_lifetime:  # a connection is wanted: a new sandbox, never a release with nothing started
        return Decision(
            Verdict.REPLACE,
            "sandbox is past its maximum lifetime; connection requested",
            cause=Cause.LIFETIME,
            recheck_at=first_look,
        )
    looked = _looked(record, connected, now, grace_seconds, link_dropped, asked=True)
    if record.prestarted:  # asked for: it no longer counts against the pre-start budget
        looked = replace(looked or record, prestarted=False)
    current = looked or record
    early = earliest(_first_look(current, now, grace_seconds), _outage_look(current, now, grace_seconds))
    if connected:
        soon = earliest(lifetime_check, now + grace_seconds + MARGIN_SECONDS)
        if current.crashes and now - current.started_at >= CRASH_LOOP_RESET_SECONDS:  # it stayed up: over
            looked = replace(current, crashes=0)
        return Decision(Verdict.KEEP, "executor is connected", recheck_at=soon, update=looked)
    if cannot_start is not None and health is Health.STARTING:
        return _unstartable(current, looked, cannot_start, now, grace_seconds, lifetime_check)
    if current.cannot_start_since is not None:  # it can start now: its grace counts from this look
        looked = current = replace(current, cannot_start_since=None, disconnected_at=now)
    since = current.disconnected_at
    bound = _bound(current, grace_seconds)
    if connected is None and bound is not None and now >= bound and current.down_since is not None:
        return Decision(
            Verdict.REPLACE,
            f"executor not seen connected for {now - current.down_since:.0f}s since the API asked for a "
            f"connection, and looks could not read its link (at most {BLIND_SPOT_GRACES} graces of "
            f"{grace_seconds:g}s)",
            cause=replaced,
            recheck_at=first_look,
        )
    if connected is None or since is None:  # the link state is unknown (API error): not yet a reason to replace
        return Decision(
            Verdict.KEEP,
            "executor link state unknown; looking again later",
            recheck_at=earliest(
                lifetime_check,
                early,
                now + grace_seconds + MARGIN_SECONDS,
                None if bound is None else bound + MARGIN_SECONDS,
            ),
            update=looked,
        )
    if bound is not None and now >= bound:
        down = now - current.down_since if current.down_since is not None else 0.0
        return Decision(
            Verdict.REPLACE,
            f"executor not connected for {down:.0f}s since the first look that saw it down, through looks "
            f"that could not read its link (at most {BLIND_SPOT_GRACES} graces of {grace_seconds:g}s)",
            cause=replaced,
            recheck_at=first_look,
        )
    if now - since <= grace_seconds:
        return Decision(
            Verdict.KEEP,
            "sandbox is up; executor reconnects by itself",
            recheck_at=earliest(
                lifetime_check,
                early,
                since + grace_seconds + MARGIN_SECONDS,
                None if bound is None else bound + MARGIN_SECONDS,
            ),
            update=looked,
        )
    return Decision(
        Verdict.REPLACE,
        f"executor not connected for {now - since:.0f}s, past the grace period ({grace_seconds:g}s)",
        cause=replaced,
        recheck_at=first_look,
    )


def _unstartable(
    record: Record,
    looked: Record | None,
    found: CannotStart,
    now: float,
    grace_seconds: float,
    lifetime_check: float | None,
) -> Decision:
    """A sandbox that cannot start (its pod's node lacks its seccomp profile) while a connection
    is wanted: kept, not replaced, whatever its grace period says — a new one could not start
    either, and replacing it again and again would only churn pods; the scheduler places it, or
    the kubelet starts its container, by itself once the profile is there. Reported by the look
    that first finds it (``Decision.cannot_start``); looked at again every grace period, so
    ``explain`` and the latest decision stay current and the first look after the cause is gone
    starts its grace clock afresh. ``record``: as this look found it (``looked``, when the look
    changed it)."""
    since = record.cannot_start_since
    return Decision(
        Verdict.KEEP,
        f"sandbox cannot start: {found.reason}; kept, not replaced (a new one could not start either)"
        + ("" if since is None else f"; for {now - since:.0f}s"),
        recheck_at=earliest(lifetime_check, now + max(grace_seconds, FIRST_LOOK_SECONDS)),
        update=replace(record, cannot_start_since=now) if since is None else looked,
        cannot_start=found if since is None else None,
    )


def crash_backoff(crashes: int) -> float:
    """How long the ``crashes``-th exit in a row waits before its sandbox is replaced: the first
    not at all (one crash, an OOM kill, is replaced at once), then ``CRASH_BACKOFF_SECONDS``,
    doubling, at most ``CRASH_BACKOFF_MAX_SECONDS``."""
    if crashes <= 1:
        return 0.0
    return min(CRASH_BACKOFF_SECONDS * 2.0 ** min(crashes - 2, 30), CRASH_BACKOFF_MAX_SECONDS)


def _exited(record: Record, health: Health, now: float) -> Decision:
    """A sandbox whose executor exited (or that is gone) while a connection is wanted (L14): replaced,
    at once when it is the first exit in a row, else once the crash loop's back-off is over
    (``crash_backoff``; Kubernetes' CrashLoopBackOff). The count and the back-off's end live in the
    record (``Record.crashes``, ``Record.backoff_until``), so every worker honours them; an executor
    that stayed up and connected for ``CRASH_LOOP_RESET_SECONDS`` starts the count again."""
    replaced = Cause.REPLACED
    first_look = now + FIRST_LOOK_SECONDS
    if record.backoff_until is not None:  # this exit was counted: its back-off runs or is over
        if now < record.backoff_until:
            return Decision(
                Verdict.KEEP,
                f"crash loop back-off: executor exited {record.crashes} times in a row; next start in "
                f"{record.backoff_until - now:.0f}s",
                recheck_at=record.backoff_until,
            )
        return Decision(
            Verdict.REPLACE,
            f"sandbox is {health.value}; crash loop back-off over (restart {record.crashes})",
            cause=replaced,
            recheck_at=first_look,
            update=replace(record, backoff_until=None),
        )
    stayed_up = record.seen_connected and now - record.started_at >= CRASH_LOOP_RESET_SECONDS
    crashes = 1 if stayed_up else record.crashes + 1
    wait = crash_backoff(crashes)
    if wait <= 0:
        return Decision(
            Verdict.REPLACE,
            f"sandbox is {health.value}",
            cause=replaced,
            recheck_at=first_look,
            update=replace(record, crashes=crashes),
        )
    return Decision(
        Verdict.KEEP,
        f"crash loop back-off: executor exited {crashes} times in a row; next start in {wait:g}s",
        recheck_at=now + wait,
        update=replace(record, crashes=crashes, backoff_until=now + wait),
        crash_loop=True,
    )


def _looked(
    record: Record,
    connected: bool | None,
    now: float,
    grace_seconds: float,
    dropped: bool = False,
    asked: bool = False,
) -> Record | None:
    """The record after a look at the executor's link, or None when the look changes nothing.

    Seen connected: the grace clock stops (and the sandbox has been seen connected). Seen not
    connected with no clock running: the clock starts now. A new sandbox's clock runs from its
    start until a look sees it connected; when a look finds the link dropped instead (the
    executor connected and lost it between two looks), the clock starts again at that look,
    as for any drop. Not looked at: as it was. A look that could not read the link while the
    clock of an executor that had connected runs is noted (``link_unknown``): the link may have
    come back unseen, so the next look that sees it down starts the clock again, and the grace
    measures an outage seen from its start, never one pieced together across a blind spot. A
    look that sees it down longer than ``_blind_gap`` after the last one did (its reads were
    retried through an API incident, say) is such a blind spot too: the clock starts again. The
    outage's first sighting (``Record.down_since``) stays through those restarts, until a look
    sees the link up: it bounds them (``_bound``). A look that could not read the link of an
    executor that had connected, with no clock running, while the API asks for a connection
    (``asked``: the API's own word that no executor is connected) starts the clock as a blind
    spot: the request is the outage's first sighting, so an executor whose link no look can
    read is still replaced within the bound."""
    if connected is True:  # (``down_since`` is None whenever ``disconnected_at`` is)
        if record.disconnected_at is None and record.seen_connected and not record.link_unknown:
            return None
        record = replace(record, down_since=None)  # the outage is over: seen up
        return replace(record, disconnected_at=None, seen_connected=True, link_unknown=False, link_looked_at=None)
    if connected is False and dropped and not record.seen_connected:
        return replace(record, disconnected_at=now, seen_connected=True, link_looked_at=now, down_since=now)
    if connected is False and record.disconnected_at is None:
        return replace(record, disconnected_at=now, link_unknown=False, link_looked_at=now, down_since=now)
    if connected is False and record.link_unknown:  # a blind spot: the clock starts again, the outage goes on
        return replace(record, disconnected_at=now, link_unknown=False, link_looked_at=now, down_since=_down(record))
    if connected is False and _clock_runs(record):
        last = record.link_looked_at if record.link_looked_at is not None else record.disconnected_at
        if last is not None and now - last > _blind_gap(grace_seconds):
            return replace(record, disconnected_at=now, link_looked_at=now, down_since=_down(record))
        return replace(record, link_looked_at=now)
    if connected is None and _clock_runs(record):
        return replace(record, link_unknown=True)
    if connected is None and asked and record.seen_connected and not record.stopped and record.disconnected_at is None:
        return replace(record, disconnected_at=now, link_unknown=True, link_looked_at=now, down_since=now)
    return None


def _down(record: Record) -> float | None:
    """When the outage whose grace clock a blind spot restarts was first seen (``Record.down_since``;
    for a record from before it was kept, or a new sandbox's clock, when its clock started)."""
    if not record.seen_connected:
        return None  # a new sandbox's clock runs from its start: no blind spot moves it
    return record.down_since if record.down_since is not None else record.disconnected_at


def _bound(record: Record, grace_seconds: float) -> float | None:
    """When blind spots stop delaying the replacement of an executor whose link is down: the
    grace clock may be restarted by blind spots, but only up to ``BLIND_SPOT_GRACES`` graces
    after the first look that saw this outage (``Record.down_since``). None: no such outage."""
    if not record.seen_connected or record.down_since is None:
        return None
    return record.down_since + BLIND_SPOT_GRACES * grace_seconds


def _blind_gap(grace_seconds: float) -> float:
    """The longest wait between two looks that see a link down over which the outage still
    counts as one: two of the looks' intervals (``_outage_look``), so a look late by up to one
    interval (a busy queue, the timers' resolution) still continues the clock."""
    return 2 * max(FIRST_LOOK_SECONDS, grace_seconds / OUTAGE_LOOKS)


def unread(record: Record | None) -> Record | None:
    """The record after a round that could not read the session at all (the API answered 5xx or
    429, or did not answer in time): like a look that could not read the link, a blind spot for
    the grace clock when it runs (``Record.link_unknown``), so the next look that sees the link
    down starts the clock again. None: nothing to note (no clock runs, or it is noted already).
    The clock is only ever restarted by a look that sees the link down, so an executor really
    gone is still replaced a grace after the first look that reads again, and at the latest by
    the first look that reads it down ``BLIND_SPOT_GRACES`` graces after its outage was first
    seen (``_bound``), however often the API fails in between."""
    if record is None or not _clock_runs(record):
        return None
    return replace(record, link_unknown=True)


def _clock_runs(record: Record) -> bool:
    """Whether the grace clock of an active sandbox whose executor had connected runs, with no
    blind spot noted yet (``Record.link_unknown``)."""
    return (
        not record.stopped and record.seen_connected and record.disconnected_at is not None and not record.link_unknown
    )


def _first_look(record: Record, now: float, grace_seconds: float) -> float | None:
    """When to look again at a new sandbox whose executor no look has seen connected yet: one
    ``FIRST_LOOK_SECONDS`` after its start, then each time as long again as its age, until its
    grace period is over (then the grace decides). None once it was seen connected."""
    if record.seen_connected or record.disconnected_at is None:
        return None
    end = record.started_at + grace_seconds + MARGIN_SECONDS
    if now >= end:
        return None
    return min(now + max(FIRST_LOOK_SECONDS, now - record.started_at), end)


def _outage_look(record: Record, now: float, grace_seconds: float) -> float | None:
    """While the link of an executor that had connected is down (its grace clock runs, and is
    within the grace), when to look again: every ``grace / OUTAGE_LOOKS`` (at least
    ``FIRST_LOOK_SECONDS``), so a look sees the link come back between two drops and the grace
    measures one continuous outage, not the time since the first of several short ones. None
    otherwise."""
    since = record.disconnected_at
    if not record.seen_connected or since is None or now - since > grace_seconds:
        return None
    return now + max(FIRST_LOOK_SECONDS, grace_seconds / OUTAGE_LOOKS)


def _used(session: Session) -> bool:
    """Whether a pre-started session has been used (input came: a turn ran or was asked for)."""
    if session.status in (SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION) or session.wants_connection:
        return True
    return session.last_active_at is not None and session.last_active_at > session.created_at


def _deleted(record: Record | None, missing: Missing, now: float, confirm_seconds: float) -> Decision:
    """A session whose read answered 404 (L7, L17): deleted only once every read of it over
    ``confirm_seconds`` answered 404 (at least ``SPREAD_READS`` reads spread over the period, the
    last at or after its end; a read that finds it starts over) and some of the other sessions
    read to confirm it answer; until then its sandbox and workspace stay. A single 404, two
    404s with a readable session between them, or a wrong key, project or base URL (every read
    answers 404, however few sessions are mapped) destroys nothing. An operator's release
    (``Missing.release_asked``) ends a hold."""
    since, reads, last = counted(missing, now, confirm_seconds)
    kept = Verdict.KEEP if record is not None and not record.stopped else Verdict.IGNORE
    waited = now - since
    if missing.release_asked is not None and missing.since is not None:
        reason = "released by an operator (sandbox-controller release); the session answers 404"
        if record is not None:
            return Decision(Verdict.RELEASE, reason, cause=Cause.DELETED, gone=True)
        return Decision(Verdict.IGNORE, reason, gone=True)
    if not confirmable(missing, now, confirm_seconds):
        # The next read: spread (half the period after the last counted one), and the last one
        # past the period's end.
        end = since + confirm_seconds + MARGIN_SECONDS
        next_read = last + confirm_seconds / 2 if reads < SPREAD_READS else end
        if reads == SPREAD_READS - 1:
            next_read = max(next_read, end)
        return Decision(
            kept,
            f"session not found (404) for {waited:.0f}s ({reads} of {SPREAD_READS} spread reads); "
            f"deleted only after {confirm_seconds:g}s of 404s",
            recheck_at=next_read,
            missing_since=since,
            missing_reads=(reads, last),
        )
    # 0 turns the confirmation off (an operator's choice, and the tests' default): the first
    # 404 counts, and only sessions compared that answer 404 too hold it.
    if _most_missing(missing) if confirm_seconds > 0 else (missing.compared and _most_missing(missing)):
        read = missing.compared + 1
        if missing.compared == 0:
            evidence = "no other session to compare with (every session read answers 404)"
        else:
            evidence = (
                f"{missing.not_found + 1} of {read} sessions read answer 404 "
                f"({missing.compared - missing.found - missing.not_found} unknown)"
            )
        return Decision(
            kept,
            f"deletion held: {evidence}; a wrong CONTROLLER_API_KEY (another project) or "
            "CONTROLLER_API_BASE_URL? Check with `sandbox-controller check-config --session SESSION_ID`; "
            "if it was deleted, `sandbox-controller release SESSION_ID`",
            # Looked at again after as long as it has answered 404 (at most HELD_RECHECK_MAX_SECONDS):
            # a wrong key must not turn every mapped session into reads every minute.
            recheck_at=now + min(max(confirm_seconds, waited, MARGIN_SECONDS), HELD_RECHECK_MAX_SECONDS),
            held=True,
            missing_since=since,
            missing_reads=(reads, last),
        )
    if record is not None:
        return Decision(Verdict.RELEASE, "session was deleted", cause=Cause.DELETED, gone=True)
    return Decision(Verdict.IGNORE, "session was deleted", gone=True)


def _most_missing(missing: Missing) -> bool:
    """Whether the sessions read to confirm a deletion (this one included) mostly answered 404,
    or none of the others could be read, or there was none to read: no evidence that the API
    sees our sessions (one mapped session alone is no evidence either)."""
    if missing.found == 0:
        return True
    return 2 * (missing.not_found + 1) > missing.found + missing.not_found + 1


def _cannot_start(session: Session, policy: trust.Policy) -> Decision | None:
    """Why a session asking for a connection must not get a sandbox, or None when it may."""
    if session.environment.id is None or not session.environment.remote_url:
        return Decision(Verdict.IGNORE, "session lists no environment id or remote url")
    refused = trust.untrusted(session, policy)
    if refused is not None:  # L2: before anything could start or replace a sandbox
        return refusal(refused)
    return None


def _idle(session: Session, record: Record, now: float, timeout: float, lifetime_check: float | None) -> Decision:
    """A running sandbox whose session wants no connection: stop it only when the session is
    idle, and has been for the whole timeout (L11, L12); never while it works."""
    if timeout <= 0:
        return Decision(
            Verdict.IGNORE, "no environment_connection action pending; kept warm", recheck_at=lifetime_check
        )
    since = max(float(session.last_active_at or 0), record.started_at)
    if session.status is SessionStatus.IDLE:
        if now - since >= timeout:
            return Decision(Verdict.STOP, f"idle for {now - since:.0f}s (idle timeout {timeout:g}s)", cause=Cause.IDLE)
        return Decision(
            Verdict.IGNORE,
            "no environment_connection action pending; idle within the timeout",
            recheck_at=earliest(since + timeout, lifetime_check),
        )
    return Decision(
        Verdict.IGNORE,
        f"no environment_connection action pending; session is {session.status.value}, never stopped",
        recheck_at=earliest(now + timeout, lifetime_check),
    )


def _stopped(
    session: Session, record: Record, now: float, grace_seconds: float, retention: float, policy: trust.Policy
) -> Decision:
    """A session whose sandbox was stopped with its workspace kept (L16)."""
    assert record.stopped_at is not None
    if session.wants_connection:
        cannot = _cannot_start(session, policy)
        if cannot is not None:
            return cannot
        return Decision(
            Verdict.START,
            "connection requested; starting on the kept workspace",
            recheck_at=now + FIRST_LOOK_SECONDS,
        )
    if retention <= 0:
        return Decision(Verdict.IGNORE, "stopped; workspace kept until the session is deleted or fails")
    if now - record.stopped_at >= retention:
        return Decision(Verdict.DISCARD, f"stopped {now - record.stopped_at:.0f}s ago; workspace retention is over")
    return Decision(
        Verdict.IGNORE, "stopped; workspace kept for its retention", recheck_at=record.stopped_at + retention
    )


def earliest(*times: float | None) -> float | None:
    """The earliest of the given times, ignoring None; None when there is none."""
    present = [t for t in times if t is not None]
    return min(present) if present else None
