"""High availability on the engines the controller already uses, with real parts on loopback:
Redis as an operator runs it for failover (a primary, a replica and three ``redis-server
--sentinel`` processes, with passwords), 2 receivers, 2 Celery workers, the scheduler,
the simulator and the real ``codex exec-server``; every process reaches Redis through the
sentinels (``CONTROLLER_REDIS_SENTINELS``).

- the primary is SIGKILLed in the middle of a burst: the sentinels promote the replica, every
  process follows it, and nothing a receiver acknowledged is lost;
- the primary is made a replica for 3 s (``REPLICAOF``) and back: the workers live on, and
  each takes jobs again;
- two schedulers whose round takes 12 s (four leases) never act as leaders at once, even when
  the leader is frozen past its lease in the middle of a round.

Each test builds its own world: it breaks parts of it. ``FIGURE`` lines give the measurements
RELIABILITY.md quotes (``pytest -s``).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller import queue
from controller.config import Settings
from controller.redis_client import Endpoint
from tests.support.codex import codex_binary
from tests.support.processes import Managed, assert_no_process_left, free_port, python_module, wait_for
from tests.support.redis_server import ReplicatedRedis
from tests.support.slow_scheduler import NAME, ROUND, SANDBOXES
from tests.system.loop import EXECUTOR_KEY, SECRETS, Loop, assert_no_secret

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

CONNECTED_WITHIN_SECONDS = 30.0
HA_SECRETS = (*SECRETS, ReplicatedRedis.PASSWORD, ReplicatedRedis.SENTINEL_PASSWORD)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(tmp_path / "loop", codex_binary(), sentinel=True)
    (tmp_path / "loop").mkdir()
    try:
        loop.start()
        yield loop
    finally:
        loop.stop()
    assert_no_process_left(tmp_path)  # the redis-servers and sentinels too, not only the executors


def _send_until_accepted(loop: Loop, port: int, session_id: str, deadline: float) -> tuple[float, float] | None:
    """A second sender: one signed delivery about the session to receiver ``port``, retried on
    anything but a 2xx (as the Agents API retries) until accepted; the accepted attempt's start
    and end."""
    headers, body = loop.delivery(session_id)
    while time.time() < deadline:
        started = time.time()
        try:
            if loop.post(port, headers, body).status_code < 300:
                return started, time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return None


def _accepted_attempts(loop: Loop) -> list[tuple[float, float]]:
    """The start and end of each of the simulator's attempts to deliver an ``action_required``
    event (a receiver accepts one only once its job is in Redis; the other events it answers
    without Redis) that a receiver accepted."""
    response = httpx.get(f"{loop.simulator_url}/admin/deliveries?type=agent.session.action_required", timeout=10)
    response.raise_for_status()
    return [
        (float(a["started_at"]), float(a["started_at"]) + float(a["duration_seconds"] or 0))
        for d in response.json()["data"]
        for a in d["attempts"]
        if a["status_code"] is not None and 200 <= a["status_code"] < 300
    ]


def _burst(
    loop: Loop, n: int, fault_after: int, fault: Any
) -> tuple[list[dict[str, Any]], float, list[tuple[float, float]]]:
    """``n`` sessions created 0.1 s apart (the simulator delivers each to receiver 0); a second
    sender delivers each to receiver 1 too. ``fault()`` runs once ``fault_after`` sessions
    exist. Returns the sessions, when ``fault()`` returned, and the second sender's accepted
    attempts (start, end)."""
    sessions: list[dict[str, Any]] = []
    accepted: list[tuple[float, float]] = []
    deadline = time.time() + 120
    with ThreadPoolExecutor(max_workers=8) as senders, loop.api() as client:
        pending = []
        faulted_at = 0.0
        for index in range(n):
            if index == fault_after:
                fault()
                faulted_at = time.time()
            session = loop.create_session(client)
            sessions.append(session)
            pending.append(senders.submit(_send_until_accepted, loop, loop.receiver_ports[1], session["id"], deadline))
            time.sleep(0.1)
        for future in pending:
            when = future.result()
            assert when is not None, "the second sender's delivery was never accepted"
            accepted.append(when)
    return sessions, faulted_at, accepted


def _all_registered(loop: Loop, sessions: list[dict[str, Any]], within: float) -> float:
    """Wait for every session's executor to register; when the last one did."""
    environment_ids = {s["environment"]["id"] for s in sessions}
    wait_for(
        lambda: {r["environment_id"] for r in loop.registered(environment_ids)} == environment_ids,
        within,
        f"all {len(sessions)} executors to register",
        interval=0.25,
    )
    return max(float(r["received_at"]) for r in loop.registered(environment_ids))


def test_primary_sigkilled_mid_burst_loses_nothing(world: Loop) -> None:
    """L1, L5: 20 sessions in a burst, each delivered to both receivers (the simulator to one, a
    second sender to the other, both retrying until accepted); 8 sessions in, the Redis primary is
    SIGKILLed. The sentinels promote the replica; receivers, workers and the scheduler follow
    it. Every delivery a receiver acknowledged was on the replica first, so every session gets
    exactly one executor (0 lost, 0 duplicated), each connected within 30 s of the kill."""
    loop = world
    assert loop.ha is not None
    ha = loop.ha
    sessions, killed_at, accepted = _burst(loop, 20, 8, ha.primary.kill)
    last = _all_registered(loop, sessions, 110)
    wait_for(lambda: ha.sentinels.master_ports() == {ha.replica.port}, 30, "the sentinels to name the new master")
    lost, duplicated = loop.lost_and_duplicated(sessions)
    # Service again: the first delivery attempt begun after the kill that a receiver accepted.
    first_accepted = min(end for start, end in [*_accepted_attempts(loop), *accepted] if start > killed_at)
    assert (lost, duplicated) == (0, 0)
    assert last - killed_at < CONNECTED_WITHIN_SECONDS, f"last registration {last - killed_at:.1f}s after the kill"
    assert all(w.alive() for w in loop.workers) and loop.scheduler is not None and loop.scheduler.alive()
    assert "Unrecoverable error" not in loop.all_output()
    assert_no_secret(loop.all_output(), HA_SECRETS)
    print(
        f"\nFIGURE Redis primary SIGKILLed 8 sessions into a 20-session burst (Sentinel, 2 receivers, 2 workers): "
        f"first delivery accepted {first_accepted - killed_at:.1f}s after the kill, last executor registered "
        f"{last - killed_at:.1f}s after it; lost {lost}, duplicated {duplicated}"
    )


def test_a_role_flip_leaves_the_workers_running_and_serves_every_session(world: Loop) -> None:
    """L1, L17: 12 sessions in a burst; 4 in, the primary is made a replica (``REPLICAOF`` an
    address where nothing listens) for 3 s, then the master again: the workers' waiting BRPOPs
    are ended (UNBLOCKED) and their writes refused (READONLY) meanwhile, acknowledgements too.
    Both workers are still running afterwards (the same processes), each takes jobs again, and
    every session gets exactly one executor."""
    loop = world
    assert loop.ha is not None
    primary = loop.ha.primary
    workers = list(loop.workers)
    flipped: list[float] = []

    def flip() -> None:
        def run() -> None:
            with primary.client(timeout=2) as admin:
                admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
                time.sleep(3)
                admin.execute_command("REPLICAOF", "NO", "ONE")
            flipped.append(time.time())

        threading.Thread(target=run, daemon=True).start()

    sessions, _, _ = _burst(loop, 12, 4, flip)
    wait_for(lambda: flipped, 30, "the primary to be the master again")
    master_again = flipped[0]
    last = _all_registered(loop, sessions, 110)
    # Each worker takes jobs again, not only one of them. A worker whose pool processes all
    # ended a job during the flip had every acknowledgement refused; kombu alone then counted
    # those jobs as held for good and the worker never asked for another (its connection was
    # fine, so it never reconnected either). More sessions, a few, give each worker work.
    extra: list[dict[str, Any]] = []
    with loop.api() as client:

        def each_worker_took_a_job() -> bool:
            if all(_jobs_taken_since(w, master_again) for w in workers):
                return True
            if len(extra) < EXTRA_SESSIONS:
                extra.append(loop.create_session(client))
            return False

        wait_for(each_worker_took_a_job, 60, "each worker to take a job once the primary was the master again", 2)
    if extra:
        last = max(last, _all_registered(loop, [*sessions, *extra], 110))
    lost, duplicated = loop.lost_and_duplicated([*sessions, *extra])
    assert (lost, duplicated) == (0, 0)
    assert loop.workers == workers and all(w.alive() for w in workers), [w.output()[-2000:] for w in workers]
    assert "Unrecoverable error" not in loop.all_output()
    taken = ", ".join(f"{w.name} {_jobs_taken_since(w, master_again)}" for w in workers)
    print(
        f"\nFIGURE Redis primary made a replica for 3 s, 4 sessions into a 12-session burst: both workers still "
        f"running; last executor registered {last - master_again:.1f}s after it was the master again; "
        f"jobs taken since then: {taken}; {len(extra)} more sessions; lost {lost}, duplicated {duplicated}"
    )


EXTRA_SESSIONS = 4
"""At most this many sessions are added after a role flip until each worker has taken a job."""


def _jobs_taken_since(worker: Managed, since: float) -> int:
    """How many jobs ``worker`` began (``task started``) after ``since`` (Unix seconds)."""
    return sum(1 for line in _lines(worker, "task started") if float(str(line["time"])) > since)


# --- leadership ------------------------------------------------------------------------------

ROUND_SECONDS = 12.0
"""Four leases (``scheduler.LEASE_SECONDS``): a leader that renewed only once a round would lose
its lease 3 s into each one."""
SLOW_SCHEDULER = "tests.support.slow_scheduler"


def _lines(process: Managed, event: str) -> list[dict[str, Any]]:
    return [line for line in process.log_lines() if line.get("event") == event]


def _leading_since(process: Managed) -> list[float]:
    """When the process started leading (each term), from its log lines' times (Unix seconds)."""
    return [float(line["time"]) for line in _lines(process, "leading: sweeping and recovering")]


def _stopped(process: Managed) -> bool:
    """Whether the process said it stopped acting as the leader."""
    said = {str(line.get("event")) for line in process.log_lines()}
    return bool(said & STOPPED_LEADING)


STOPPED_LEADING = {
    "leadership lost mid-round; acting no further",
    "stopped leading: the term could not be renewed in time, or another leads",
}


def _session_of(message: str | bytes) -> str:
    """The session id a queued task message is about."""
    body = json.loads(message)["body"]
    return str(json.loads(base64.b64decode(body))[0][0])


def test_two_schedulers_whose_round_takes_12_seconds_never_lead_at_once(tmp_path: Path) -> None:
    """L17, L18: two real schedulers through the sentinels; each round's sweep takes 12 s (a slow
    listing of the sandboxes; ``tests.support.slow_scheduler``), four times the 3 s lease.
    The leader renews on its own thread, so for two whole rounds the other stands by and queues
    nothing. Then the leader is frozen (SIGSTOP) a quarter into its round for 6 s: its lease
    lapses and the other takes over; thawed, the old leader's round goes on, but its term is over:
    it queues nothing more (its renew deadline passed; its pushes are fenced) and stands by.
    Every job on the maintenance queue, in the order Redis took them, came from the process that
    was leading then."""
    ha = ReplicatedRedis(tmp_path / "redis-ha").start()
    settings = Settings.from_env(ha.settings())
    client = Endpoint.from_settings(settings.queue).client()
    arrivals: list[tuple[float, str]] = []
    stop = threading.Event()

    def consume() -> None:  # stands in for the workers: takes each job as it is queued
        while not stop.is_set():
            try:
                taken = client.brpop([queue.MAINTENANCE_QUEUE], timeout=0.5)
            except Exception:
                time.sleep(0.2)
                continue
            if taken:
                arrivals.append((time.time(), _session_of(taken[1])))

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")},
        **ha.settings(),
        "CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY,
        "CONTROLLER_LOCAL_STATE_DIRECTORY": str(tmp_path / "sandboxes"),
        "CONTROLLER_LOCAL_EXECUTOR_SAME_USER": "true",
        "CONTROLLER_RECONCILE_INTERVAL_SECONDS": "1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        ROUND: str(ROUND_SECONDS),
        SANDBOXES: "3",
    }
    schedulers = {
        name: Managed(name, python_module(SLOW_SCHEDULER), {**env, NAME: name}, tmp_path / f"{name}.log")
        for name in ("first", "second")
    }
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    first, second = schedulers["first"], schedulers["second"]
    try:
        first.start()
        wait_for(lambda: _leading_since(first), 30, "the first scheduler to lead")
        second.start()
        wait_for(lambda: len(_lines(first, "test: listing")) >= 2, 3 * ROUND_SECONDS, "two of the leader's rounds")
        assert _leading_since(second) == [], "the standby led during the leader's long rounds"
        assert {sid.split("-")[0] for _, sid in arrivals} == {"first"}

        # A quarter into the leader's third round (it began at most a second after the second
        # listing ended), so that after a freeze of two leases the round still has 2-4 s to go.
        time.sleep(ROUND_SECONDS / 4)
        os.killpg(first.pid, signal.SIGSTOP)
        frozen_at = time.time()
        time.sleep(6)  # two leases: the standby takes over meanwhile
        os.killpg(first.pid, signal.SIGCONT)
        wait_for(lambda: _leading_since(second), 30, "the standby to take over")
        took_over = _leading_since(second)[0]
        # The thawed leader finishes its listing (its last 2-4 s), finds its term over and stops.
        wait_for(lambda: _stopped(first), 2 * ROUND_SECONDS, "the thawed leader to stop acting")
        wait_for(
            lambda: any(sid.startswith("second") for _, sid in arrivals), 3 * ROUND_SECONDS, "the new leader's jobs"
        )
        time.sleep(ROUND_SECONDS / 2)
        assert first.alive() and second.alive()
    finally:
        stop.set()
        for process in schedulers.values():
            if process.alive():
                os.killpg(process.pid, signal.SIGCONT)  # never left frozen, whatever failed
            process.stop()
        consumer.join(timeout=5)
        client.close()
        ha.stop()
    by_first = [t for t, sid in arrivals if sid.startswith("first")]
    by_second = [t for t, sid in arrivals if sid.startswith("second")]
    assert by_first and by_second
    assert max(by_first) < took_over, "the old leader queued jobs after the other had taken over"
    assert took_over > frozen_at
    assert _stopped(first), first.output()[-3000:]
    assert_no_process_left(tmp_path)
    print(
        f"\nFIGURE two schedulers, 12 s rounds: {len(by_first)} jobs from the first leader, none from the standby "
        f"during its rounds; first frozen mid-round, the other led {took_over - frozen_at:.1f}s later; the thawed "
        f"first queued nothing after that ({len(by_second)} jobs from the new leader)"
    )
