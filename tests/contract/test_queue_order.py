"""Webhook jobs never wait behind maintenance: a real Celery worker on a real redis-server
takes the webhook queue first (``controller.queue``).

The sweep's jobs are published as the scheduler publishes them (``queue.fenced_publisher``: one
push of task messages per batch, made under the leader's term), so this also proves a real
worker consumes those messages. The worker is
the product's app and worker arguments with a task that records the order it
works sessions in (``tests.support.order_worker``), one pool process. The first maintenance job
holds that process until the test releases it, so the order is decided by the queues alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from controller import queue
from controller.config import PREFIX, Settings
from controller.inbox import Job
from controller.scheduler import LEADER_KEY
from tests.support.order_worker import GATE, ORDER, RELEASE
from tests.support.processes import Managed, assert_no_process_left, python_module, wait_for
from tests.support.redis_server import RedisServer

SWEEP = 10_000
WEBHOOKS = 20


def test_webhook_jobs_published_after_a_sweep_are_worked_before_it(server: RedisServer, tmp_path: Path) -> None:
    """L5/L17: 20 webhook jobs published after 10,000 maintenance jobs are worked next, not after them."""
    client = server.client()
    client.flushdb()
    app = queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url}))
    maintenance = queue.publisher(app, queue.MAINTENANCE_QUEUE)
    webhook = queue.publisher(app, queue.QUEUE)
    maintenance(Job(GATE, "", "reconcile"))
    client.set(LEADER_KEY, "the-term")  # as a leading scheduler holds it
    publish_sweep = queue.fenced_publisher(client, queue.MAINTENANCE_QUEUE, LEADER_KEY)
    publish_sweep([Job(f"sweep-{n}", "", "reconcile") for n in range(SWEEP)], "the-term")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, PREFIX + "REDIS_URL": server.url, "PYTHONPATH": root, "SANDBOX_TEST_DIR": str(tmp_path)}
    worker = Managed("worker", python_module("tests.support.order_worker"), env, tmp_path / "worker.log", cwd=tmp_path)
    worker.start()
    try:
        wait_for(lambda: GATE in client.lrange(ORDER, 0, -1), 60, "the worker to take the first maintenance job")
        for n in range(WEBHOOKS):
            webhook(Job(f"hook-{n}", f"msg_{n}", "agent.session.action_required"))
        client.rpush(RELEASE, "1")
        wait_for(lambda: client.llen(ORDER) >= WEBHOOKS + 3, 60, "the worker to work the webhook jobs")
        order = client.lrange(ORDER, 0, -1)
    finally:
        worker.stop()
        client.close()
    assert order[0] == GATE
    hooks = [i for i, sid in enumerate(order) if sid.startswith("hook-")]
    # With one pool process and prefetch 1, at most one more maintenance job can have been
    # taken before the webhooks were published (none, in practice); then every webhook job.
    assert len(hooks) == WEBHOOKS, order[: WEBHOOKS + 5]
    assert hooks[-1] <= WEBHOOKS + 1, order[: WEBHOOKS + 5]
    assert "sweep-0" in order  # the batched messages are ones a real worker consumes, in order
    assert client_left(server) > 0  # the sweep is still queued: it waited for the webhooks
    assert_no_process_left(tmp_path)


def client_left(server: RedisServer) -> int:
    with server.client() as c:
        return int(c.llen(queue.MAINTENANCE_QUEUE))
