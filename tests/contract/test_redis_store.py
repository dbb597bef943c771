"""``RedisSessionStore`` and ``RedisInbox`` against a real redis-server on loopback."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from controller import lifecycle
from controller.errors import Fenced, StoreUnavailable
from controller.heartbeat import Heartbeat
from controller.inbox import Job, Outcome
from controller.model import Handle, Link, NotFound, Record, Session
from controller.store.base import Busy, Lease
from controller.store.redis import (
    DEMAND_KEY_PREFIX,
    PENDING_KEY,
    PRESTARTED_KEY,
    RedisClock,
    RedisDemandLog,
    RedisInbox,
    RedisSessionStore,
)
from tests.support.clock import FakeClock
from tests.support.fakes import FakeRunner, make_session
from tests.support.processes import wait_for
from tests.support.redis_clients import connect, connect_async
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
    """A fresh session id per test (the server is shared by the module)."""
    return f"sess_{next(_ids)}_{time.monotonic_ns()}"


def store_of(client: redis.Redis, ttl: float = 30.0, requeue_after: float = 15.0) -> RedisSessionStore:
    return RedisSessionStore(client, lease_ttl_seconds=ttl, requeue_after_seconds=requeue_after)


def a_record(session_id: str, generation: int = 1, started_at: float = 1_700_000_000.25) -> Record:
    return Record(
        session_id=session_id,
        environment_id="env_1",
        handle=Handle(session_id=session_id, name=f"executor-g{generation}", generation=generation, uid="4242:99"),
        started_at=started_at,
    )


def take(store: RedisSessionStore, session_id: str) -> Lease:
    taken = store.acquire(session_id)
    assert isinstance(taken, Lease), taken
    return taken


# --- leases, fencing, coalescing ---------------------------------------------------------


def test_acquire_returns_none_when_nothing_is_wanted(client: redis.Redis, sid: str) -> None:
    """L1: no delivery, no work: nothing to lease."""
    store = store_of(client)
    assert store.acquire(sid) is None
    store.want(sid)
    lease = take(store, sid)
    assert store.complete(lease) is None
    assert store.acquire(sid) is None


def test_lease_is_exclusive_across_stores(client: redis.Redis, server: RedisServer, sid: str) -> None:
    """L1: two workers (two stores, two connections) never hold one session at once."""
    first, second = store_of(client), store_of(connect(server.url))
    assert first.want(sid) == 1
    lease = take(first, sid)
    busy = second.acquire(sid)
    assert isinstance(busy, Busy)
    assert 0 < busy.retry_after <= 30.0
    assert first.complete(lease) is None
    second.want(sid)
    assert isinstance(second.acquire(sid), Lease)


def test_fencing_tokens_strictly_increase(client: redis.Redis, sid: str) -> None:
    """L12 fencing: every new lease of a session carries a higher token."""
    store = store_of(client)
    tokens = []
    for _ in range(5):
        store.want(sid)
        lease = take(store, sid)
        tokens.append(lease.token)
        store.abandon(lease) if len(tokens) % 2 else store.complete(lease)
    assert tokens == sorted(set(tokens))


def test_expired_lease_is_fenced_and_a_new_holder_gets_a_higher_token(client: redis.Redis, sid: str) -> None:
    """L1/L12 fencing: a lapsed holder can no longer write; the next holder's token is higher."""
    store = store_of(client, ttl=1)
    store.want(sid)
    old = take(store, sid)
    store.save(old, a_record(sid))
    assert isinstance(store.acquire(sid), Busy)

    def acquired() -> Lease | None:
        taken = store.acquire(sid)
        return taken if isinstance(taken, Lease) else None

    new = wait_for(acquired, timeout=5, what="the lease to expire", interval=0.05)
    assert isinstance(new, Lease)
    assert new.token > old.token

    for write in (
        store.check,
        lambda lease: store.save(lease, a_record(sid, 2)),
        store.forget,
        store.complete,
    ):
        with pytest.raises(Fenced):
            write(old)
    store.abandon(old)  # a no-op for a stale token: must not release the new holder
    assert isinstance(store.acquire(sid), Busy)
    assert store.record(sid) == a_record(sid)  # the stale save and forget changed nothing

    store.check(new)
    store.save(new, a_record(sid, 2))
    assert store.complete(new) is None


def test_check_extends_the_lease(client: redis.Redis, sid: str) -> None:
    """L12 fencing: a worker that keeps checking keeps its lease past the TTL."""
    store = store_of(client, ttl=0.5)
    store.want(sid)
    lease = take(store, sid)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        store.check(lease)
        time.sleep(0.1)
    store.check(lease)
    assert store.complete(lease) is None


def test_work_wanted_during_a_round_gets_another_round(client: redis.Redis, sid: str) -> None:
    """L1: deliveries during a held round are coalesced: complete hands back a new round, then None."""
    store = store_of(client)
    store.want(sid)
    lease = take(store, sid)
    assert lease.wanted == 1
    store.want(sid)
    store.want(sid)
    again = store.complete(lease)
    assert again == Lease(session_id=sid, token=lease.token, wanted=3)
    store.check(again)  # still held
    assert client.get(f"sc:done:{sid}") == "1"  # the first round is done; the second is still wanted
    assert client.zscore(PENDING_KEY, sid) is not None
    assert store.complete(again) is None
    assert store.acquire(sid) is None
    assert client.zscore(PENDING_KEY, sid) is None


def test_abandon_leaves_the_work_owed(client: redis.Redis, sid: str) -> None:
    """L1: a failed round releases the lease but the work is still wanted."""
    store = store_of(client)
    store.want(sid)
    lease = take(store, sid)
    store.abandon(lease)
    retry = take(store, sid)
    assert retry.wanted == 1 and retry.token > lease.token


def test_records_round_trip_and_index(client: redis.Redis, server: RedisServer, sid: str) -> None:
    """L1: the session→sandbox mapping survives a round trip and is listed for reconciliation."""
    store = store_of(client)
    other = f"{sid}_other"
    assert store.record(sid) is None
    store.want(sid)
    lease = take(store, sid)
    rec = a_record(sid, generation=7, started_at=1_700_000_123.456789)
    store.save(lease, rec)
    assert store.record(sid) == rec
    assert store_of(connect(server.url)).record(sid) == rec  # another process sees the same
    store.want(other)
    other_lease = take(store, other)
    store.save(other_lease, a_record(other))
    assert {sid, other} <= set(store.session_ids())
    assert store.session_ids() == sorted(store.session_ids())

    store.save(lease, a_record(sid, generation=8))  # overwrite replaces every field
    assert store.record(sid) == a_record(sid, generation=8)
    store.forget(lease)
    assert store.record(sid) is None
    assert sid not in store.session_ids() and other in store.session_ids()
    store.forget(other_lease)


def test_concurrent_workers_never_overlap_and_every_want_is_completed(server: RedisServer, sid: str) -> None:
    """L1: 8 workers racing for one session with deliveries interleaved: one holder at a time, nothing lost."""
    threads, attempts = 8, 60
    holders = 0
    overlaps: list[int] = []
    rounds = 0
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def worker(n: int) -> None:
        nonlocal holders, rounds
        store = store_of(connect(server.url, timeout_seconds=5.0), ttl=30)
        try:
            start.wait()
            for i in range(attempts):
                if (i + n) % 3 == 0:
                    store.want(sid)
                taken = store.acquire(sid)
                lease = taken if isinstance(taken, Lease) else None
                bump = i % 4 == 0
                while lease is not None:
                    with lock:
                        holders += 1
                        if holders > 1:
                            overlaps.append(holders)
                        rounds += 1
                    if bump:
                        bump = False
                        store.want(sid)  # a delivery during our own round
                    time.sleep(0.0005)
                    with lock:
                        holders -= 1
                    lease = store.complete(lease)
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in pool)
    assert not errors, errors
    assert overlaps == []
    # No drain needed: a want that meets a busy session is picked up by the holder's complete.
    c = connect(server.url)
    # Every want was completed: nothing pending, and the counters of a session without a
    # mapping were removed by the complete that caught up (none is left half-counted).
    assert c.zscore(PENDING_KEY, sid) is None
    assert c.exists(f"sc:want:{sid}", f"sc:done:{sid}") == 0
    assert store_of(c).acquire(sid) is None
    assert rounds > 0
    assert c.exists(f"sc:lease:{sid}") == 0


# --- fencing across data loss, pending work, key hygiene ---------------------------------


def test_a_lease_from_before_a_data_loss_is_fenced_after_it(server: RedisServer, sid: str) -> None:
    """L1/L12 fencing: tokens do not restart when Redis loses its data (FLUSHALL): the lease
    taken before is fenced once another worker takes the session after."""
    c = connect(server.url)
    try:
        first, second = store_of(c), store_of(connect(server.url))
        first.want(sid)
        old = take(first, sid)
        c.flushall()  # the data is gone: counters, fence and lease
        second.want(sid)
        new = take(second, sid)
        assert new.token > old.token
        with pytest.raises(Fenced):
            first.check(old)
        with pytest.raises(Fenced):
            first.save(old, a_record(sid))
        second.check(new)
        assert second.complete(new) is None
    finally:
        c.close()


def test_a_lease_from_before_a_restart_without_persistence_is_fenced(tmp_path: Path) -> None:
    """L1/L12 fencing: Redis restarted with no data (no AOF): the old lease's token still
    fails ``check`` once a new holder has the session."""
    own = RedisServer(tmp_path / "redis")
    own.start()
    c = connect(own.url, timeout_seconds=1.0)
    try:
        store = store_of(c)
        store.want("sess_restart")
        old = take(store, "sess_restart")
        own.stop()
        for name in ("appendonlydir", "appendonly.aof", "dump.rdb"):  # lose every byte it had
            path = tmp_path / "redis" / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        own.start()
        assert c.dbsize() == 0
        store.want("sess_restart")
        new = take(store_of(connect(own.url)), "sess_restart")
        assert new.token > old.token
        with pytest.raises(Fenced):
            store.check(old)
    finally:
        c.close()
        own.stop()


def test_pending_index_follows_want_and_done(client: redis.Redis, sid: str) -> None:
    """L1: a session is in the pending index exactly while its wanted work is not done."""
    store = store_of(client)
    assert client.zscore(PENDING_KEY, sid) is None
    store.want(sid)
    assert client.zscore(PENDING_KEY, sid) is not None
    lease = take(store, sid)
    store.abandon(lease)  # failed round: still owed
    assert client.zscore(PENDING_KEY, sid) is not None
    lease = take(store, sid)
    assert store.complete(lease) is None
    assert client.zscore(PENDING_KEY, sid) is None


def test_want_many_wants_each_session_as_want_does(client: redis.Redis, sid: str) -> None:
    """L17: the sweep's batched want records work on every session, one generation more each."""
    store = store_of(client)
    sids = [f"{sid}_{n}" for n in range(250)]
    store.want(sids[0])  # one already wanted: its generation goes on from there
    store.want_many(sids)
    store.want_many([])
    assert all(client.zscore(PENDING_KEY, s) is not None for s in sids)
    assert [int(client.get(f"sc:want:{s}")) for s in sids[:3]] == [2, 1, 1]  # type: ignore[arg-type]
    lease = take(store, sids[0])
    assert lease.wanted == 2
    assert store.complete(lease) is None
    assert isinstance(store.acquire(sids[-1]), Lease)


def test_take_overdue_hands_out_lost_work_once_and_skips_held_and_queued(client: redis.Redis, sid: str) -> None:
    """L1: the recovery index returns a session whose work is wanted, whose lease is free and
    whose last enqueue is older than the grace period; not one merely queued, not one held."""
    store = store_of(client, ttl=30, requeue_after=0.3)
    held, queued = f"{sid}_held", f"{sid}_queued"
    store.want(sid)  # its job is then lost
    store.want(held)
    lease = take(store, held)  # a worker holds it
    assert sid not in store.take_overdue(100)  # still within the grace period
    time.sleep(0.4)
    store.want(queued)  # a fresh job, just enqueued
    overdue = store.take_overdue(100)
    assert sid in overdue and held not in overdue and queued not in overdue
    assert sid not in store.take_overdue(100)  # marked enqueued: not handed out again at once
    first_wait = ms_until_due(client, sid)
    again = wait_for(lambda: sid in store.take_overdue(100), 5, "the grace period to pass again", interval=0.05)
    assert again
    assert ms_until_due(client, sid) > 1.5 * first_wait  # re-enqueued and still not taken: it backs off
    store.complete(lease)
    done = take(store, sid)
    assert client.hget("sc:requeues", sid) is None  # a worker took it: the back-off resets
    assert store.complete(done) is None
    time.sleep(0.4)
    overdue = store.take_overdue(100)
    assert sid not in overdue and held not in overdue and queued in overdue


def ms_until_due(client: redis.Redis, session_id: str) -> float:
    seconds, micros = client.time()  # type: ignore[misc]
    score = client.zscore(PENDING_KEY, session_id)
    assert score is not None
    return float(score) - (seconds * 1000 + micros // 1000)


def test_an_expired_lease_makes_its_session_overdue(client: redis.Redis, sid: str) -> None:
    """L1: a worker that died holding a session (its lease lapses) leaves the work to the
    recovery index within about one lease TTL."""
    store = store_of(client, ttl=1.0, requeue_after=60)
    store.want(sid)
    take(store, sid)  # and the worker dies: nobody renews, completes or abandons
    assert sid not in store.take_overdue(100)
    started = time.monotonic()
    wait_for(lambda: sid in store.take_overdue(100), 5, "the session to become overdue", interval=0.05)
    assert time.monotonic() - started < 60  # the lease TTL, not the requeue grace period


def test_counters_of_a_session_without_mapping_are_removed_when_done(client: redis.Redis, sid: str) -> None:
    """Per-session counters go with the mapping: kept while mapped, removed by the complete
    that catches up once the mapping is gone; a later delivery starts afresh and is not lost."""
    store = store_of(client)
    store.want(sid)
    lease = take(store, sid)
    store.save(lease, a_record(sid))
    assert store.complete(lease) is None
    assert client.exists(f"sc:want:{sid}", f"sc:done:{sid}") == 2  # mapped: kept
    store.want(sid)
    lease = take(store, sid)
    store.forget(lease)
    store.want(sid)  # a delivery while the last round runs
    again = store.complete(lease)
    assert again is not None  # not deleted: that delivery is still owed
    assert store.complete(again) is None
    assert client.exists(f"sc:want:{sid}", f"sc:done:{sid}", f"sc:rec:{sid}") == 0
    assert client.zscore(PENDING_KEY, sid) is None
    assert 0 < client.pttl(f"sc:fence:{sid}") <= 24 * 3600 * 1000  # the fence expires on its own
    assert store.want(sid) == 1
    assert isinstance(store.acquire(sid), Lease)


# --- the lease heartbeat -----------------------------------------------------------------


class SlowDeletedSessions:
    """The Agents API answering "deleted" after ``seconds``: a round that takes a while."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def get(self, session_id: str) -> Session | None:
        time.sleep(self.seconds)
        return None

    def environment_link(self, environment_id: str) -> Link | None:
        return None


def slow_deps(store: RedisSessionStore, seconds: float, renew_every: float | None) -> lifecycle.Deps:
    return lifecycle.Deps(
        sessions=SlowDeletedSessions(seconds),
        store=store,
        runner=FakeRunner(),
        clock=FakeClock(),
        renew_every_seconds=renew_every,
    )


def test_work_renews_its_lease_while_it_runs(server: RedisServer, sid: str) -> None:
    """L1: a round longer than the lease TTL keeps its lease (renewed every third of the TTL):
    no other worker can take the session meanwhile, and the round completes unfenced."""
    store, other = store_of(connect(server.url), ttl=1.0), store_of(connect(server.url), ttl=1.0)
    store.want(sid)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(lifecycle.work(sid, slow_deps(store, 3.0, 1.0 / 3))))
    thread.start()
    watcher = server.client()
    wait_for(lambda: watcher.exists(f"sc:lease:{sid}"), 5, "the worker to take the lease", interval=0.02)
    seen = []
    while thread.is_alive():
        seen.append(other.acquire(sid))
        time.sleep(0.05)
    thread.join()
    assert seen and all(isinstance(taken, Busy) for taken in seen[:-1]), seen
    assert isinstance(result[0], list) and len(result[0]) == 1
    assert other.acquire(sid) is None  # done, lease released


def test_without_renewal_a_long_round_loses_its_lease(server: RedisServer, sid: str) -> None:
    """L1/L12: the same long round with renewal off: the lease lapses after its TTL, another
    worker takes the session, and the stale round is fenced (it does not complete)."""
    store, other = store_of(connect(server.url), ttl=1.0), store_of(connect(server.url), ttl=1.0)
    store.want(sid)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            lifecycle.work(sid, slow_deps(store, 2.5, None))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    watcher = server.client()  # the round holds the lease first (else the other worker takes it before the round)
    wait_for(lambda: watcher.exists(f"sc:lease:{sid}"), 5, "the worker to take the lease", interval=0.02)
    taken = wait_for(lambda: isinstance(other.acquire(sid), Lease), 5, "the lapsed lease to be taken")
    assert taken
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], Fenced), errors


class SlowAskingSessions:
    """The Agents API answering, after ``seconds``, that the session asks for a connection."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def get(self, session_id: str) -> Session | None:
        time.sleep(self.seconds)
        return make_session(session_id)

    def environment_link(self, environment_id: str) -> Link | None:
        return None


def test_a_round_that_lost_its_lease_between_its_read_and_its_start_starts_nothing(
    server: RedisServer, sid: str
) -> None:
    """L1/L12: a worker frozen between its read of the session and its start (here: the read
    takes longer than the lease TTL, no renewal) while another worker takes the session must
    not start a sandbox: the start checks the lease first (fenced), so the runner is never
    asked, and the stale round fails. The chaos schedule cannot time a freeze into that window;
    this is the guard of the ``lease-not-checked`` mutant (``tests/chaos/mutants.py``)."""
    store, other = store_of(connect(server.url), ttl=1.0), store_of(connect(server.url), ttl=1.0)
    store.want(sid)
    runner = FakeRunner()
    deps = lifecycle.Deps(sessions=SlowAskingSessions(2.5), store=store, runner=runner, clock=FakeClock())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            lifecycle.work(sid, deps)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert wait_for(lambda: isinstance(other.acquire(sid), Lease), 5, "the lapsed lease to be taken")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Fenced)
    assert runner.calls == []  # no sandbox started, none released


def test_heartbeat_stops_and_says_so_when_the_lease_is_lost(client: redis.Redis, sid: str) -> None:
    """L12: a renewal that finds the lease gone (lapsed, or lost with Redis's data) stops
    renewing and marks the lease lost; it never takes the lease back."""
    store = store_of(client, ttl=5.0)
    store.want(sid)
    lease = take(store, sid)
    with Heartbeat(store, lease, interval=0.1) as beat:
        time.sleep(0.3)
        assert not beat.lost
        client.delete(f"sc:lease:{sid}")
        wait_for(lambda: beat.lost, 5, "the heartbeat to notice", interval=0.05)
    assert client.exists(f"sc:lease:{sid}") == 0


# --- the inbox ----------------------------------------------------------------------------------


def job_for(sid: str, webhook_id: str | None = None) -> Job:
    return Job(session_id=sid, webhook_id=webhook_id or f"msg_{sid}", event_type="agent.session.action_required")


@contextlib.asynccontextmanager
async def inbox_of(url: str, sid: str) -> AsyncIterator[RedisInbox]:
    """An inbox on a fresh asyncio client, queueing to a list of the test's own, closed after use."""
    inbox = RedisInbox(connect_async(url), queue_of(sid), dedup_ttl_seconds=3600)
    try:
        yield inbox
    finally:
        await inbox.close()


def queue_of(sid: str) -> str:
    return f"test-queue-{sid}"


def queued_sessions(client: redis.Redis, sid: str) -> list[str]:
    """The session id argument of each task message on the test's queue, oldest first."""
    messages = client.lrange(queue_of(sid), 0, -1)
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in reversed(messages)]  # type: ignore[union-attr]


def test_a_delivery_is_wanted_queued_and_remembered_at_once(server: RedisServer, client: redis.Redis, sid: str) -> None:
    """L5: one script wants the work, queues the job and remembers the id; a copy is a duplicate."""
    before_ms = int(time.time() * 1000)

    async def scenario() -> list[Outcome]:
        async with inbox_of(server.url, sid) as inbox:
            first = await inbox.submit(job_for(sid))
            client.script_flush()  # a Redis that lost its scripts (restart, failover): loaded again
            return [first, await inbox.submit(job_for(sid)), await inbox.submit(job_for(sid, f"msg_{sid}_other"))]

    outcomes = asyncio.run(scenario())
    assert outcomes == [Outcome.ENQUEUED, Outcome.DUPLICATE, Outcome.ENQUEUED]
    assert queued_sessions(client, sid) == [sid, sid]
    assert client.get(f"sc:want:{sid}") == "2"
    assert client.get(f"sc:seen:msg_{sid}") == "done"
    assert 0 < client.ttl(f"sc:seen:msg_{sid}") <= 3600
    # The pending index as ``RedisSessionStore.want`` keeps it: a job is expected within the grace.
    score = client.zscore(PENDING_KEY, sid)
    assert score is not None and before_ms + 15_000 <= score <= time.time() * 1000 + 15_000
    lease = store_of(client).acquire(sid)  # what a worker does with the job
    assert isinstance(lease, Lease) and lease.wanted == 2


def test_concurrent_copies_of_one_delivery_queue_once(server: RedisServer, client: redis.Redis, sid: str) -> None:
    """L5/L1: 20 replicas receiving the same webhook-id at once queue exactly one job."""

    async def scenario() -> list[Outcome]:
        async with contextlib.AsyncExitStack() as stack:
            inboxes = [await stack.enter_async_context(inbox_of(server.url, sid)) for _ in range(20)]
            return list(await asyncio.gather(*(inbox.submit(job_for(sid)) for inbox in inboxes)))

    outcomes = asyncio.run(scenario())
    assert sorted(outcomes) == sorted([Outcome.ENQUEUED] + [Outcome.DUPLICATE] * 19)
    assert queued_sessions(client, sid) == [sid]
    assert client.get(f"sc:want:{sid}") == "1"


def test_a_push_that_fails_leaves_the_work_wanted_and_the_id_unremembered(
    server: RedisServer, client: redis.Redis, sid: str
) -> None:
    """L5: the script wants the work before it pushes and remembers the id after: a push that
    fails (here the queue key holds a string) leaves work the recovery pass will redo, and the
    sender's retry is queued."""
    client.set(queue_of(sid), "not a list")
    inbox_job = job_for(sid)

    async def submit() -> Outcome:
        async with inbox_of(server.url, sid) as inbox:
            return await inbox.submit(inbox_job)

    with pytest.raises(redis.ResponseError):
        asyncio.run(submit())
    assert client.get(f"sc:seen:{inbox_job.webhook_id}") is None
    assert client.get(f"sc:want:{sid}") == "1"
    client.delete(queue_of(sid))
    assert asyncio.run(submit()) is Outcome.ENQUEUED
    assert queued_sessions(client, sid) == [sid]


def test_ready_answers_ping(server: RedisServer, sid: str) -> None:
    async def ready() -> bool:
        async with inbox_of(server.url, sid) as inbox:
            return await inbox.ready()

    assert asyncio.run(ready()) is True


# Keep last: it stops the module's server (and restarts it for any test ordered after it).
def test_redis_down_is_store_unavailable(server: RedisServer, sid: str) -> None:
    """L5: with Redis down every store call and the inbox raise StoreUnavailable (→ 503, sender retries)."""
    down = connect(server.url, timeout_seconds=0.5)
    store = store_of(down)
    server.stop()
    try:
        lease = Lease(session_id=sid, token=1, wanted=1)
        calls = [
            lambda: store.want(sid),
            lambda: store.acquire(sid),
            lambda: store.complete(lease),
            lambda: store.abandon(lease),
            lambda: store.check(lease),
            lambda: store.record(sid),
            lambda: store.save(lease, a_record(sid)),
            lambda: store.forget(lease),
            store.session_ids,
        ]
        for call in calls:
            with pytest.raises(StoreUnavailable) as raised:
                call()
            assert raised.value.retry_after is not None

        async def inbox_calls() -> bool:
            async with inbox_of(server.url, sid) as inbox:
                with pytest.raises(StoreUnavailable) as raised:
                    await inbox.submit(job_for(sid))
                assert raised.value.retry_after is not None
                return await inbox.ready()

        assert asyncio.run(inbox_calls()) is False
    finally:
        down.close()
        server.process = None
        server.start()


# --- one clock, deletions waiting for confirmation, the pre-start budget (issue 16) --------------


def test_the_clock_is_redis_time(client: redis.Redis) -> None:
    """L12: every worker decides on Redis's clock, the one timers fall due on (``TIME``), so a
    worker whose own clock is off by any amount reads the same time as the others."""
    clock = RedisClock(client)
    before = client.time()
    now = clock.now()
    after = client.time()
    assert before[0] + before[1] / 1e6 <= now <= after[0] + after[1] / 1e6


def test_the_404_mark_is_kept_until_forgotten_and_only_under_the_lease(client: redis.Redis, sid: str) -> None:
    """L17: the time a session's reads began answering 404 is written with its timer, fenced;
    the first time stays (later rounds do not move it); a round that finds the session clears it."""
    store = store_of(client, ttl=30)
    store.want(sid)
    lease = take(store, sid)
    store.arm(lease, 1_700_000_061.0, missing_since=1_700_000_000.5)
    store.arm(lease, 1_700_000_122.0, missing_since=1_700_000_061.0)
    assert store.missing_since(sid) == 1_700_000_000.5
    assert store.missing()[sid] == 1_700_000_000.5
    store.arm(lease, None)
    assert store.missing_since(sid) is None
    client.delete(f"sc:lease:{sid}")  # the lease lapsed
    with pytest.raises(Fenced):
        store.arm(lease, None, missing_since=1.0)
    assert store.missing_since(sid) is None


def test_the_404_reads_and_an_operators_release_are_kept_with_the_mark(client: redis.Redis, sid: str) -> None:
    """L7/L17: the 404 reads counted toward a deletion are written with the mark (each round
    replaces them); an operator's release is noted only for a session known to answer 404; a
    round that finds the session forgets all three."""
    store = store_of(client, ttl=30)
    assert store.not_found(sid) is None
    assert store.ask_release(sid, 1_700_000_100.0) is False  # not known to answer 404: nothing noted
    store.want(sid)
    lease = take(store, sid)
    store.arm(lease, 1_700_000_030.0, missing_since=1_700_000_000.5)  # a mark without reads: the first
    assert store.not_found(sid) == NotFound(1_700_000_000.5, 1, None, None)
    store.arm(lease, 1_700_000_061.0, missing_since=1_700_000_030.0, missing_reads=(2, 1_700_000_030.25))
    assert store.not_found(sid) == NotFound(1_700_000_000.5, 2, 1_700_000_030.25, None)
    assert store.ask_release(sid, 1_700_000_100.0) is True
    assert store.not_found(sid) == NotFound(1_700_000_000.5, 2, 1_700_000_030.25, 1_700_000_100.0)
    store.arm(lease, None)  # found again
    assert store.not_found(sid) is None
    assert client.hget("sc:missing:reads", sid) is None and client.hget("sc:release", sid) is None


def test_a_good_read_forgets_the_404s_before_its_round_acts(client: redis.Redis, sid: str) -> None:
    """L7/L17 (issue 37, item 1): ``found`` forgets the mark, the reads counted and a release asked
    in one fenced step, leaving the session's timer as it was (the round arms it at its end, if
    it gets there); a worker whose lease lapsed changes nothing."""
    store = store_of(client, ttl=30)
    store.want(sid)
    lease = take(store, sid)
    store.arm(lease, 1_700_000_061.0, missing_since=1_700_000_000.5, missing_reads=(2, 1_700_000_030.25))
    assert store.ask_release(sid, 1_700_000_040.0) is True
    client.delete(f"sc:lease:{sid}")  # the lease lapsed
    with pytest.raises(Fenced):
        store.found(lease)
    assert store.not_found(sid) == NotFound(1_700_000_000.5, 2, 1_700_000_030.25, 1_700_000_040.0)
    store.want(sid)
    lease = take(store, sid)
    store.found(lease)
    assert store.not_found(sid) is None and store.timer(sid) == 1_700_000_061.0
    assert client.hget("sc:missing:reads", sid) is None and client.hget("sc:release", sid) is None


def test_sessions_to_compare_are_those_that_answer_first(client: redis.Redis, sid: str) -> None:
    """L17: the sessions read to confirm a deletion are mapped ones other than it, those not known
    to answer 404 only, unless every other one is known to."""
    store = store_of(client, ttl=30)
    others = [f"{sid}_other{i}" for i in range(4)]
    for session_id in [sid, *others]:
        store.want(session_id)
        store.save(take(store, session_id), a_record(session_id))
    for session_id in others[:3]:
        client.hset("sc:missing", session_id, "1700000000.0")
    assert store.others_to_compare(sid, 3) == [others[3]]
    client.hset("sc:missing", others[3], "1700000000.0")
    picked = store.others_to_compare(sid, 3)
    assert len(picked) == 3 and set(picked) <= set(others)
    for session_id in [sid, *others]:
        client.delete(f"sc:rec:{session_id}")
        client.srem("sc:sessions", session_id)
        client.hdel("sc:missing", session_id)


def test_the_prestart_budget_holds_across_stores_and_frees_room(client: redis.Redis, server: RedisServer) -> None:
    """L9: pre-start room is taken atomically under each session's lease, whatever store (worker)
    asks; a used (saved without ``prestarted``), stopped or forgotten sandbox frees it, and a
    reservation whose start was never recorded is dropped once it is a minute old."""
    client.delete(PRESTARTED_KEY)
    stores = [store_of(client), store_of(connect(server.url))]
    sids = [f"pre_{next(_ids)}_{i}" for i in range(5)]
    leases = {}
    granted = []
    for i, session_id in enumerate(sids):
        stores[i % 2].want(session_id)
        leases[session_id] = take(stores[i % 2], session_id)
        granted.append(stores[i % 2].reserve_prestart(leases[session_id], 3))
    assert granted == [True, True, True, False, False]
    assert stores[0].reserve_prestart(leases[sids[0]], 3)  # its own room again: still granted
    for session_id in sids[:3]:
        stores[0].save(leases[session_id], replace(a_record(session_id), prestarted=True))
    assert not stores[0].reserve_prestart(leases[sids[3]], 3)
    stores[0].save(leases[sids[0]], a_record(sids[0]))  # used: saved without the mark
    assert stores[0].reserve_prestart(leases[sids[3]], 3)
    stores[0].forget(leases[sids[1]])
    assert stores[0].reserve_prestart(leases[sids[4]], 3)
    assert client.zcard(PRESTARTED_KEY) == 3  # the budget: three pre-starts hold room
    # A reservation whose start never got recorded (its worker died) goes after a minute.
    client.zadd(PRESTARTED_KEY, {"lost_reservation": 0})
    client.zrem(PRESTARTED_KEY, sids[2])  # make room for the check below, then fill it again
    stale = f"pre_{next(_ids)}_stale"
    stores[0].want(stale)
    assert stores[0].reserve_prestart(take(stores[0], stale), 3)
    assert client.zscore(PRESTARTED_KEY, "lost_reservation") is None
    client.delete(f"sc:lease:{sids[3]}")
    with pytest.raises(Fenced):
        stores[0].reserve_prestart(leases[sids[3]], 3)
    client.delete(PRESTARTED_KEY)


def test_new_record_fields_round_trip(client: redis.Redis, sid: str) -> None:
    """L14/L9: whether the executor was ever seen connected, and whether the sandbox is a
    pre-start not yet used, are stored with the mapping."""
    store = store_of(client)
    store.want(sid)
    lease = take(store, sid)
    saved = replace(a_record(sid), disconnected_at=None, seen_connected=True, prestarted=True)
    store.save(lease, saved)
    assert store.record(sid) == saved
    blind = replace(saved, disconnected_at=1_700_000_000.5, link_unknown=True)  # L14: a look could not read the link
    store.save(lease, blind)
    assert store.record(sid) == blind
    looked = replace(blind, link_unknown=False, link_looked_at=1_700_000_003.25)  # L14: the last look that saw it down
    store.save(lease, looked)
    assert store.record(sid) == looked
    restored = replace(looked, lineage_started_at=1_699_999_000.5)  # issue 37: a restored lineage's first start
    store.save(lease, restored)
    assert store.record(sid) == restored
    bounded = replace(looked, down_since=1_699_999_990.75)  # L14: when the outage was first seen
    store.save(lease, bounded)
    assert store.record(sid) == bounded
    looping = replace(bounded, crashes=5, backoff_until=1_700_000_016.5)  # a crash loop's count and back-off
    store.save(lease, looping)
    assert store.record(sid) == looping
    stuck = replace(looping, cannot_start_since=1_700_000_020.25)  # issue 39: found unable to start (no profile)
    store.save(lease, stuck)
    assert store.record(sid) == stuck


def test_a_decision_is_noted_with_redis_time_and_whether_it_held(client: redis.Redis, sid: str) -> None:
    """L17: ``status`` shows when each last decision was made (Redis's clock) and whether it held
    a deletion."""
    store = store_of(client)
    store.note_decision(sid, "keep", "deletion held: ...", held=True)
    noted = store.last_decision(sid)
    seconds, micros = client.time()
    assert noted is not None and noted.held and noted.verdict == "keep"
    assert abs(noted.at - (seconds + micros / 1e6)) < 5


def test_the_demand_log_stamps_placements_on_redis_clock_and_keeps_only_its_window(client: redis.Redis) -> None:
    """Placements noted by any process are stamped with Redis's ``TIME`` (the clock ``recent``
    reads too), each within the moment it was noted; a note drops those older than the window
    it keeps, and the key expires a minute after that window (a template nobody uses leaves
    nothing); another template's notes are its own."""
    log = RedisDemandLog(client)
    template = f"t{next(_ids)}"
    before = RedisClock(client).now()
    for _ in range(3):
        log.note(template, keep_seconds=0.5)
    log.note(template + "-other", keep_seconds=600)
    now, stamps = log.recent(template)
    assert len(stamps) == 3 and all(before <= s <= now for s in stamps)
    assert 0 < client.ttl(DEMAND_KEY_PREFIX + template) <= 61
    time.sleep(0.6)
    log.note(template, keep_seconds=0.5)
    now, stamps = log.recent(template)
    assert len(stamps) == 1 and now - 0.5 <= stamps[0] <= now
    assert len(log.recent(template + "-other")[1]) == 1
    assert log.recent("never-used")[1] == []
