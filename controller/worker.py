"""The queue's two tasks, both thin: ``sync_session`` (ids in, ``lifecycle.work`` does the rest)
and ``watch_connection`` (measures delivery → executor connected; it never decides).

Each start's stages (``start_stages``) are observed where they are known: the queue wait and
the placing by ``sync_session`` on its own clock, the pod's stages and the connection by the
watch job once the executor is connected; the timeline is noted for ``explain``.

Errors map to what the caller should do: ``Transient`` and ``Busy`` → retry later (with
jittered backoff), ``Permanent`` → log and give up, ``Fenced`` → drop quietly.
A retry is a new message: if the broker refuses it, or the retries run out, the job is gone
but the session's work stays wanted in the store, and the scheduler's recovery pass
(``controller.recovery``) enqueues it again.
The app and its delivery settings are ``queue.make_app``; ``wiring.worker_app`` builds the
dependencies.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from celery import Celery, Task

from controller import lifecycle, logs, queue, start_stages
from controller.decide import Verdict
from controller.errors import Fenced, Permanent, StoreUnavailable, Transient
from controller.metrics import (
    DELIVERY_TO_CONNECTED_SECONDS,
    DELIVERY_TO_START_SECONDS,
    LEASE_BUSY_TOTAL,
    START_STAGE_SECONDS,
    Metrics,
)
from controller.model import Link
from controller.runners.base import Starts
from controller.store.base import Busy, StartLog

log = logs.get(__name__)
CONNECTION_WINDOW_SECONDS = 300.0
"""How long a watch job waits for a started executor to connect (the API's window, L15)."""
WATCH_FIRST_SECONDS, WATCH_MAX_SECONDS = 0.5, 5.0
"""A watch job asks after 0.5 s, then √2 times later each time, at most every 5 s: about ten
requests for a 20-second connection, and the measure is late by at most a third of itself."""


def watch_delay(asked: int) -> float:
    return float(min(WATCH_MAX_SECONDS, WATCH_FIRST_SECONDS * 2 ** (asked / 2)))


def announce_ready(**_: Any) -> None:
    """Celery's ``worker_ready`` signal: the worker consumes the queue from now on."""
    log.info("worker ready", extra={"pid": os.getpid()})


def run(app: Celery, argv: list[str]) -> int:
    """Run ``celery <argv>`` (the worker) and return its exit status.

    What ``app.worker_main`` does, keeping the status it drops: a worker that gives up (Celery's
    "Unrecoverable error") returns 1, so the process exits non-zero and a supervisor that
    restarts on failure brings it back; a warm shutdown (SIGTERM) returns 0."""
    # Imported here: Celery's command line is for the worker process only (the receiver and the
    # scheduler import this module through wiring, and never run it).
    from celery.bin.celery import celery as command

    command.params[0].default = app  # as Celery.start does: the app the command runs
    try:
        return int(command.main(args=argv, standalone_mode=False) or 0)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    finally:
        command.params[0].default = None


def backoff_seconds(retries: int, hint: float | None) -> float:
    """Jittered exponential backoff for task retries, at least the server's hint."""
    ceiling = min(60.0, 1.0 * 2**retries)
    return max(hint or 0.0, random.uniform(ceiling / 2, ceiling))


class KeptProducer:
    """One producer (and its channel to the broker) for every watch job a pool process queues.

    Celery's own pool hands out a producer per publish and drops its channel on release: on
    Redis each publish then opened a connection (a DNS lookup, a PING) of its own. The kept one
    reconnects by itself when the broker goes away (kombu's ``ensure``). ``connect`` opens it
    ahead of the process's first job (``wiring.ProcessDeps``, on the process's connect thread):
    else the first watch job queued, right after the process's first placement, opened it (the
    connection, its channel, the queue's declaration) while the sandbox it placed was starting.
    """

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._kept: Any = None  # acquired after the fork, never released
        self._lock = threading.Lock()  # held for no network: a job never waits on ``connect``

    def get(self) -> Any:
        with self._lock:
            if self._kept is None:
                self._kept = self._app.producer_pool.acquire(block=True)
            return self._kept

    def connect(self) -> None:
        """Open the producer's connection and channel, and declare the queue the watch jobs go
        to (``StoreUnavailable`` when the broker cannot be reached: tried twice, kombu's
        ``connect``). A producer of its own, kept only if no job took one meanwhile (a job does
        not wait for it, and two threads never share one)."""
        with self._lock:
            if self._kept is not None:
                return
            producer = self._app.producer_pool.acquire(block=True)
        try:
            producer.connection.connect()
            producer.maybe_declare(self._app.amqp.queues[queue.QUEUE])
        except (*producer.connection.connection_errors, *producer.connection.channel_errors, OSError) as exc:
            producer.release()
            raise StoreUnavailable(f"could not connect to the broker ({type(exc).__name__})") from exc
        with self._lock:
            if self._kept is None:
                self._kept, producer = producer, None
        if producer is not None:
            producer.release()


@dataclass(frozen=True)
class Tasks:
    """What the two tasks share in one worker process: its dependencies (``deps()``), the
    metrics (``None``: not served), whether delivery → executor connected is watched, and how a
    watch job asks again later (``ask_later``: queues ``watch_connection`` with a delay)."""

    deps: Callable[[], lifecycle.Deps]
    metrics: Metrics | None
    watch_connections: bool
    ask_later: Callable[[str, float, float, int, dict[str, Any] | None], None]


def register(
    app: Celery,
    max_retries: int,
    deps: Callable[[], lifecycle.Deps],
    metrics: Metrics | None = None,
    watch_connections: bool = False,
    producer: KeptProducer | None = None,
) -> None:
    """Add the tasks to ``app``; ``deps()`` gives the worker process's dependencies; ``metrics``
    counts busy leases and observes delivery → sandbox start, and, with ``watch_connections``
    (metrics are served), delivery → executor connected; ``producer`` queues the watch jobs
    (``wiring`` connects it at each pool process's start). Each task is a named step of its own
    (``sync_session``, ``watch_connection``); this only binds them to the app."""
    kept = producer if producer is not None else KeptProducer(app)

    def ask_later(
        environment_id: str, received_at: float, deadline: float, asked: int, start: dict[str, Any] | None
    ) -> None:
        watch_task.apply_async(
            args=[environment_id, received_at, deadline],
            kwargs={"asked": asked, **({"start": start} if start else {})},
            countdown=watch_delay(asked),
            queue=queue.QUEUE,
            producer=kept.get(),
        )

    tasks = Tasks(deps, metrics, watch_connections, ask_later)

    # shared=False: the tasks are this app's only (Celery would otherwise add them to every app
    # the process finalizes later, each bound to this app's ``deps``).
    @app.task(  # type: ignore[untyped-decorator]
        name=queue.TASK_SYNC_SESSION, bind=True, max_retries=max_retries, shared=False
    )
    def sync_task(
        self: Task,
        session_id: str,
        webhook_id: str | None = None,
        event_type: str | None = None,
        received_at: float | None = None,
    ) -> None:
        sync_session(tasks, self, session_id, webhook_id, event_type, received_at)

    @app.task(  # type: ignore[untyped-decorator]
        name=queue.TASK_WATCH_CONNECTION, max_retries=None, acks_late=False, shared=False
    )
    def watch_task(
        environment_id: str,
        received_at: float,
        deadline: float,
        asked: int = 0,
        start: dict[str, Any] | None = None,
    ) -> None:
        watch_connection(tasks, environment_id, received_at, deadline, asked, start)


def sync_session(
    tasks: Tasks,
    task: Task,
    session_id: str,
    webhook_id: str | None,
    event_type: str | None,
    received_at: float | None,
) -> None:
    """The ``sync_session`` task: ``lifecycle.work`` on the session, its errors turned into
    what Celery should do (``retry_or_give_up``), a busy lease into a retry soon, and a start
    noted (``note_start``)."""
    taken = time.time()
    with logs.bind(session_id=session_id, webhook_id=webhook_id, task_id=task.request.id):
        log.info("task started", extra={"event_type": event_type, "pid": os.getpid(), "retries": task.request.retries})
        try:
            result = lifecycle.work(session_id, tasks.deps())
        except (Fenced, Permanent, Transient) as exc:
            retry_or_give_up(task, exc)
            return
        if isinstance(result, Busy):
            if tasks.metrics is not None:
                tasks.metrics.inc(LEASE_BUSY_TOTAL)
            delay = min(result.retry_after, 2.0) + random.uniform(0, 0.5)
            log.info("session busy elsewhere; will look again", extra={"countdown": round(delay, 2)})
            raise task.retry(countdown=delay, max_retries=None)
        started = any(d.verdict in (Verdict.START, Verdict.REPLACE) for d in result)
        if started and received_at and tasks.metrics is not None:
            tasks.metrics.observe(DELIVERY_TO_START_SECONDS, max(0.0, time.time() - received_at))
        if started:
            note_start(tasks, session_id, received_at or 0.0, taken)
        log.info("task done", extra={"rounds": len(result)})


def retry_or_give_up(task: Task, exc: Fenced | Permanent | Transient) -> None:
    """What a failed round's error asks of the task (raises Celery's ``Retry`` to retry)."""
    if isinstance(exc, Fenced):
        # Our decision is stale and was not acted on; the work itself is still owed (the lease
        # may simply have expired). A retry finds it done, busy, or to do.
        delay = 0.5 + random.uniform(0, 0.5)
        log.info("stale decision dropped; looking again", extra={"reason": str(exc)})
        raise task.retry(countdown=delay, max_retries=None) from exc
    if isinstance(exc, Permanent):
        log.error("giving up on session", extra={"reason": str(exc), "error_type": type(exc).__name__})
        return
    if task.max_retries is not None and task.request.retries >= task.max_retries:
        # The work stays wanted (work() released the lease without marking it done): the
        # scheduler's recovery pass enqueues the session again.
        log.error("retries exhausted; left to the recovery pass", extra={"reason": str(exc)})
        return
    delay = backoff_seconds(task.request.retries, exc.retry_after)
    log.warning("will retry", extra={"reason": str(exc), "countdown": round(delay, 2)})
    raise task.retry(countdown=delay, exc=exc) from exc


def note_start(tasks: Tasks, session_id: str, received_at: float, taken: float) -> None:
    """A sandbox was just started: observe and note its first stages (``start_stages``), and
    with ``watch_connections`` start a watch job for the rest (only to measure; it never
    decides). A store that cannot note it loses the note only."""
    placed = time.time()
    found = tasks.deps()
    record = found.store.record(session_id)
    if record is None:
        return
    if isinstance(found.runner, Starts):
        template, source = found.runner.placement(session_id) or ("", "cold")
    else:
        template, source = "local", "cold"  # the local runner: no templates, no pool
    stamps = {"taken": taken, "placed": placed, **({"delivered": received_at} if received_at else {})}
    observe_stages(tasks.metrics, stamps, source, template)
    sandbox = f"{record.handle.name}/{record.handle.uid}"
    if isinstance(found.store, StartLog):
        fields = {"source": source, "template": template, **{k: repr(v) for k, v in stamps.items()}}
        try:
            found.store.begin_start(session_id, sandbox, fields)
        except StoreUnavailable:
            log.warning("could not note the start's timeline", extra={"session_id": session_id})
    if tasks.watch_connections:
        start = {"session_id": session_id, "sandbox": sandbox, "placed": placed, "source": source}
        start["template"] = template
        tasks.ask_later(record.environment_id, received_at, placed + CONNECTION_WINDOW_SECONDS, 0, start)


def observe_stages(metrics: Metrics | None, stamps: dict[str, float], source: str, template: str) -> None:
    if metrics is None:
        return
    for stage, seconds in start_stages.stages(stamps):
        metrics.observe(START_STAGE_SECONDS, seconds, stage=stage, source=source, template=template or "none")


def finish_start(tasks: Tasks, start: dict[str, Any], connected: float) -> None:
    """The watch job saw the executor connected: the sandbox's own stamps (from the runner) and
    ``connected``, observed and added to the start's timeline."""
    found = tasks.deps()
    session_id, sandbox = str(start["session_id"]), str(start["sandbox"])
    # The first read that found it connected is the first that can tell it registered
    # (``start_stages``: the API reports no registration time).
    stamps: dict[str, float] = {"placed": float(start["placed"]), "registered": connected, "connected": connected}
    if start.get("registered_after"):
        stamps["registered_after"] = float(start["registered_after"])
    record = found.store.record(session_id)
    same = record is not None and f"{record.handle.name}/{record.handle.uid}" == sandbox
    if same and record is not None and isinstance(found.runner, Starts):
        try:
            stamps.update(found.runner.start_stamps(record.handle))
        except Transient as exc:  # the API server away: this start's pod stages only are lost
            log.warning("could not read the sandbox's start stamps", extra={"reason": str(exc)})
    observe_stages(tasks.metrics, stamps, str(start.get("source", "cold")), str(start.get("template", "")))
    if isinstance(found.store, StartLog):
        try:
            found.store.add_to_start(session_id, sandbox, {k: repr(v) for k, v in stamps.items() if k != "placed"})
        except StoreUnavailable:
            log.warning("could not note the start's timeline", extra={"session_id": session_id})


def watch_connection(
    tasks: Tasks,
    environment_id: str,
    received_at: float,
    deadline: float,
    asked: int = 0,
    start: dict[str, Any] | None = None,
) -> None:
    """The ``watch_connection`` task: observe delivery → executor connected once the API reports
    the environment connected; ask again (``watch_delay``) until ``deadline``. A lost watch job
    loses one observation only.

    "Not yet" queues the next ask itself (``asked`` counts them) and returns: no Celery retry,
    whose exception makes Celery capture and format a traceback each time; with ten sandboxes
    starting at once that was as much of the workers' CPU as starting them."""
    connected = tasks.deps().sessions.environment_link(environment_id) is Link.UP
    now = time.time()
    if connected:
        if tasks.metrics is not None and received_at:
            tasks.metrics.observe(DELIVERY_TO_CONNECTED_SECONDS, max(0.0, now - received_at))
        if start:
            finish_start(tasks, start, now)
        since = received_at or float(start["placed"] if start else now)
        log.info("executor connected", extra={"environment_id": environment_id, "after_seconds": round(now - since, 2)})
        return
    if now + watch_delay(asked + 1) > deadline:
        log.warning("executor not connected within the window", extra={"environment_id": environment_id})
        return
    # This read found it not registered yet: the registration's window opens here.
    tasks.ask_later(
        environment_id, received_at, deadline, asked + 1, {**start, "registered_after": now} if start else None
    )
