"""A worker survives its broker going away while it holds a job (``controller.broker``).

A real Celery worker (the product's app and worker arguments, ``tests.support.order_worker``)
with two pool processes takes a job and holds it unacknowledged while it waits for the next
one (a BRPOP in flight); the real redis-server is then stopped and started again on the same
port with its data. Celery 5.7.0 exits on this ("Unrecoverable error:
AttributeError: 'NoneType' object has no attribute 'hostname'", raised while closing the lost
connection); the product's consumer keeps the worker alive, it reconnects, works a job
published after the outage, and the job it held comes back once its visibility timeout passes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from controller import queue
from controller.config import PREFIX, Settings
from controller.inbox import Job
from tests.support.order_worker import CONCURRENCY, GATE, ORDER
from tests.support.processes import Managed, assert_no_process_left, python_module, wait_for
from tests.support.redis_server import RedisServer

VISIBILITY_TIMEOUT = 5


def test_a_worker_holding_a_job_survives_a_redis_restart(tmp_path: Path) -> None:
    """L17: Redis stops while a worker holds a job: the worker lives on and nothing is lost."""
    server = RedisServer(tmp_path / "redis").start()
    client = server.client()
    env = {
        **os.environ,
        PREFIX + "REDIS_URL": server.url,
        PREFIX + "QUEUE_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        CONCURRENCY: "2",  # one process holds the job, the consumer waits for the next
    }
    publish = queue.publisher(queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url})), queue.QUEUE)
    worker = Managed("worker", python_module("tests.support.order_worker"), env, tmp_path / "worker.log", cwd=tmp_path)
    worker.start()
    try:
        publish(Job(GATE, "msg_gate", "agent.session.action_required"))
        wait_for(lambda: GATE in client.lrange(ORDER, 0, -1), 60, "the worker to take the held job")
        server.stop()
        time.sleep(2)  # the outage: the worker's reconnect attempts fail meanwhile
        server.start()
        client = server.client()
        publish(Job("after", "msg_after", "agent.session.action_required"))
        wait_for(lambda: "after" in client.lrange(ORDER, 0, -1), 60, "the worker to work a job queued after the outage")
        # The held job was never acknowledged: it is delivered again, not lost.
        wait_for(lambda: client.lrange(ORDER, 0, -1).count(GATE) >= 2, 60, "the held job to come back")
        assert worker.alive(), worker.output()[-3000:]
        assert "Unrecoverable error" not in worker.output()
    finally:
        worker.stop()
        client.close()
        server.stop()
    assert_no_process_left(tmp_path)
