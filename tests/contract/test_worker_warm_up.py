"""A worker pool process opens its connections to Redis at its start, not inside its first job
(``wiring.connect_redis``, run by ``ProcessDeps.on_process_init`` on the process's connect
thread), and Celery's result backend is built before the fork (``queue.build_backend``).

On the 2-core node ten fresh pool processes took a burst's ten jobs at once, and each opened its
connections then (the store's; the producer's that queues the watch jobs, with its channel and
the queue's declaration), right beside the ten sandboxes they had just placed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller import queue, wiring, worker
from controller.config import PREFIX, Settings
from tests.support.redis_server import RedisServer
from tests.support.simulator import StartSimulator

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter is one pool process: the product's worker app, Celery's
# ``worker_process_init`` signal sent as a pool process's start sends it (when WARM is set), its
# connect thread waited for; then the first job of each kind, run as the pool runs them, between
# two reads of how many connections Redis has accepted.
_POOL_PROCESS = """
import json, os, sys, threading, time
import redis
from celery import signals
from controller import wiring
from controller.config import Settings

admin = redis.Redis.from_url(os.environ["CONTROLLER_REDIS_URL"])
accepted = lambda: int(admin.info("stats")["total_connections_received"])
app = wiring.worker_app(Settings.from_env(os.environ))
started = accepted()
if os.environ["WARM"] == "1":
    signals.worker_process_init.send(sender=None)
    deadline = time.monotonic() + 30
    while any(t.name == "connect" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
before = accepted()
app.tasks["controller.sync_session"].run("sess_unknown_to_the_api")
if os.environ.get("CONTROLLER_METRICS_PORT"):  # watch jobs are queued only then
    app.tasks["controller.watch_connection"].run("env_unknown_to_the_api", 0.0, time.time() + 300)
print(json.dumps({"at_start": before - started, "opened": accepted() - before}))
"""


def _first_jobs(
    server: RedisServer, api_url: str, api_key: str, tmp_path: Path, warm: bool, watch: bool = True
) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    env.update(
        {
            PREFIX + "REDIS_URL": server.url,
            PREFIX + "API_BASE_URL": api_url,
            PREFIX + "API_KEY": api_key,
            PREFIX + "EXECUTOR_KEY": "ek-test",
            PREFIX + "WEBHOOK_SECRETS": "a-webhook-secret-of-24-bytes",
            PREFIX + "RUNNER": "local",
            PREFIX + "LOCAL_STATE_DIRECTORY": str(tmp_path / f"sandboxes-{int(warm)}"),
            PREFIX + "LOCAL_EXECUTOR_SAME_USER": "true",
            "WARM": "1" if warm else "0",
            **({PREFIX + "METRICS_PORT": "9090"} if watch else {}),  # never served here: it turns on watch jobs
            "PYTHONPATH": str(ROOT),
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", _POOL_PROCESS], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_pool_process_first_jobs_open_no_connection_to_redis(
    server: RedisServer, start_simulator: StartSimulator, tmp_path: Path
) -> None:
    """A pool process that started (``worker_process_init``) runs its first ``sync_session``
    (the lease, the record) and its first ``watch_connection`` (which queues the next watch job
    through the kept producer) on connections it opened at its start: Redis accepts none
    during them. The control: a process whose start did not run opens them inside those jobs
    (the test can see them)."""
    simulator = start_simulator()
    assert simulator.api_key is not None
    warm = _first_jobs(server, simulator.base_url, simulator.api_key, tmp_path, warm=True)
    cold = _first_jobs(server, simulator.base_url, simulator.api_key, tmp_path, warm=False)
    assert warm["opened"] == 0
    assert isinstance(cold["opened"], int) and cold["opened"] >= 2
    print(f"\nFIGURE connections at a pool process's start: {warm['at_start']}")


def test_a_pool_process_that_queues_no_watch_jobs_opens_no_producer_at_its_start(
    server: RedisServer, start_simulator: StartSimulator, tmp_path: Path
) -> None:
    """Without metrics served (no ``CONTROLLER_METRICS_PORT``) a worker queues no watch jobs, so
    a pool process's start opens the store's connection only, not the producer's (a connection,
    a channel and the queue's declaration it would never use); its first job still opens none.
    The control: with metrics served its start opens more."""
    simulator = start_simulator()
    assert simulator.api_key is not None
    quiet = _first_jobs(server, simulator.base_url, simulator.api_key, tmp_path, warm=True, watch=False)
    watched = _first_jobs(server, simulator.base_url, simulator.api_key, tmp_path, warm=True, watch=True)
    assert quiet["opened"] == 0
    assert quiet["at_start"] == 1, quiet
    assert isinstance(watched["at_start"], int) and watched["at_start"] > 1, watched


def test_the_worker_app_builds_celerys_result_backend_before_the_fork(tmp_path: Path) -> None:
    """``wiring.worker_app`` (the worker's main process, before its pool processes fork) builds
    the app's result backend (``queue.build_backend``): Celery would build it on each pool
    process's first publish (its name resolved through every installed package's entry
    points). It is the disabled one (results are ignored): nothing connects before the fork.
    The control: the app alone has none built."""
    settings = Settings.from_env(
        {
            PREFIX + "REDIS_URL": "redis://127.0.0.1:1/0",  # never dialled
            PREFIX + "API_KEY": "sk-test-api-key",
            PREFIX + "EXECUTOR_KEY": "ek-test",
            PREFIX + "RUNNER": "local",
            PREFIX + "LOCAL_STATE_DIRECTORY": str(tmp_path / "sandboxes"),
            PREFIX + "LOCAL_EXECUTOR_SAME_USER": "true",
        }
    )
    assert queue.make_app(settings)._backend is None
    app = wiring.worker_app(settings)
    assert app._backend is not None
    assert type(app._backend).__name__ == "DisabledBackend"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:  # a server of its own: the count is of its connections
    started = RedisServer(tmp_path / "redis").start()
    try:
        yield started
    finally:
        started.stop()


def test_redis_refusing_the_password_at_a_pool_process_start_is_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``connect_redis`` against a Redis that refuses the configured password: one warning line
    and no exception (the connect thread ends quietly, the process lives; its first job meets
    the refusal and reports it as it would have), and the password is in no line."""
    server = RedisServer(tmp_path / "redis-auth", password="the-right-password").start()
    try:
        url = server.url.replace("the-right-password", "a-wrong-password")
        found = Settings.from_env({PREFIX + "REDIS_URL": url})
        producer = worker.KeptProducer(queue.make_app(found))
        with caplog.at_level(logging.WARNING):
            wiring.connect_redis(producer)(SimpleNamespace(store=wiring.store(found)))  # type: ignore[arg-type]
    finally:
        server.stop()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in lines] == ["could not connect to Redis ahead of a job"]
    assert "a-wrong-password" not in caplog.text
