"""The periodic sweep (L17, L18): every session with a mapping, a managed sandbox or a
kept workspace is worked again, through the same queue and lease as a webhook.

Deleting a session sends nothing, so only a sweep finds compute whose session is gone
(404), failed or past its maximum lifetime, a mapping whose sandbox vanished, a sandbox
nobody recorded, or a kept workspace whose session is gone. The sweep decides nothing
itself: it asks for work on each such session; the worker, holding the session's lease,
re-reads it and decides with ``lifecycle.decide`` (release, adopt, discard, or leave
alone). A start and a cleanup of one session therefore never interleave (L18). Each of those
decisions re-arms the session's durable timer, so the sweep also gives a timer back to a
mapped session that lost its own (``controller.timers``).

A mapped session with a timer armed is looked at when its timer falls due (every decision
arms the next time anything about it needs a look: idle deadline, grace, maximum lifetime,
retention), so most sweeps (``full=False``) leave such sessions to their timers and enqueue
only mapped sessions without a timer and sandboxes or workspaces without a mapping: at
10,000 idle sessions a pass costs the workers (and the Agents API) only what changed. Every
``FULL_EVERY``-th pass, and the first after the scheduler starts, is full: the slow safety net
for a session deleted while its timer is far away.

Exactly one scheduler sweeps at a time (``scheduler.Leadership``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller import logs
from controller.runners.base import Runner
from controller.store.base import SessionStore

log = logs.get(__name__)
BATCH = 1000
FULL_EVERY = 12
"""One sweep in this many enqueues every mapped session, timer or not (hourly at the default
300 s interval)."""


@dataclass(frozen=True)
class Sweep:
    mapped: int
    managed: int
    enqueued: int
    running: int = 0
    """Sandboxes the runner manages (live or not yet cleaned up): the running-sandboxes gauge."""
    left_to_timers: int = 0
    """Mapped sessions not enqueued because their timer will bring them back (``full=False``)."""


def sweep(
    store: SessionStore,
    runner: Runner,
    enqueue: Callable[[Sequence[str]], None],
    batch: int = BATCH,
    full: bool = True,
) -> Sweep:
    """Want work on, then enqueue, every such session (``full``), or all but the mapped sessions
    with a timer armed (not ``full``), ``batch`` sessions at a time: one store round trip and one
    queue round trip per batch (each session's work is wanted before its job exists, as for a
    webhook)."""
    mapped = set(store.session_ids())
    handles = runner.list_managed()
    managed = {handle.session_id for handle in handles} | set(runner.workspaces())
    chosen = mapped | managed
    if not full:
        # Mapped and timed: the timer brings it back (a running sandbox's next check, a kept
        # workspace's end of retention). A sandbox or workspace without a mapping and a mapped
        # session without a timer are enqueued as before.
        timed = store.armed() & mapped
        chosen = (mapped - timed) | (managed - mapped)
    ordered = sorted(chosen)
    for start in range(0, len(ordered), batch):
        chunk = ordered[start : start + batch]
        store.want_many(chunk)
        enqueue(chunk)
    result = Sweep(
        mapped=len(mapped),
        managed=len(managed),
        enqueued=len(ordered),
        running=len(handles),
        left_to_timers=len((mapped | managed) - chosen),
    )
    log.info(
        "reconcile sweep",
        extra={
            "mapped": result.mapped,
            "managed": result.managed,
            "enqueued": result.enqueued,
            "running": result.running,
            "left_to_timers": result.left_to_timers,
            "full": full,
        },
    )
    return result
