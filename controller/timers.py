"""Durable timers: "look at this session again at time T", carried out by the active scheduler.

A decision can say when to look again (``decide.Decision.recheck_at``: an idle deadline,
the end of an executor's grace period, the maximum lifetime, the end of a kept workspace's
retention). The worker arms that time under the session's lease (``SessionStore.arm``, fenced:
a worker that lost its lease arms nothing). Each session has at most one timer, the next time
anything about it needs a look; arming again replaces it, and arming ``None`` removes it.

Timers live in the store (Redis: the sorted set ``sc:timers``, session id → due time), not in
the queue: a Celery ETA or countdown job would sit in one worker's memory for hours and
collide with the broker's visibility timeout. The active scheduler calls ``fire`` about once a
second; ``Due.take_due`` removes the due timers *and* asks for work on each session in one
atomic step, exactly as a webhook's ``want`` does. So a timer is never lost between the two:
if the scheduler dies before it enqueues, the work is still wanted and the recovery pass
(``controller.recovery``) enqueues it. The worker then re-reads the session under its lease
and decides afresh; a timer never stops anything by itself (L12, L13).

Every sweep (``controller.reconcile``) works every mapped session that has no timer (unless
the pod watch looks after its sandbox), a full sweep (``CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS``)
works them all, and each decision re-arms, so a mapped session that lost its timer (a Redis
restart without its append-only file) gets one back within one full sweep at most; one that
has a timer is left to it between full sweeps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from controller import logs

log = logs.get(__name__)

BATCH = 500
RESOLUTION_SECONDS = 1.0
"""How often the active scheduler serves due timers (their resolution)."""


class Due(Protocol):
    def take_due(self, limit: int) -> list[str]:
        """Up to ``limit`` sessions whose timer is due: each timer is removed and the session's
        work is wanted (as ``SessionStore.want`` would), in one atomic step."""
        ...


def drain(
    take: Callable[[int], list[str]], enqueue: Callable[[Sequence[str]], None], batch: int, max_batches: int
) -> int:
    """Enqueue every session ``take`` hands out, ``batch`` at a time (one ``enqueue`` per batch:
    one round trip to the queue, and where the scheduler checks it still leads), until it has
    fewer left (at most ``batch * max_batches`` per call); returns how many were enqueued."""
    enqueued = 0
    for _ in range(max_batches):
        taken = take(batch)
        if taken:
            enqueue(taken)
            enqueued += len(taken)
        if len(taken) < batch:
            break
    return enqueued


def fire(due: Due, enqueue: Callable[[Sequence[str]], None], batch: int = BATCH, max_batches: int = 20) -> int:
    """Enqueue a job for every session whose timer is due, a batch at a time; returns how many."""
    fired = drain(due.take_due, enqueue, batch, max_batches)
    if fired:
        log.info("timers fired", extra={"fired": fired})
    return fired
