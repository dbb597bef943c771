"""The Agents API over HTTP, at its edge: one request, its errors translated once.

``call`` sends one request with an ``httpx.Client`` and returns the JSON object it answered,
or raises what the caller should act on (``errors.py``): ``ApiUnavailable`` for a timeout, a
transport error, 429 or 5xx (with the server's ``Retry-After``, capped) and a body that is not
a JSON object — retry later; ``ApiRejected`` for any other 4xx, with the API's own message
(the client's key masked in it) — do not retry. A 404 is ``None`` when the caller reads something that may be gone
(``missing_ok``: a deleted session), ``ApiRejected`` otherwise. Both adapters of the API use it:
``sessions.HttpSessions`` (session and environment reads, retried briefly by tenacity) and
``webhook_endpoints.HttpWebhookEndpoints`` (the ``webhook`` commands, never retried).
Messages name what was being done and the status, never a header or a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from controller import logs
from controller.errors import ApiRejected, ApiUnavailable

log = logs.get(__name__)

RETRY_AFTER_CAP_SECONDS = 30.0
BETA_HEADER = {"OpenAI-Beta": "agents=v1"}


def call(
    client: httpx.Client,
    method: str,
    path: str,
    what: str,
    *,
    missing_ok: bool = False,
    on_status: Callable[[str], None] = lambda status: None,
    **kwargs: Any,
) -> dict[str, Any] | None:
    """One request; ``what`` says what it does ("reading session sess_1"). ``on_status`` is told
    the status code, or ``timeout`` / ``transport_error`` (a metric). None only for a 404 that
    ``missing_ok`` allows."""
    try:
        response = client.request(method, path, **kwargs)
    except httpx.TimeoutException as exc:
        on_status("timeout")
        raise ApiUnavailable(f"timed out {what}") from exc
    except httpx.TransportError as exc:
        on_status("transport_error")
        raise ApiUnavailable(f"could not reach the Agents API {what}: {type(exc).__name__}") from exc
    status = response.status_code
    on_status(str(status))
    if status == 404 and missing_ok:
        return None
    if status == 429 or status >= 500:
        log.info("agents api busy", extra={"status": status, "path": path})
        raise ApiUnavailable(f"Agents API answered {status} {what}", retry_after_seconds(response))
    if status >= 400:
        raise ApiRejected(f"Agents API answered {status} {what}: {_message(response, client)}")
    try:
        body = response.json()
    except ValueError as exc:
        raise ApiUnavailable(f"Agents API sent a body that is not JSON {what}") from exc
    if not isinstance(body, dict):
        raise ApiUnavailable(f"Agents API sent an unexpected body {what}")
    return body


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The server's ``Retry-After`` in seconds (capped at ``RETRY_AFTER_CAP_SECONDS``), if it sent one."""
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return min(max(float(raw), 0.0), RETRY_AFTER_CAP_SECONDS)
    except ValueError:
        return None


def _message(response: httpx.Response, client: httpx.Client) -> str:
    """The API's own error message (``{"error": {"message": …}}``), cut short, with the client's
    own key masked: an error message may quote the credential it refused."""
    try:
        error = response.json().get("error") or {}
        message = str(error.get("message") or "no message")
    except (ValueError, AttributeError):
        return "no message"
    scheme, _, key = client.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key:
        message = message.replace(key, "***")
    return message[:300]
