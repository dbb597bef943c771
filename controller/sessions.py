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

from controller import agents_api
from controller.errors import ApiRejected, ApiUnavailable
from controller.model import DEFAULT_WORKSPACE, Environment, Link, RequiredAction, Session, SessionStatus


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
        # httpx's keep-alive expiry (an idle connection kept 5 s) is kept on purpose. A longer one
        # would be safe: httpcore does not reuse a pooled connection the server closed while idle
        # (its socket is readable), and a close that crosses a request fails that attempt as a
        # transport error, which the retry below repeats on a new connection (both tested). It
        # would buy nothing measured: ten reads at once cost as much on a new connection as on a
        # kept one (plain HTTP on loopback, as the bench's workers read the simulator), each
        # worker process's first read opens one anyway, and the simulator's server closes idle
        # connections after 5 s itself (BENCHMARKS.md, goal 1).
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={
                "Authorization": f"Bearer {api_key}",
                **agents_api.BETA_HEADER,
                "User-Agent": "sandbox-controller",
            },
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
        path = f"/v1/agents/sessions/{quote(session_id, safe='')}"
        data = self._get_json(path, f"reading session {session_id}", "retrieve_session")
        if data is None:
            return None
        try:
            return parse_session(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ApiUnavailable(f"Agents API sent a session body the controller cannot read ({session_id})") from exc

    def environment_link(self, environment_id: str) -> Link | None:
        """The environment's link by its ``status``; None when unknown (an error, or 404)."""
        path = f"/v1/agents/environments/{quote(environment_id, safe='')}"
        try:
            data = self._get_json(path, f"reading environment {environment_id}", "retrieve_environment")
        except (ApiUnavailable, ApiRejected):
            return None
        if data is None:
            return None
        status = data.get("status")
        if status == "connected":
            return Link.UP
        if status == "disconnected":
            return Link.DROPPED
        return Link.NOT_YET

    def _get_json(self, path: str, what: str, operation: str) -> dict[str, Any] | None:
        """A GET that may answer 404 (None), retried briefly on what ``agents_api`` calls
        unavailable; each answer is counted by ``operation`` and status."""

        def on_status(status: str) -> None:
            self._on_response(operation, status)

        result: dict[str, Any] | None = self._retrying(
            agents_api.call, self._client, "GET", path, what, missing_ok=True, on_status=on_status
        )
        return result
