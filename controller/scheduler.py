"""``sandbox-controller scheduler``: one active process that sweeps on a timer.

Leadership is a Redis key holding this process's token with a TTL of three intervals
(``leadership_ttl_seconds``), renewed each round, one interval apart, by a compare-and-expire
script: it lapses only when a leader misses two renewals in a row, and a standby takes over
within three intervals of the leader stopping. A scheduler that cannot renew stops sweeping
until it wins the key again, so two never sweep at once.
"""

from __future__ import annotations

import secrets
import signal
import threading
from collections.abc import Callable
from types import FrameType

import redis

from controller import logs, reconcile
from controller.config import Settings
from controller.errors import Transient
from controller.inbox import Job
from controller.runners.base import Runner
from controller.store.base import SessionStore

log = logs.get(__name__)
LEADER_KEY = "sc:scheduler:leader"
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""


def leadership_ttl_seconds(interval_seconds: float) -> float:
    """Three renewal intervals: longer than the wait between renewals, whatever the interval."""
    return 3 * interval_seconds


class Leadership:
    def __init__(self, client: redis.Redis, ttl_seconds: float) -> None:
        self._token = secrets.token_hex(8)
        self._ttl_ms = int(ttl_seconds * 1000)
        self._renew = client.register_script(_RENEW)

    def hold(self) -> bool:
        """Take or keep leadership; False when another scheduler has it or Redis is away."""
        try:
            return bool(self._renew(keys=[LEADER_KEY], args=[self._token, self._ttl_ms]))
        except redis.RedisError:
            return False


def run(
    settings: Settings,
    store: SessionStore,
    runner: Runner,
    client: redis.Redis,
    publish: Callable[[Job], None],
    stop: threading.Event | None = None,
) -> None:
    interval = settings.lifecycle.reconcile_interval_seconds
    leadership = Leadership(client, ttl_seconds=leadership_ttl_seconds(interval))
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def enqueue(session_id: str) -> None:
        publish(Job(session_id=session_id, webhook_id="", event_type="reconcile"))

    log.info("scheduler started", extra={"interval_seconds": interval})
    while not stop.is_set():
        if leadership.hold():
            try:
                reconcile.sweep(store, runner, enqueue)
            except Transient as exc:
                log.warning("reconcile sweep failed; next round retries", extra={"reason": str(exc)})
        else:
            log.info("another scheduler is active; standing by")
        stop.wait(interval)
    log.info("scheduler stopped")
