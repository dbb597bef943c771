"""A worker survives its broker going away, or becoming a replica, while it holds a job
(``controller.broker``); one that must give up exits non-zero.

A real Celery worker (the product's app and worker arguments, ``tests.support.order_worker``)
with two pool processes takes a job and holds it unacknowledged while it waits for the next
one (a BRPOP in flight); the real redis-server is then stopped and started again on the same
port with its data. Celery 5.7.0 exits on this ("Unrecoverable error:
AttributeError: 'NoneType' object has no attribute 'hostname'", raised while closing the lost
connection); the product's consumer keeps the worker alive, it reconnects, works a job
published after the outage, and the job it held comes back once its visibility timeout passes.
A role change (the master made a replica for a few seconds, as a failover or an operator's
``REPLICAOF`` does) used to end the worker the same way, with status 0 ("Unrecoverable error:
ReadOnlyError", or ``UNBLOCKED`` for its waiting ``BRPOP``): it now reconnects until the server
is the master again and goes on.

A job that ends while the server is a replica cannot be acknowledged (or rejected): Redis refuses
to take it out of the unacked index. kombu 5.7.0 then still counted it as held, so a worker whose
every pool process had ended a job during the flip never asked for another one, and, its
connection being fine, never reconnected: it sat idle for good. ``controller.broker`` gives the
credit back whatever Redis answered; the job comes back once its visibility timeout passes.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from controller import queue
from controller.config import PREFIX, Settings
from controller.inbox import Job
from tests.support.order_worker import CONCURRENCY, FILE_GATE, FILE_REJECT, GATE, ORDER, RELEASED
from tests.support.processes import Managed, assert_no_process_left, free_port, python_module, wait_for
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


def order_worker(server: RedisServer, directory: Path, concurrency: int = 2) -> Managed:
    """By default two pool processes: one holds the job, the consumer waits for the next."""
    env = {
        **os.environ,
        PREFIX + "REDIS_URL": server.url,
        PREFIX + "QUEUE_VISIBILITY_TIMEOUT_SECONDS": str(VISIBILITY_TIMEOUT),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        CONCURRENCY: str(concurrency),
    }
    return Managed("worker", python_module("tests.support.order_worker"), env, directory / "worker.log", cwd=directory)


def demote(server: RedisServer) -> None:
    """The master becomes a replica (of an address where nothing listens: its data stays)."""
    with server.client(timeout=2) as admin:
        admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


def promote(server: RedisServer) -> None:
    with server.client(timeout=2) as admin:
        admin.execute_command("REPLICAOF", "NO", "ONE")


def test_a_worker_holding_a_job_outlives_a_role_change(tmp_path: Path) -> None:
    """L17: the master becomes a replica for 3 s while a worker holds a job and waits for the
    next (its BRPOP is ended with UNBLOCKED, its writes refused with READONLY): the worker lives
    on, works a job queued once the server is the master again, and the held job comes back."""
    server = RedisServer(tmp_path / "redis").start()
    client = server.client()
    publish = queue.publisher(queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url})), queue.QUEUE)
    worker = order_worker(server, tmp_path).start()
    try:
        publish(Job(GATE, "msg_gate", "agent.session.action_required"))
        wait_for(lambda: GATE in client.lrange(ORDER, 0, -1), 60, "the worker to take the held job")
        demote(server)
        time.sleep(3)  # the worker's reconnects find a replica meanwhile
        assert worker.alive(), worker.output()[-3000:]
        promote(server)
        publish(Job("after", "msg_after", "agent.session.action_required"))
        wait_for(lambda: "after" in client.lrange(ORDER, 0, -1), 60, "the worker to work a job queued after the flip")
        wait_for(lambda: client.lrange(ORDER, 0, -1).count(GATE) >= 2, 60, "the held job to come back")
        assert worker.alive(), worker.output()[-3000:]
        assert "Unrecoverable error" not in worker.output()
    finally:
        worker.stop()
        client.close()
        server.stop()
    assert_no_process_left(tmp_path)


@pytest.mark.parametrize(("job", "refused"), [(FILE_GATE, "Couldn't ack"), (FILE_REJECT, "Couldn't reject")])
def test_a_worker_whose_job_ended_while_redis_was_a_replica_takes_jobs_again(
    tmp_path: Path, job: str, refused: str
) -> None:
    """L17: a worker with one pool process holds a job (so it holds all it may: it waits for no
    other, and nothing ends its connection); the master becomes a replica, and the job ends
    meanwhile: its acknowledgement (or rejection) is refused (READONLY). Once the server is the
    master again the worker works a job queued then; a job whose acknowledgement was refused
    comes back after its visibility timeout (not lost). kombu alone kept counting the refused
    job as held, and the worker never asked Redis for a job again."""
    server = RedisServer(tmp_path / "redis").start()
    client = server.client()
    publish = queue.publisher(queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url})), queue.QUEUE)
    worker = order_worker(server, tmp_path, concurrency=1).start()
    try:
        publish(Job(job, "msg_held", "agent.session.action_required"))
        wait_for(lambda: job in client.lrange(ORDER, 0, -1), 60, "the worker to take the held job")
        demote(server)
        (tmp_path / RELEASED).touch()  # the job ends while the server is a replica
        wait_for(lambda: refused in worker.output(), 30, f"the worker to log {refused!r}")
        promote(server)
        publish(Job("after", "msg_after", "agent.session.action_required"))
        wait_for(lambda: "after" in client.lrange(ORDER, 0, -1), 60, "the worker to work a job queued after the flip")
        if job == FILE_GATE:
            wait_for(lambda: client.lrange(ORDER, 0, -1).count(job) >= 2, 60, "the unacknowledged job to come back")
        assert worker.alive(), worker.output()[-3000:]
        assert "Unrecoverable error" not in worker.output()
    finally:
        worker.stop()
        client.close()
        server.stop()
    assert_no_process_left(tmp_path)


def test_a_worker_started_while_redis_is_read_only_works_once_it_is_the_master(tmp_path: Path) -> None:
    """L17: a worker started against a replica (read-only) does not exit: it keeps trying, and
    works the queue once the server is the master."""
    server = RedisServer(tmp_path / "redis").start()
    client = server.client()
    demote(server)
    worker = order_worker(server, tmp_path).start()
    try:
        time.sleep(5)  # starting up against a replica
        assert worker.alive(), worker.output()[-3000:]
        promote(server)
        publish = queue.publisher(queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url})), queue.QUEUE)
        publish(Job("first", "msg_first", "agent.session.action_required"))
        wait_for(lambda: "first" in client.lrange(ORDER, 0, -1), 60, "the worker to work the job")
        assert "Unrecoverable error" not in worker.output()
    finally:
        worker.stop()
        client.close()
        server.stop()
    assert_no_process_left(tmp_path)


@pytest.mark.timeout(120)
def _worker_exit(directory: Path, redis_url: str, timeout: float) -> tuple[int | None, str]:
    """Run the real ``sandbox-controller worker`` (the local runner) against ``redis_url`` until
    it exits by itself: its status (None if it was still running after ``timeout`` seconds, then
    stopped) and its output."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(PREFIX)},
        PREFIX + "REDIS_URL": redis_url,
        PREFIX + "API_KEY": "sk-worker-exit-test",
        PREFIX + "EXECUTOR_KEY": "envkey-worker-exit-test",
        PREFIX + "LOCAL_STATE_DIRECTORY": str(directory / "sandboxes"),
        PREFIX + "LOCAL_EXECUTOR_SAME_USER": "true",
    }
    worker = Managed("worker", python_module("controller", "worker", "--concurrency", "1"), env, directory / "w.log")
    worker.start()
    try:
        assert worker.proc is not None
        code: int | None = worker.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        worker.stop()
    return code, worker.output()


def test_a_worker_that_gives_up_exits_non_zero(tmp_path: Path) -> None:
    """A worker that cannot go on (here the webhook queue's key holds a string, not a list:
    Celery's "Unrecoverable error") exits with a non-zero status, so a supervisor that restarts
    on failure brings it back (it used to exit 0). The real ``sandbox-controller worker``."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        with server.client() as client:
            client.set(queue.QUEUE, "not a list")
        code, output = _worker_exit(tmp_path, server.url, 90)
    finally:
        server.stop()
    assert "Unrecoverable error" in output
    assert code == 1, output[-2000:]
    assert_no_process_left(tmp_path)


def test_a_worker_whose_redis_refuses_the_password_exits_at_once_naming_the_setting(tmp_path: Path) -> None:
    """A wrong password in ``CONTROLLER_REDIS_URL`` is a configuration error for the worker's
    broker connection too (``redis_client``'s connections, which ``controller.broker`` uses):
    the real ``sandbox-controller worker`` exits non-zero at its start, its line naming the
    setting and never the password, so its pod restarts (with the Secret's new value, once it is
    fixed) instead of looping on reconnects that cannot succeed."""
    server = RedisServer(tmp_path / "redis", password="the-right-one").start()
    wrong = server.url.replace(":the-right-one@", ":not-the-password@")
    assert wrong != server.url
    try:
        code, output = _worker_exit(tmp_path, wrong, 60)
    finally:
        server.stop()
    assert code == 1, output[-2000:]
    assert "RedisPasswordRefused" in output and PREFIX + "REDIS_URL" in output
    assert "not-the-password" not in output
    assert_no_process_left(tmp_path)
