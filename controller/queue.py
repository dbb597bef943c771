"""The job queue: Celery on Redis, its settings, and publishing one job.

Delivery guarantees come from the settings, not from hope:
``acks_late`` + ``reject_on_worker_lost`` put a job back when the process working it dies;
``prefetch_multiplier=1`` keeps unstarted jobs in Redis, not in a dying worker's memory;
jobs a whole dead worker held are redelivered after the broker's visibility timeout.

The receiver and the scheduler publish through ``publisher`` (by task name, so they never
import the worker); ``worker.register`` adds the task that consumes the queue.
"""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from controller.config import Settings
from controller.inbox import Job

TASK_SYNC_SESSION = "controller.sync_session"
TASK_WATCH_CONNECTION = "controller.watch_connection"
QUEUE = "sandbox-controller"


def make_app(settings: Settings) -> Celery:
    """A Celery app configured for the queue (no task registered: publishing needs none)."""
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
    return app


def publisher(app: Celery) -> Callable[[Job], None]:
    """The inbox's publish function: put one job on the queue (raises if the broker refuses)."""

    def publish(job: Job) -> None:
        kwargs: dict[str, object] = {"webhook_id": job.webhook_id, "event_type": job.event_type}
        if job.received_at:
            kwargs["received_at"] = job.received_at  # for delivery → sandbox start latency
        app.send_task(TASK_SYNC_SESSION, args=[job.session_id], kwargs=kwargs, queue=QUEUE)

    return publish
