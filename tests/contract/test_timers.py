"""Durable timers (``sc:timers``) against a real redis-server: armed under the lease, taken
once together with the session's work, kept across a restart from the append-only file, and
fired by the active scheduler (``controller.timers``, ``controller.scheduler``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from controller import scheduler
from controller.config import Settings
from controller.errors import Fenced
from controller.inbox import Job
from controller.store.base import Lease
from controller.store.redis import PENDING_KEY, TIMERS_KEY, RedisSessionStore
from tests.support.fakes import FakeRunner
from tests.support.processes import wait_for
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer

_ids = itertools.count(1)


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = connect(server.url, timeout_seconds=2.0)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def sid() -> str:
    return f"sess_t{next(_ids)}_{time.monotonic_ns()}"


def store_of(client: redis.Redis) -> RedisSessionStore:
    return RedisSessionStore(client, lease_ttl_seconds=30, requeue_after_seconds=15)


def leased(store: RedisSessionStore, session_id: str) -> Lease:
    store.want(session_id)
    lease = store.acquire(session_id)
    assert isinstance(lease, Lease), lease
    return lease


def settle(store: RedisSessionStore, lease: Lease) -> None:
    """Finish the round (want == done), as a worker does after arming."""
    assert store.complete(lease) is None


def test_arm_is_fenced_and_replaces_or_removes_the_one_timer(client: redis.Redis, sid: str) -> None:
    """L12: only the lease holder arms; a session has one timer; None removes it."""
    store = store_of(client)
    lease = leased(store, sid)
    store.arm(lease, 2_000_000_000.5)
    store.arm(lease, 2_000_000_100.25)
    assert store.timer(sid) == 2_000_000_100.25
    assert client.zcard(TIMERS_KEY) >= 1 and client.zscore(TIMERS_KEY, sid) == 2_000_000_100_250
    client.delete(f"sc:lease:{sid}")  # the lease lapsed
    with pytest.raises(Fenced):
        store.arm(lease, 1.0)
    assert store.timer(sid) == 2_000_000_100.25
    again = leased(store, sid)
    store.arm(again, None)
    assert store.timer(sid) is None


def test_take_due_fires_once_and_wants_the_work_in_the_same_step(client: redis.Redis, sid: str) -> None:
    """A due timer is taken once; its session's work is wanted (and in the pending index) as a
    webhook's would be, so a scheduler dying right after still leaves the work to the recovery pass."""
    store = store_of(client)
    later, soon = f"{sid}_later", sid
    for session_id, due in ((later, time.time() + 3600), (soon, time.time() - 1)):
        lease = leased(store, session_id)
        store.arm(lease, due)
        settle(store, lease)
    want_before = int(client.get(f"sc:want:{soon}") or 0)
    assert client.zscore(PENDING_KEY, soon) is None
    assert store.take_due(100) == [soon]
    assert store.take_due(100) == []
    assert int(client.get(f"sc:want:{soon}") or 0) == want_before + 1
    assert client.zscore(PENDING_KEY, soon) is not None
    assert store.timer(soon) is None and store.timer(later) is not None
    assert isinstance(store.acquire(soon), Lease)  # the worker finds work to do


def test_timers_survive_a_redis_restart_from_the_append_only_file(tmp_path: Path) -> None:
    """Durable: Redis killed (SIGKILL) with timers pending comes back from its AOF with every
    timer, and each fires exactly once."""
    own = RedisServer(tmp_path / "redis").start()
    try:
        store = store_of(connect(own.url))
        ids = [f"sess_aof_{n}" for n in range(5)]
        for session_id in ids:
            lease = leased(store, session_id)
            store.arm(lease, time.time() + 1.0)
            settle(store, lease)
        assert own.process is not None
        own.process.kill()
        own.process.stop()
        own.start()
        store = store_of(connect(own.url))
        fired: list[str] = []
        wait_for(lambda: fired.extend(store.take_due(100)) or len(fired) >= len(ids), 15, "the timers to fall due")
        time.sleep(0.5)
        fired.extend(store.take_due(100))
        assert sorted(fired) == ids
    finally:
        own.stop()


def _settings() -> Settings:
    return Settings.from_env(
        {"CONTROLLER_RECONCILE_INTERVAL_SECONDS": "300", "CONTROLLER_RECOVERY_INTERVAL_SECONDS": "5"}
    )


def test_the_active_scheduler_fires_due_timers_through_the_queue(server: RedisServer, sid: str) -> None:
    """The leader serves timers about once a second (its round is at most a second): each due
    timer becomes one ``timer`` job; a standby fires none."""
    client = connect(server.url)
    client.delete(scheduler.LEADER_KEY)
    store = store_of(client)
    lease = leased(store, sid)
    store.arm(lease, time.time() + 1.5)
    settle(store, lease)
    published: list[Job] = []
    stops = [threading.Event(), threading.Event()]

    def publish(jobs: Sequence[Job], term: str) -> None:
        published.extend(jobs)

    threads = [
        threading.Thread(
            target=scheduler.run,
            args=(_settings(), store_of(connect(server.url)), FakeRunner(), connect(server.url), publish, s),
            daemon=True,
        )
        for s in stops
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: any(j.session_id == sid for j in published), 15, "the timer to fire")
        time.sleep(2.5)  # more rounds of both schedulers: the timer must not fire twice
    finally:
        for stop, thread in zip(stops, threads, strict=True):
            stop.set()
            thread.join(timeout=10)
            assert not thread.is_alive()
        client.close()
    assert [j for j in published if j.session_id == sid] == [Job(session_id=sid, webhook_id="", event_type="timer")]
