"""The scheduler against a real redis-server: ``Leadership`` and the ``run`` loop (L17, L18).

Exactly one scheduler sweeps at a time; the sweep publishes one job per mapped or managed
session per round. The runner is the in-memory fake; the store is the real ``RedisSessionStore``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from controller import queue, scheduler
from controller.config import Settings
from controller.errors import LeadershipLost, StoreUnavailable
from controller.inbox import Job
from controller.model import Handle, PoolState, Record, SandboxSpec
from controller.scheduler import LEADER_KEY, Leadership
from controller.store.base import Lease
from controller.store.redis import RedisSessionStore
from tests.support.fakes import FakeRunner
from tests.support.processes import wait_for
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer

INTERVAL = 1.0
_ids = itertools.count(1)


@pytest.fixture
def clients(server: RedisServer) -> Iterator[Callable[[], redis.Redis]]:
    """New connections to a flushed server (the leader key is global), all closed afterwards."""
    made: list[redis.Redis] = []

    def new() -> redis.Redis:
        made.append(connect(server.url, timeout_seconds=2.0))
        return made[-1]

    new().flushdb()
    try:
        yield new
    finally:
        for c in made:
            c.close()


# --- Leadership ----------------------------------------------------------------------------


def test_only_one_leadership_holds_at_a_time(clients: Callable[[], redis.Redis]) -> None:
    """L17/L18: two schedulers never sweep at once: the second cannot take the key while it is held."""
    first, second = Leadership(clients()), Leadership(clients())
    assert first.attempt() is True
    term = first.term()
    for _ in range(5):
        assert second.attempt() is False and second.term() is None
        assert first.attempt() is True
    assert first.term() == term  # renewals keep the term


def test_the_holder_renews_the_lease(clients: Callable[[], redis.Redis]) -> None:
    """L17: a holder that renews keeps leadership well past one lease; each renewal resets it."""
    client = clients()
    holder, other = Leadership(client, 1.0, 0.6, 0.2), Leadership(clients(), 1.0, 0.6, 0.2)
    assert holder.attempt()
    deadline = time.monotonic() + 2.5  # 2.5 leases
    while time.monotonic() < deadline:
        time.sleep(0.2)
        assert holder.attempt() is True
        assert 800 < int(client.pttl(LEADER_KEY)) <= 1000  # type: ignore[arg-type]
        assert other.attempt() is False


def test_another_takes_over_after_the_holder_stops_renewing(clients: Callable[[], redis.Redis]) -> None:
    """L17: a holder that stopped (crashed, lost Redis) is replaced once its lease has passed, not
    before; the new leader's term is a new one, and the old holder finds the key taken."""
    holder, other = Leadership(clients(), 0.6, 0.4, 0.1), Leadership(clients(), 0.6, 0.4, 0.1)
    assert holder.attempt()
    stopped = time.monotonic()
    assert other.attempt() is False
    wait_for(other.attempt, timeout=5, what="the other scheduler to take over", interval=0.05)
    assert time.monotonic() - stopped >= 0.5
    assert holder.attempt() is False and holder.term() is None  # it stands by
    assert other.term() not in (None, holder.term())


def test_a_leader_that_cannot_renew_stops_acting_before_its_lease_lapses(clients: Callable[[], redis.Redis]) -> None:
    """Leader election as client-go does it: a leader counts itself the leader only until its
    renew deadline (measured from sending its last renewal), which comes before its lease ends,
    so it has stopped acting while no standby can take over yet. Once it can renew again it
    leads in a new term (its old one may be fenced already)."""
    now = [1000.0]
    client = clients()
    leader = Leadership(client, lease_seconds=30, renew_deadline_seconds=20, retry_seconds=1, clock=lambda: now[0])
    standby = Leadership(clients(), lease_seconds=30, renew_deadline_seconds=20, retry_seconds=1)
    assert leader.attempt()
    term = leader.term()
    assert term is not None and leader.leads(term)
    now[0] += 19.9  # no renewal got through meanwhile (Redis away, the process starved)
    assert leader.term() == term
    now[0] += 0.2  # the renew deadline has passed
    assert leader.term() is None and not leader.leads(term)  # acts no more ...
    assert int(client.pttl(LEADER_KEY)) > 5000  # type: ignore[arg-type]  # ... though its lease still runs:
    assert standby.attempt() is False  # no standby can take over yet
    assert leader.attempt() is True  # Redis answers again: a new term
    assert leader.term() not in (None, term)


def test_a_stopped_leadership_gives_the_lead_up_at_once(clients: Callable[[], redis.Redis]) -> None:
    """A scheduler that stops (deploy, scale-in) releases the key: the standby need not wait a lease."""
    client = clients()
    leader = Leadership(client).start()
    assert leader.term() is not None  # the first attempt is made before ``start`` returns
    standby = Leadership(clients())
    assert standby.attempt() is False
    leader.stop()
    assert client.get(LEADER_KEY) is None
    assert standby.attempt() is True


def test_renewal_runs_on_its_own_thread_whatever_the_round_does(clients: Callable[[], redis.Redis]) -> None:
    """The lease is renewed every retry period by a thread of its own: a leader busy for many
    leases (a long round) keeps its term, and a standby trying all along never takes over."""
    leader = Leadership(clients(), 0.6, 0.4, 0.1).start()
    standby = Leadership(clients(), 0.6, 0.4, 0.1).start()
    try:
        term = leader.term()
        assert term is not None
        deadline = time.monotonic() + 3.0  # five leases
        while time.monotonic() < deadline:
            assert leader.term() == term and standby.term() is None
            time.sleep(0.05)
    finally:
        leader.stop()
        standby.stop()


def test_attempt_raises_store_unavailable_when_redis_is_stopped(tmp_path: Path) -> None:
    """L17/L18: with Redis away nobody can prove leadership: attempt() raises StoreUnavailable
    (not False, which would read as "another scheduler is active"), quickly."""
    own = RedisServer(tmp_path / "redis").start()
    client = connect(own.url, timeout_seconds=1.0)
    try:
        leadership = Leadership(client)
        assert leadership.attempt() is True
        own.stop()
        started = time.monotonic()
        for _ in range(2):
            with pytest.raises(StoreUnavailable):
                leadership.attempt()
        assert leadership.unreachable is not None
        assert time.monotonic() - started < 30
    finally:
        client.close()
        own.stop()


def test_the_fenced_publisher_pushes_only_for_the_current_term(clients: Callable[[], redis.Redis]) -> None:
    """Every leader action carries the leadership's term: a push made under a term that no longer
    holds the leader key (it lapsed and another leads, however late the push arrives) queues
    nothing and raises ``LeadershipLost``; the current leader's pushes go through, in batches."""
    client = clients()
    publish = queue.fenced_publisher(client, "test:fenced", LEADER_KEY, batch=2)
    first = Leadership(client, 0.6, 0.4, 0.1)
    assert first.attempt()
    old = first.term()
    assert old is not None
    publish([Job(f"sess_{n}", "", "timer") for n in range(3)], old)
    assert client.llen("test:fenced") == 3
    client.delete(LEADER_KEY)  # the lease lapsed ...
    second = Leadership(clients(), 0.6, 0.4, 0.1)
    assert second.attempt()  # ... and another took over
    new = second.term()
    assert new is not None and new != old
    with pytest.raises(LeadershipLost):
        publish([Job("sess_late", "", "timer")], old)
    assert client.llen("test:fenced") == 3
    publish([Job("sess_new", "", "timer")], new)
    assert client.llen("test:fenced") == 4


# --- run -----------------------------------------------------------------------------------


def settings(recovery_interval: float = 1.0) -> Settings:
    # Only what `run` reads; `require("scheduler")` (Redis URL, executor key) is the CLI's business.
    return Settings.from_env(
        {
            "CONTROLLER_RECONCILE_INTERVAL_SECONDS": str(int(INTERVAL)),
            "CONTROLLER_RECOVERY_INTERVAL_SECONDS": str(recovery_interval),
        }
    )


def map_session(store: RedisSessionStore, session_id: str) -> None:
    """A session with a stored mapping, as a worker leaves it (want == done, lease released)."""
    store.want(session_id)
    lease = store.acquire(session_id)
    assert isinstance(lease, Lease)
    handle = Handle(session_id=session_id, name=f"sbx-{session_id}-g1", generation=1, uid="u1")
    store.save(lease, Record(session_id, "env_1", handle, started_at=time.time()))
    assert store.complete(lease) is None


def recorder(published: list[Job]) -> scheduler.Publish:
    """A ``Publish`` that keeps the jobs in order (the term they came under is the leader's)."""

    def publish(jobs: Sequence[Job], term: str) -> None:
        published.extend(jobs)

    return publish


class Scheduler:
    """One ``scheduler.run`` in a thread, with its own connection, store and publish list."""

    def __init__(
        self,
        client: redis.Redis,
        runner: FakeRunner,
        requeue_after: float = 15.0,
        publish: scheduler.Publish | None = None,
        watch: FakeWatch | None = None,
    ) -> None:
        self.client = client
        self.store = RedisSessionStore(client, lease_ttl_seconds=30, requeue_after_seconds=requeue_after)
        self.published: list[Job] = []
        self.pools_seen: list[Sequence[PoolState]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=scheduler.run,
            args=(settings(), self.store, runner, client, publish or recorder(self.published), self.stop),
            kwargs={"watch": watch, "on_pools": self.pools_seen.append},
            daemon=True,
        )

    def start(self) -> Scheduler:
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def sessions(clients: Callable[[], redis.Redis]) -> tuple[list[str], FakeRunner]:
    """Two mapped sessions (one with its sandbox) and one unrecorded managed sandbox."""
    n = next(_ids)
    mapped, managed_only = [f"sess_a{n}", f"sess_b{n}"], f"sess_c{n}"
    store = RedisSessionStore(clients(), lease_ttl_seconds=30)
    for sid in mapped:
        map_session(store, sid)
    runner = FakeRunner()
    for sid in (mapped[0], managed_only):
        runner.ensure(SandboxSpec(sid, "env_1", "https://api.example.test/v1/agents/env"), 1)
    runner.calls.clear()
    return sorted([*mapped, managed_only]), runner


def rounds(published: list[Job], per_round: int) -> list[list[str]]:
    """The sweep's jobs, round by round (recovery jobs, if any, are not part of a sweep)."""
    ids = [j.session_id for j in published if j.event_type == "reconcile"]
    assert len(ids) % per_round == 0, ids
    return [ids[i : i + per_round] for i in range(0, len(ids), per_round)]


def test_run_sweeps_and_publishes_every_mapped_and_managed_session(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17: each round publishes one reconcile job per session with a mapping or a managed sandbox."""
    expected, runner = sessions
    one = Scheduler(clients(), runner).start()
    try:
        wait_for(lambda: len(one.published) >= 2 * len(expected), timeout=10, what="two sweeps")
    finally:
        one.halt()
    assert all(r == expected for r in rounds(one.published, len(expected)))
    sweeps = [j for j in one.published if j.event_type == "reconcile"]
    assert set(sweeps) == {Job(session_id=s, webhook_id="", event_type="reconcile") for s in expected}
    # Each publish came with more work wanted: the worker re-decides under the lease (L18).
    check = RedisSessionStore(clients(), lease_ttl_seconds=30)
    n_rounds = len(sweeps) // len(expected)
    for sid in expected:
        mapped = sid in check.session_ids()
        assert int(one.client.get(f"sc:want:{sid}") or 0) == n_rounds + (1 if mapped else 0)
    assert runner.calls == []  # the sweep itself starts and stops nothing


def timed_session(clients: Callable[[], redis.Redis], runner: FakeRunner) -> tuple[str, RedisSessionStore]:
    """A mapped session with its sandbox and a timer armed an hour away, as a worker leaves it."""
    timed = f"sess_t{next(_ids)}"
    store = RedisSessionStore(clients(), lease_ttl_seconds=30)
    store.want(timed)
    lease = store.acquire(timed)
    assert isinstance(lease, Lease)
    store.save(lease, Record(timed, "env_1", Handle(timed, f"sbx-{timed}-g1", 1, uid="u1"), started_at=time.time()))
    store.arm(lease, time.time() + 3600)
    assert store.complete(lease) is None
    runner.ensure(SandboxSpec(timed, "env_1", "https://api.example.test/v1/agents/env"), 1)
    runner.calls.clear()
    return timed, store


def test_with_the_pod_watch_live_sweeps_after_the_first_leave_timed_sessions_to_their_timers(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17: the first sweep enqueues every session; later ones (until the next full one) skip a
    mapped session whose timer is armed, and still enqueue a mapping without a sandbox and a
    sandbox without a mapping."""
    expected, runner = sessions
    timed, store = timed_session(clients, runner)
    one = Scheduler(clients(), runner, watch=FakeWatch()).start()

    def swept(sid: str) -> int:
        return sum(1 for j in one.published if j.event_type == "reconcile" and j.session_id == sid)

    try:
        wait_for(lambda: all(swept(sid) >= 3 for sid in expected[1:]), timeout=20, what="three sweeps")
    finally:
        one.halt()
    assert settings().lifecycle.full_sweep_interval_seconds > 20 * INTERVAL  # one full sweep here: the first
    assert swept(timed) == 1
    assert store.timer(timed) is not None  # left armed: its timer brings it back


def test_without_a_pod_watch_every_sweep_is_full(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17: with nothing to tell the scheduler that a sandbox died (the local runner, or the pod
    watch turned off), every sweep enqueues every session, timer or not."""
    expected, runner = sessions
    timed, _ = timed_session(clients, runner)
    one = Scheduler(clients(), runner).start()

    def swept(sid: str) -> int:
        return sum(1 for j in one.published if j.event_type == "reconcile" and j.session_id == sid)

    try:
        wait_for(lambda: all(swept(sid) >= 3 for sid in [*expected, timed]), timeout=20, what="three full sweeps")
    finally:
        one.halt()
    assert settings().lifecycle.full_sweep_interval_seconds > 20 * INTERVAL  # not the full-sweep timer


class FakeWatch:
    """``SandboxWatch`` in memory: the test plays the pod watch's thread through ``notify``."""

    def __init__(self) -> None:
        self.notify: Callable[[str], None] | None = None
        self.starts = self.stops = 0
        self.is_live = False

    def start(self, notify: Callable[[str], None]) -> None:
        self.notify, self.is_live = notify, True
        self.starts += 1

    def stop(self) -> None:
        self.is_live = False
        self.stops += 1

    def live(self) -> bool:
        return self.is_live


def test_the_leader_enqueues_what_the_pod_watch_names_and_leaves_watched_sandboxes_to_it(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L14, L17: the leading scheduler starts the pod watch, wants work on each session it names
    and publishes a job for it; while the watch is live, partial sweeps leave a mapped session
    whose sandbox is there to it (the first, full, sweep does not), and still enqueue a mapping
    without a sandbox and a sandbox without a mapping. A standby never starts its watch; the
    leader's stops with the scheduler."""
    expected, runner = sessions
    watched = expected[0]  # mapped, with its sandbox
    watch = FakeWatch()
    client = clients()
    store = RedisSessionStore(client, lease_ttl_seconds=30)
    published: list[Job] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=scheduler.run,
        args=(settings(), store, runner, client, recorder(published), stop),
        kwargs={"watch": watch},
        daemon=True,
    )
    thread.start()
    standby_watch = FakeWatch()
    standby_client = clients()
    standby = threading.Thread(
        target=scheduler.run,
        args=(settings(), RedisSessionStore(standby_client, 30), runner, standby_client, recorder(published), stop),
        kwargs={"watch": standby_watch},
        daemon=True,
    )

    def swept(sid: str) -> int:
        return sum(1 for j in list(published) if j.event_type == "reconcile" and j.session_id == sid)

    try:
        wait_for(lambda: watch.starts == 1, timeout=10, what="the leader to start its watch")
        standby.start()
        wait_for(lambda: all(swept(sid) >= 3 for sid in expected[1:]), timeout=20, what="three sweeps")
        assert watch.starts == 1 and watch.notify is not None
        assert standby_watch.starts == 0
        wants = int(client.get(f"sc:want:{watched}") or 0)
        watch.notify(watched)  # its pod failed, say
        wait_for(lambda: Job(watched, "", "pod") in published, timeout=10, what="the watched session's job")
        assert int(client.get(f"sc:want:{watched}") or 0) == wants + 1  # wanted, as a sweep wants
    finally:
        stop.set()
        thread.join(timeout=10)
        if standby.is_alive():
            standby.join(timeout=10)
    assert not thread.is_alive() and not standby.is_alive()
    assert swept(watched) == 1  # the first sweep only: full
    assert watch.stops == 1 and not watch.live()
    assert runner.calls == []


def test_second_scheduler_stands_by_while_the_first_leads(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17/L18: with two schedulers running, each round is published once, by the leader only."""
    expected, runner = sessions
    first = Scheduler(clients(), runner).start()
    wait_for(lambda: first.published, timeout=5, what="the first scheduler to lead")
    second = Scheduler(clients(), runner).start()
    try:
        wait_for(lambda: len(first.published) >= 4 * len(expected), timeout=15, what="three more sweeps")
        assert second.published == []
    finally:
        first.halt()
        second.halt()
    assert second.published == []
    assert all(r == expected for r in rounds(first.published, len(expected)))


def test_the_leaders_key_is_renewed_every_retry_period(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17: while a scheduler leads, its key never has less than a lease minus a retry period
    (and some slack for a loaded machine) left: it never comes near lapsing between renewals."""
    _, runner = sessions
    client = clients()
    leader = Scheduler(client, runner).start()
    try:
        wait_for(lambda: leader.published, timeout=5, what="the scheduler to lead")
        lease_ms, retry_ms = scheduler.LEASE_SECONDS * 1000, scheduler.RETRY_SECONDS * 1000
        for _ in range(10):
            assert lease_ms - retry_ms - 500 < int(client.pttl(LEADER_KEY)) <= lease_ms  # type: ignore[arg-type]
            time.sleep(0.2)
    finally:
        leader.halt()
    assert scheduler.RETRY_SECONDS < scheduler.RENEW_DEADLINE_SECONDS < scheduler.LEASE_SECONDS


def test_standby_scheduler_takes_over_when_the_leader_stops(
    clients: Callable[[], redis.Redis], sessions: tuple[list[str], FakeRunner]
) -> None:
    """L17: when the leader stops, it gives the key up and the standby sweeps at once (within a
    retry period and a round, not a lease)."""
    expected, runner = sessions
    first = Scheduler(clients(), runner).start()
    wait_for(lambda: first.published, timeout=5, what="the first scheduler to lead")
    second = Scheduler(clients(), runner).start()
    try:
        time.sleep(1.5 * INTERVAL)
        assert second.published == []
        first.halt()
        led = len(first.published)
        stopped = time.monotonic()
        wait_for(lambda: second.published, timeout=10, what="the standby to take over")
        assert time.monotonic() - stopped < scheduler.LEASE_SECONDS  # released: no lease to wait out
        wait_for(lambda: len(second.published) >= len(expected), timeout=5, what="a full sweep")
    finally:
        first.halt()
        second.halt()
    assert len(first.published) == led
    assert all(r == expected for r in rounds(second.published, len(expected)))


# --- recovery ------------------------------------------------------------------------------


def test_recovery_pass_re_enqueues_work_whose_job_was_lost(clients: Callable[[], redis.Redis]) -> None:
    """L1: work wanted whose job vanished (never worked, lease free) is published again by the
    leader's recovery pass, once per grace period; a session held by a worker, or whose work
    is done, is not."""
    n = next(_ids)
    lost, held, done = f"sess_lost{n}", f"sess_held{n}", f"sess_done{n}"
    store = RedisSessionStore(clients(), lease_ttl_seconds=30, requeue_after_seconds=1.0)
    for sid in (lost, held, done):
        store.want(sid)  # as the receiver does, then its job is lost
    assert isinstance(store.acquire(held), Lease)  # a live worker is on it
    finished = store.acquire(done)
    assert isinstance(finished, Lease) and store.complete(finished) is None
    one = Scheduler(clients(), FakeRunner(), requeue_after=1.0).start()
    try:

        def recovered() -> list[str]:
            return [j.session_id for j in one.published if j.event_type == "recovery"]

        wait_for(lambda: lost in recovered(), 10, "the lost work to be re-enqueued")
        first = time.monotonic()
        wait_for(lambda: recovered().count(lost) >= 2, 10, "the next grace period's re-enqueue")
        assert time.monotonic() - first >= 0.5  # not every round: once per grace period
    finally:
        one.halt()
    assert held not in recovered() and done not in recovered()
    assert Job(session_id=lost, webhook_id="", event_type="recovery") in one.published


def test_scheduler_survives_redis_stopping_mid_run_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """L17: Redis (store and broker) stopping under a running scheduler neither ends the
    process nor reads as "another scheduler is active": it logs "redis unavailable" with the
    reason each round, and sweeps again once Redis is back (its data kept by the AOF)."""
    own = RedisServer(tmp_path / "redis").start()
    client = connect(own.url, timeout_seconds=1.0)
    broker = connect(own.url, timeout_seconds=1.0)

    def publish(jobs: Sequence[Job], term: str) -> None:  # a broker on the same Redis, as in production
        broker.rpush("test:published", *(job.session_id for job in jobs))

    try:
        store = RedisSessionStore(client, lease_ttl_seconds=30)
        map_session(store, "sess_mapped")
        caplog.set_level(logging.INFO, logger="controller.scheduler")
        one = Scheduler(client, FakeRunner(), publish=publish).start()
        try:
            wait_for(lambda: broker.llen("test:published") >= 1, 10, "a first sweep")
            own.stop()
            said = lambda: any("redis unavailable" in r.getMessage() for r in caplog.records)  # noqa: E731
            wait_for(said, 15, "the reason to be logged")
            time.sleep(2 * INTERVAL)  # several rounds without Redis
            assert one.thread.is_alive()
            down = [r.getMessage() for r in caplog.records if "redis unavailable" in r.getMessage()]
            assert all(f"127.0.0.1:{own.port}" in m for m in down), down  # the reason names what is unreachable
            assert not any("another scheduler is active" in r.getMessage() for r in caplog.records)
            own.start()
            before = int(broker.llen("test:published"))
            wait_for(lambda: int(broker.llen("test:published")) > before, 20, "sweeps to resume after Redis returns")
            assert one.thread.is_alive()
        finally:
            one.halt()
    finally:
        client.close()
        broker.close()
        own.stop()


class PoolingRunner(FakeRunner):
    """The fake runner, with warm pools to tend (counts the calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.tended = 0

    def tend_pools(self) -> list[PoolState]:
        self.tended += 1
        return [PoolState("fast", size=2, ready=self.tended % 3, starting=2 - self.tended % 3)]


def test_only_the_leader_tends_the_warm_pools(clients: Callable[[], redis.Redis]) -> None:
    """The leader tends a pooling runner's warm pools round after round, and passes each
    tending's census on (the warm-pool gauges); a standby never tends and reports nothing. A
    leader that loses the lead stops tending and reports no pool (no stale gauges)."""
    leading, standing = PoolingRunner(), PoolingRunner()
    first = Scheduler(clients(), leading).start()
    wait_for(lambda: leading.tended >= 1, timeout=10, what="the leader to tend the pools")
    second = Scheduler(clients(), standing).start()
    try:
        wait_for(lambda: leading.tended >= 3, timeout=20, what="the leader to tend the pools again")
        assert standing.tended == 0 and second.pools_seen == []
        seen = list(first.pools_seen)
        assert [pools[0].ready for pools in seen] == [n % 3 for n in range(1, len(seen) + 1)]

        clients().set(LEADER_KEY, "another-scheduler", px=60_000)  # another process takes the lead
        wait_for(lambda: list(first.pools_seen[-1]) == [], timeout=10, what="the former leader to clear its pools")
        tended = leading.tended
        time.sleep(3 * INTERVAL)
        assert leading.tended == tended and standing.tended == 0
    finally:
        first.halt()
        second.halt()


# --- long rounds ---------------------------------------------------------------------------


class SlowRunner(FakeRunner):
    """The fake runner, whose listing of the sandboxes takes ``seconds`` (a slow API server):
    each listing's start and end are kept, by the name it was given."""

    def __init__(self, name: str, seconds: float, listings: list[tuple[str, float, float]]) -> None:
        super().__init__()
        self.name, self.seconds, self.listings = name, seconds, listings

    def list_managed(self) -> list[Handle]:
        started = time.monotonic()
        time.sleep(self.seconds)
        self.listings.append((self.name, started, time.monotonic()))
        return super().list_managed()


def test_a_round_longer_than_the_lease_keeps_one_leader(clients: Callable[[], redis.Redis]) -> None:
    """L17/L18: the leader's round takes four leases (a sweep whose listing is slow); its lease is
    renewed meanwhile, so the standby never leads: only one scheduler ever sweeps. (Renewed
    once a round, as before, the lease lapsed three seconds into the round and the standby
    swept alongside.)"""
    listings: list[tuple[str, float, float]] = []
    round_seconds = 4 * scheduler.LEASE_SECONDS
    first = Scheduler(clients(), SlowRunner("first", round_seconds, listings)).start()
    wait_for(lambda: first.store.session_ids() is not None and listings == [] and first.thread.is_alive(), 5, "start")
    time.sleep(0.5)  # the first leads (its round is under way)
    second = Scheduler(clients(), SlowRunner("second", round_seconds, listings)).start()
    try:
        wait_for(lambda: len(listings) >= 2, 3 * round_seconds, "two of the leader's rounds")
    finally:
        first.halt()
        second.halt()
    assert {name for name, _, _ in listings} == {"first"}, listings
    assert second.published == []


def test_a_leader_publishes_due_timers_batch_by_batch_and_stops_when_its_term_ends(
    clients: Callable[[], redis.Redis],
) -> None:
    """10,000 due timers are published in batches (one push of 500 jobs each, not one publish
    per job), each under the leader's term; when another process takes the lead mid-drain
    (after the second batch here), the push in flight is refused and no further batch is taken or
    pushed: the timers left are left to the new leader, and what was taken but refused stays
    wanted (the recovery pass enqueues it)."""
    client = clients()
    due = time.time() * 1000 - 1000
    client.zadd("sc:timers", {f"sess_due{n}": due for n in range(10_000)})
    fenced = queue.fenced_publisher(client, "test:timers", LEADER_KEY)
    pushes: list[int] = []

    def publish(jobs: Sequence[Job], term: str) -> None:
        pushes.append(len(jobs))
        if len(pushes) == 3:
            client.set(LEADER_KEY, "another-scheduler", px=60_000)  # another process took the lead
        fenced(jobs, term)

    one = Scheduler(clients(), FakeRunner(), publish=publish).start()
    try:
        wait_for(lambda: len(pushes) >= 3, 20, "the third batch")
        time.sleep(3 * scheduler.RETRY_SECONDS + 1)  # the leader finds the key taken; it acts no more
        assert one.thread.is_alive()
    finally:
        one.halt()
    assert pushes[:3] == [500, 500, 500]
    assert client.llen("test:timers") == 1000  # the third push was refused
    assert len(pushes) == 3
    assert client.zcard("sc:timers") == 10_000 - 1500  # no batch taken after the refusal
