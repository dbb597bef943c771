"""``/v1/webhook_endpoints``: webhook endpoints registered through the API, as OpenAI serves them.

``create`` answers the endpoint with its ``signing_secret`` (the only time besides
``rotate_secret``); ``retrieve``, ``update`` and ``list`` answer it with a masked
``signing_secret_hint``. ``rotate_secret`` with ``keep_old_secret_active_for_24_hours``
keeps the previous secret valid for 24 hours: deliveries in that overlap carry one
signature per valid secret, newest first. ``test`` posts one signed sample event to the
endpoint at once and answers the status it got. ``updated_at`` moves only when the
configuration or the secret changes. Deliveries of real events reach every endpoint
subscribed to their type (``Targets`` is how ``WebhookSender`` asks).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agents_simulator.errors import ApiError, bad_request, not_found
from agents_simulator.http import json_body
from agents_simulator.state import new_id
from controller.clock import Clock
from controller.signing import sign_headers

OVERLAP_SECONDS = 24 * 3600
"""How long ``keep_old_secret_active_for_24_hours`` keeps the previous secret valid."""

EVENT_TYPES = (
    "batch.completed",
    "batch.failed",
    "batch.expired",
    "batch.cancelled",
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
    "eval.run.succeeded",
    "eval.run.failed",
    "eval.run.canceled",
    "fine_tuning.job.succeeded",
    "fine_tuning.job.failed",
    "fine_tuning.job.cancelled",
    "realtime.call.incoming",
    "video.completed",
    "video.failed",
    "agent.environment.ready",
    "agent.environment.failed",
    "agent.environment.suspended",
    "agent.environment.expired",
    "agent.session.created",
    "agent.session.action_required",
    "agent.session.in_progress",
    "agent.session.idle",
    "agent.session.failed",
    "safety.alert.created",
)
"""The event types an endpoint may subscribe to (the API's list, as its client declares it)."""


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass
class SimEndpoint:
    id: str
    name: str
    url: str
    event_types: list[str]
    created_at: int
    updated_at: int
    secret: str = field(repr=False)
    old_secret: str | None = field(default=None, repr=False)
    old_secret_until: float = 0.0

    def signing_secrets(self, now: float) -> list[str]:
        """Every secret valid at ``now``, newest first."""
        if self.old_secret is not None and now < self.old_secret_until:
            return [self.secret, self.old_secret]
        return [self.secret]

    def to_json(self, with_secret: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "webhook_endpoint",
            "name": self.name,
            "url": self.url,
            "event_types": list(self.event_types),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "signing_secret_hint": "whsec_…" + self.secret[-4:],
        }
        if with_secret:
            body["signing_secret"] = self.secret
        return body


@dataclass(frozen=True)
class Target:
    """Where one event goes, and the secrets to sign each attempt with (read per attempt)."""

    url: str
    secrets: Callable[[], Sequence[str]]


class Endpoints:
    """The registry: endpoints by id, in creation order."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.by_id: dict[str, SimEndpoint] = {}

    def now(self) -> float:
        return self._clock.now()

    def targets(self, event_type: str) -> list[Target]:
        return [Target(e.url, partial(self._secrets_of, e)) for e in self.by_id.values() if event_type in e.event_types]

    def _secrets_of(self, endpoint: SimEndpoint) -> list[str]:
        return endpoint.signing_secrets(self._clock.now())

    def get(self, endpoint_id: str) -> SimEndpoint:
        endpoint = self.by_id.get(endpoint_id)
        if endpoint is None:
            raise not_found("webhook endpoint", endpoint_id)
        return endpoint

    def create(self, body: Any) -> SimEndpoint:
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.")
        for required in ("name", "url", "event_types"):
            if required not in body:
                raise bad_request(f"Missing required parameter: '{required}'.", required)
        now = int(self._clock.now())
        endpoint = SimEndpoint(
            id=new_id("we"),
            name=_name(body["name"]),
            url=_url(body["url"]),
            event_types=_event_types(body["event_types"]),
            created_at=now,
            updated_at=now,
            secret=new_secret(),
        )
        self.by_id[endpoint.id] = endpoint
        return endpoint

    def update(self, endpoint_id: str, body: Any) -> SimEndpoint:
        endpoint = self.get(endpoint_id)
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.")
        changed = {
            "name": _name(body["name"]) if "name" in body else endpoint.name,
            "url": _url(body["url"]) if "url" in body else endpoint.url,
            "event_types": _event_types(body["event_types"]) if "event_types" in body else endpoint.event_types,
        }
        if (changed["name"], changed["url"], changed["event_types"]) != (
            endpoint.name,
            endpoint.url,
            endpoint.event_types,
        ):
            endpoint.name = str(changed["name"])
            endpoint.url = str(changed["url"])
            endpoint.event_types = list(changed["event_types"])
            endpoint.updated_at = int(self._clock.now())
        return endpoint

    def delete(self, endpoint_id: str) -> dict[str, Any]:
        self.get(endpoint_id)
        del self.by_id[endpoint_id]
        return {"id": endpoint_id, "object": "webhook_endpoint.deleted", "deleted": True}

    def rotate(self, endpoint_id: str, body: Any) -> SimEndpoint:
        endpoint = self.get(endpoint_id)
        keep = isinstance(body, dict) and body.get("keep_old_secret_active_for_24_hours") is True
        now = self._clock.now()
        endpoint.old_secret = endpoint.secret if keep else None
        endpoint.old_secret_until = now + OVERLAP_SECONDS if keep else 0.0
        endpoint.secret = new_secret()
        endpoint.updated_at = int(now)
        return endpoint

    def page(self, request: Request) -> dict[str, Any]:
        """Newest first, in OpenAI's cursor-list envelope."""
        try:
            limit = int(request.query_params.get("limit", "20"))
        except ValueError as exc:
            raise bad_request("'limit' must be an integer.", "limit") from exc
        if not 1 <= limit <= 100:
            raise bad_request("'limit' must be between 1 and 100.", "limit")
        ordered = list(reversed(self.by_id.values()))
        after = request.query_params.get("after")
        if after:
            ids = [e.id for e in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        data = [e.to_json() for e in ordered[:limit]]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(ordered) > limit,
        }


def sample_event(event_type: str, now: int) -> dict[str, Any]:
    """A test event: a made-up session that no application created. An action-required
    sample asks for a function call, so a controller acknowledges it and starts nothing."""
    data: dict[str, Any] = {"id": new_id("sess")}
    if event_type == "agent.session.action_required":
        data["required_action"] = {"type": "function_call"}
    elif event_type.startswith("agent.session."):
        data.update(environment_type="self_hosted", environment_id=new_id("env"))
    elif event_type.startswith("agent.environment."):
        data = {"id": new_id("env")}
    return {"id": new_id("evt"), "object": "event", "created_at": now, "type": event_type, "data": data}


def routes(
    registry: Endpoints, guard: Callable[[Request, str], Awaitable[None]], timeout_seconds: float
) -> list[Route]:
    async def collection(request: Request) -> Response:
        if request.method == "POST":
            await guard(request, "create_webhook_endpoint")
            return JSONResponse(registry.create(await json_body(request)).to_json(with_secret=True))
        await guard(request, "list_webhook_endpoints")
        return JSONResponse(registry.page(request))

    async def one(request: Request) -> Response:
        endpoint_id = request.path_params["endpoint_id"]
        if request.method == "DELETE":
            await guard(request, "delete_webhook_endpoint")
            return JSONResponse(registry.delete(endpoint_id))
        if request.method == "POST":
            await guard(request, "update_webhook_endpoint")
            return JSONResponse(registry.update(endpoint_id, await json_body(request)).to_json())
        await guard(request, "retrieve_webhook_endpoint")
        return JSONResponse(registry.get(endpoint_id).to_json())

    async def rotate(request: Request) -> Response:
        await guard(request, "rotate_webhook_secret")
        body = await json_body(request, optional=True)
        return JSONResponse(registry.rotate(request.path_params["endpoint_id"], body).to_json(with_secret=True))

    async def test(request: Request) -> Response:
        await guard(request, "test_webhook_endpoint")
        endpoint = registry.get(request.path_params["endpoint_id"])
        body = await json_body(request)
        event_type = body.get("event_type") if isinstance(body, dict) else None
        if event_type not in EVENT_TYPES:
            raise bad_request(f"Invalid 'event_type': {event_type!r}.", "event_type")
        now = registry.now()
        event = sample_event(str(event_type), int(now))
        raw = json.dumps(event, separators=(",", ":")).encode()
        headers = {"content-type": "application/json", "user-agent": "sandbox-controller-simulator"}
        headers.update(sign_headers(endpoint.signing_secrets(now), event["id"], int(now), raw))
        try:
            async with httpx.AsyncClient(follow_redirects=False, timeout=timeout_seconds) as client:
                answer = await client.post(endpoint.url, content=raw, headers=headers)
        except httpx.HTTPError as exc:
            reason = type(exc).__name__
            raise ApiError(400, f"Could not reach {endpoint.url}: {reason}.", code="webhook_test_failed") from exc
        return JSONResponse(
            {
                "object": "webhook_endpoint.test",
                "webhook_endpoint_id": endpoint.id,
                "event_type": event_type,
                "status_code": answer.status_code,
                "success": True,
            }
        )

    async def event_types(request: Request) -> Response:
        await guard(request, "list_webhook_event_types")
        return JSONResponse({"object": "list", "data": list(EVENT_TYPES)})

    return [
        Route("/v1/webhook_endpoints", collection, methods=["GET", "POST"]),
        Route("/v1/webhook_endpoints/{endpoint_id}", one, methods=["GET", "POST", "DELETE"]),
        Route("/v1/webhook_endpoints/{endpoint_id}/rotate_secret", rotate, methods=["POST"]),
        Route("/v1/webhook_endpoints/{endpoint_id}/test", test, methods=["POST"]),
        Route("/v1/webhook_event_types", event_types, methods=["GET"]),
    ]


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise bad_request("'name' must be a non-empty string.", "name")
    return value


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise bad_request("'url' must be an http(s) URL.", "url")
    return value


def _event_types(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise bad_request("'event_types' must be a non-empty list.", "event_types")
    unknown = [t for t in value if t not in EVENT_TYPES]
    if unknown:
        raise bad_request(f"Unknown event types: {unknown}.", "event_types")
    return list(dict.fromkeys(value))
