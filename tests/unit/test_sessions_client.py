"""``HttpSessions`` over ``httpx.MockTransport`` and ``parse_session`` on wire JSON."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from controller.errors import ApiRejected, ApiUnavailable, ControllerError
from controller.model import DEFAULT_WORKSPACE, Environment, Link, RequiredAction, SessionStatus
from controller.sessions import HttpSessions, parse_session
from tests.support.processes import wait_for

API_KEY = "sk-controller-secret-0123456789"
BASE = "https://api.example.test"

FULL_SESSION: dict[str, Any] = {
    "id": "sess_1",
    "object": "agent.session",
    "status": "requires_action",
    "agent": {"id": "agent_1", "name": "builder"},
    "environment": {
        "type": "self_hosted",
        "id": "env_1",
        "remote_url": "https://api.openai.com/v1/agents/env",
        "workspace_directory": "/srv/work",
        "capability_directories": ["/opt/caps"],
    },
    "required_actions": [
        {"type": "function_call", "call_id": "call_1"},
        {"type": "environment_connection", "environment_id": "env_1"},
    ],
    "metadata": {"team": "a", "sandbox_template": "small"},
    "created_at": 1_700_000_000,
    "last_active_at": 1_700_000_050,
    "error": None,
}

Handler = Callable[[httpx.Request], httpx.Response]


class Script:
    """A MockTransport handler answering scripted responses in turn, recording each request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(time.monotonic())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def client_for(script: Script, max_attempts: int = 4) -> Iterator[HttpSessions]:
    sessions = HttpSessions(
        BASE + "/",
        API_KEY,
        timeout_seconds=1.0,
        max_attempts=max_attempts,
        transport=httpx.MockTransport(script),
        backoff_initial_seconds=0.01,
        backoff_cap_seconds=0.02,
    )
    try:
        yield sessions
    finally:
        sessions.close()


def run(script: Script, call: Callable[[HttpSessions], Any], max_attempts: int = 4) -> Any:
    for sessions in client_for(script, max_attempts):
        return call(sessions)
    raise AssertionError("unreachable")


def ok(body: Any) -> httpx.Response:
    return httpx.Response(200, json=body)


def assert_no_key(exc: BaseException) -> None:
    """The API key appears in no message along the exception chain."""
    seen: BaseException | None = exc
    while seen is not None:
        assert API_KEY not in str(seen) and API_KEY not in repr(seen)
        assert "Bearer" not in str(seen)
        seen = seen.__cause__ or seen.__context__


def test_get_sends_bearer_and_beta_header_and_parses() -> None:
    """L7: the worker retrieves the session with the controller's key and the beta header."""
    script = Script(ok(FULL_SESSION))
    session = run(script, lambda s: s.get("sess_1"))
    request = script.requests[0]
    assert request.method == "GET"
    assert str(request.url) == f"{BASE}/v1/agents/sessions/sess_1"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["openai-beta"] == "agents=v1"
    assert session.id == "sess_1" and session.wants_connection


def test_deleted_session_is_none() -> None:
    """L7: 404 means the session was deleted: None, no retry."""
    script = Script(httpx.Response(404, json={"error": {"message": "not found"}}))
    assert run(script, lambda s: s.get("sess_gone")) is None
    assert len(script.requests) == 1


def test_429_with_retry_after_is_retried_after_the_servers_wait() -> None:
    """429 is retried, waiting what Retry-After says (not the much shorter backoff)."""
    script = Script(httpx.Response(429, headers={"Retry-After": "0.2"}), ok(FULL_SESSION))
    session = run(script, lambda s: s.get("sess_1"))
    assert session is not None and session.id == "sess_1"
    assert len(script.requests) == 2
    waited = script.times[1] - script.times[0]
    assert 0.2 <= waited < 2.0  # backoff alone would be at most 0.02 s


def test_retry_after_is_capped() -> None:
    """A huge Retry-After is capped, so a worker is not parked for hours at the HTTP edge."""
    from controller.agents_api import retry_after_seconds

    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "86400"})) == 30.0
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "-3"})) == 0.0
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "soon"})) is None
    assert retry_after_seconds(httpx.Response(429)) is None


@pytest.mark.parametrize(
    "failure",
    [
        httpx.Response(500),
        httpx.Response(502, text="<html>bad gateway</html>"),
        httpx.Response(503, headers={"Retry-After": "0"}),
        httpx.Response(429),
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.ConnectError("connection refused"),
    ],
    ids=["500", "502", "503", "429-no-retry-after", "read-timeout", "connect-timeout", "connect-error"],
)
def test_transient_failures_are_retried_up_to_max_attempts(failure: httpx.Response | Exception) -> None:
    """Timeouts, 429 and 5xx are retried a few times at the edge, then ApiUnavailable (Celery retries later)."""
    script = Script(failure)
    with pytest.raises(ApiUnavailable) as raised:
        run(script, lambda s: s.get("sess_1"), max_attempts=3)
    assert len(script.requests) == 3
    assert "sess_1" in str(raised.value)
    assert_no_key(raised.value)


def test_transient_then_success_recovers() -> None:
    script = Script(httpx.Response(503), httpx.ReadTimeout("slow"), ok(FULL_SESSION))
    assert run(script, lambda s: s.get("sess_1")).id == "sess_1"
    assert len(script.requests) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 409, 422])
def test_client_errors_are_rejected_without_retry(status: int) -> None:
    """4xx other than 404/429 is permanent: ApiRejected at once, never retried."""
    script = Script(httpx.Response(status, json={"error": {"message": f"bad key {API_KEY}"}}))
    with pytest.raises(ApiRejected) as raised:
        run(script, lambda s: s.get("sess_1"))
    assert len(script.requests) == 1
    assert str(status) in str(raised.value)
    assert_no_key(raised.value)


@pytest.mark.parametrize(
    "response",
    [httpx.Response(200, text="not json"), httpx.Response(200, json=["a", "list"])],
    ids=["not-json", "not-an-object"],
)
def test_garbled_bodies_are_transient(response: httpx.Response) -> None:
    script = Script(response)
    with pytest.raises(ApiUnavailable):
        run(script, lambda s: s.get("sess_1"), max_attempts=2)
    assert len(script.requests) == 2


def test_environment_link() -> None:
    """L10/L14: the environment's status says whether an executor holds the link, held it and
    lost it (``disconnected``), or has not held it; unknown is None."""
    script = Script(ok({"id": "env_1", "status": "connected"}))
    assert run(script, lambda s: s.environment_link("env_1")) is Link.UP
    assert str(script.requests[0].url) == f"{BASE}/v1/agents/environments/env_1"
    dropped = Script(ok({"id": "env_1", "status": "disconnected"}))
    assert run(dropped, lambda s: s.environment_link("env_1")) is Link.DROPPED
    for status in ("pending", "ready", "failed"):
        not_yet = Script(ok({"id": "env_1", "status": status}))
        assert run(not_yet, lambda s: s.environment_link("env_1")) is Link.NOT_YET
    assert run(Script(httpx.Response(404)), lambda s: s.environment_link("env_1")) is None
    assert run(Script(httpx.Response(503)), lambda s: s.environment_link("env_1"), max_attempts=2) is None
    assert run(Script(httpx.Response(403)), lambda s: s.environment_link("env_1")) is None


def test_the_api_key_never_appears_in_any_error() -> None:
    """L2: messages carry ids, never the controller's API key."""
    failures: list[httpx.Response | Exception] = [
        httpx.Response(401, text=f"invalid key {API_KEY}"),
        httpx.Response(500, text=f"echo {API_KEY}"),
        httpx.ConnectError("connection refused"),
        httpx.Response(200, text=f"garbled {API_KEY}"),
    ]
    for failure in failures:
        with pytest.raises(ControllerError) as raised:
            run(Script(failure), lambda s: s.get("sess_1"), max_attempts=2)
        assert_no_key(raised.value)


# --- parse_session --------------------------------------------------------------------------


def test_parse_full_self_hosted_session() -> None:
    """L7/L8: the fields the worker needs are read from the session object."""
    session = parse_session(FULL_SESSION)
    assert session.id == "sess_1"
    assert session.status is SessionStatus.REQUIRES_ACTION
    assert session.environment == Environment(
        type="self_hosted",
        id="env_1",
        remote_url="https://api.openai.com/v1/agents/env",
        workspace_directory="/srv/work",
    )
    assert session.required_actions == (
        RequiredAction(type="function_call"),
        RequiredAction(type="environment_connection", environment_id="env_1"),
    )
    assert session.wants_connection
    assert session.agent_id == "agent_1"
    assert dict(session.metadata) == {"team": "a", "sandbox_template": "small"}
    assert session.created_at == 1_700_000_000
    assert session.last_active_at == 1_700_000_050
    assert session.error is None


def test_parse_minimal_session() -> None:
    session = parse_session({"id": "sess_min"})
    assert session.id == "sess_min"
    assert session.status is SessionStatus.UNKNOWN
    assert session.environment == Environment(type="none")
    assert session.environment.workspace_directory == DEFAULT_WORKSPACE
    assert session.required_actions == ()
    assert session.agent_id is None
    assert dict(session.metadata) == {}
    assert session.created_at == 0 and session.last_active_at is None
    assert not session.wants_connection


def test_parse_odd_session() -> None:
    """Nulls, unknown statuses, non-object entries and a bare agent_id are tolerated."""
    session = parse_session(
        {
            "id": 123,
            "status": "something_new",
            "environment": {"type": "self_hosted", "id": "env_9", "workspace_directory": None},
            "required_actions": [None, "environment_connection", {"environment_id": "env_9"}],
            "agent": None,
            "agent_id": "agent_7",
            "metadata": None,
            "created_at": None,
            "error": {"code": "executor_timeout"},
        }
    )
    assert session.id == "123"
    assert session.status is SessionStatus.UNKNOWN
    assert session.environment.workspace_directory == DEFAULT_WORKSPACE
    assert session.environment.remote_url is None
    assert session.required_actions == (RequiredAction(type="", environment_id="env_9"),)
    assert not session.wants_connection
    assert session.agent_id == "agent_7"
    assert dict(session.metadata) == {}
    assert session.created_at == 0
    assert session.error == {"code": "executor_timeout"}


@pytest.mark.parametrize("status", ["idle", "in_progress", "requires_action", "failed"])
def test_parse_known_statuses(status: str) -> None:
    assert parse_session({"id": "s", "status": status}).status.value == status


def test_not_self_hosted_never_wants_connection() -> None:
    """L6/L7: an openai_hosted session with an environment_connection entry is not ours to start."""
    data = {**FULL_SESSION, "environment": {"type": "openai_hosted", "id": "env_1"}}
    assert not parse_session(data).wants_connection


class _ClosingServer:
    """A loopback HTTP/1.1 server (real sockets) answering the session's JSON with keep-alive,
    then closing each connection as ``close`` says: ``idle`` right after its first answer (the
    server's idle timeout, while the client keeps it pooled), ``racing`` when that connection's
    second request arrives, unanswered (a close that crosses the client's reuse)."""

    def __init__(self, close: str) -> None:
        import socket
        import threading

        self.close = close
        self.connections = 0
        self.answered = 0
        self.closed = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import json

        body = json.dumps(FULL_SESSION).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        answer = head + body
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                for request in range(2):
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data or (self.close == "racing" and request == 1):
                        break  # closed with the request unanswered
                    self.answered += 1  # before the answer leaves: the client may read it and go on at once
                    conn.sendall(answer)
                    if self.close == "idle":
                        break
            self.closed += 1

    def stop(self) -> None:
        import socket

        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self._listener.close()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive()


@pytest.mark.parametrize(
    ("close", "answers"), [("idle", ["200", "200"]), ("racing", ["200", "transport_error", "200"])]
)
def test_a_pooled_connection_the_server_closed_never_fails_a_read(close: str, answers: list[str]) -> None:
    """L7: the session is read whatever became of the kept-alive connection of the previous
    read: one the server closed while idle is not reused (httpcore sees its socket readable
    before reusing it: no attempt fails), and one the server closes as the request arrives fails
    that attempt as a transport error, retried on a new connection (``agents_api.call``, tenacity)."""
    server = _ClosingServer(close)
    seen: list[str] = []
    sessions = HttpSessions(
        server.url,
        API_KEY,
        timeout_seconds=5.0,
        backoff_initial_seconds=0.01,
        on_response=lambda operation, status: seen.append(status),
    )
    try:
        assert sessions.get("sess_1") is not None
        if close == "idle":  # closed (its FIN on loopback is in the client's socket once close returns)
            wait_for(lambda: server.closed == 1, 5, "the server to close the idle connection")
        session = sessions.get("sess_1")
        assert session is not None and session.id == "sess_1"
        assert seen == answers
        assert (server.connections, server.answered) == (2, 2)
    finally:
        sessions.close()
        server.stop()
