"""The Agents API simulator for tests: as a subprocess or in-process, plus a webhook receiver.

``SimulatorProcess`` runs ``python -m agents_simulator`` on a free loopback port (its
secrets passed through the environment, not argv) and always stops it; ``InProcessSimulator``
serves ``create_app`` with uvicorn in a thread, exposing the engine as ``.engine``.
``WebhookReceiver`` is a real HTTP server on loopback that records deliveries and answers
with scripted statuses (then 200). ``run_turn`` has a running simulator carry commands to a
session's executor over its link and waits for the turn to finish.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents_simulator import SimulatorConfig, create_app
from agents_simulator.cli import ENV_PREFIX
from tests.support.processes import Managed, free_port, python_module, wait_for


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def new_environment_key() -> str:
    return "envkey-" + secrets.token_hex(16)


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]  # lower-case names
    body: bytes
    answered: int
    at: float

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class WebhookReceiver:
    """Records every POST; answers the statuses in ``script`` in turn, then 200.

    ``respond(event)``, when given, decides the status instead (``None`` falls back to the script).
    """

    def __init__(
        self, script: Iterable[int] = (), respond: Callable[[dict[str, Any]], int | None] | None = None
    ) -> None:
        self._script = list(script)
        self._respond = respond
        self._lock = threading.Lock()
        self.received: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    status = receiver._status_for(body)
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    receiver.received.append(Received(headers, body, status, time.time()))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/webhooks"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    def _status_for(self, body: bytes) -> int:
        if self._respond is not None:
            try:
                chosen = self._respond(json.loads(body))
            except ValueError:
                chosen = None
            if chosen is not None:
                return chosen
        return self._script.pop(0) if self._script else 200

    def script(self, statuses: Iterable[int]) -> None:
        with self._lock:
            self._script = list(statuses)

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def of_type(self, event_type: str, session_id: str | None = None) -> list[Received]:
        return [
            r
            for r in self.snapshot()
            if r.event["type"] == event_type and (session_id is None or r.event["data"].get("id") == session_id)
        ]

    def wait_for_type(self, event_type: str, session_id: str | None = None, timeout: float = 10.0) -> Received:
        found = wait_for(lambda: self.of_type(event_type, session_id), timeout, f"webhook {event_type}")
        assert isinstance(found, list)
        first: Received = found[0]
        return first


class _Endpoints:
    """Calls shared by both ways of running the simulator."""

    base_url: str
    api_key: str

    @property
    def api_url(self) -> str:
        return self.base_url + "/v1"

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            timeout=10.0,
            headers={"authorization": f"Bearer {self.api_key}", "openai-beta": "agents=v1"},
        )

    def admin(self, method: str, path: str, json: Any = None) -> Any:
        with httpx.Client(base_url=self.base_url, timeout=10.0) as client:
            response = client.request(method, path, json=json)
        response.raise_for_status()
        return response.json() if response.content else None

    def openai(self, **kwargs: Any) -> Any:
        import openai

        options = {"base_url": self.api_url, "api_key": self.api_key, "max_retries": 0, **kwargs}
        return openai.OpenAI(**options)

    def session(self, session_id: str) -> dict[str, Any]:
        with self.http() as client:
            response = client.get(f"/v1/agents/sessions/{session_id}")
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def environment_status(self, environment_id: str) -> str:
        with self.http() as client:
            response = client.get(f"/v1/agents/environments/{environment_id}")
        response.raise_for_status()
        return str(response.json()["status"])

    def registrations(self, environment_id: str | None = None) -> list[dict[str, Any]]:
        query = f"?environment_id={environment_id}" if environment_id else ""
        data: list[dict[str, Any]] = self.admin("GET", "/admin/registrations" + query)["data"]
        return data

    def wait_for_status(self, session_id: str, status: str, timeout: float = 10.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            session = self.session(session_id)
            return session if session["status"] == status else None

        found = wait_for(reached, timeout, f"session {session_id} to be {status}")
        assert isinstance(found, dict)
        return found


class SimulatorProcess(_Endpoints):
    """``python -m agents_simulator`` on a free loopback port."""

    def __init__(
        self,
        directory: Path,
        *,
        webhook_urls: Sequence[str] = (),
        webhook_secret: str | None = None,
        environment_key: str | None = None,
        api_key: str = "sk-test",
        exact_api_key: bool = False,
        args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.webhook_secret = webhook_secret or new_webhook_secret()
        self.environment_key = environment_key or new_environment_key()
        self.api_key = api_key
        argv = python_module("agents_simulator", "--port", str(self.port), *args)
        for url in webhook_urls:
            argv += ["--webhook-url", url]
        env = {
            **_base_env(),
            ENV_PREFIX + "ENVIRONMENT_KEY": self.environment_key,
            ENV_PREFIX + "WEBHOOK_SECRET": self.webhook_secret,
        }
        if exact_api_key:
            env[ENV_PREFIX + "API_KEY"] = api_key
        directory.mkdir(parents=True, exist_ok=True)
        self.process = Managed(
            "simulator",
            argv,
            env,
            directory / f"simulator-{self.port}.log",
            cwd=Path(__file__).resolve().parents[2],
        )

    def start(self, timeout: float = 15.0) -> SimulatorProcess:
        self.process.start()

        def healthy() -> bool:
            if not self.process.alive():
                raise AssertionError("simulator exited:\n" + self.process.output())
            return httpx.get(self.base_url + "/healthz", timeout=1.0).status_code == 200

        try:
            wait_for(healthy, timeout, "the simulator to answer /healthz")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class InProcessSimulator(_Endpoints):
    """``create_app(config)`` served by uvicorn in a background thread of this process."""

    def __init__(self, config: SimulatorConfig, api_key: str = "sk-test") -> None:
        import uvicorn

        self.config = config
        self.base_url = config.base_url
        self.api_key = config.api_key or api_key
        self.app = create_app(config)
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host=config.host,
                port=config.port,
                log_config=None,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=5,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="simulator", daemon=True)

    @classmethod
    def on_free_port(cls, **fields: Any) -> InProcessSimulator:
        fields.setdefault("environment_key", new_environment_key())
        return cls(SimulatorConfig(port=free_port(), **fields))

    @property
    def engine(self) -> Any:
        return self.app.state.simulator

    def start(self, timeout: float = 10.0) -> InProcessSimulator:
        self._thread.start()
        wait_for(lambda: self._server.started, timeout, "the in-process simulator to start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> InProcessSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_turn(
    simulator_url: str, session_id: str, commands: Sequence[list[str] | dict[str, Any]], timeout: float = 120
) -> dict[str, Any]:
    """A simulated turn carrying ``commands``, run by the simulator over the executor's link;
    the finished turn (its commands' results) once the simulator says it finished."""
    response = httpx.post(f"{simulator_url}/admin/sessions/{session_id}/turns", json={"commands": commands}, timeout=10)
    response.raise_for_status()
    turn_id = str(response.json()["id"])

    def finished() -> dict[str, Any] | None:
        turns = httpx.get(f"{simulator_url}/admin/sessions/{session_id}/turns", timeout=10).json()["data"]
        turn = next(t for t in turns if t["id"] == turn_id)
        return dict(turn) if turn["status"] == "finished" else None

    found = wait_for(finished, timeout, f"turn {turn_id} to finish", interval=0.5)
    assert isinstance(found, dict)
    return found


def _base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "SSL_CERT_FILE")
    return {k: v for k, v in os.environ.items() if k in keep}


StartSimulator = Callable[..., SimulatorProcess]


@pytest.fixture
def start_simulator(tmp_path: Path) -> Iterator[StartSimulator]:
    """Start simulator subprocesses; every one is stopped at the end of the test."""
    started: list[SimulatorProcess] = []

    def start(**kwargs: Any) -> SimulatorProcess:
        simulator = SimulatorProcess(tmp_path / "logs", **kwargs)
        started.append(simulator)
        return simulator.start()

    yield start
    for simulator in started:
        simulator.stop()
