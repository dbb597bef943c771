"""Decisions about one session's sandbox, and the loop that carries them out.

``decide`` is a plain function of what was observed (session, stored record, sandbox
health, executor link) and the time; it returns a ``Decision``. ``work`` runs the
coalesced loop for one session under its lease: observe → decide → act, fenced, until no
more work is wanted. Everything with side effects sits behind the protocols passed in
``Deps`` (sessions API, store, runner, clock), so tests use fakes and a fake clock.

Rules: L1 (one sandbox per session), L6 (routing), L7 (look before acting), L8 (the
executor dials out with the session's environment id), L9/L10 (only an
environment_connection action starts compute), L14 (reconnect, don't duplicate), L2 (the
executor key goes only to an allowed ``remote_url``; ids are checked before they reach an
argument list, a path or a label: ``trust.py``). A refused session is logged, counted through
``Deps.on_refusal`` and left alone.

Stopping (L11–L13, L16): a running sandbox whose session is ``idle``, lists no
environment_connection action and has not been active for the idle timeout is STOPped: the
sandbox goes, its workspace and a stopped mapping stay, and the next connection request
STARTs a new sandbox on that workspace; DISCARD removes the workspace once its retention is
over. The decision is made only from a fresh read under the lease, never from an event.
Every decision says when to look again (``Decision.recheck_at``: idle deadline, end of the
executor's grace period, maximum lifetime, end of retention), and ``act`` arms that as the
session's durable timer, fenced (``controller.timers``).

The executor's grace period (L14) counts only while its link is down: it starts at the first
look that sees the executor not connected (for a new sandbox: at its start, until a look first
sees it connected, and such a sandbox is looked at again soon after its start) and is cleared
by any look that sees it connected, whatever the session is doing. A session whose read
answers 404 counts as deleted only once its reads have answered 404 for the deletion
confirmation period, and only when most of the sessions read to confirm it answer; until then
its sandbox and workspace stay (``Missing``).

One clock: each round reads the time once from ``Deps.clock`` (the workers use Redis's ``TIME``,
the clock timers fall due on), and every time it decides or stores comes from that reading, so
a worker whose own clock is off neither stops early nor spins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from controller import logs, timers, trust
from controller.clock import Clock
from controller.config import RoutingSettings
from controller.errors import ApiRejected, ApiUnavailable, Fenced, Permanent
from controller.heartbeat import Heartbeat
from controller.model import Handle, Health, Record, SandboxSpec, Session, SessionStatus
from controller.runners.base import Runner
from controller.store.base import Busy, Lease, SessionStore

log = logs.get(__name__)


class Sessions(Protocol):
    """The Agents API as decisions need it (adapter: ``sessions.HttpSessions``)."""

    def get(self, session_id: str) -> Session | None:
        """The session, or None when it was deleted (404)."""
        ...

    def environment_connected(self, environment_id: str) -> bool | None:
        """Whether an executor holds the environment's link; None when unknown."""
        ...


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
    """The record as it should be stored after this decision, when it changed (KEEP, IGNORE)."""
    missing_since: float | None = None
    """When the session's reads began answering 404, kept until its deletion is confirmed (or
    it is found again: None clears it)."""
    gone: bool = False
    """The session is deleted (confirmed) or failed: its workspace is of no use any more (L16)."""
    held: bool = False
    """A deletion that would be confirmed was held because most sessions read answer 404 (a
    wrong API key, project or base URL): nothing is released while that lasts."""
    prestart: bool = False
    """A START before anything asked for the sandbox (L9's pre-start): it needs room in the
    pre-start budget (``CONTROLLER_PRESTART_MAX_SANDBOXES``), taken when it is carried out."""


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


def refusal(found: trust.Refusal) -> Decision:
    """Leave a session alone that must not get a sandbox (L2)."""
    return Decision(Verdict.IGNORE, f"refused: {found.reason}", refused=found.kind)


Routing = RoutingSettings
"""Which sessions this controller serves (L6): the routing settings, as parsed."""


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


MARGIN_SECONDS = timers.RESOLUTION_SECONDS
"""Rechecks of "past a limit" deadlines look one timer resolution after it (past, not at)."""
PRESTART_WINDOW_SECONDS = 300
"""How new a session must be to be pre-started: a creation's job that waited longer (a backlog,
the sender's retries) is too late to be worth a sandbox nobody asked for yet."""
HELD_RECHECK_MAX_SECONDS = 3600.0
"""A held deletion is looked at again after as long as its session has answered 404, at most this."""
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
) -> Decision:
    """What to do about one session, from what was observed (pure).

    ``connected``: whether the executor holds its link (None: not looked at, or unknown).
    ``idle_timeout_seconds``: stop an idle session's sandbox this long after its last activity
    (0: keep warm). ``retention_seconds``: discard a stopped session's workspace this long
    after the stop (0: keep it until the session is deleted or fails). ``prestart``: the
    session's agent is one configured to pre-start (L9's eager mode): a session created less
    than ``PRESTART_WINDOW_SECONDS`` ago with no sandbox yet gets one before it asks.
    ``missing``: what is known of a session whose read answered 404 (``session`` is None);
    ``deletion_confirm_seconds``: how long its reads must answer 404 before it counts as deleted.
    """
    if session is None:
        return _deleted(record, missing or Missing(), now, deletion_confirm_seconds)
    reason = not_ours(session, routing)
    if reason is not None:
        return Decision(Verdict.IGNORE, f"not ours: {reason}")
    if session.status is SessionStatus.FAILED:
        if record is not None:
            return Decision(Verdict.RELEASE, "session failed", cause=Cause.FAILED, gone=True)
        return Decision(Verdict.IGNORE, "session failed; no compute to release", gone=True)
    if record is not None and record.stopped:
        return _stopped(session, record, now, grace_seconds, retention_seconds, policy)
    deadline = record.started_at + max_lifetime_seconds if record is not None and max_lifetime_seconds else None
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
            looked = _looked(record, connected, now)
            if record.prestarted and _used(session):
                looked = replace(looked or record, prestarted=False)
            current = looked or record
            decision = _idle(session, current, now, idle_timeout_seconds, lifetime_check)
            if decision.verdict is not Verdict.STOP:
                return replace(
                    decision,
                    update=looked,
                    recheck_at=timers.earliest(decision.recheck_at, _first_look(current, now, grace_seconds)),
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
    if health in (Health.GONE, Health.FAILED, Health.TERMINATING, None):
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
    looked = _looked(record, connected, now)
    if record.prestarted:  # asked for: it no longer counts against the pre-start budget
        looked = replace(looked or record, prestarted=False)
    current = looked or record
    early = _first_look(current, now, grace_seconds)
    if connected:
        soon = timers.earliest(lifetime_check, now + grace_seconds + MARGIN_SECONDS)
        return Decision(Verdict.KEEP, "executor is connected", recheck_at=soon, update=looked)
    since = current.disconnected_at
    if connected is None or since is None:  # the link state is unknown (API error): never a reason to replace
        return Decision(
            Verdict.KEEP,
            "executor link state unknown; looking again later",
            recheck_at=timers.earliest(lifetime_check, early, now + grace_seconds + MARGIN_SECONDS),
            update=looked,
        )
    if now - since <= grace_seconds:
        return Decision(
            Verdict.KEEP,
            "sandbox is up; executor reconnects by itself",
            recheck_at=timers.earliest(lifetime_check, early, since + grace_seconds + MARGIN_SECONDS),
            update=looked,
        )
    return Decision(
        Verdict.REPLACE,
        f"executor not connected for {now - since:.0f}s, past the grace period ({grace_seconds:g}s)",
        cause=replaced,
        recheck_at=first_look,
    )


def _looked(record: Record, connected: bool | None, now: float) -> Record | None:
    """The record after a look at the executor's link, or None when the look changes nothing.

    Seen connected: the grace clock stops (and the sandbox has been seen connected). Seen not
    connected with no clock running: the clock starts now. Not looked at, or unknown: as it was."""
    if connected is True:
        if record.disconnected_at is None and record.seen_connected:
            return None
        return replace(record, disconnected_at=None, seen_connected=True)
    if connected is False and record.disconnected_at is None:
        return replace(record, disconnected_at=now)
    return None


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


def _used(session: Session) -> bool:
    """Whether a pre-started session has been used (input came: a turn ran or was asked for)."""
    if session.status in (SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION) or session.wants_connection:
        return True
    return session.last_active_at is not None and session.last_active_at > session.created_at


def _deleted(record: Record | None, missing: Missing, now: float, confirm_seconds: float) -> Decision:
    """A session whose read answered 404 (L7, L17): deleted only once its reads have answered 404
    for ``confirm_seconds`` and most of the other sessions read to confirm it answer; until
    then its sandbox and workspace stay. A single 404, or a wrong key, project or base URL
    (every read answers 404), destroys nothing."""
    since = missing.since if missing.since is not None else now
    kept = Verdict.KEEP if record is not None and not record.stopped else Verdict.IGNORE
    waited = now - since
    if waited < confirm_seconds:
        return Decision(
            kept,
            f"session not found (404) for {waited:.0f}s; deleted only after {confirm_seconds:g}s of 404s",
            recheck_at=since + confirm_seconds + MARGIN_SECONDS,
            missing_since=since,
        )
    if missing.compared and _most_missing(missing):
        read = missing.compared + 1
        return Decision(
            kept,
            f"deletion held: {missing.not_found + 1} of {read} sessions read answer 404 "
            f"({missing.compared - missing.found - missing.not_found} unknown); "
            "a wrong CONTROLLER_API_KEY (another project) or CONTROLLER_API_BASE_URL?",
            # Looked at again after as long as it has answered 404 (at most HELD_RECHECK_MAX_SECONDS):
            # a wrong key must not turn every mapped session into reads every minute.
            recheck_at=now + min(max(confirm_seconds, waited, MARGIN_SECONDS), HELD_RECHECK_MAX_SECONDS),
            missing_since=since,
            held=True,
        )
    if record is not None:
        return Decision(Verdict.RELEASE, "session was deleted", cause=Cause.DELETED, gone=True)
    return Decision(Verdict.IGNORE, "session was deleted", gone=True)


def _most_missing(missing: Missing) -> bool:
    """Whether the sessions read to confirm a deletion (this one included) mostly answered 404,
    or none of the others could be read at all: no evidence that the API sees our sessions."""
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
            recheck_at=timers.earliest(since + timeout, lifetime_check),
        )
    return Decision(
        Verdict.IGNORE,
        f"no environment_connection action pending; session is {session.status.value}, never stopped",
        recheck_at=timers.earliest(now + timeout, lifetime_check),
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


def spec_for(session: Session, template: str | None = None) -> SandboxSpec:
    env = session.environment
    assert env.id is not None and env.remote_url is not None
    return SandboxSpec(
        session_id=session.id,
        environment_id=env.id,
        remote_url=env.remote_url,
        workspace_directory=env.workspace_directory,
        template=template,
    )


@dataclass
class Deps:
    sessions: Sessions
    store: SessionStore
    runner: Runner
    clock: Clock
    """The one clock every time-based decision reads, once per round (the workers: Redis's ``TIME``)."""
    routing: Routing = field(default_factory=Routing)
    grace_seconds: float = 60.0
    max_lifetime_seconds: float | None = None
    on_decision: Callable[[str, Decision], None] = lambda session_id, decision: None
    trust_policy: trust.Policy = trust.DEFAULT_POLICY
    on_refusal: Callable[[str], None] = lambda kind: None
    """Called with ``Decision.refused`` for each refusal (the worker counts them in a metric)."""
    choose_template: Callable[[Session], str | None] = lambda session: None
    renew_every_seconds: float | None = None
    """Renew the lease this often while working (a third of its TTL); None: never."""
    idle_timeout_seconds: float = 0.0
    """Stop an idle session's sandbox this long after its last activity; 0: keep warm (L11)."""
    retention_seconds: float = 0.0
    """Discard a stopped session's workspace this long after the stop; 0: keep it (L16)."""
    on_stop: Callable[[str], None] = lambda cause: None
    """Called with ``Decision.cause`` for each sandbox stopped, released or replaced (metrics)."""
    prestarts_agent: Callable[[str | None], bool] = lambda agent_id: False
    """Whether sessions of this agent are pre-started (``LifecycleSettings.prestarts_agent``)."""
    prestart_max_sandboxes: int = 10
    """Pre-started sandboxes not yet used, at most (``CONTROLLER_PRESTART_MAX_SANDBOXES``)."""
    on_prestart_skipped: Callable[[], None] = lambda: None
    """Called for each creation that started nothing because the pre-start budget was used up."""
    deletion_confirm_seconds: float = 0.0
    """How long a session's reads must answer 404 before it counts as deleted; 0: at once."""
    compare_sessions: int = 3
    """Other mapped sessions read to confirm a deletion (``Missing``)."""
    on_held: Callable[[], None] = lambda: None
    """Called for each deletion held because most sessions read answer 404 (a metric)."""


def work(session_id: str, deps: Deps) -> list[Decision] | Busy:
    """Work one session until nothing more is wanted. Busy: another worker holds it.

    The lease is renewed while the work runs (``renew_every_seconds``). On any failure the
    lease is released and the work stays wanted, for the task's retry or the scheduler's
    recovery pass; only a ``Permanent`` failure marks the round done (given up, logged by
    the caller), so a session that can never succeed is not retried forever.
    """
    taken = deps.store.acquire(session_id)
    if taken is None or isinstance(taken, Busy):
        return [] if taken is None else taken
    lease: Lease | None = taken
    decisions = []
    with _renewing(taken, deps) as beat:
        try:
            while lease is not None:
                decisions.append(act(lease, deps))
                with beat.paused():
                    lease = deps.store.complete(lease)
                    if lease is None:
                        beat.stop()
        except Permanent:
            if lease is not None:
                with beat.paused():
                    beat.stop()
                    _give_up(lease, deps)
            raise
        except BaseException:
            if lease is not None:
                with beat.paused():
                    beat.stop()
                    deps.store.abandon(lease)
            raise
    return decisions


def _renewing(lease: Lease, deps: Deps) -> Heartbeat:
    # An interval of 0/None disables renewal (fakes and tests with a fake clock).
    return Heartbeat(deps.store, lease, deps.renew_every_seconds or 0.0)


def _give_up(lease: Lease, deps: Deps) -> None:
    """Mark this round done without success; later deliveries still get their own round."""
    try:
        again = deps.store.complete(lease)
        if again is not None:
            deps.store.abandon(again)
    except Fenced:
        pass  # someone else holds the session now: the round is theirs


@dataclass(frozen=True)
class Observation:
    """What a round sees of one session before it decides (``observe``)."""

    session: Session | None
    record: Record | None
    adopted: bool
    """``record`` stands for a sandbox found without one (``act`` then records it)."""
    health: Health | None
    connected: bool | None
    now: float
    """The round's one reading of the clock: everything it decides and stores uses it."""
    missing: Missing | None = None
    """What is known of a session whose read answered 404 (None: it was found)."""


def observe(sid: str, deps: Deps) -> Observation:
    """Read the clock, the session, its record (or a live sandbox nobody recorded: adopted, not
    duplicated), the sandbox's health and, when it matters, whether its executor is connected:
    while a connection is wanted, and while its grace clock runs (to stop it once the executor
    is seen connected, whatever the session is doing). For a session that answered 404, when
    its deletion would be confirmed, read a few other mapped sessions to compare (``Missing``)."""
    now = deps.clock.now()
    session = deps.sessions.get(sid)
    record = deps.store.record(sid)
    adopted = False
    if record is None:
        found = deps.runner.find(sid)
        if found is not None:
            record = Record(sid, found.environment_id, found, found.created_at or now)
            adopted = True
    health = deps.runner.status(record.handle) if record else None
    connected = None
    if (
        record is not None
        and session is not None
        and not record.stopped
        and health in (Health.RUNNING, Health.STARTING)
        and (session.wants_connection or record.disconnected_at is not None)
    ):
        connected = deps.sessions.environment_connected(record.environment_id)
    missing = _missing(sid, deps, now) if session is None else None
    return Observation(session, record, adopted, health, connected, now, missing)


def _missing(sid: str, deps: Deps, now: float) -> Missing:
    """What is known of a session that answered 404: since when, and, once its deletion would be
    confirmed, how other mapped sessions answer now (reads only; none is changed)."""
    since = deps.store.missing_since(sid)
    if now - (now if since is None else since) < deps.deletion_confirm_seconds:
        return Missing(since)
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
    return Missing(since, compared=len(others), found=found, not_found=not_found)


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
    )


def act(lease: Lease, deps: Deps) -> Decision:
    """One round: observe, decide, then act under the lease (fenced)."""
    sid = lease.session_id
    if not trust.valid_id(sid):  # L2: a malformed id reaches no URL, path, label or argument list
        decision = refusal(trust.Refusal(trust.SESSION_ID, "session id does not match the id pattern"))
        with logs.bind(session_id=trust.printable(sid)):
            _refused(decision, deps)
        return decision
    seen = observe(sid, deps)
    session = seen.session
    decision = decide_observed(seen, deps)
    environment_id = session.environment.id if session else None
    if environment_id is not None and not trust.valid_id(environment_id):
        environment_id = trust.printable(environment_id)  # logged, escaped and cut short, never used
    with logs.bind(session_id=sid, environment_id=environment_id):
        if decision.prestart and not deps.store.reserve_prestart(lease, deps.prestart_max_sandboxes):
            decision = _budget_used(decision, deps)
        log.info(
            "session looked up",
            extra={
                "status": session.status.value if session else "not found",
                "verdict": decision.verdict.value,
                "reason": decision.reason,
                "recheck_at": decision.recheck_at,
            },
        )
        deps.on_decision(sid, decision)
        if decision.refused is not None:
            _refused(decision, deps)
            return decision
        if decision.held:
            log.error(
                "deletions held",
                extra={"reason": decision.reason, "missing_since": decision.missing_since},
            )
            deps.on_held()
        _carry_out(lease, decision, seen, deps)
        deps.store.arm(lease, decision.recheck_at, decision.missing_since)  # fenced: follows the latest decision
    return decision


def _budget_used(decision: Decision, deps: Deps) -> Decision:
    """A pre-start the budget has no room for: nothing starts (a connection request later will)."""
    skipped = Decision(
        Verdict.IGNORE,
        f"pre-start skipped: {deps.prestart_max_sandboxes} pre-started sandboxes are waiting to be used",
    )
    log.warning("pre-start skipped", extra={"reason": skipped.reason, "limit": deps.prestart_max_sandboxes})
    deps.on_prestart_skipped()
    return skipped


def _carry_out(lease: Lease, decision: Decision, seen: Observation, deps: Deps) -> None:
    sid = lease.session_id
    session, record, now = seen.session, seen.record, seen.now
    if decision.verdict in (Verdict.START, Verdict.REPLACE):
        assert session is not None
        stopping = record is not None and not record.stopped
        _start(lease, session, record, now, decision.prestart, deps)
        if stopping and decision.cause is not None:
            assert record is not None
            _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.RELEASE:
        assert record is not None
        deps.store.check(lease)
        deps.runner.release(record.handle)
        deps.runner.discard(sid)  # L16: the workspace goes with the session, not before
        deps.store.forget(lease)
        log.info("sandbox released", extra={"sandbox": record.handle.name})
        if not record.stopped:
            _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.STOP:
        assert record is not None and session is not None
        deps.store.check(lease)
        deps.runner.release(record.handle)  # the sandbox goes; its workspace stays (L16)
        deps.store.save(lease, replace(record, stopped_at=now, disconnected_at=None, prestarted=False))
        _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.DISCARD:
        assert record is not None
        deps.store.check(lease)
        deps.runner.discard(sid)
        deps.store.forget(lease)
        log.info("workspace discarded", extra={"sandbox": record.handle.name})
    elif record is None and decision.gone and deps.runner.keeps_workspace(sid):
        deps.runner.discard(sid)  # a workspace kept after its sandbox went (L16)
    elif decision.update is not None or (decision.verdict is Verdict.KEEP and seen.adopted):
        assert record is not None
        deps.store.save(lease, decision.update or record)
        if seen.adopted:
            log.info("sandbox adopted", extra={"sandbox": record.handle.name})


def _stopped_log(decision: Decision, session: Session | None, record: Record, deps: Deps) -> None:
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


def _refused(decision: Decision, deps: Deps) -> None:
    assert decision.refused is not None
    log.warning("session refused", extra={"refused": decision.refused, "reason": decision.reason})
    deps.on_refusal(decision.refused)


def _start(lease: Lease, session: Session, record: Record | None, now: float, prestart: bool, deps: Deps) -> Handle:
    generation = record.handle.generation + 1 if record else 1
    deps.store.check(lease)  # fenced: a worker that lost its lease must not act
    if record is not None:
        deps.runner.release(record.handle)  # never two live sandboxes: the old one goes first
    spec = spec_for(session, deps.choose_template(session))
    handle = deps.runner.ensure(spec, generation)
    deps.store.save(
        lease,
        Record(
            session_id=session.id,
            environment_id=spec.environment_id,
            handle=handle,
            started_at=now,
            disconnected_at=now,  # not seen connected yet: the grace period starts now
            prestarted=prestart,
        ),
    )
    log.info("sandbox started", extra={"sandbox": handle.name, "generation": handle.generation})
    return handle
