"""The Agents API's webhook endpoints (``/v1/webhook_endpoints``), for ``sandbox-controller webhook``.

``HttpWebhookEndpoints`` is the adapter (httpx; errors translated once, by ``agents_api.call``:
timeouts, 429 and 5xx are ``ApiUnavailable``, other 4xx ``ApiRejected``). It does not
retry: ``register`` is idempotent per URL, so running the command again is the retry, and a
blind retry of a create could make a second endpoint. A signing secret comes back as a
``config.Secret`` (masked in every repr) and only from ``create`` and ``rotate_secret``.

``register`` is the decision the command makes: create an endpoint for the URL, or bring the
one that exists to exactly the wanted event types (the API keeps its secret then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from controller import agents_api
from controller.config import Secret
from controller.errors import ApiUnavailable

DEFAULT_NAME = "sandbox-controller"
OVERLAP_SECONDS = 24 * 3600
"""How long the API keeps signing with the previous secret after a rotation that asked it to."""


@dataclass(frozen=True)
class Endpoint:
    id: str
    name: str
    url: str
    event_types: tuple[str, ...]
    created_at: int
    updated_at: int | None
    secret_hint: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "url": self.url,
            "event_types": list(self.event_types),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "signing_secret_hint": self.secret_hint,
        }


@dataclass(frozen=True)
class WithSecret:
    endpoint: Endpoint
    secret: Secret


@dataclass(frozen=True)
class TestResult:
    endpoint_id: str
    event_type: str
    status_code: int

    @property
    def received(self) -> bool:
        return 200 <= self.status_code < 300


@dataclass(frozen=True)
class Registration:
    endpoint: Endpoint
    secret: Secret | None
    """The new endpoint's secret; ``None`` when an existing endpoint was updated (its secret stands)."""
    changed: bool


def parse_endpoint(data: Mapping[str, Any]) -> Endpoint:
    return Endpoint(
        id=str(data["id"]),
        name=str(data.get("name") or ""),
        url=str(data["url"]),
        event_types=tuple(str(t) for t in data.get("event_types") or ()),
        created_at=int(data.get("created_at") or 0),
        updated_at=data.get("updated_at"),
        secret_hint=data.get("signing_secret_hint"),
    )


class HttpWebhookEndpoints:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/v1",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "sandbox-controller"},
            timeout=timeout_seconds,
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def create(self, name: str, url: str, event_types: Sequence[str]) -> WithSecret:
        body = self._call(
            "POST", "/webhook_endpoints", "creating a webhook endpoint", json=_params(name, url, event_types)
        )
        return _with_secret(body)

    def retrieve(self, endpoint_id: str) -> Endpoint:
        return parse_endpoint(self._call("GET", _path(endpoint_id), f"reading webhook endpoint {endpoint_id}"))

    def update(self, endpoint_id: str, name: str, url: str, event_types: Sequence[str]) -> Endpoint:
        what = f"updating webhook endpoint {endpoint_id}"
        return parse_endpoint(self._call("POST", _path(endpoint_id), what, json=_params(name, url, event_types)))

    def list(self) -> list[Endpoint]:
        """Every endpoint, newest first (all pages)."""
        found: list[Endpoint] = []
        after: str | None = None
        while True:
            params = {"limit": "100", **({"after": after} if after else {})}
            page = self._call("GET", "/webhook_endpoints", "listing webhook endpoints", params=params)
            found += [parse_endpoint(item) for item in page.get("data") or ()]
            after = page.get("last_id")
            if not page.get("has_more") or not after:
                return found

    def delete(self, endpoint_id: str) -> bool:
        body = self._call("DELETE", _path(endpoint_id), f"deleting webhook endpoint {endpoint_id}")
        return bool(body.get("deleted"))

    def rotate_secret(self, endpoint_id: str, keep_old: bool) -> WithSecret:
        what = f"rotating the secret of webhook endpoint {endpoint_id}"
        body = self._call(
            "POST", _path(endpoint_id) + "/rotate_secret", what, json={"keep_old_secret_active_for_24_hours": keep_old}
        )
        return _with_secret(body)

    def test(self, endpoint_id: str, event_type: str) -> TestResult:
        what = f"testing webhook endpoint {endpoint_id}"
        body = self._call("POST", _path(endpoint_id) + "/test", what, json={"event_type": event_type})
        return TestResult(str(body.get("webhook_endpoint_id") or endpoint_id), event_type, int(body["status_code"]))

    def find(self, url: str) -> Endpoint | None:
        """The endpoint registered for exactly this URL (the newest, should there be several)."""
        return next((e for e in self.list() if e.url == url), None)

    def _call(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        body = agents_api.call(self._client, method, path, what, **kwargs)
        assert body is not None  # a 404 is ApiRejected here (no missing_ok)
        return body


def register(api: HttpWebhookEndpoints, url: str, event_types: Sequence[str], name: str = DEFAULT_NAME) -> Registration:
    """Create the endpoint for ``url``, or make the existing one subscribe to exactly ``event_types``."""
    existing = api.find(url)
    if existing is None:
        created = api.create(name, url, event_types)
        return Registration(created.endpoint, created.secret, changed=True)
    if sorted(existing.event_types) == sorted(event_types) and existing.name == name:
        return Registration(existing, None, changed=False)
    return Registration(api.update(existing.id, name, url, event_types), None, changed=True)


def _with_secret(body: Mapping[str, Any]) -> WithSecret:
    secret = body.get("signing_secret")
    if not isinstance(secret, str) or not secret:
        raise ApiUnavailable("Agents API answered without the signing secret")
    return WithSecret(parse_endpoint(body), Secret(secret))


def _params(name: str, url: str, event_types: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "url": url, "event_types": list(event_types)}


def _path(endpoint_id: str) -> str:
    return f"/webhook_endpoints/{quote(endpoint_id, safe='')}"
