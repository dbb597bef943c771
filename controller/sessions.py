"""The Agents API as the controller reads it: sessions and environment status.

``HttpSessions`` is the adapter behind ``lifecycle.Sessions`` (httpx at the edge, a few quick tenacity retries on
timeouts, 429 and 5xx honouring ``Retry-After``); Celery retries for longer at the task.
``parse_session`` turns the wire JSON into ``model.Session`` (pure, tested directly).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx
import tenacity

from controller import logs
from controller.errors import ApiRejected, ApiUnavailable
from controller.model import DEFAULT_WORKSPACE, Environment, RequiredAction, Session, SessionStatus

log = logs.get(__name__)

BETA_HEADER = {"OpenAI-Beta": "agents=v1"}
_RETRY_AFTER_CAP_SECONDS = 30.0


def parse_session(data: Mapping[str, Any]) -> Session:
    env = data.get("environment") or {}
    agent = data.get("agent") or {}
    metadata = data.get("metadata") or {}
    return Session(
        id=str(data["id"]),
        status=SessionStatus.parse(data.get("status")),
        environment=Environment(
            type=str(env.get("type", "none")),
            id=env.get("id"),
            remote_url=env.get("remote_url"),
            workspace_directory=env.get("workspace_directory") or DEFAULT_WORKSPACE,
        ),
        required_actions=tuple(
            RequiredAction(type=str(a.get("type", "")), environment_id=a.get("environment_id"))
            for a in data.get("required_actions") or ()
            if isinstance(a, Mapping)
        ),
        agent_id=(agent.get("id") if isinstance(agent, Mapping) else None) or data.get("agent_id"),
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, Mapping) else {},
        created_at=int(data.get("created_at") or 0),
        last_active_at=data.get("last_active_at"),
        error=data.get("error"),
    )


def retry_after_seconds(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return min(max(float(raw), 0.0), _RETRY_AFTER_CAP_SECONDS)
    except ValueError:
        return None


class _Wait(tenacity.wait.wait_base):
    """Full-jitter exponential backoff, or the server's Retry-After when it sent one."""

    def __init__(self, initial: float, cap: float) -> None:
        self.initial, self.cap = initial, cap

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, ApiUnavailable) and exc.retry_after is not None:
            return exc.retry_after
        ceiling = min(self.cap, self.initial * 2 ** (retry_state.attempt_number - 1))
        return random.uniform(0, ceiling)


class HttpSessions:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float = 10.0,
        max_attempts: int = 4,
        transport: httpx.BaseTransport | None = None,
        backoff_initial_seconds: float = 0.5,
        backoff_cap_seconds: float = 8.0,
        on_response: Callable[[str, str], None] | None = None,
    ) -> None:
        self._on_response = on_response or (lambda operation, status: None)
        """Told (operation, status) after every request: the status code, ``timeout`` or ``transport_error``."""
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", **BETA_HEADER, "User-Agent": "sandbox-controller"},
            timeout=timeout_seconds,
            transport=transport,
        )
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ApiUnavailable),
            stop=tenacity.stop_after_attempt(max_attempts),
            wait=_Wait(backoff_initial_seconds, backoff_cap_seconds),
            reraise=True,
        )

    def close(self) -> None:
        self._client.close()

    def get(self, session_id: str) -> Session | None:
        data = self._get_json(
            f"/v1/agents/sessions/{quote(session_id, safe='')}",
            what=f"session {session_id}",
            operation="retrieve_session",
        )
        if data is None:
            return None
        try:
            return parse_session(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ApiUnavailable(f"Agents API sent a session body the controller cannot read ({session_id})") from exc

    def environment_connected(self, environment_id: str) -> bool | None:
        try:
            data = self._get_json(
                f"/v1/agents/environments/{quote(environment_id, safe='')}",
                what=f"environment {environment_id}",
                operation="retrieve_environment",
            )
        except (ApiUnavailable, ApiRejected):
            return None
        if data is None:
            return None
        return data.get("status") == "connected"

    def _get_json(self, path: str, what: str, operation: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._retrying(self._get_once, path, what, operation)
        return result

    def _get_once(self, path: str, what: str, operation: str) -> dict[str, Any] | None:
        try:
            response = self._client.get(path)
        except httpx.TimeoutException as exc:
            self._on_response(operation, "timeout")
            raise ApiUnavailable(f"timed out reading {what}") from exc
        except httpx.TransportError as exc:
            self._on_response(operation, "transport_error")
            raise ApiUnavailable(f"could not reach the Agents API reading {what}: {type(exc).__name__}") from exc
        status = response.status_code
        self._on_response(operation, str(status))
        if status == 404:
            return None
        if status == 429 or status >= 500:
            log.info("agents api busy", extra={"status": status, "path": path})
            raise ApiUnavailable(f"Agents API answered {status} reading {what}", retry_after_seconds(response))
        if status >= 400:
            raise ApiRejected(f"Agents API answered {status} reading {what}")
        try:
            body = response.json()
        except ValueError as exc:
            raise ApiUnavailable(f"Agents API sent a body that is not JSON reading {what}") from exc
        if not isinstance(body, dict):
            raise ApiUnavailable(f"Agents API sent an unexpected body reading {what}")
        return body
