"""The job queue: Celery on Redis, its settings, and publishing one job.

Delivery guarantees come from the settings, not from hope:
``acks_late`` + ``reject_on_worker_lost`` put a job back when the process working it dies;
``prefetch_multiplier=1`` keeps unstarted jobs in Redis, not in a dying worker's memory;
jobs a whole dead worker held are redelivered after the broker's visibility timeout.

Two queues: webhook jobs (the receiver's) on ``QUEUE``, maintenance jobs (the scheduler's
sweep, recovery pass and timers) on ``MAINTENANCE_QUEUE``. A worker consumes both, the webhook
queue first: with ``queue_order_strategy="priority"`` kombu's Redis transport asks for them in
one ``BRPOP`` listing the queues in the order the worker was given (``CONSUMED``), and Redis
pops from the first non-empty one. So a connection request waits for the jobs the workers are
already running, never behind the 10,000 jobs a sweep just queued. (``round_robin``, kombu's
default, would move a queue to the back after each pop: webhook and maintenance jobs would
alternate.) A retried job stays on the queue it came from (Celery retries to the same route).

The receiver queues its jobs itself (``task_message``, in its Redis script); the scheduler
through ``fenced_publisher`` (one push per batch, made only while its leadership term holds);
``publisher`` publishes one job through Celery (by task name, so nothing here imports the
worker); ``worker.register`` adds the task that consumes the queues.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis
from celery import Celery

from controller import task_message
from controller.config import Settings
from controller.errors import LeadershipLost
from controller.inbox import Job
from controller.redis_client import Endpoint

TASK_SYNC_SESSION = "controller.sync_session"
TASK_WATCH_CONNECTION = "controller.watch_connection"
QUEUE = "sandbox-controller"
"""Webhook jobs: what a person is waiting for."""
MAINTENANCE_QUEUE = "sandbox-controller-maintenance"
"""The scheduler's jobs (reconcile sweep, recovery pass, timers): worked when no webhook job waits."""
CONSUMED = (QUEUE, MAINTENANCE_QUEUE)
"""The queues a worker consumes, in the order it asks for them (the first non-empty one wins)."""


def make_app(settings: Settings) -> Celery:
    """A Celery app configured for the queue (no task registered: publishing needs none)."""
    app = Celery("sandbox-controller", set_as_current=False)
    # Where the broker is: one URL, or a Sentinel set (kombu's Sentinel transport), with TLS;
    # through controller.broker, which survives an outage and follows the master.
    broker = Endpoint.from_settings(settings.queue).broker()
    app.conf.update(
        broker_url=broker["broker_url"],
        broker_transport=broker["broker_transport"],
        broker_use_ssl=broker.get("broker_use_ssl"),
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            **broker["transport_options"],
            "visibility_timeout": settings.queue.visibility_timeout_seconds,
            # Sweep for a dead worker's unacknowledged jobs often enough to honour the timeout.
            "unacked_restore_interval": max(1, min(10, settings.queue.visibility_timeout_seconds // 5)),
            "unacked_restore_throttle": 1,
            "socket_timeout": 3,
            "socket_connect_timeout": 3,
            # Ask for the queues in CONSUMED's order on every pop: webhook jobs first.
            "queue_order_strategy": "priority",
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


def build_backend(app: Celery) -> None:
    """Build ``app``'s result backend now (``disabled``: ``task_ignore_result``; no connection).
    Celery builds it on the first publish, resolving its name through every installed package's
    entry points (about 5 ms of CPU): a worker builds it before its pool processes fork, so that
    no process's first watch job does."""
    app.backend  # noqa: B018  (the property builds and keeps it)


def publisher(app: Celery, queue: str = QUEUE) -> Callable[[Job], None]:
    """Put one job on ``queue`` (raises if the broker refuses): the inbox publishes to the webhook
    queue, the scheduler to ``MAINTENANCE_QUEUE``."""

    def publish(job: Job) -> None:
        app.send_task(TASK_SYNC_SESSION, args=[job.session_id], kwargs=task_message.job_kwargs(job), queue=queue)

    return publish


_FENCED_PUSH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
return redis.call('LPUSH', KEYS[2], unpack(ARGV, 2))
"""


def fenced_publisher(
    client: redis.Redis, queue: str, fence_key: str, batch: int = 1000
) -> Callable[[Sequence[Job], str], None]:
    """``batch_publisher``'s pushes, each made only while ``fence_key`` holds the given token (one
    script: the check and the push are one step), so a scheduler whose leadership term is over
    queues nothing, however late its push arrives. Raises ``LeadershipLost`` for a refused push
    (that batch and the rest are not queued), and redis-py's errors as ``batch_publisher`` does."""
    push = client.register_script(_FENCED_PUSH)

    def publish_many(jobs: Sequence[Job], token: str) -> None:
        for start in range(0, len(jobs), batch):
            messages = [task_message.encode(job, queue) for job in jobs[start : start + batch]]
            if int(push(keys=[fence_key, queue], args=[token, *messages])) < 0:
                raise LeadershipLost(f"term {token} no longer leads: {len(jobs) - start} jobs not queued")

    return publish_many


def batch_publisher(client: redis.Redis, queue: str = QUEUE, batch: int = 1000) -> Callable[[Sequence[Job]], None]:
    """Put many jobs on ``queue``: one ``LPUSH`` of up to ``batch`` task messages written by
    ``task_message`` (the format the receiver's script pushes, which a real worker consumes:
    tests/contract/test_task_message.py), so the sweep's 10,000 jobs cost ten round trips and
    no Celery call. Jobs keep their order. Raises if Redis refuses; the jobs of a push that
    failed are then not queued (their work stays wanted in the store, and the recovery pass
    enqueues it)."""

    def publish_many(jobs: Sequence[Job]) -> None:
        for start in range(0, len(jobs), batch):
            client.lpush(queue, *(task_message.encode(job, queue) for job in jobs[start : start + batch]))

    return publish_many
