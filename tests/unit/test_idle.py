"""Idle shutdown, durable rechecks and kept workspaces: ``work`` with the timers it arms (the
``World`` fakes; the Redis timers are in tests/contract). The idle decision itself (``decide``)
is tests/unit/test_decide.py.
"""

from __future__ import annotations

import itertools

import pytest

from controller import fleet, timers
from controller.decide import (
    CRASH_LOOP_RESET_SECONDS,
    FIRST_LOOK_SECONDS,
    Cause,
    Verdict,
    crash_backoff,
)
from controller.errors import Fenced
from controller.model import Health, SessionStatus
from tests.support.fakes import GRACE, T0, World, idle_since, make_session, verdicts

TIMEOUT = 1800.0
RETENTION = 7 * 24 * 3600.0
IDLE = make_session(status=SessionStatus.IDLE, actions=())


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
    start; one that died meanwhile is replaced (at once the first time, then after the crash
    loop's back-off, whose end is the session's timer), so a crash loop cannot use up the API's
    five-minute connection window waiting for the sweep."""
    world = started_world()
    world.sessions.connected["env_1"] = False
    for generation in (1, 2, 3):
        saved = world.store.record("sess_1")
        assert saved is not None and saved.handle.generation == generation
        world.runner.set_health(saved.handle, Health.FAILED)  # the executor crashed right away
        world.clock.advance(FIRST_LOOK_SECONDS)
        fired = world.fire_timers()
        if generation > 1:  # backing off: the timer falls due at the back-off's end
            assert fired == {"sess_1": [Verdict.KEEP]}
            world.clock.advance(crash_backoff(generation))
            fired = world.fire_timers()
        assert fired == {"sess_1": [Verdict.REPLACE]}
        assert world.store.timer("sess_1") == world.clock.now() + FIRST_LOOK_SECONDS
    assert world.stopped == ["replaced"] * 3
    assert world.runner.max_live["sess_1"] == 1


def crash_loop(world: World, until: float) -> list[float]:
    """Every executor started exits before its first look, as one refused its registration does;
    the session's timers fire as they fall due, up to ``until`` seconds after T0, and each
    delivery the API would send meanwhile (it asks for a connection again) comes 0.5 s after an
    exit is seen. When (seconds after T0) each replacement started."""
    starts = []
    while (due := world.store.timer("sess_1")) is not None and due <= T0 + until:
        saved = world.store.record("sess_1")
        assert saved is not None
        world.runner.set_health(saved.handle, Health.FAILED)
        world.clock.advance(max(0.0, due - world.clock.now()))
        if world.fire_timers()["sess_1"] == [Verdict.REPLACE]:
            starts.append(world.clock.now() - T0)
        elif world.store.timer("sess_1") is not None:
            world.clock.advance(0.5)
            assert verdicts(world.deliver()) == [Verdict.KEEP]  # backing off: a request starts nothing
    return starts


def test_an_executor_that_exits_at_each_start_is_restarted_with_a_growing_back_off() -> None:
    """L14/L15 (issue 37, item 2): an executor that exits at once, every time (the API refuses its
    registration), is not restarted every look: the first exit is replaced at once, each one
    after it waits 2 s, doubling, at most a minute (Kubernetes' CrashLoopBackOff), the wait kept
    in the store (the record and the session's timer: every worker honours it, and a delivery
    meanwhile starts nothing). Each back-off is counted and ``status``/``explain`` show the
    restarts and the time left. An executor that then stays up and connected long enough
    (``CRASH_LOOP_RESET_SECONDS``) ends the loop: its next exit is replaced at once."""
    world = started_world()
    world.sessions.connected["env_1"] = False
    starts = crash_loop(world, 400.0)
    assert [b - a for a, b in itertools.pairwise([0.0, *starts])] == [1, 3, 5, 9, 17, 33, 61, 61, 61, 61, 61]
    assert world.crash_loops == len(starts) and world.count("ensure") == 1 + len(starts)  # the last: backing off
    saved = world.store.record("sess_1")
    assert saved is not None and saved.handle.generation == 1 + len(starts) and saved.backoff_until is not None
    shown = fleet.crash_loop(saved, saved.backoff_until - 10)
    assert shown == {"restarts": 12, "next_start_in_seconds": 10.0}
    world.clock.advance(saved.backoff_until - world.clock.now())
    assert world.fire_timers() == {"sess_1": [Verdict.REPLACE]}
    world.sessions.connected["env_1"] = True  # the cause passed: it connects and stays up
    world.clock.advance(CRASH_LOOP_RESET_SECONDS)
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.crashes == 0 and fleet.crash_loop(saved, world.clock.now()) is None
    world.runner.set_health(saved.handle, Health.FAILED)  # one crash after that: replaced at once
    assert verdicts(world.deliver()) == [Verdict.REPLACE]


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
