"""The whole loop from real parts on loopback: redis-server, the simulator, receivers
(``sandbox-controller serve``), Celery worker processes and the local runner with the real
codex binary."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agents_simulator.dev import simulator_secrets
from controller.runners.local import LocalRunner, session_key
from controller.signing import sign_headers
from tests.support.codex import codex_binary
from tests.support.local_runner import live
from tests.support.processes import Managed, assert_no_process_left, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer, ReplicatedRedis

WEBHOOK_SECRET = "whsec_" + "c2FuZGJveC1jb250cm9sbGVyLXRlc3Qtc2VjcmV0IQ=="
API_KEY = "sk-controller-test-api-key-1234"
EXECUTOR_KEY = "ek-environment-test-key-5678"
SECRETS = (WEBHOOK_SECRET, API_KEY, EXECUTOR_KEY)


class Loop:
    def __init__(
        self,
        directory: Path,
        codex: str,
        receivers: int = 2,
        workers: int = 2,
        extra_env: dict[str, str | None] | None = None,
        worker_env: dict[int, dict[str, str]] | None = None,
        sentinel: bool = False,
    ) -> None:
        """``sentinel``: Redis is a primary, a replica and three sentinels (``ha``), and every
        process reaches it through the sentinels; otherwise one redis-server (``redis``)."""
        self.extra_env = dict(extra_env or {})
        self.worker_env = dict(worker_env or {})
        """More environment for single workers, by index (e.g. a clock that is off)."""
        self.directory = directory
        self.codex = codex
        self.redis = RedisServer(directory / "redis")
        self.ha = ReplicatedRedis(directory / "redis-ha") if sentinel else None
        self.simulator_port = free_port()
        self.simulator_url = f"http://127.0.0.1:{self.simulator_port}"
        self.receiver_ports = [free_port() for _ in range(receivers)]
        self.state_directory = directory / "sandboxes"
        self.worker_count = workers
        self.simulator: Managed | None = None
        self.receivers: list[Managed] = []
        self.workers: list[Managed] = []
        self.scheduler: Managed | None = None
        self.metrics_ports: dict[str, int] = {}
        """``GET /metrics`` of each receiver, worker and the scheduler (by process name), on loopback."""

    # -- processes ------------------------------------------------------------------------

    def controller_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
        env.update(self.ha.settings() if self.ha is not None else {"CONTROLLER_REDIS_URL": self.redis.url})
        env.update(
            CONTROLLER_WEBHOOK_SECRETS=WEBHOOK_SECRET,
            CONTROLLER_API_KEY=API_KEY,
            CONTROLLER_API_BASE_URL=self.simulator_url,
            CONTROLLER_EXECUTOR_KEY=EXECUTOR_KEY,
            CONTROLLER_EXECUTOR_COMMAND=self.codex,
            CONTROLLER_RUNNER="local",
            CONTROLLER_LOCAL_STATE_DIRECTORY=str(self.state_directory),
            # codex lives under root's 0700 home, which `nobody` cannot read: executors run as
            # the workers' uid here (the separate user is proven in tests/contract/test_local_runner.py).
            CONTROLLER_LOCAL_EXECUTOR_SAME_USER="true",
            CONTROLLER_LEASE_TTL_SECONDS="5",
            CONTROLLER_QUEUE_VISIBILITY_TIMEOUT_SECONDS="20",
            CONTROLLER_EXECUTOR_GRACE_SECONDS="30",
            # A deletion counts once reads answered 404 this long (60 s by default).
            CONTROLLER_DELETION_CONFIRM_SECONDS="3",
            CONTROLLER_API_MAX_ATTEMPTS="3",
            # The simulator's sessions name it as their remote_url: http://127.0.0.1:<port>.
            CONTROLLER_REMOTE_URL_ALLOWLIST="127.0.0.1",
        )
        for key, value in self.extra_env.items():  # None removes a setting
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(self) -> Loop:
        if self.ha is not None:
            self.ha.start()
        else:
            self.redis.start()
        self.start_simulator()
        for index, port in enumerate(self.receiver_ports):
            metrics_port = self.metrics_ports[f"receiver{index}"] = free_port()
            self.receivers.append(
                Managed(
                    f"receiver{index}",
                    python_module(
                        "controller", "serve", "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1"
                    ),
                    {**self.controller_env(), "CONTROLLER_METRICS_PORT": str(metrics_port)},
                    self.directory / f"receiver{index}.log",
                ).start()
            )
        for index in range(self.worker_count):
            self.start_worker(index)
        self.metrics_ports["scheduler"] = free_port()
        self.scheduler = Managed(
            "scheduler",
            python_module("controller", "scheduler", "--metrics-host", "127.0.0.1"),
            {
                **self.controller_env(),
                # Sweeps every 3 s unless a test asks for another interval.
                "CONTROLLER_RECONCILE_INTERVAL_SECONDS": self.extra_env.get("CONTROLLER_RECONCILE_INTERVAL_SECONDS")
                or "3",
                "CONTROLLER_METRICS_PORT": str(self.metrics_ports["scheduler"]),
            },
            self.directory / "scheduler.log",
        ).start()
        for port in self.receiver_ports:
            wait_for(partial(port_open, port), 30, f"receiver on port {port}")
        wait_for(self.workers_ready, 60, "celery workers to be ready")
        return self

    def simulator_options(self) -> list[str]:
        """The simulator's options besides its port (a world that needs others overrides this)."""
        return [
            "--webhook-url",
            f"http://127.0.0.1:{self.receiver_ports[0]}/webhooks",
            "--connect-timeout-seconds",
            "120",
            "--turn-seconds",
            "0.5",
            "--webhook-retry-initial-seconds",
            "0.5",
            "--webhook-retry-max-seconds",
            "2",
        ]

    def start_simulator(self) -> None:
        argv = python_module(
            "controller",
            "simulator",  # the documented CLI path: sandbox-controller simulator ...
            "--port",
            str(self.simulator_port),
            *self.simulator_options(),
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
        # Secrets in the environment, as dev does: on argv they would show in `ps`.
        env.update(
            simulator_secrets(
                {
                    "CONTROLLER_WEBHOOK_SECRETS": WEBHOOK_SECRET,
                    "CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY,
                    "CONTROLLER_API_KEY": API_KEY,
                }
            )
        )
        self.simulator = Managed("simulator", argv, env, self.directory / "simulator.log").start()
        wait_for(lambda: port_open(self.simulator_port), 30, "simulator")

    def start_worker(self, index: int) -> Managed:
        port = self.metrics_ports[f"worker{index}"] = free_port()
        worker = Managed(
            f"worker{index}",
            python_module(
                "controller",
                "worker",
                "--concurrency",
                "2",
                "--hostname",
                f"w{index}-{uuid.uuid4().hex[:6]}@test",
                "--metrics-host",
                "127.0.0.1",
            ),
            {**self.controller_env(), "CONTROLLER_METRICS_PORT": str(port), **self.worker_env.get(index, {})},
            self.directory / f"worker{index}.log",
        ).start()
        self.workers.append(worker)
        return worker

    def workers_ready(self) -> bool:
        return all(w.alive() and "worker ready" in w.output() for w in self.workers)

    def stop(self) -> None:
        """Stop everything, then check that no executor (or any other process running in the
        state directory) is left: every one must go with its whole process group."""
        try:
            for process in [*self.receivers, *self.workers, self.scheduler]:
                if process is not None:
                    process.stop()
            if self.state_directory.exists():
                LocalRunner(self.state_directory, [self.codex], EXECUTOR_KEY).stop_all()
            if self.simulator is not None:
                self.simulator.stop()
            self.redis.stop()
            if self.ha is not None:
                self.ha.stop()
        finally:
            assert_no_process_left(self.state_directory)

    def all_output(self) -> str:
        parts = []
        for process in [*self.receivers, *self.workers, self.simulator, self.scheduler]:
            if process is not None:
                parts.append(process.output())
        for log in self.state_directory.glob("sessions/*/executor.log"):
            parts.append(log.read_text(errors="replace"))
        return "\n".join(parts)

    # -- the Agents API side --------------------------------------------------------------

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.simulator_url,
            headers={"Authorization": f"Bearer {API_KEY}", "OpenAI-Beta": "agents=v1"},
            timeout=10,
        )

    def create_session(self, client: httpx.Client, *, input_text: str | None = "hello", **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "agent": {"model": "gpt-test"},
            "environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
            **extra,
        }
        if input_text is not None:
            body["input"] = input_text
        response = client.post("/v1/agents/sessions", json=body)
        response.raise_for_status()
        return dict(response.json())

    def submit(self, session_id: str, text: str = "again") -> None:
        """New input for a session, as an application sends it."""
        with self.api() as client:
            client.post(
                f"/v1/agents/sessions/{session_id}/events",
                json={
                    "events": [
                        {
                            "type": "agent.session.input.message",
                            "input": [{"role": "user", "type": "message", "content": text}],
                        }
                    ]
                },
            ).raise_for_status()

    def session(self, session_id: str) -> dict[str, Any]:
        with self.api() as client:
            response = client.get(f"/v1/agents/sessions/{session_id}")
        response.raise_for_status()
        return dict(response.json())

    def events_sent(self, session_id: str) -> list[dict[str, Any]]:
        """Every webhook event the simulator sent about this session, in order."""
        response = httpx.get(f"{self.simulator_url}/admin/events", timeout=10)
        response.raise_for_status()
        return [e for e in response.json()["data"] if e["data"].get("id") == session_id]

    def registrations(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.simulator_url}/admin/registrations", timeout=10)
        response.raise_for_status()
        return list(response.json()["data"])

    def environment_status(self, environment_id: str) -> str:
        with self.api() as client:
            response = client.get(f"/v1/agents/environments/{environment_id}")
        response.raise_for_status()
        return str(response.json()["status"])

    def registered(self, environment_ids: set[str]) -> list[dict[str, Any]]:
        """The simulator's accepted registrations of these environments' executors."""
        return [r for r in self.registrations() if r["environment_id"] in environment_ids and r["status_code"] == 200]

    def lost_and_duplicated(self, sessions: list[dict[str, Any]]) -> tuple[int, int]:
        """(lost, duplicated) over the sessions, counted three ways (registrations at the
        simulator, live executors, the workers' "executor process started" lines), after a
        settling pause that gives a duplicate the chance to show itself."""
        environments = {s["id"]: s["environment"]["id"] for s in sessions}
        time.sleep(3)
        per_environment = Counter(r["environment_id"] for r in self.registered(set(environments.values())))
        live = self.live_executors()
        started = Counter(
            str(line["session_id"]) for line in self.started_log_lines() if line.get("session_id") in environments
        )
        lost = sum(1 for sid, env in environments.items() if per_environment[env] == 0 or live[sid] == 0)
        duplicated = sum(
            1 for sid, env in environments.items() if per_environment[env] > 1 or live[sid] > 1 or started[sid] > 1
        )
        return lost, duplicated

    def runner(self) -> LocalRunner:
        return LocalRunner(self.state_directory, [self.codex], EXECUTOR_KEY)

    def live_executors(self) -> Counter[str]:
        return Counter(h.session_id for h in live(self.runner()))

    def worker_lines(self, event: str, session_id: str | None = None) -> list[dict[str, Any]]:
        """The workers' log lines of ``event`` (about ``session_id`` only, when given), in the order
        they were written (by their time, across the workers: one worker's lines, then the
        next's, would put a later line first)."""
        lines = [
            line
            for w in self.workers
            for line in w.log_lines()
            if line.get("event") == event and (session_id is None or line.get("session_id") == session_id)
        ]
        return sorted(lines, key=lambda line: float(line.get("time", 0.0)))

    def worker_metric(self, name: str, **labels: str) -> float:
        """``name`` summed over every worker's ``GET /metrics``."""
        workers = [port for key, port in self.metrics_ports.items() if key.startswith("worker")]
        return sum(total(scrape(port), name, **labels) for port in workers)

    def started_log_lines(self) -> list[dict[str, Any]]:
        return self.worker_lines("executor process started")

    # -- deliveries -----------------------------------------------------------------------

    def delivery(
        self,
        session_id: str,
        event_type: str = "agent.session.action_required",
        required: str | None = "environment_connection",
        webhook_id: str | None = None,
        timestamp: int | None = None,
    ) -> tuple[dict[str, str], bytes]:
        data: dict[str, Any] = {"id": session_id}
        if event_type == "agent.session.action_required":
            data["required_action"] = {"type": required}
        else:
            data.update(environment_type="self_hosted", environment_id=None)
        body = json.dumps(
            {
                "id": f"evt_{uuid.uuid4().hex}",
                "object": "event",
                "created_at": int(time.time()),
                "type": event_type,
                "data": data,
            }
        ).encode()
        headers = sign_headers(
            WEBHOOK_SECRET, webhook_id or f"wh_{uuid.uuid4().hex}", timestamp or int(time.time()), body
        )
        headers["content-type"] = "application/json"
        return headers, body

    def copies(self, sessions: Iterable[dict[str, Any]], copies: int = 5) -> list[tuple[int, dict[str, str], bytes]]:
        """``copies`` identical signed deliveries per session, spread over the receivers."""
        deliveries = []
        for session in sessions:
            headers, body = self.delivery(session["id"])
            deliveries += [(self.receiver_ports[n % len(self.receiver_ports)], headers, body) for n in range(copies)]
        return deliveries

    def arm_fault(
        self, target: str, status: int, count: int, retry_after: float | None = None, object_id: str | None = None
    ) -> None:
        """The simulator answers the next ``count`` calls to ``target`` (about ``object_id`` only,
        when given) with ``status``."""
        fault: dict[str, Any] = {"target": target, "status": status, "count": count}
        if retry_after is not None:
            fault["retry_after"] = retry_after
        if object_id is not None:
            fault["object_id"] = object_id
        httpx.post(f"{self.simulator_url}/admin/faults", json=fault, timeout=10).raise_for_status()

    def post(self, port: int, headers: dict[str, str], body: bytes) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{port}/webhooks", headers=headers, content=body, timeout=30)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@contextmanager
def started(directory: Path, codex: str | None = None, **kwargs: Any) -> Iterator[Loop]:
    """A ``Loop`` in ``directory`` with the real codex (or ``codex``), started, always stopped."""
    loop = Loop(directory, codex or codex_binary(), **kwargs)
    try:
        yield loop.start()
    finally:
        loop.stop()


def looked_up(loop: Loop, session_id: str) -> list[dict[str, Any]]:
    """Every look a worker logged at ``session_id`` (``session looked up``)."""
    return loop.worker_lines("session looked up", session_id)


def connected_session(loop: Loop) -> tuple[str, str]:
    """A session whose first turn ran: its executor connected, the session idle."""
    with loop.api() as client:
        session = loop.create_session(client)
    sid, environment_id = session["id"], session["environment"]["id"]
    wait_for(lambda: loop.session(sid)["status"] == "idle", 90, f"session {sid} to finish its turn")
    wait_for(lambda: loop.environment_status(environment_id) == "connected", 30, "the executor to be connected")
    return sid, environment_id


def stops(loop: Loop, session_id: str | None = None) -> list[dict[str, Any]]:
    """Every stop a worker logged (of ``session_id``)."""
    return loop.worker_lines("sandbox stopped", session_id)


def workspace_of(loop: Loop, session_id: str) -> Path:
    """The local runner's workspace of ``session_id``."""
    return loop.state_directory / "sessions" / session_key(session_id) / "workspace"


def wait_idle(loop: Loop, session_id: str, timeout: float = 120) -> dict[str, Any]:
    """The session once it reads ``idle``, waited for with a deadline."""

    def idle() -> dict[str, Any] | None:
        session = loop.session(session_id)
        assert session["status"] != "failed", session
        return session if session["status"] == "idle" else None

    found = wait_for(idle, timeout, f"session {session_id} to be idle", interval=0.1)
    assert found is not None  # wait_for returns only what is truthy
    return found


def scrape(port: int, path: str = "/metrics") -> Samples:
    """Every sample of one ``GET /metrics``, by name and sorted labels."""
    text = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over samples whose labels include ``labels`` (ignoring ``pid``)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def assert_no_secret(text: str, secrets: Iterable[str] = SECRETS) -> None:
    for secret in secrets:
        assert secret not in text, "a secret appeared in the output"


def python() -> str:
    return sys.executable
