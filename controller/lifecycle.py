"""The loop that carries out the decisions about one session's sandbox: observe, decide, act.

``work`` runs the coalesced loop for one session under its lease, fenced, until no more work
is wanted; each round (``act``):

- observes (``observation.observe``): one reading of ``Deps.clock``, a fresh read of the session, its
  stored record (or a live sandbox nobody recorded: adopted, not duplicated), the sandbox's
  health and, when it matters, its executor's link; for a session that answers 404, what is
  known of it and, when its deletion would be confirmed, how a few other sessions answer
  (``Missing``). A decision is made only from this fresh read, never from an event (L7, L13);
- asks ``decide.decide`` (``observation.decide_observed``, with the policy ``Deps`` carries);
- acts: starts, replaces, stops, releases or discards through the runner, records the result,
  and arms the decision's ``recheck_at`` as the session's durable timer (``controller.timers``),
  all fenced by the lease.

Which verdict when (starting, keeping, the executor's grace period, idle stops, retention,
deletion confirmation) is ``decide.py``'s, and docs/lifecycle.md states the rules (L1–L18);
they are not restated here. What this module adds: ids are checked before they reach a URL,
a path, a label or an argument list (L2, ``trust.py``), and a refused session is logged,
counted through ``Deps.on_refusal`` and left alone; a pre-start takes room in the budget under
the lease (L9). Each thing that happens beside the verdict is told by ``controller.reports`` (a
line and a count). Everything with side effects sits behind the protocols passed in ``Deps``
(``controller.deps``: sessions API, store, runner, clock), so tests use fakes and a fake clock.

One clock: each round reads the time once from ``Deps.clock`` (the workers use Redis's ``TIME``,
the clock timers fall due on), and every time it decides or stores comes from that reading, so
a worker whose own clock is off neither stops early nor spins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeGuard

from controller import logs, reports, trust
from controller.decide import Cause, Decision, Verdict, refusal
from controller.deps import Deps, Routing, Sessions
from controller.errors import ApiRejected, ApiUnavailable, Fenced, Permanent, RunnerRejected, SpecRefused, StartFailed
from controller.heartbeat import Heartbeat
from controller.model import Handle, Record, SandboxSpec, Session
from controller.observation import Observation, decide_observed, observe
from controller.runners.base import Runner, Suspends
from controller.store.base import Busy, Lease

__all__ = ["Deps", "Routing", "Sessions", "act", "decide_observed", "observe", "spec_for", "suspends", "work"]
"""``Deps``, ``Routing`` and ``Sessions`` (``controller.deps``) and ``observe``/``decide_observed``
(``controller.observation``) are named here too: what a round is given, and how it sees."""

log = logs.get(__name__)


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


def act(lease: Lease, deps: Deps) -> Decision:
    """One round: observe, decide, then act under the lease (fenced)."""
    sid = lease.session_id
    if not trust.valid_id(sid):  # L2: a malformed id reaches no URL, path, label or argument list
        decision = refusal(trust.Refusal(trust.SESSION_ID, "session id does not match the id pattern"))
        with logs.bind(session_id=trust.printable(sid)):
            reports.refused(decision, deps)
        return decision
    try:
        seen = observe(sid, deps)
    except (ApiUnavailable, ApiRejected):
        reports.blind_spot(lease, deps)  # then retried (or given up) as before
        raise
    session = seen.session
    decision = decide_observed(seen, deps)
    environment_id = session.environment.id if session else None
    if environment_id is not None and not trust.valid_id(environment_id):
        environment_id = trust.printable(environment_id)  # logged, escaped and cut short, never used
    with logs.bind(session_id=sid, environment_id=environment_id):
        if decision.prestart and not deps.store.reserve_prestart(lease, deps.prestart_max_sandboxes):
            decision = reports.budget_used(decision, deps)
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
            reports.refused(decision, deps)
            return decision
        if decision.crash_loop:
            reports.crash_loop(decision, deps)
        if decision.cannot_start is not None:
            assert seen.record is not None
            reports.cannot_start(seen.record.handle, decision.cannot_start, deps)
        if decision.held:
            reports.held(decision, deps)
        if session is not None and decision.verdict in _ACTS:
            deps.store.found(lease)  # fenced; before acting: a round that then fails keeps no 404 mark
        _carry_out(lease, decision, seen, deps)
        deps.store.arm(lease, decision.recheck_at, decision.missing_since, decision.missing_reads)  # fenced
    return decision


_ACTS = frozenset({Verdict.START, Verdict.REPLACE, Verdict.STOP, Verdict.RELEASE, Verdict.DISCARD})
"""Verdicts carried out through the runner, which may fail (a start that fails raises): a round
that found its session forgets the session's 404 marks before it acts on one of these. Other
rounds forget them at their end (``arm``), with nothing between that could fail but the store."""


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
            reports.stopped(decision, session, record, deps)
    elif decision.verdict is Verdict.RELEASE:
        assert record is not None
        deps.store.check(lease)
        deps.runner.release(record.handle)
        deps.runner.discard(sid)  # L16: the workspace goes with the session, not before
        deps.store.forget(lease)
        log.info("sandbox released", extra={"sandbox": record.handle.name})
        if not record.stopped:
            reports.stopped(decision, session, record, deps)
    elif decision.verdict is Verdict.STOP:
        assert record is not None and session is not None
        deps.store.check(lease)
        if suspends(deps.runner, decision.cause):
            deps.runner.suspend(record.handle)  # checkpointed, then freed (issue 29); its workspace stays
        else:
            deps.runner.release(record.handle)  # the sandbox goes; its workspace stays (L16)
        deps.store.save(lease, replace(record, stopped_at=now, disconnected_at=None, down_since=None, prestarted=False))
        reports.stopped(decision, session, record, deps)
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
        reports.start_failed(session.id, str(exc), True, deps)
        raise
    except RunnerRejected as exc:  # may pass: the binary back, a uid freed, a quota raised
        reports.start_failed(session.id, str(exc), False, deps)
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
