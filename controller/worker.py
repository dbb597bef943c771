"""The Celery app and its one task. Tasks are thin: ids in, ``lifecycle.work`` does the rest.

Delivery guarantees come from the settings, not from hope:
``acks_late`` + ``reject_on_worker_lost`` put a job back when the process working it dies;
``prefetch_multiplier=1`` keeps unstarted jobs in Redis, not in a dying worker's memory;
jobs a whole dead worker held are redelivered after the broker's visibility timeout.
Errors map to what the caller should do: ``Transient`` and ``Busy`` → retry later (with
jittered backoff), ``Permanent`` → log and give up, ``Fenced`` → drop quietly.
A retry is a new message: if the broker refuses it, or the retries run out, the job is gone
but the session's work stays wanted in the store, and the scheduler's recovery pass
(``controller.recovery``) enqueues it again.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

from celery import Celery, Task, signals

from controller import lifecycle, logs
from controller.config import Settings
from controller.errors import Fenced, Permanent, Transient
from controller.inbox import Job
from controller.store.base import Busy

log = logs.get(__name__)

TASK_SYNC_SESSION = "controller.sync_session"
QUEUE = "sandbox-controller"
_deps: lifecycle.Deps | None = None


def make_app(settings: Settings) -> Celery:
    app = Celery("sandbox-controller", set_as_current=False)
    app.conf.update(
        broker_url=settings.queue.redis_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.queue.visibility_timeout_seconds,
            # Sweep for a dead worker's unacknowledged jobs often enough to honour the timeout.
            "unacked_restore_interval": max(1, min(10, settings.queue.visibility_timeout_seconds // 5)),
            "unacked_restore_throttle": 1,
            "socket_timeout": 3,
            "socket_connect_timeout": 3,
        },
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.3, "interval_max": 0.5},
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    _register(app, settings)
    return app


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _announce_ready(**_: Any) -> None:
    log.info("worker ready", extra={"pid": os.getpid()})


def publisher(app: Celery) -> Callable[[Job], None]:
    """The inbox's publish function: put one job on the queue (raises if the broker refuses)."""

    def publish(job: Job) -> None:
        app.send_task(
            TASK_SYNC_SESSION,
            args=[job.session_id],
            kwargs={"webhook_id": job.webhook_id, "event_type": job.event_type},
            queue=QUEUE,
        )

    return publish


def backoff_seconds(retries: int, hint: float | None) -> float:
    """Jittered exponential backoff for task retries, at least the server's hint."""
    ceiling = min(60.0, 1.0 * 2**retries)
    return max(hint or 0.0, random.uniform(ceiling / 2, ceiling))


def _register(app: Celery, settings: Settings) -> None:
    max_retries = settings.queue.task_max_retries

    @app.task(  # type: ignore[untyped-decorator]
        name=TASK_SYNC_SESSION, bind=True, max_retries=max_retries
    )
    def sync_session(self: Task, session_id: str, webhook_id: str | None = None, event_type: str | None = None) -> None:
        with logs.bind(session_id=session_id, webhook_id=webhook_id, task_id=self.request.id):
            log.info(
                "task started", extra={"event_type": event_type, "pid": os.getpid(), "retries": self.request.retries}
            )
            try:
                result = lifecycle.work(session_id, _worker_deps(settings))
            except Fenced as exc:
                # Our decision is stale and was not acted on; the work itself is still owed
                # (the lease may simply have expired). A retry finds it done, busy, or to do.
                delay = 0.5 + random.uniform(0, 0.5)
                log.info("stale decision dropped; looking again", extra={"reason": str(exc)})
                raise self.retry(countdown=delay, max_retries=None) from exc
            except Permanent as exc:
                log.error("giving up on session", extra={"reason": str(exc), "error_type": type(exc).__name__})
                return
            except Transient as exc:
                if self.max_retries is not None and self.request.retries >= self.max_retries:
                    # The work stays wanted (work() released the lease without marking it
                    # done): the scheduler's recovery pass enqueues the session again.
                    log.error("retries exhausted; left to the recovery pass", extra={"reason": str(exc)})
                    return
                delay = backoff_seconds(self.request.retries, exc.retry_after)
                log.warning("will retry", extra={"reason": str(exc), "countdown": round(delay, 2)})
                raise self.retry(countdown=delay, exc=exc) from exc
            if isinstance(result, Busy):
                delay = min(result.retry_after, 2.0) + random.uniform(0, 0.5)
                log.info("session busy elsewhere; will look again", extra={"countdown": round(delay, 2)})
                raise self.retry(countdown=delay, max_retries=None)
            log.info("task done", extra={"rounds": len(result)})


def _worker_deps(settings: Settings) -> lifecycle.Deps:
    """Built once per worker process, after the fork (connections must not cross it)."""
    global _deps
    if _deps is None:
        from controller import wiring

        _deps = wiring.worker_deps(settings)
    return _deps
