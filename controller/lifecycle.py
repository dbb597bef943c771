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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from controller import logs, trust
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
    START = "start"  # no sandbox yet: start one
    REPLACE = "replace"  # sandbox gone, failed, terminating or never connected: exactly one new one
    KEEP = "keep"  # healthy sandbox: its executor reconnects by itself (L14)
    RELEASE = "release"  # failed or deleted session: free its compute
    IGNORE = "ignore"  # nothing to do (deleted without compute, action resolved, not ours)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    refused: str | None = None
    """Set when the session was refused (L2): the ``trust.Refusal`` kind, a fixed word."""


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
) -> Decision:
    """What to do about one session, from what was observed (pure)."""
    if session is None:
        if record is not None:
            return Decision(Verdict.RELEASE, "session was deleted")
        return Decision(Verdict.IGNORE, "session was deleted")
    reason = not_ours(session, routing)
    if reason is not None:
        return Decision(Verdict.IGNORE, f"not ours: {reason}")
    if session.status is SessionStatus.FAILED:
        if record is not None:
            return Decision(Verdict.RELEASE, "session failed")
        return Decision(Verdict.IGNORE, "session failed; no compute to release")
    if record is not None and max_lifetime_seconds and now - record.started_at > max_lifetime_seconds:
        return Decision(Verdict.RELEASE, "sandbox is past its maximum lifetime")
    if not session.wants_connection:
        if record is not None and health in (Health.GONE, Health.FAILED):
            return Decision(Verdict.RELEASE, f"sandbox is {health.value}; removing the mapping")
        return Decision(Verdict.IGNORE, "no environment_connection action pending")
    if session.environment.id is None or not session.environment.remote_url:
        return Decision(Verdict.IGNORE, "session lists no environment id or remote url")
    refused = trust.untrusted(session, policy)
    if refused is not None:  # L2: before anything could start or replace a sandbox
        return refusal(refused)
    if record is None:
        return Decision(Verdict.START, "connection requested; no sandbox")
    if record.environment_id != session.environment.id:
        return Decision(Verdict.REPLACE, "sandbox serves another environment id")
    if health in (Health.GONE, Health.FAILED, Health.TERMINATING, None):
        return Decision(Verdict.REPLACE, f"sandbox is {health.value if health else 'unknown'}")
    if connected:
        return Decision(Verdict.KEEP, "executor is connected")
    if now - record.started_at <= grace_seconds:
        return Decision(Verdict.KEEP, "sandbox is up; executor reconnects by itself")
    return Decision(Verdict.REPLACE, "executor not connected past the grace period")


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


def act(lease: Lease, deps: Deps) -> Decision:
    """One round: observe, decide, then act under the lease (fenced)."""
    sid = lease.session_id
    if not trust.valid_id(sid):  # L2: a malformed id reaches no URL, path, label or argument list
        decision = refusal(trust.Refusal(trust.SESSION_ID, "session id does not match the id pattern"))
        with logs.bind(session_id=trust.printable(sid)):
            _refused(decision, deps)
        return decision
    session = deps.sessions.get(sid)
    record = deps.store.record(sid)
    adopted = False
    if record is None:  # a sandbox whose start was never recorded is adopted, not duplicated
        found = deps.runner.find(sid)
        if found is not None:
            record = Record(sid, found.environment_id, found, found.created_at or deps.clock.now())
            adopted = True
    health = deps.runner.status(record.handle) if record else None
    connected = None
    if record and session and session.wants_connection and health in (Health.RUNNING, Health.STARTING):
        connected = deps.sessions.environment_connected(record.environment_id)
    decision = decide(
        session,
        record,
        health,
        connected,
        deps.clock.now(),
        deps.grace_seconds,
        deps.routing,
        deps.max_lifetime_seconds,
        deps.trust_policy,
    )
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
            },
        )
        deps.on_decision(sid, decision)
        if decision.refused is not None:
            _refused(decision, deps)
        elif decision.verdict in (Verdict.START, Verdict.REPLACE):
            assert session is not None
            _start(lease, session, record, deps)
        elif decision.verdict is Verdict.RELEASE:
            assert record is not None
            deps.store.check(lease)
            deps.runner.release(record.handle)
            if released_for_good(session):
                deps.runner.discard(sid)  # L16: the workspace goes with the session, not before
            deps.store.forget(lease)
            log.info("sandbox released", extra={"sandbox": record.handle.name})
        elif record is None and released_for_good(session) and deps.runner.keeps_workspace(sid):
            deps.runner.discard(sid)  # a workspace kept after its sandbox went (L16)
        elif decision.verdict is Verdict.KEEP and adopted:
            assert record is not None
            deps.store.save(lease, record)
            log.info("sandbox adopted", extra={"sandbox": record.handle.name})
    return decision


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
        ),
    )
    log.info("sandbox started", extra={"sandbox": handle.name, "generation": handle.generation})
    return handle
