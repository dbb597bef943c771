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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from controller import logs, timers, trust
from controller.clock import Clock
from controller.config import RoutingSettings
from controller.errors import Fenced, Permanent
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
    """The record as it should be stored after this decision, when it changed (KEEP)."""


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
) -> Decision:
    """What to do about one session, from what was observed (pure).

    ``idle_timeout_seconds``: stop an idle session's sandbox this long after its last activity
    (0: keep warm). ``retention_seconds``: discard a stopped session's workspace this long
    after the stop (0: keep it until the session is deleted or fails). ``prestart``: the
    session's agent is one configured to pre-start (L9's eager mode): a session created less
    than ``PRESTART_WINDOW_SECONDS`` ago with no sandbox yet gets one before it asks.
    """
    if session is None:
        if record is not None:
            return Decision(Verdict.RELEASE, "session was deleted", cause=Cause.DELETED)
        return Decision(Verdict.IGNORE, "session was deleted")
    reason = not_ours(session, routing)
    if reason is not None:
        return Decision(Verdict.IGNORE, f"not ours: {reason}")
    if session.status is SessionStatus.FAILED:
        if record is not None:
            return Decision(Verdict.RELEASE, "session failed", cause=Cause.FAILED)
        return Decision(Verdict.IGNORE, "session failed; no compute to release")
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
                    recheck_at=now + grace_seconds + MARGIN_SECONDS,
                )
            return Decision(Verdict.IGNORE, "no environment_connection action pending")
        if health in (Health.GONE, Health.FAILED):
            decision = Decision(Verdict.STOP, f"sandbox is {health.value}; workspace kept", cause=Cause.FAILED)
        elif past_lifetime:
            decision = Decision(Verdict.STOP, "sandbox is past its maximum lifetime", cause=Cause.LIFETIME)
        else:
            decision = _idle(session, record, now, idle_timeout_seconds, lifetime_check)
        if decision.verdict is Verdict.STOP and retention_seconds > 0:  # the next look: the end of retention
            decision = replace(decision, recheck_at=now + retention_seconds)
        return decision
    cannot = _cannot_start(session, policy)
    if cannot is not None:
        return cannot
    if record is None:
        return Decision(
            Verdict.START, "connection requested; no sandbox", recheck_at=now + grace_seconds + MARGIN_SECONDS
        )
    replaced = Cause.REPLACED
    fresh = now + grace_seconds + MARGIN_SECONDS  # a new sandbox is looked at again once its grace is over
    if record.environment_id != session.environment.id:
        return Decision(Verdict.REPLACE, "sandbox serves another environment id", cause=replaced, recheck_at=fresh)
    if health in (Health.GONE, Health.FAILED, Health.TERMINATING, None):
        return Decision(
            Verdict.REPLACE, f"sandbox is {health.value if health else 'unknown'}", cause=replaced, recheck_at=fresh
        )
    if past_lifetime:  # a connection is wanted: a new sandbox, never a release with nothing started
        return Decision(
            Verdict.REPLACE,
            "sandbox is past its maximum lifetime; connection requested",
            cause=Cause.LIFETIME,
            recheck_at=fresh,
        )
    soon = timers.earliest(lifetime_check, fresh)
    if connected:
        update = replace(record, disconnected_at=None) if record.disconnected_at is not None else None
        return Decision(Verdict.KEEP, "executor is connected", recheck_at=soon, update=update)
    if connected is None:  # the link state is unknown (API error): never a reason to replace
        return Decision(Verdict.KEEP, "executor link state unknown; looking again later", recheck_at=soon)
    since = record.disconnected_at if record.disconnected_at is not None else now
    if now - since <= grace_seconds:
        update = replace(record, disconnected_at=since) if record.disconnected_at is None else None
        return Decision(
            Verdict.KEEP,
            "sandbox is up; executor reconnects by itself",
            recheck_at=timers.earliest(lifetime_check, since + grace_seconds + MARGIN_SECONDS),
            update=update,
        )
    return Decision(Verdict.REPLACE, "executor not connected past the grace period", cause=replaced, recheck_at=fresh)


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
            recheck_at=now + grace_seconds + MARGIN_SECONDS,
        )
    if retention <= 0:
        return Decision(Verdict.IGNORE, "stopped; workspace kept until the session is deleted or fails")
    if now - record.stopped_at >= retention:
        return Decision(Verdict.DISCARD, f"stopped {now - record.stopped_at:.0f}s ago; workspace retention is over")
    return Decision(
        Verdict.IGNORE, "stopped; workspace kept for its retention", recheck_at=record.stopped_at + retention
    )


def released_for_good(session: Session | None) -> bool:
    """A deleted or failed session will never need its workspace again (L16); a live one
    whose sandbox was released (max lifetime, sandbox died) keeps it for the next sandbox."""
    return session is None or session.status is SessionStatus.FAILED


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
    prestarts_agent: Callable[[str | None], bool] = lambda agent_id: False
    """Whether sessions of this agent are pre-started (``LifecycleSettings.prestarts_agent``)."""
    """Called with ``Decision.cause`` for each sandbox stopped, released or replaced (metrics)."""


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


def observe(sid: str, deps: Deps) -> Observation:
    """Read the session, its record (or a live sandbox nobody recorded: adopted, not
    duplicated), the sandbox's health and, when it matters, whether its executor is connected."""
    session = deps.sessions.get(sid)
    record = deps.store.record(sid)
    adopted = False
    if record is None:
        found = deps.runner.find(sid)
        if found is not None:
            record = Record(sid, found.environment_id, found, found.created_at or deps.clock.now())
            adopted = True
    health = deps.runner.status(record.handle) if record else None
    connected = None
    if record and session and session.wants_connection and health in (Health.RUNNING, Health.STARTING):
        connected = deps.sessions.environment_connected(record.environment_id)
    return Observation(session, record, adopted, health, connected, deps.clock.now())


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
    session, record = seen.session, seen.record
    decision = decide_observed(seen, deps)
    environment_id = session.environment.id if session else None
    if environment_id is not None and not trust.valid_id(environment_id):
        environment_id = trust.printable(environment_id)  # logged, escaped and cut short, never used
    with logs.bind(session_id=sid, environment_id=environment_id):
        log.info(
            "session looked up",
            extra={
                "status": session.status.value if session else "deleted",
                "verdict": decision.verdict.value,
                "reason": decision.reason,
                "recheck_at": decision.recheck_at,
            },
        )
        deps.on_decision(sid, decision)
        if decision.refused is not None:
            _refused(decision, deps)
            return decision
        _carry_out(lease, decision, session, record, seen.adopted, deps)
        deps.store.arm(lease, decision.recheck_at)  # fenced: the timer follows the latest decision
    return decision


def _carry_out(
    lease: Lease, decision: Decision, session: Session | None, record: Record | None, adopted: bool, deps: Deps
) -> None:
    sid = lease.session_id
    if decision.verdict in (Verdict.START, Verdict.REPLACE):
        assert session is not None
        stopping = record is not None and not record.stopped
        _start(lease, session, record, deps)
        if stopping and decision.cause is not None:
            assert record is not None
            _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.RELEASE:
        assert record is not None
        deps.store.check(lease)
        deps.runner.release(record.handle)
        if released_for_good(session):
            deps.runner.discard(sid)  # L16: the workspace goes with the session, not before
        deps.store.forget(lease)
        log.info("sandbox released", extra={"sandbox": record.handle.name})
        if not record.stopped:
            _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.STOP:
        assert record is not None and session is not None
        deps.store.check(lease)
        deps.runner.release(record.handle)  # the sandbox goes; its workspace stays (L16)
        deps.store.save(lease, replace(record, stopped_at=deps.clock.now(), disconnected_at=None))
        _stopped_log(decision, session, record, deps)
    elif decision.verdict is Verdict.DISCARD:
        assert record is not None
        deps.store.check(lease)
        deps.runner.discard(sid)
        deps.store.forget(lease)
        log.info("workspace discarded", extra={"sandbox": record.handle.name})
    elif record is None and released_for_good(session) and deps.runner.keeps_workspace(sid):
        deps.runner.discard(sid)  # a workspace kept after its sandbox went (L16)
    elif decision.update is not None or (decision.verdict is Verdict.KEEP and adopted):
        assert record is not None
        deps.store.save(lease, decision.update or record)
        if adopted:
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


def _start(lease: Lease, session: Session, record: Record | None, deps: Deps) -> Handle:
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
            started_at=deps.clock.now(),
            disconnected_at=deps.clock.now(),  # not connected yet: the grace period starts now
        ),
    )
    log.info("sandbox started", extra={"sandbox": handle.name, "generation": handle.generation})
    return handle
