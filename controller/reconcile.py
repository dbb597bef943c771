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

Exactly one scheduler sweeps at a time (``scheduler.Leadership``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller import logs
from controller.runners.base import Runner
from controller.store.base import SessionStore

log = logs.get(__name__)


@dataclass(frozen=True)
class Sweep:
    mapped: int
    managed: int
    enqueued: int
    running: int = 0
    """Sandboxes the runner manages (live or not yet cleaned up): the running-sandboxes gauge."""


def sweep(store: SessionStore, runner: Runner, enqueue: Callable[[str], None]) -> Sweep:
    mapped = set(store.session_ids())
    handles = runner.list_managed()
    managed = {handle.session_id for handle in handles} | set(runner.workspaces())
    for session_id in sorted(mapped | managed):
        store.want(session_id)
        enqueue(session_id)
    result = Sweep(mapped=len(mapped), managed=len(managed), enqueued=len(mapped | managed), running=len(handles))
    log.info(
        "reconcile sweep",
        extra={
            "mapped": result.mapped,
            "managed": result.managed,
            "enqueued": result.enqueued,
            "running": result.running,
        },
    )
    return result
