"""Nothing acknowledged is lost, whatever fails: the whole loop from real parts on loopback
(redis-server with its append-only file, 2 receivers, 2 Celery workers, the
simulator, the real ``codex exec-server``), with Redis or a worker killed mid-burst.

Each test builds its own world: it kills parts of it."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.codex import codex_binary
from tests.support.processes import Managed, wait_for
from tests.system.loop import Loop

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(tmp_path / "loop", codex_binary())
    (tmp_path / "loop").mkdir()
    try:
        loop.start()
        yield loop
    finally:
        loop.stop()


def _task_lines(loop: Loop, event: str, session_ids: set[str]) -> list[dict[str, object]]:
    return [
        line
        for worker in loop.workers
        for line in worker.log_lines()
        if line.get("event") == event and line.get("session_id") in session_ids
    ]


def _recovered(loop: Loop) -> int:
    assert loop.scheduler is not None
    return sum(
        int(str(line.get("enqueued", 0)))
        for line in loop.scheduler.log_lines()
        if line.get("event") == "wanted work re-enqueued: no job was going to do it"
    )


def test_redis_sigkill_and_aof_restart_mid_burst_with_retries_in_flight_loses_nothing(world: Loop) -> None:
    """L1, L5: 15 sessions delivered while the Agents API answers 503 (tasks sit in Celery
    retries); Redis is SIGKILLed and restarted from its append-only file while those retries
    are in flight. A retry is a new message: those published while Redis is down are gone.
    The store's wanted-vs-done count survives in the AOF, and the scheduler's recovery pass
    re-enqueues every session owed work that no job is doing: every session ends with
    exactly one executor (0 lost, 0 duplicated)."""
    loop = world
    loop.arm_fault("retrieve_session", 503, 150)
    with loop.api() as client:
        sessions = [loop.create_session(client) for _ in range(15)]
    session_ids = {s["id"] for s in sessions}
    environment_ids = {s["environment"]["id"] for s in sessions}
    wait_for(
        lambda: len(_task_lines(loop, "will retry", session_ids)) >= 10, 120, "tasks to sit in retry", interval=0.05
    )
    retrying_at_kill = len({line["session_id"] for line in _task_lines(loop, "will retry", session_ids)})
    assert loop.redis.process is not None
    loop.redis.process.kill(signal.SIGKILL)
    killed = time.monotonic()
    time.sleep(3)  # retries published meanwhile are refused by the broker
    loop.redis.start()  # same port and directory: the AOF is replayed
    down_for = time.monotonic() - killed

    wait_for(
        lambda: len({r["environment_id"] for r in loop.registered(environment_ids)}) == 15,
        110,  # within the simulator's 120 s connection deadline
        "every session's executor to register",
        interval=0.5,
    )
    recovered_by = time.monotonic() - killed
    lost, duplicated = loop.lost_and_duplicated(sessions)
    assert (lost, duplicated) == (0, 0)
    assert loop.scheduler is not None and loop.scheduler.alive()  # Redis going away did not end it
    print(
        f"\nFIGURE redis SIGKILL + AOF restart mid-burst: 15 sessions, {retrying_at_kill} retrying at the kill, "
        f"redis down {down_for:.1f}s, {_recovered(loop)} re-enqueued by the recovery pass, "
        f"all registered {recovered_by:.1f}s after the kill; lost {lost}, duplicated {duplicated}"
    )


_TASK_ENDS = {
    "task done",
    "will retry",
    "session busy elsewhere; will look again",
    "stale decision dropped; looking again",
    "giving up on session",
    "retries exhausted; left to the recovery pass",
}


def _unfinished_tasks(worker: Managed) -> int:
    """Tasks the worker's log shows started and never ended (it was killed in them)."""
    lines = worker.log_lines()
    started = {line.get("task_id") for line in lines if line.get("event") == "task started"}
    ended = {line.get("task_id") for line in lines if line.get("event") in _TASK_ENDS}
    return len(started - ended)


def _burst(loop: Loop, n: int, kill_after: float | None) -> tuple[float, float | None, list[dict[str, Any]], int]:
    """``n`` sessions at once; optionally SIGKILL a whole worker ``kill_after`` seconds in
    (and start a replacement, as a Deployment would). Returns (seconds from the first
    delivery to the last registration, seconds from the kill to it, the sessions, the tasks
    the killed worker was in the middle of).

    The Agents API throttles (2n × 429, Retry-After 1 s), which the workers wait out inside
    the task, holding the session's lease: the burst takes several seconds, and a worker
    killed 2 s in dies holding leases, as a worker does when its calls are slow."""
    loop.arm_fault("retrieve_session", 429, 2 * n, retry_after=1.0)
    with loop.api() as client:
        first = time.time()
        sessions = [loop.create_session(client) for _ in range(n)]
    environment_ids = {s["environment"]["id"] for s in sessions}
    kill_at: float | None = None
    in_flight = 0
    if kill_after is not None:
        time.sleep(max(0.0, first + kill_after - time.time()))
        victim: Managed = loop.workers[0]
        victim.kill(signal.SIGKILL)  # main process and pool: leases held, jobs unacknowledged
        kill_at = time.time()
        in_flight = _unfinished_tasks(victim)
        loop.workers.remove(victim)
        loop.start_worker(len(loop.workers) + 10)
        loop.workers.append(victim)  # keep its log for the counts
    wait_for(
        lambda: len({r["environment_id"] for r in loop.registered(environment_ids)}) == n,
        110,
        f"all {n} executors to register",
        interval=0.25,
    )
    last = max(float(r["received_at"]) for r in loop.registered(environment_ids))
    return last - first, (last - kill_at if kill_at is not None else None), sessions, in_flight


def test_a_worker_sigkilled_mid_burst_costs_seconds_not_a_lease(world: Loop) -> None:
    """L1: 20 sessions at once (2 receivers, 2 workers, the Agents API throttling), then the
    same burst with one whole worker SIGKILLed 2 s in: the dead worker's leases are no longer
    renewed and lapse after the (short) lease TTL, and the recovery pass re-enqueues its
    sessions without waiting for the broker's visibility timeout. Every session gets exactly
    one executor; the FIGURE lines compare the time to the last registration with and
    without the kill."""
    loop = world
    baseline, _, calm, _ = _burst(loop, 20, None)
    assert loop.lost_and_duplicated(calm) == (0, 0)
    recovered_before = _recovered(loop)
    with_kill, after_kill, stormy, in_flight = _burst(loop, 20, 2.0)
    assert loop.lost_and_duplicated(stormy) == (0, 0)
    env = loop.controller_env()
    ttl = env.get("CONTROLLER_LEASE_TTL_SECONDS", "10 (default)")
    print(f"\nFIGURE 20-session burst, no kill: last executor registered {baseline:.1f}s after the first delivery")
    print(
        f"FIGURE 20-session burst, whole worker SIGKILLed 2 s in: last registered {with_kill:.1f}s after the first "
        f"delivery ({after_kill:.1f}s after the kill, which caught {in_flight} tasks mid-way; lease TTL {ttl}s, "
        "visibility timeout "
        f"{env.get('CONTROLLER_QUEUE_VISIBILITY_TIMEOUT_SECONDS', '300 (default)')}s, "
        f"{_recovered(loop) - recovered_before} re-enqueued by the recovery pass)"
    )
