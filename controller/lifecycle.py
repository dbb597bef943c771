"""The loop that carries out the decisions about one session's sandbox: observe, decide, act.

``work`` runs the coalesced loop for one session under its lease, fenced, until no more work
is wanted; each round (``act``):

- observes (``observe``): one reading of ``Deps.clock``, a fresh read of the session, its
  stored record (or a live sandbox nobody recorded: adopted, not duplicated), the sandbox's
  health and, when it matters, its executor's link; for a session that answers 404, what is
  known of it and, when its deletion would be confirmed, how a few other sessions answer
  (``Missing``). A decision is made only from this fresh read, never from an event (L7, L13);
- asks ``decide.decide`` (``decide_observed``, with the policy ``Deps`` carries);
- acts: starts, replaces, stops, releases or discards through the runner, records the result,
  and arms the decision's ``recheck_at`` as the session's durable timer (``controller.timers``),
  all fenced by the lease.

Which verdict when (starting, keeping, the executor's grace period, idle stops, retention,
deletion confirmation) is ``decide.py``'s, and docs/lifecycle.md states the rules (L1–L18);
they are not restated here. What this module adds: ids are checked before they reach a URL,
a path, a label or an argument list (L2, ``trust.py``), and a refused session is logged,
counted through ``Deps.on_refusal`` and left alone; a pre-start takes room in the budget under
the lease (L9). Everything with side effects sits behind the protocols passed in ``Deps``
(sessions API, store, runner, clock), so tests use fakes and a fake clock.

One clock: each round reads the time once from ``Deps.clock`` (the workers use Redis's ``TIME``,
the clock timers fall due on), and every time it decides or stores comes from that reading, so
a worker whose own clock is off neither stops early nor spins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeGuard

from controller import logs, trust
from controller.clock import Clock
from controller.config import RoutingSettings
from controller.decide import Cause, Decision, Missing, Verdict, confirmable, decide, refusal, unread
from controller.errors import ApiRejected, ApiUnavailable, Fenced, Permanent, RunnerRejected, SpecRefused, StartFailed
from controller.heartbeat import Heartbeat
from controller.model import CannotStart, Handle, Health, Link, Record, SandboxSpec, Session
from controller.runners.base import Diagnoses, Runner, Suspends
from controller.store.base import Busy, Lease, SessionStore

log = logs.get(__name__)


class Sessions(Protocol):
    """The Agents API as decisions need it (adapter: ``sessions.HttpSessions``)."""

    def get(self, session_id: str) -> Session | None:
        """The session, or None when it was deleted (404)."""
        ...

    def environment_link(self, environment_id: str) -> Link | None:
        """Whether an executor holds the environment's link, held it and lost it, or never held
        it; None when unknown."""
        ...


Routing = RoutingSettings
"""Which sessions this controller serves (L6): the routing settings, as parsed (``decide.Routing``)."""


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
    on_crash_loop: Callable[[], None] = lambda: None
    """Called for each crash-loop back-off begun (``Decision.crash_loop``: a metric)."""
    on_cannot_start: Callable[[str], None] = lambda kind: None
    """Called with ``CannotStart.kind`` for each sandbox first found unable to start (a metric)."""
    on_start_failed: Callable[[str, str, bool], None] = lambda session_id, reason, permanent: None
    """Called with (session id, reason, permanent) for each sandbox start that failed (a metric,
    and the session's latest decision for ``status``/``explain``)."""


def work(session_id: str, deps: Deps) -> list[Decision] | Busy:
    """Work one session until nothing more is wanted. Busy: another worker holds it.

    The lease is renewed while the work runs (``renew_every_seconds``). On any failure the
    lease is released and the work stays wanted, for the task's retry or the scheduler's
    recovery pass; only a ``Permanent`` failure marks the round done (given up, logged by
    the caller), so a session that can never succeed is not retried forever. A sandbox start
    that fails for a reason that may pass (``RunnerRejected``: the executor binary missing,
    an exec error, the uid range full, the API server's 403 or quota) is ``StartFailed``, a
    ``Transient``: retried with backoff, then enqueued again by the recovery pass, each round
    re-reading the session, until it starts or the session no longer asks. Only an unsafe
    spec (``SpecRefused``) is dropped.
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


def act(lease: Lease, deps: Deps) -> Decision:
    """One round: observe, decide, then act under the lease (fenced)."""
    sid = lease.session_id
    if not trust.valid_id(sid):  # L2: a malformed id reaches no URL, path, label or argument list
        decision = refusal(trust.Refusal(trust.SESSION_ID, "session id does not match the id pattern"))
        with logs.bind(session_id=trust.printable(sid)):
            _refused(decision, deps)
        return decision
    try:
        seen = observe(sid, deps)
    except (ApiUnavailable, ApiRejected):
        _blind_spot(lease, deps)  # then retried (or given up) as before
        raise
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
        if decision.crash_loop:
            assert decision.update is not None
            log.warning(
                "crash loop back-off",
                extra={"reason": decision.reason, "restarts": decision.update.crashes, "until": decision.recheck_at},
            )
            deps.on_crash_loop()
        if decision.cannot_start is not None:
            assert seen.record is not None
            _cannot_start(seen.record.handle, decision.cannot_start, deps)
        if decision.held:
            log.error(
                "deletions held",
                extra={"reason": decision.reason, "missing_since": decision.missing_since},
            )
            deps.on_held()
        if session is not None and decision.verdict in _ACTS:
            deps.store.found(lease)  # fenced; before acting: a round that then fails keeps no 404 mark
        _carry_out(lease, decision, seen, deps)
        deps.store.arm(lease, decision.recheck_at, decision.missing_since, decision.missing_reads)  # fenced
    return decision


_ACTS = frozenset({Verdict.START, Verdict.REPLACE, Verdict.STOP, Verdict.RELEASE, Verdict.DISCARD})
"""Verdicts carried out through the runner, which may fail (a start that fails raises): a round
that found its session forgets the session's 404 marks before it acts on one of these. Other
rounds forget them at their end (``arm``), with nothing between that could fail but the store."""


def _blind_spot(lease: Lease, deps: Deps) -> None:
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


def _budget_used(decision: Decision, deps: Deps) -> Decision:
    """A pre-start the budget has no room for: nothing starts (a connection request later will)."""
    skipped = Decision(
        Verdict.IGNORE,
        f"pre-start skipped: {deps.prestart_max_sandboxes} pre-started sandboxes are waiting to be used",
    )
    log.warning("pre-start skipped", extra={"reason": skipped.reason, "limit": deps.prestart_max_sandboxes})
    deps.on_prestart_skipped()
    return skipped


def suspends(runner: Runner, cause: Cause | None) -> TypeGuard[Suspends]:
    """The one choice between suspending a sandbox and stopping it (issue 29): a stop for
    idleness, on a runner that checkpoints, suspends; every other stop releases. (A checkpoint
    the runner then cannot make, refused for room or failed, ends as a stop: its runner logs and
    counts that.)"""
    return cause is Cause.IDLE and isinstance(runner, Suspends) and runner.checkpointing


def _carry_out(lease: Lease, decision: Decision, seen: Observation, deps: Deps) -> None:
    sid = lease.session_id
    session, record, now = seen.session, seen.record, seen.now
    if decision.verdict in (Verdict.START, Verdict.REPLACE):
        assert session is not None
        stopping = record is not None and not record.stopped
        carried = decision.update or record  # the crash loop's count goes on with the new sandbox
        _start(lease, session, record, now, decision.prestart, deps, carried.crashes if carried else 0)
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
        if suspends(deps.runner, decision.cause):
            deps.runner.suspend(record.handle)  # checkpointed, then freed (issue 29); its workspace stays
        else:
            deps.runner.release(record.handle)  # the sandbox goes; its workspace stays (L16)
        deps.store.save(lease, replace(record, stopped_at=now, disconnected_at=None, down_since=None, prestarted=False))
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


def _start_failed(session_id: str, reason: str, permanent: bool, deps: Deps) -> None:
    """One line per failed start (each attempt), counted and noted as the latest decision."""
    log.error(
        "sandbox start failed",
        extra={"reason": reason, "kind": "permanent" if permanent else "transient", "retried": not permanent},
    )
    deps.on_start_failed(session_id, reason, permanent)


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


def _cannot_start(handle: Handle, found: CannotStart, deps: Deps) -> None:
    """A sandbox first found unable to start: one warning line, an Event on it, the count."""
    log.warning(
        "sandbox cannot start",
        extra={"sandbox": handle.name, "template": found.template, "kind": found.kind, "reason": found.reason},
    )
    if isinstance(deps.runner, Diagnoses):
        deps.runner.tell_cannot_start(handle, found)
    deps.on_cannot_start(found.kind)


def _refused(decision: Decision, deps: Deps) -> None:
    assert decision.refused is not None
    log.warning("session refused", extra={"refused": decision.refused, "reason": decision.reason})
    deps.on_refusal(decision.refused)


def _start(
    lease: Lease, session: Session, record: Record | None, now: float, prestart: bool, deps: Deps, crashes: int = 0
) -> Handle:
    generation = record.handle.generation + 1 if record else 1
    deps.store.check(lease)  # fenced: a worker that lost its lease must not act
    if record is not None:
        deps.runner.release(record.handle)  # never two live sandboxes: the old one goes first
    spec = spec_for(session, deps.choose_template(session))
    try:
        handle = deps.runner.ensure(spec, generation)
    except SpecRefused as exc:  # the spec itself is unsafe: no retry can help (L2)
        _start_failed(session.id, str(exc), True, deps)
        raise
    except RunnerRejected as exc:  # may pass: the binary back, a uid freed, a quota raised
        _start_failed(session.id, str(exc), False, deps)
        raise StartFailed(f"sandbox start failed; retried while the session asks: {exc}") from exc
    deps.store.save(
        lease,
        Record(
            session_id=session.id,
            environment_id=spec.environment_id,
            handle=handle,
            started_at=now,
            disconnected_at=now,  # not seen connected yet: the grace period starts now
            prestarted=prestart,
            lineage_started_at=handle.lineage_started_at or None,  # restored: its lifetime goes on
            crashes=crashes,
        ),
    )
    log.info("sandbox started", extra={"sandbox": handle.name, "generation": handle.generation})
    return handle
