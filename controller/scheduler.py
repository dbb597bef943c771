"""``sandbox-controller scheduler``: one active process that sweeps and recovers on timers.

Leadership is elected as client-go's ``leaderelection`` does it, on one Redis key
(``LEADER_KEY``, ``Leadership``): the key holds the leader's term (its fencing token) with a TTL,
the lease (``LEASE_SECONDS``). A thread of its own renews it every ``RETRY_SECONDS``, whatever
the round is doing; a standby tries as often, and takes the key once it has lapsed. A leader
counts itself the leader only until the renew deadline (``RENEW_DEADLINE_SECONDS``, shorter
than the lease) has passed since it sent its last successful renewal: one that cannot renew
(Redis away, the process starved or paused) stops acting before its lease can lapse, so before
a standby can take over. Every leader action carries the term: the jobs are pushed by a
script that pushes only while the key holds that term (``queue.fenced_publisher``), so a push
that arrives late, after another took over, queues nothing; long steps (timers, recovery, the
sweep) publish in batches and check the term before each one. Wanting work is not a leader
action (a webhook wants work too; the worker decides under the session's lease): what a
refused push leaves wanted, the next recovery pass enqueues. Tending the warm pools (Kubernetes
calls) is checked against the term before it starts, not fenced. A scheduler that stops
releases the key, so a standby takes over at once.

Each round the leader fires the durable timers that fell due (``controller.timers``, every
``timers.RESOLUTION_SECONDS``: about one second), runs the recovery pass
(``controller.recovery``, every ``CONTROLLER_RECOVERY_INTERVAL_SECONDS``) and, when due, the
reconcile sweep (``controller.reconcile``, every ``CONTROLLER_RECONCILE_INTERVAL_SECONDS``;
a full one every ``CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS``, and the first; every one is
full without a pod watch). However long a round takes (10,000 due timers, a slow listing of
the sandboxes), leadership is renewed meanwhile.
With a runner that keeps warm pools (``runners.base.Pools``), the leader also tends them every
``POOL_TEND_SECONDS`` (dead or too old warm pods replaced, the pools filled to their size).

With the Kubernetes runner the leader also watches the sandbox pods (``watch``:
``runners.kubernetes.watch``, started when this process wins leadership and stopped when it
loses it). The watch hands over the sessions whose pod changed in a way that matters; each
round the leader wants work on them and enqueues them on the maintenance queue, exactly as a
sweep does (``store.want_many``, then a fenced publish), so de-duplication and leases are
the same. While the watch is live, partial sweeps leave sessions whose pod is there to it.

Redis or the broker being away is a state, not a crash: the loop logs "redis unavailable"
with the reason and tries again next round; "another scheduler is active" is logged only
when another process really holds the key.
"""

from __future__ import annotations

import math
import secrets
import signal
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from functools import partial
from typing import Protocol

import redis

from controller import logs, reconcile, recovery, timers
from controller.config import Settings
from controller.errors import LeadershipLost, QueueUnavailable, StoreUnavailable, Transient
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
LEASE_SECONDS = 3.0
"""How long the leader key lives after a renewal: a standby may take over this long after the
leader's last renewal."""
RENEW_DEADLINE_SECONDS = 2.0
"""How long after sending its last successful renewal a leader still acts. Shorter than the
lease: a leader that cannot renew stops acting a second before a standby could take over."""
RETRY_SECONDS = 0.5
"""How often the leader renews, and a standby tries to take the lead."""
POOL_TEND_SECONDS = 2.0
"""How often the leader tends the warm pools (it alone refills them: a claim adds no pod)."""
_ACQUIRE_OR_RENEW = """
local held = redis.call('GET', KEYS[1])
if held and held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return held
end
if held and held ~= ARGV[4] then return false end
local t = redis.call('TIME')
local term = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2])) .. '-' .. ARGV[2]
redis.call('SET', KEYS[1], term, 'PX', ARGV[3])
return term
"""
"""Renew the term this process holds (``ARGV[1]``), or start a new one when the key is free or
holds this process's own lapsed term (``ARGV[4]``): Redis time in microseconds and the process's
id (``ARGV[2]``), so every term is new. Returns the term held, or nothing when another leads."""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_BROKER_ERRORS = (redis.RedisError, OSError)  # the queue is a Redis list the leader pushes to

Publish = Callable[[Sequence[Job], str], None]
"""Queue jobs as the leader of the given term; raises ``LeadershipLost`` when that term no
longer leads (``queue.fenced_publisher``)."""


class Leadership:
    """One process's side of the leader election (see the module's docstring).

    ``attempt`` tries once to take or keep the lead; ``start`` runs it every ``retry_seconds`` on
    a thread of its own; ``term`` is the term this process leads in right now, or None.
    """

    def __init__(
        self,
        client: redis.Redis,
        lease_seconds: float = LEASE_SECONDS,
        renew_deadline_seconds: float = RENEW_DEADLINE_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_seconds < renew_deadline_seconds < lease_seconds:
            raise ValueError("leadership needs retry < renew deadline < lease")
        self._id = secrets.token_hex(4)
        self._lease_ms = int(lease_seconds * 1000)
        self._deadline = renew_deadline_seconds
        self._retry = retry_seconds
        self._clock = clock
        self._acquire_or_renew = client.register_script(_ACQUIRE_OR_RENEW)
        self._release = client.register_script(_RELEASE)
        self._lock = threading.Lock()
        self._term: str | None = None
        self._valid_until = -math.inf
        self._lapsed: str | None = None
        self.unreachable: str | None = None
        """Why the last attempt could not ask Redis (None when it could)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def term(self) -> str | None:
        """The term this process leads in, while it is sure no other process can: its last
        renewal was sent less than the renew deadline ago. None otherwise."""
        with self._lock:
            return self._term if self._clock() < self._valid_until else None

    def leads(self, term: str) -> bool:
        return self.term() == term

    def end(self, term: str) -> None:
        """Take ``term`` as over at once (a push under it was refused: the key is no longer
        its), rather than at the next renewal."""
        with self._lock:
            if self._term == term:
                self._term, self._valid_until = None, -math.inf

    def attempt(self) -> bool:
        """Take or keep the lead, once: True when this process leads now.

        Raises ``StoreUnavailable`` when Redis cannot be asked (then nobody can prove
        leadership; a leader stops acting at its renew deadline all the same)."""
        sent = self._clock()
        with self._lock:
            if self._term is not None and sent >= self._valid_until:
                # The renew deadline passed: this term is over, whatever the key says. A new
                # one may replace it at once (nobody else led meanwhile if the key is still ours).
                self._term, self._lapsed = None, self._term
            held, lapsed = self._term, self._lapsed
        try:
            term = self._acquire_or_renew(keys=[LEADER_KEY], args=[held or "", self._id, self._lease_ms, lapsed or ""])
        except redis.RedisError as exc:
            self.unreachable = str(exc)
            raise StoreUnavailable(f"cannot reach redis to hold leadership: {exc}", retry_after=2) from exc
        self.unreachable = None
        with self._lock:
            if term:  # renewed, or a new term (the key was free, or held our lapsed one)
                self._term, self._valid_until, self._lapsed = str(term), sent + self._deadline, None
            else:
                self._term, self._lapsed = None, None  # another process leads (the key is theirs)
            return self._term is not None and self._clock() < self._valid_until

    def start(self) -> Leadership:
        """Try once now (so the first round knows its role), then renew or try to take the lead
        every ``retry_seconds`` on a thread of its own."""
        self._try()
        self._thread = threading.Thread(target=self._run, name="leadership", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._retry):
            self._try()

    def _try(self) -> None:
        try:
            self.attempt()
        except StoreUnavailable:
            pass  # said by the round (``unreachable``); the renew deadline does the rest
        except Exception:  # a bug: say so, keep trying (a leader that cannot renew stops acting)
            log.exception("leadership attempt failed unexpectedly")

    def stop(self) -> None:
        """Stop renewing, and give the lead up at once if this process holds it (a standby takes
        over within its retry period instead of a lease)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            term, self._term, self._valid_until = self._term, None, -math.inf
        if term is not None:
            try:
                self._release(keys=[LEADER_KEY], args=[term])
            except redis.RedisError:
                pass  # the lease lapses by itself


class Role(StrEnum):
    LEADING = "leading"
    STANDING_BY = "standing by"
    UNREACHABLE = "redis unavailable"


class Acting:
    """What the leader does in one term: each batch it publishes is checked against the term first
    and pushed under it (``Publish``), so a term that ended stops the step at the next batch."""

    def __init__(self, leadership: Leadership, term: str, publish: Publish) -> None:
        self._leadership = leadership
        self.term = term
        self._publish = publish

    def check(self) -> None:
        if not self._leadership.leads(self.term):
            raise LeadershipLost(f"term {self.term} is over")

    def enqueue(self, session_ids: Sequence[str], event_type: str) -> None:
        self.check()
        jobs = [Job(session_id=sid, webhook_id="", event_type=event_type) for sid in session_ids]
        try:
            self._publish(jobs, self.term)
        except _BROKER_ERRORS as exc:
            raise QueueUnavailable(f"broker refused {event_type} jobs: {exc}", retry_after=2) from exc

    def enqueuer(self, event_type: str) -> Callable[[Sequence[str]], None]:
        return lambda session_ids: self.enqueue(session_ids, event_type)


class Rounds:
    """The leader's steps, each due on its own interval (monotonic clock): the changed sandboxes
    (every round), the durable timers, the recovery pass, the reconcile sweep (full at the
    first and every ``full_sweep_interval_seconds``, or always without a watch) and the warm
    pools. ``round`` makes the ones due; a step that fails is retried at the next round."""

    def __init__(
        self,
        settings: Settings,
        store: SchedulerStore,
        runner: Runner,
        watch: SandboxWatch | None,
        on_sweep: Callable[[reconcile.Sweep], None],
        on_pools: Callable[[Sequence[PoolState]], None],
    ) -> None:
        self.store, self.runner, self.watch = store, runner, watch
        self.on_sweep, self.on_pools = on_sweep, on_pools
        self.pools = runner if isinstance(runner, Pools) else None
        self.changed = Changed()
        self.sweep_every = settings.lifecycle.reconcile_interval_seconds
        self.full_every = settings.lifecycle.full_sweep_interval_seconds
        self.recover_every = settings.queue.recovery_interval_seconds
        self.fire_every = timers.RESOLUTION_SECONDS
        self.tick = min(self.sweep_every, self.recover_every, self.fire_every)
        self.next_sweep = self.next_recovery = self.next_fire = self.next_tend = 0.0
        self.next_full = 0.0  # the first sweep, and the first once full_every has passed since the last, is full

    def round(self, acting: Acting) -> None:
        """One round of the leader's steps; a ``LeadershipLost`` ends it where it stands."""
        now = time.monotonic()
        _guarded("enqueueing changed sandboxes", partial(self.enqueue_changed, acting))
        taking = _Taking(self.store, acting)
        if now >= self.next_fire and _guarded("timers", lambda: timers.fire(taking, acting.enqueuer("timer"))):
            self.next_fire = now + self.fire_every
        if now >= self.next_recovery and _guarded(
            "recovery pass", lambda: recovery.recover(taking, acting.enqueuer("recovery"))
        ):
            self.next_recovery = now + self.recover_every
        if now >= self.next_sweep and _guarded("reconcile sweep", partial(self.sweep, acting, now)):
            self.next_sweep = now + self.sweep_every
        if self.pools is not None and now >= self.next_tend:
            acting.check()
            pools = self.pools
            if _guarded("warm pools", lambda: self.on_pools(pools.tend_pools())):
                self.next_tend = now + POOL_TEND_SECONDS

    def enqueue_changed(self, acting: Acting) -> None:
        """The sessions the watch named: wanted, then enqueued, as a sweep does; kept for the
        next round when Redis or the broker refuses, or the term ends."""
        session_ids = self.changed.take()
        if not session_ids:
            return
        try:
            acting.check()
            self.store.want_many(session_ids)
            acting.enqueue(session_ids, "pod")
        except BaseException:
            self.changed.give_back(session_ids)
            raise
        log.info("sandboxes changed; their sessions enqueued", extra={"enqueued": len(session_ids)})

    def sweep(self, acting: Acting, now: float) -> None:
        """``now``: the round's start, the clock ``next_sweep`` is set by too (so a full sweep
        every 3600 s with a pass every 300 s is exactly every 12th)."""
        # Without a watch (the local runner, or the pod watch turned off) every sweep is full:
        # nothing else would notice a sandbox that died while its session's timer is far away.
        full = now >= self.next_full or self.watch is None
        watched = self.watch is not None and self.watch.live()
        self.on_sweep(
            reconcile.sweep(self.store, self.runner, acting.enqueuer("reconcile"), full=full, watched=watched)
        )
        if full:
            self.next_full = now + self.full_every

    def follow(self, was: Role | None, now: Role) -> None:
        """What a change of role starts or stops: only the leader watches the sandboxes, and
        one that stops leading reports no pools (its figures would go stale: the new leader
        reports them)."""
        if now is Role.LEADING and was is not Role.LEADING and self.watch is not None:
            self.watch.start(self.changed.add)
        elif was is Role.LEADING and now is not Role.LEADING:
            if self.watch is not None:
                self.watch.stop()
            if self.pools is not None:
                self.on_pools(())

    def wait_seconds(self) -> float:
        """How long the leader sleeps after a round: until the next step is due, at most a tick
        (an overdue step, one that failed, is retried after one tick)."""
        wait = min(self.next_sweep, self.next_recovery, self.next_fire) - time.monotonic()
        return min(self.tick, max(0.1, wait)) if wait > 0 else self.tick


def role_now(leadership: Leadership, term: str | None) -> tuple[Role, str]:
    """This process's role by its leadership's last answer, with the reason Redis is away."""
    if term is not None:
        return Role.LEADING, ""
    if leadership.unreachable is not None:
        return Role.UNREACHABLE, leadership.unreachable
    return Role.STANDING_BY, ""


def log_role(was: Role | None, now: Role, reason: str, term: str | None) -> None:
    """One line when the role changes (and each round Redis is away)."""
    if now is Role.UNREACHABLE:
        log.warning(f"redis unavailable: {reason}; trying again next round", extra={"reason": reason})
    elif now is Role.LEADING and was is not Role.LEADING:
        log.info("leading: sweeping and recovering", extra={"term": term})
    elif now is not was:
        log.info("another scheduler is active; standing by")
    if was is Role.LEADING and now is not Role.LEADING:
        log.warning("stopped leading: the term could not be renewed in time, or another leads")


def run(
    settings: Settings,
    store: SchedulerStore,
    runner: Runner,
    client: redis.Redis,
    publish: Publish,
    stop: threading.Event | None = None,
    on_sweep: Callable[[reconcile.Sweep], None] = lambda sweep: None,
    watch: SandboxWatch | None = None,
    on_pools: Callable[[Sequence[PoolState]], None] = lambda pools: None,
    leadership: Leadership | None = None,
) -> None:
    """``publish`` queues the leader's jobs under its term (``Publish``); ``on_sweep`` is told each
    sweep's counts (the running-sandboxes gauge); ``watch`` (optional) names sessions whose
    sandbox changed, and runs while this process leads; ``on_pools`` is told how each warm pool
    was found at each tending (the warm-pool gauges), and told of no pool when this process
    stops leading (its figures would go stale); ``leadership`` (default: the standard timings on
    ``client``) is started here and stopped on the way out. Each loop: the role now
    (``role_now``, ``log_role``, ``Rounds.follow``), then, leading, one of ``Rounds.round``."""
    rounds = Rounds(settings, store, runner, watch, on_sweep, on_pools)
    leadership = leadership or Leadership(client)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda signum, frame: stop.set())
    log.info(
        "scheduler started",
        extra={"interval_seconds": rounds.sweep_every, "recovery_interval_seconds": rounds.recover_every},
    )
    role: Role | None = None
    leadership.start()
    try:
        while not stop.is_set():
            term = leadership.term()
            now_role, reason = role_now(leadership, term)
            log_role(role, now_role, reason, term)
            rounds.follow(role, now_role)
            role = now_role
            if term is None:
                stop.wait(min(rounds.tick, RETRY_SECONDS))
                continue
            try:
                rounds.round(Acting(leadership, term, publish))
            except LeadershipLost as exc:
                leadership.end(term)
                log.warning("leadership lost mid-round; acting no further", extra={"reason": str(exc)})
                continue
            stop.wait(rounds.wait_seconds())
    finally:
        if watch is not None and role is Role.LEADING:
            watch.stop()
        leadership.stop()
    log.info("scheduler stopped")


class _Taking:
    """The store's ``take_due`` and ``take_overdue`` (``timers.Due``, ``recovery.Backlog``), each
    done only while the term holds: what a stale leader would take, it leaves."""

    def __init__(self, store: SchedulerStore, acting: Acting) -> None:
        self._store = store
        self._acting = acting

    def take_due(self, limit: int) -> list[str]:
        self._acting.check()
        return self._store.take_due(limit)

    def take_overdue(self, limit: int) -> list[str]:
        self._acting.check()
        return self._store.take_overdue(limit)


def _guarded(what: str, step: Callable[[], object]) -> bool:
    """Run one step; a failure is logged and retried next round, never ends the loop (a
    ``LeadershipLost`` ends the round: it is raised)."""
    try:
        step()
        return True
    except LeadershipLost:
        raise
    except (StoreUnavailable, QueueUnavailable) as exc:
        reason = str(exc.__cause__ or exc)
        log.warning(f"redis unavailable: {reason}; {what} retried next round", extra={"reason": reason})
    except Transient as exc:
        log.warning(f"{what} failed; retried next round", extra={"reason": str(exc)})
    except Exception as exc:  # a bug or an untranslated error: say so loudly, keep the scheduler up
        log.exception(f"{what} failed unexpectedly; retried next round", extra={"error_type": type(exc).__name__})
    return False
