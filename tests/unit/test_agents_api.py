"""``agents_api.call``: the one place the Agents API's HTTP answers become the controller's errors."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from controller import agents_api
from controller.errors import ApiRejected, ApiUnavailable

KEY = "sk-controller-secret-0123456789"


def client(answer: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(
        base_url="https://api.test", headers={"Authorization": f"Bearer {KEY}"}, transport=httpx.MockTransport(answer)
    )


def test_a_rejection_carries_the_apis_message_with_the_key_masked() -> None:
    """L2: a 4xx is ApiRejected with the API's own message (useful to whoever runs ``webhook``),
    but never with the key, which an error message may quote."""
    seen: list[str] = []
    refused = client(lambda r: httpx.Response(403, json={"error": {"message": f"key {KEY} may not do this"}}))
    with pytest.raises(ApiRejected) as raised:
        agents_api.call(refused, "POST", "/v1/webhook_endpoints", "creating an endpoint", on_status=seen.append)
    assert str(raised.value) == "Agents API answered 403 creating an endpoint: key *** may not do this"
    assert seen == ["403"]


def test_a_404_is_none_only_where_something_may_be_gone() -> None:
    gone = client(lambda r: httpx.Response(404, json={"error": {"message": "no such session"}}))
    assert agents_api.call(gone, "GET", "/v1/agents/sessions/s", "reading session s", missing_ok=True) is None
    with pytest.raises(ApiRejected, match="404 reading endpoint e: no such session"):
        agents_api.call(gone, "GET", "/v1/webhook_endpoints/e", "reading endpoint e")


@pytest.mark.parametrize(
    ("answer", "status", "retry_after"),
    [
        (lambda r: httpx.Response(429, headers={"Retry-After": "7"}), "429", 7.0),
        (lambda r: httpx.Response(503), "503", None),
        (lambda r: httpx.Response(200, text="<html>"), "200", None),
        (lambda r: httpx.Response(200, json=[1, 2]), "200", None),
    ],
    ids=["429", "503", "not-json", "not-an-object"],
)
def test_what_can_pass_is_unavailable(
    answer: Callable[[httpx.Request], httpx.Response], status: str, retry_after: float | None
) -> None:
    seen: list[str] = []
    with pytest.raises(ApiUnavailable) as raised:
        agents_api.call(client(answer), "GET", "/x", "reading x", on_status=seen.append)
    assert raised.value.retry_after == retry_after and seen == [status]


def test_timeouts_and_transport_errors_are_unavailable_and_counted() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    seen: list[str] = []
    with pytest.raises(ApiUnavailable, match="timed out reading x"):
        agents_api.call(client(slow), "GET", "/x", "reading x", on_status=seen.append)
    with pytest.raises(ApiUnavailable, match="could not reach the Agents API reading x: ConnectError"):
        agents_api.call(client(refused), "GET", "/x", "reading x", on_status=seen.append)
    assert seen == ["timeout", "transport_error"]
