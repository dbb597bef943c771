"""The receiver writes Celery's task message itself (``controller.task_message``, pushed by the
inbox's Redis script): this is the contract that keeps it honest, on a real redis-server with a
real Celery worker.

- the message equals what ``app.send_task`` stores through kombu's Redis transport for the same
  job (ids, which are unique per message, aside), on the list kombu pushes to;
- a real worker (the product's app and worker arguments, ``tests.support.order_worker``) runs
  each message the receiver's script pushed with the job's arguments, and acknowledges it;
- a duplicate delivery pushes nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from pathlib import Path
from typing import Any

from controller import queue, task_message
from controller.config import PREFIX, Settings
from controller.inbox import Job, Outcome
from controller.store.redis import RedisInbox
from tests.support.order_worker import CALLS
from tests.support.processes import Managed, assert_no_process_left, python_module, wait_for
from tests.support.redis_clients import connect_async
from tests.support.redis_server import RedisServer

UNIQUE_PER_MESSAGE = {
    ("headers", "id"),
    ("headers", "root_id"),
    ("headers", "origin"),
    ("properties", "correlation_id"),
    ("properties", "reply_to"),
    ("properties", "delivery_tag"),
}


def normalized(raw: str) -> dict[str, Any]:
    """A stored message with its per-message ids blanked and its body decoded."""
    message: dict[str, Any] = json.loads(raw)
    for part, key in UNIQUE_PER_MESSAGE:
        assert message[part][key], (part, key)
        message[part][key] = "<unique>"
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_the_message_is_the_one_send_task_stores(server: RedisServer) -> None:
    """L5: for the same job and queue, ``task_message.encode`` writes what Celery's ``send_task``
    stores through kombu's Redis transport, on the list named after the queue."""
    client = server.client()
    client.flushdb()
    job = Job("sess_contract", "msg_contract", "agent.session.action_required", "evt_1", received_at=1_700_000_000.25)
    without_time = Job("sess_plain", "msg_plain", "agent.session.failed")
    app = queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url}))
    publish = queue.publisher(app, queue.QUEUE)
    for each in (job, without_time):
        publish(each)
        (celerys,) = client.lrange(queue.QUEUE, 0, -1)
        client.delete(queue.QUEUE)
        ours = task_message.encode(each, queue.QUEUE)
        assert normalized(ours) == normalized(celerys)
        assert json.loads(ours)["headers"]["id"] == json.loads(ours)["properties"]["correlation_id"]
    assert task_message.TASK_SYNC_SESSION == queue.TASK_SYNC_SESSION
    client.close()


def test_a_real_worker_runs_what_the_receivers_script_pushed(server: RedisServer, tmp_path: Path) -> None:
    """L5: jobs the inbox's script pushed are run by a real Celery worker with their arguments
    and acknowledged; a duplicate delivery pushed nothing."""
    client = server.client()
    client.flushdb()
    jobs = [
        Job(f"sess_{n}", f"msg_{n}", "agent.session.action_required", f"evt_{n}", received_at=1_700_000_000.5 + n)
        for n in range(5)
    ] + [Job("sess_failed", "msg_failed", "agent.session.failed")]

    async def submit_all() -> list[Outcome]:
        inbox = RedisInbox(connect_async(server.url), queue.QUEUE, dedup_ttl_seconds=3600)
        try:
            outcomes = [await inbox.submit(job) for job in jobs]
            return [*outcomes, await inbox.submit(jobs[0])]  # the sender's retry of a delivery
        finally:
            await inbox.close()

    outcomes = asyncio.run(submit_all())
    assert outcomes == [Outcome.ENQUEUED] * len(jobs) + [Outcome.DUPLICATE]
    assert client.llen(queue.QUEUE) == len(jobs)  # the duplicate pushed nothing

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, PREFIX + "REDIS_URL": server.url, "PYTHONPATH": root, "SANDBOX_TEST_DIR": str(tmp_path)}
    worker = Managed("worker", python_module("tests.support.order_worker"), env, tmp_path / "worker.log", cwd=tmp_path)
    worker.start()
    try:
        wait_for(lambda: client.llen(CALLS) >= len(jobs), 60, "the worker to run every queued job")
        # Acknowledged: kombu keeps a delivered message in its ``unacked`` hash until the ack.
        wait_for(lambda: client.hlen("unacked") == 0, 30, "the worker to acknowledge every job")
        calls = [json.loads(raw) for raw in client.lrange(CALLS, 0, -1)]
    finally:
        worker.stop()
    expected = [[job.session_id, task_message.job_kwargs(job)] for job in jobs]
    assert sorted(calls, key=str) == sorted(expected, key=str)
    assert client.llen(queue.QUEUE) == 0
    assert "Traceback" not in worker.output()
    client.close()
    assert_no_process_left(tmp_path)
