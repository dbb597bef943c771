"""The periodic sweep (L17, L18): every session with a mapping, a managed sandbox or a
kept workspace is worked again, through the same queue and lease as a webhook.

Deleting a session sends nothing, so only a sweep finds compute whose session is gone
(404), failed or past its maximum lifetime, a mapping whose sandbox vanished, a sandbox
nobody recorded, or a kept workspace whose session is gone. A full sweep first has the runner
stop a sandbox whose start was cut short before the runner itself recorded it
(``EndsUnrecorded``: the local runner's worker killed between the executor's spawn and its
``sandbox.json``), which no worker could ever find to stop. The sweep decides nothing
itself: it asks for work on each such session; the worker, holding the session's lease,
re-reads it and decides with ``decide.decide`` (release, adopt, discard, or leave
alone). A start and a cleanup of one session therefore never interleave (L18). Each of those
decisions re-arms the session's durable timer, so the sweep also gives a timer back to a
mapped session that lost its own (``controller.timers``).

A mapped session with a timer armed is looked at when its timer falls due (every decision
arms the next time anything about it needs a look: idle deadline, grace, maximum lifetime,
retention), and with the Kubernetes runner a mapped session whose pod is there is looked at
when the pod watch sees it change (``runners.kubernetes.watch``: deleted, failed, restarted,
Ready). So most sweeps (``full=False``) leave such sessions to their timers and, while the
watch is live (``watched``), to the watch; they enqueue only the rest: mapped sessions with
neither (a mapping whose sandbox vanished among them), and sandboxes or workspaces without a
mapping. At 10,000 idle sessions a pass then costs the workers (and the Agents API) only what
changed. A full sweep, every ``CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS`` and the first after the
scheduler starts, works them all: the slow safety net for a session deleted (no webhook, L17)
while its timer is far away and its sandbox quiet. A failed session is released at once
through its ``agent.session.failed`` webhook (L4, L7); the sweep is the net under that too.

Exactly one scheduler sweeps at a time (``scheduler.Leadership``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller import logs
from controller.runners.base import EndsUnrecorded, Runner
from controller.store.base import SessionStore

log = logs.get(__name__)
BATCH = 1000


@dataclass(frozen=True)
class Sweep:
    mapped: int
    managed: int
    enqueued: int
    running: int = 0
    """Sandboxes the runner manages (live or not yet cleaned up): the running-sandboxes gauge."""
    left_to_timers: int = 0
    """Mapped sessions not enqueued because their timer will bring them back (``full=False``)."""
    left_to_watch: int = 0
    """Mapped sessions without a timer not enqueued because the pod watch will bring them back."""


def sweep(
    store: SessionStore,
    runner: Runner,
    enqueue: Callable[[Sequence[str]], None],
    batch: int = BATCH,
    full: bool = True,
    watched: bool = False,
) -> Sweep:
    """Want work on, then enqueue, every such session (``full``), or all but the mapped sessions
    with a timer armed (not ``full``) and, when the pod watch is live (``watched``), those whose
    sandbox is there to watch, ``batch`` sessions at a time: one store round trip and one queue
    round trip per batch (each session's work is wanted before its job exists, as for a
    webhook)."""
    if full and isinstance(runner, EndsUnrecorded):
        runner.end_unrecorded()  # a start cut short: its sandbox would run with nothing to stop it
    mapped = set(store.session_ids())
    handles = runner.list_managed()
    managed = {handle.session_id for handle in handles} | set(runner.workspaces())
    chosen = mapped | managed
    watching: set[str] = set()
    if not full:
        # Mapped and timed: the timer brings it back (a running sandbox's next check, a kept
        # workspace's end of retention). A sandbox or workspace without a mapping and a mapped
        # session without a timer are enqueued as before.
        timed = store.armed() & mapped
        # Mapped with its sandbox there, watch live: the watch brings it back when the sandbox
        # goes, fails, restarts or becomes Ready. A mapping whose sandbox is not listed is not
        # watched: it is enqueued (the worker finds the sandbox gone).
        if watched:
            watching = {handle.session_id for handle in handles} & (mapped - timed)
        chosen = (mapped - timed - watching) | (managed - mapped)
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
        left_to_timers=len((mapped | managed) - chosen - watching),
        left_to_watch=len(watching),
    )
    log.info(
        "reconcile sweep",
        extra={
            "mapped": result.mapped,
            "managed": result.managed,
            "enqueued": result.enqueued,
            "running": result.running,
            "left_to_timers": result.left_to_timers,
            "left_to_watch": result.left_to_watch,
            "full": full,
        },
    )
    return result
