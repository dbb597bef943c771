"""``sandbox-controller scheduler``: one active process that sweeps and recovers on timers.

Leadership is a Redis key holding this process's token with a TTL of three rounds
(``leadership_ttl_seconds``), renewed every round by a compare-and-expire script: it lapses
only when a leader misses two renewals in a row, and a standby takes over within three rounds
of the leader stopping. A scheduler that cannot renew stops working until it wins the key
again, so two never act at once.

Each round the leader fires the durable timers that fell due (``controller.timers``, every
``timers.RESOLUTION_SECONDS``: about one second), runs the recovery pass
(``controller.recovery``, every ``CONTROLLER_RECOVERY_INTERVAL_SECONDS``) and, when due, the
reconcile sweep (``controller.reconcile``, every ``CONTROLLER_RECONCILE_INTERVAL_SECONDS``;
a full one every ``CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS``, and the first; every one is
full without a pod watch).
A round is therefore at most a second long, and so is a third of the leadership's TTL.
With a runner that keeps warm pools (``runners.base.Pools``), the leader also tends them every
``POOL_TEND_SECONDS`` (dead or too old warm pods replaced, the pools filled to their size).

With the Kubernetes runner the leader also watches the sandbox pods (``watch``:
``runners.kubernetes.watch``, started when this process wins leadership and stopped when it
loses it). The watch hands over the sessions whose pod changed in a way that matters; each
round the leader wants work on them and enqueues them on the maintenance queue, exactly as a
sweep does (``store.want_many``, then the batch publisher), so de-duplication and leases are
the same. While the watch is live, partial sweeps leave sessions whose pod is there to it.

Redis or the broker being away is a state, not a crash: the loop logs "redis unavailable"
with the reason and tries again next round; "another scheduler is active" is logged only
when another process really holds the key.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from functools import partial
from types import FrameType
from typing import Protocol

import kombu.exceptions
import redis

from controller import logs, reconcile, recovery, timers
from controller.config import Settings
from controller.errors import QueueUnavailable, StoreUnavailable, Transient
from controller.inbox import Job
from controller.model import PoolState
from controller.recovery import RecoverableStore
from controller.runners.base import Pools, Runner
from controller.timers import Due


class SchedulerStore(RecoverableStore, Due, Protocol):
    """The store as the scheduler needs it: leases, mappings, pending work and due timers."""


class SandboxWatch(Protocol):
    """A watch on the sandboxes that names the sessions whose sandbox changed (in a thread)."""

    def start(self, notify: Callable[[str], None]) -> None: ...

    def stop(self) -> None: ...

    def live(self) -> bool:
        """True while the watch is established: a change now would be seen."""
        ...


class Changed:
    """Sessions the watch named, kept until the leader has enqueued them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, session_id: str) -> None:
        with self._lock:
            self._ids.add(session_id)

    def take(self) -> list[str]:
        with self._lock:
            taken, self._ids = sorted(self._ids), set()
        return taken

    def give_back(self, session_ids: Sequence[str]) -> None:
        with self._lock:
            self._ids.update(session_ids)


log = logs.get(__name__)
LEADER_KEY = "sc:scheduler:leader"
POOL_TEND_SECONDS = 2.0
"""How often the leader tends the warm pools (a claim refills its pool at once; this is the net)."""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""
_BROKER_ERRORS = (redis.RedisError, kombu.exceptions.KombuError, OSError)


def leadership_ttl_seconds(interval_seconds: float) -> float:
    """Three rounds (renewals are one round apart): longer than the wait between renewals."""
    return 3 * interval_seconds


class Leadership:
    def __init__(self, client: redis.Redis, ttl_seconds: float) -> None:
        self._token = secrets.token_hex(8)
        self._ttl_ms = int(ttl_seconds * 1000)
        self._renew = client.register_script(_RENEW)

    def hold(self) -> bool:
        """Take or keep leadership: True when this process leads, False when another does.

        Raises ``StoreUnavailable`` when Redis cannot be asked (then nobody can prove
        leadership, and nobody should act).
        """
        try:
            return bool(self._renew(keys=[LEADER_KEY], args=[self._token, self._ttl_ms]))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"cannot reach redis to hold leadership: {exc}", retry_after=2) from exc


class Role(StrEnum):
    LEADING = "leading"
    STANDING_BY = "standing by"
    UNREACHABLE = "redis unavailable"


def run(
    settings: Settings,
    store: SchedulerStore,
    runner: Runner,
    client: redis.Redis,
    publish: Callable[[Job], None],
    stop: threading.Event | None = None,
    on_sweep: Callable[[reconcile.Sweep], None] = lambda sweep: None,
    publish_many: Callable[[Sequence[Job]], None] | None = None,
    watch: SandboxWatch | None = None,
    on_pools: Callable[[Sequence[PoolState]], None] = lambda pools: None,
) -> None:
    """``on_sweep`` is told each sweep's counts (the running-sandboxes gauge); ``publish_many``
    publishes the sweep's batches (one ``publish`` per job without it); ``watch`` (optional)
    names sessions whose sandbox changed, and runs while this process leads; ``on_pools`` is
    told how each warm pool was found at each tending (the warm-pool gauges), and told of no
    pool when this process stops leading (its figures would go stale)."""
    sweep_every = settings.lifecycle.reconcile_interval_seconds
    full_every = settings.lifecycle.full_sweep_interval_seconds
    recover_every = settings.queue.recovery_interval_seconds
    fire_every = timers.RESOLUTION_SECONDS
    tick = min(sweep_every, recover_every, fire_every)
    leadership = Leadership(client, ttl_seconds=leadership_ttl_seconds(tick))
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def enqueuer(event_type: str) -> Callable[[str], None]:
        def enqueue(session_id: str) -> None:
            try:
                publish(Job(session_id=session_id, webhook_id="", event_type=event_type))
            except _BROKER_ERRORS as exc:
                raise QueueUnavailable(f"broker refused a {event_type} job: {exc}", retry_after=2) from exc

        return enqueue

    def enqueue_many(session_ids: Sequence[str], event_type: str = "reconcile") -> None:
        jobs = [Job(session_id=sid, webhook_id="", event_type=event_type) for sid in session_ids]
        try:
            if publish_many is not None:
                publish_many(jobs)
            else:
                for job in jobs:
                    publish(job)
        except _BROKER_ERRORS as exc:
            raise QueueUnavailable(f"broker refused {event_type} jobs: {exc}", retry_after=2) from exc

    changed = Changed()

    def enqueue_changed() -> None:
        """The sessions the watch named: wanted, then enqueued, as a sweep does; kept for the
        next round when Redis or the broker refuses."""
        session_ids = changed.take()
        if not session_ids:
            return
        try:
            store.want_many(session_ids)
            enqueue_many(session_ids, "pod")
        except BaseException:
            changed.give_back(session_ids)
            raise
        log.info("sandboxes changed; their sessions enqueued", extra={"enqueued": len(session_ids)})

    log.info(
        "scheduler started",
        extra={"interval_seconds": sweep_every, "recovery_interval_seconds": recover_every},
    )
    role: Role | None = None
    next_sweep = next_recovery = next_fire = next_tend = 0.0
    next_full = 0.0  # the first sweep, and the first once full_every has passed since the last, is full
    pools = runner if isinstance(runner, Pools) else None

    def sweep_once(now: float) -> None:
        """``now``: the round's start, the clock ``next_sweep`` is set by too (so a full sweep
        every 3600 s with a pass every 300 s is exactly every 12th)."""
        nonlocal next_full
        # Without a watch (the local runner, or the pod watch turned off) every sweep is full:
        # nothing else would notice a sandbox that died while its session's timer is far away.
        full = now >= next_full or watch is None
        on_sweep(reconcile.sweep(store, runner, enqueue_many, full=full, watched=watch is not None and watch.live()))
        if full:
            next_full = now + full_every

    try:
        while not stop.is_set():
            try:
                now_role = Role.LEADING if leadership.hold() else Role.STANDING_BY
                reason = ""
            except StoreUnavailable as exc:
                now_role, reason = Role.UNREACHABLE, str(exc.__cause__ or exc)
            was_leading, leading = role is Role.LEADING, now_role is Role.LEADING
            if now_role is Role.UNREACHABLE:
                log.warning(f"redis unavailable: {reason}; trying again next round", extra={"reason": reason})
            elif now_role is not role:
                log.info("leading: sweeping and recovering" if leading else "another scheduler is active; standing by")
            role = now_role
            if leading and not was_leading and watch is not None:
                watch.start(changed.add)  # only the leader watches
            elif was_leading and not leading:
                if watch is not None:
                    watch.stop()
                if pools is not None:
                    on_pools(())  # its figures would go stale: the new leader reports the pools
            if leading:
                now = time.monotonic()
                _guarded("enqueueing changed sandboxes", enqueue_changed)
                if now >= next_fire and _guarded("timers", lambda: timers.fire(store, enqueuer("timer"))):
                    next_fire = now + fire_every
                if now >= next_recovery and _guarded(
                    "recovery pass", lambda: recovery.recover(store, enqueuer("recovery"))
                ):
                    next_recovery = now + recover_every
                if now >= next_sweep and _guarded("reconcile sweep", partial(sweep_once, now)):
                    next_sweep = now + sweep_every
                if (
                    pools is not None
                    and now >= next_tend
                    and _guarded("warm pools", lambda: on_pools(pools.tend_pools()))
                ):
                    next_tend = now + POOL_TEND_SECONDS
                # Wake for whichever is due next (a failed step is retried after one tick).
                wait = min(next_sweep, next_recovery, next_fire) - time.monotonic()
                stop.wait(min(tick, max(0.1, wait)) if wait > 0 else tick)
            else:
                stop.wait(tick)
    finally:
        if watch is not None and role is Role.LEADING:
            watch.stop()
    log.info("scheduler stopped")


def _guarded(what: str, step: Callable[[], object]) -> bool:
    """Run one step; a failure is logged and retried next round, never ends the loop."""
    try:
        step()
        return True
    except (StoreUnavailable, QueueUnavailable) as exc:
        reason = str(exc.__cause__ or exc)
        log.warning(f"redis unavailable: {reason}; {what} retried next round", extra={"reason": reason})
    except Transient as exc:
        log.warning(f"{what} failed; retried next round", extra={"reason": str(exc)})
    except Exception as exc:  # a bug or an untranslated error: say so loudly, keep the scheduler up
        log.exception(f"{what} failed unexpectedly; retried next round", extra={"error_type": type(exc).__name__})
    return False
