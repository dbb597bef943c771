"""Idle shutdown, durable rechecks and kept workspaces: ``decide`` on a fake clock, and ``work``
with the timers it arms (the ``World`` fakes; the Redis timers are in tests/contract).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller import timers
from controller.decide import FIRST_LOOK_SECONDS, Cause, Decision, Verdict, decide
from controller.errors import Fenced
from controller.lifecycle import Routing
from controller.model import Handle, Health, Record, Session, SessionStatus
from tests.support.fakes import GRACE, T0, World, make_session, verdicts

TIMEOUT = 1800.0
RETENTION = 7 * 24 * 3600.0
IDLE = make_session(status=SessionStatus.IDLE, actions=())


def idle_since(at: float, status: SessionStatus = SessionStatus.IDLE, actions: tuple[str, ...] = ()) -> Session:
    return replace(make_session(status=status, actions=actions), last_active_at=int(at))


def record(started_at: float = T0, stopped_at: float | None = None) -> Record:
    handle = Handle(session_id="sess_1", name="sandbox-g1", generation=1, uid="u1")
    return Record("sess_1", "env_1", handle, started_at, stopped_at=stopped_at)


def decided(
    session: Session, rec: Record | None, now: float, timeout: float = TIMEOUT, retention: float = 0.0
) -> Decision:
    return decide(
        session,
        rec,
        Health.RUNNING,
        True,
        now,
        GRACE,
        Routing(),
        idle_timeout_seconds=timeout,
        retention_seconds=retention,
    )


# --- decide: the idle decision ------------------------------------------------------------------


def test_idle_past_the_timeout_stops_at_it_not_before() -> None:
    """L11/L12: an idle session with no pending action is stopped once it has been inactive for
    the whole timeout; before that the decision re-arms for ``last_active_at + timeout``."""
    session = idle_since(T0 + 100)
    before = decided(session, record(), T0 + 100 + TIMEOUT - 1)
    assert before.verdict is Verdict.IGNORE and before.recheck_at == T0 + 100 + TIMEOUT
    at = decided(session, record(), T0 + 100 + TIMEOUT)
    assert (at.verdict, at.cause, at.recheck_at) == (Verdict.STOP, Cause.IDLE, None)


@pytest.mark.parametrize("status", [SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION, SessionStatus.UNKNOWN])
def test_a_working_session_is_never_stopped(status: SessionStatus) -> None:
    """L11/L12: in_progress and requires_action (e.g. a function call) never stop, however long
    ago the last activity was; the check is re-armed a timeout later."""
    actions = ("function_call",) if status is SessionStatus.REQUIRES_ACTION else ()
    now = T0 + 10 * TIMEOUT
    decision = decided(idle_since(T0, status, actions), record(), now)
    assert decision.verdict is Verdict.IGNORE
    assert decision.recheck_at == now + TIMEOUT


def test_a_pending_connection_request_is_never_stopped() -> None:
    """L12: an idle-looking session that lists an environment_connection action keeps its sandbox."""
    session = idle_since(T0, SessionStatus.REQUIRES_ACTION, ("environment_connection",))
    decision = decided(session, record(), T0 + 10 * TIMEOUT)
    assert decision.verdict is Verdict.KEEP


def test_timeout_zero_keeps_warm_forever() -> None:
    """L11: an idle timeout of 0 keeps the sandbox warm; nothing is armed without a lifetime."""
    decision = decided(idle_since(T0), record(), T0 + 100 * TIMEOUT, timeout=0)
    assert (decision.verdict, decision.recheck_at) == (Verdict.IGNORE, None)


def test_the_timeout_counts_from_the_later_of_last_activity_and_the_start() -> None:
    """L11: a sandbox started for an old session (or with no last_active_at) gets its full timeout."""
    started = T0 + 5000
    for session in (idle_since(T0), IDLE):
        decision = decided(session, record(started_at=started), started + TIMEOUT - 1)
        assert decision.verdict is Verdict.IGNORE and decision.recheck_at == started + TIMEOUT


def test_idle_never_starts_compute() -> None:
    """L9/L13: an idle session without a sandbox gets nothing started."""
    assert decided(idle_since(T0), None, T0 + TIMEOUT).verdict is Verdict.IGNORE


# --- decide: stopped sessions and their workspace ------------------------------------------------


def test_a_connection_request_starts_a_stopped_session_on_its_workspace() -> None:
    """L16: the next environment_connection after a stop starts a new sandbox (same workspace)."""
    decision = decided(make_session(), record(stopped_at=T0 + 10), T0 + 20)
    assert decision.verdict is Verdict.START and "kept workspace" in decision.reason
    assert decision.recheck_at == T0 + 20 + FIRST_LOOK_SECONDS


def test_retention_discards_a_stopped_workspace_after_it_not_before() -> None:
    """L16: a stopped session's workspace is kept for the retention period, then discarded;
    0 keeps it until the session is deleted or fails."""
    stopped = record(stopped_at=T0)
    kept = decided(IDLE, stopped, T0 + RETENTION - 1, retention=RETENTION)
    assert (kept.verdict, kept.recheck_at) == (Verdict.IGNORE, T0 + RETENTION)
    assert decided(IDLE, stopped, T0 + RETENTION, retention=RETENTION).verdict is Verdict.DISCARD
    forever = decided(IDLE, stopped, T0 + 100 * RETENTION, retention=0)
    assert (forever.verdict, forever.recheck_at) == (Verdict.IGNORE, None)


@pytest.mark.parametrize("ending", ["deleted", "failed"])
def test_a_stopped_session_that_ends_releases_its_workspace(ending: str) -> None:
    """L16: deleted or failed, a stopped session's workspace goes with it."""
    session = None if ending == "deleted" else make_session(status=SessionStatus.FAILED, actions=())
    decision = decided(session, record(stopped_at=T0), T0 + 1)  # type: ignore[arg-type]
    assert decision.verdict is Verdict.RELEASE


# --- work: stop, keep the workspace, start again; timers armed ----------------------------------


def started_world(**kwargs: float) -> World:
    world = World(idle_timeout=TIMEOUT, retention=RETENTION, **kwargs)  # type: ignore[arg-type]
    world.sessions.put(make_session())
    assert verdicts(world.deliver()) == [Verdict.START]
    world.sessions.connected["env_1"] = True
    return world


def test_every_start_arms_a_first_look_soon_then_until_the_grace_is_over() -> None:
    """L14/L15: a started sandbox is looked at again one ``FIRST_LOOK_SECONDS`` after its start,
    then each time as long again as its age, until a look sees its executor connected (then the
    usual timers take over) or its grace period is over — not at the next sweep."""
    world = started_world()
    world.sessions.connected["env_1"] = False
    assert world.store.timer("sess_1") == T0 + FIRST_LOOK_SECONDS
    looks = []
    while (due := world.store.timer("sess_1")) is not None and due < T0 + GRACE + timers.RESOLUTION_SECONDS:
        world.clock.advance(due - world.clock.now())
        assert world.fire_timers() == {"sess_1": [Verdict.KEEP]}
        looks.append(world.clock.now() - T0)
    assert looks == [1, 2, 4, 8, 16, 32]
    assert world.store.timer("sess_1") == T0 + GRACE + timers.RESOLUTION_SECONDS
    world.sessions.connected["env_1"] = True  # seen connected at the end of the grace: kept, usual timer
    world.clock.advance(GRACE + timers.RESOLUTION_SECONDS - looks[-1])
    assert world.fire_timers() == {"sess_1": [Verdict.KEEP]}
    saved = world.store.record("sess_1")
    assert saved is not None and saved.seen_connected and saved.disconnected_at is None


def test_a_crash_looping_sandbox_is_looked_at_again_after_each_replacement() -> None:
    """L15: between a start and the next event, a timer re-checks the sandbox soon after its
    start; one that died meanwhile is replaced at once (and re-checked again), so a crash loop
    cannot use up the API's five-minute connection window waiting for the sweep."""
    world = started_world()
    world.sessions.connected["env_1"] = False
    for generation in (1, 2, 3):
        saved = world.store.record("sess_1")
        assert saved is not None and saved.handle.generation == generation
        world.runner.set_health(saved.handle, Health.FAILED)  # the executor crashed right away
        world.clock.advance(FIRST_LOOK_SECONDS)
        assert world.fire_timers() == {"sess_1": [Verdict.REPLACE]}
        assert world.store.timer("sess_1") == world.clock.now() + FIRST_LOOK_SECONDS
    assert world.stopped == ["replaced"] * 3
    assert world.runner.max_live["sess_1"] == 1


def test_idle_session_is_stopped_by_its_timer_and_keeps_its_workspace() -> None:
    """L11/L12/L16: after the turn the session goes idle; its timer falls due at last_active_at +
    timeout; the worker re-reads, stops the sandbox, keeps the workspace, arms the retention."""
    world = started_world()
    world.clock.advance(30)
    world.sessions.put(idle_since(world.clock.now()))
    assert verdicts(world.deliver()) == [Verdict.IGNORE]  # the idle webhook: re-read, arm
    assert world.store.timer("sess_1") == world.clock.now() + TIMEOUT
    world.clock.advance(TIMEOUT - 1)
    assert world.fire_timers() == {}
    world.clock.advance(1)
    assert world.fire_timers() == {"sess_1": [Verdict.STOP]}
    assert world.runner.live == {} and world.runner.keeps_workspace("sess_1")
    assert world.count("discard") == 0
    saved = world.store.record("sess_1")
    assert saved is not None and saved.stopped_at == world.clock.now()
    assert world.store.timer("sess_1") == world.clock.now() + RETENTION
    assert world.stopped == ["idle"]


def test_new_input_before_the_timer_postpones_the_stop() -> None:
    """L12: a turn that started (or a connection request) before the timer fell due is seen by the
    re-read: nothing stops, and the check is re-armed."""
    world = started_world()
    world.sessions.put(idle_since(world.clock.now()))
    world.deliver()
    world.clock.advance(TIMEOUT)
    world.sessions.put(idle_since(world.clock.now() - 5, SessionStatus.IN_PROGRESS))
    assert world.fire_timers() == {"sess_1": [Verdict.IGNORE]}
    assert "sess_1" in world.runner.live and world.stopped == []
    assert world.store.timer("sess_1") == world.clock.now() + TIMEOUT


def test_idle_event_after_the_connection_was_resolved_stops_nothing() -> None:
    """L13: the idle event of the previous turn arrives after a new input's connection request was
    resolved but before its turn started; the session's last activity is recent, so the re-read
    keeps the sandbox even with the timeout long past since the previous turn."""
    world = started_world()
    world.clock.advance(2 * TIMEOUT)
    world.sessions.put(idle_since(world.clock.now() - 1))  # the new input touched last_active_at
    assert verdicts(world.deliver()) == [Verdict.IGNORE]
    assert "sess_1" in world.runner.live and world.stopped == []


def test_stop_then_connection_request_starts_on_the_same_workspace() -> None:
    """L16: stop → the next environment_connection starts a new sandbox, workspace never discarded."""
    world = started_world()
    world.sessions.put(idle_since(world.clock.now()))
    world.clock.advance(TIMEOUT)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    world.sessions.put(make_session())
    assert verdicts(world.deliver()) == [Verdict.START]
    saved = world.store.record("sess_1")
    assert saved is not None and not saved.stopped and saved.handle.generation == 2
    assert world.count("discard") == 0 and world.runner.keeps_workspace("sess_1")
    assert world.runner.max_live["sess_1"] == 1


def test_retention_timer_discards_the_workspace() -> None:
    """L16: active → stopped (workspace kept) → workspace deleted, by the retention timer."""
    world = started_world()
    world.sessions.put(idle_since(world.clock.now()))
    world.clock.advance(TIMEOUT)
    world.deliver()
    world.clock.advance(RETENTION)
    assert world.fire_timers() == {"sess_1": [Verdict.DISCARD]}
    assert world.store.record("sess_1") is None and not world.runner.keeps_workspace("sess_1")
    assert world.store.timer("sess_1") is None


def test_a_stop_decided_under_a_lost_lease_is_discarded() -> None:
    """L12: fencing: a worker whose lease lapsed while it read the session neither stops the
    sandbox nor touches the timer."""
    world = started_world()
    world.sessions.put(idle_since(world.clock.now()))
    world.deliver()
    armed = world.store.timer("sess_1")
    world.clock.advance(TIMEOUT)
    world.sessions.on_get = world.store.expire  # the lease lapses mid-round
    with pytest.raises(Fenced):
        world.deliver()
    assert "sess_1" in world.runner.live and world.count("release") == 0
    assert world.store.timer("sess_1") == armed and world.stopped == []


def test_stop_counts_by_cause_and_the_sweep_counts_running() -> None:
    """Visible: each stop is counted by its cause; the sweep reports how many sandboxes run."""
    world = started_world(max_lifetime=10 * TIMEOUT)
    world.sessions.put(IDLE)
    world.clock.advance(10 * TIMEOUT + 1)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.stopped == ["lifetime"]
    assert world.sweep().running == 0


def test_fire_enqueues_each_due_session_once() -> None:
    """Timers fire once: taking a due timer removes it and wants the session's work."""
    world = started_world()
    world.clock.advance(GRACE + timers.RESOLUTION_SECONDS)
    due = world.store.take_due_at(world.clock.now())
    assert due == ["sess_1"] and world.store.take_due_at(world.clock.now()) == []
    want, done = world.store.counters("sess_1")
    assert want == done + 1


def test_stops_and_running_sandboxes_are_metrics() -> None:
    """Visible: ``controller_sandboxes_stopped_total{reason}`` counts each cause; the scheduler's
    ``on_sweep`` sets ``controller_sandboxes_running`` from the sweep."""
    from controller.metrics import SANDBOXES_RUNNING, SANDBOXES_STOPPED_TOTAL, Metrics
    from controller.reconcile import Sweep
    from controller.wiring import SchedulerParts

    metrics = Metrics()
    for cause in Cause:
        metrics.inc(SANDBOXES_STOPPED_TOTAL, reason=cause.value)
    metrics.inc(SANDBOXES_STOPPED_TOTAL, reason="idle")
    assert metrics.value(SANDBOXES_STOPPED_TOTAL, reason="idle") == 2
    assert metrics.value(SANDBOXES_STOPPED_TOTAL, reason="replaced") == 1
    parts = SchedulerParts(None, None, None, None, metrics, None)  # type: ignore[arg-type]
    parts.on_sweep(Sweep(mapped=3, managed=4, enqueued=4, running=2))
    assert metrics.value(SANDBOXES_RUNNING) == 2
    assert "controller_sandboxes_running 2.0" in metrics.render().decode()
