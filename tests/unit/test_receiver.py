"""The webhook receiver app, driven through Starlette's TestClient (controller/endpoint/app.py)."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from starlette.testclient import TestClient

from controller import logs
from controller.config import Secret, WebhookSettings
from controller.endpoint import ReceiverServices, create_app
from controller.endpoint import app as receiver_module
from controller.endpoint.app import MAX_SESSION_ID_CHARS, retry_after_seconds
from controller.errors import RedisPasswordRefused
from controller.inbox import Job
from controller.metrics import WEBHOOKS_TOTAL, Metrics
from controller.signing import Verifier
from tests.support.clock import FakeClock
from tests.support.deliveries import SAMPLE_ENVELOPES, SECRET, action_required, session_event, signed
from tests.support.fakes import FakeInbox

OTHER_SECRET = "whsec_" + base64.b64encode(b"another signing secret, 32 bytes").decode()

NOW = 1_700_000_000
LIMIT = 4096


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def inbox() -> FakeInbox:
    return FakeInbox()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def client(inbox: FakeInbox, clock: FakeClock, metrics: Metrics) -> Iterator[TestClient]:
    services = ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics)
    with TestClient(create_app(services)) as test_client:
        yield test_client


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """Everything the receiver logs during the test, as JSON lines (the production formatter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("controller.receiver")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


WELL_FORMED = signed(b"{}")[0]
"""Signature headers that pass the pre-check (present, in the window) but match no other body."""
WIRE_HEADERS = [(name.encode(), value.encode()) for name, value in WELL_FORMED.items()]


def post(client: TestClient, name: str, webhook_id: str = "msg_1", timestamp: int = NOW) -> Any:
    headers, body = signed(SAMPLE_ENVELOPES[name], webhook_id=webhook_id, timestamp=timestamp)
    return client.post("/webhooks", content=body, headers=headers)


def test_environment_connection_is_enqueued(client: TestClient, inbox: FakeInbox, metrics: Metrics) -> None:
    """L4, L5: a verified connection request is queued, then acknowledged with 200."""
    response = post(client, "environment_connection", webhook_id="msg_conn")
    assert (response.status_code, response.json()) == (200, {"status": "enqueued"})
    assert inbox.jobs == [Job("sess_1", "msg_conn", "agent.session.action_required", "evt_test")]
    assert inbox.jobs[0].received_at == NOW  # the receiver's clock: delivery → start latency starts here
    assert metrics.value(WEBHOOKS_TOTAL, outcome="enqueued", reason="environment_connection") == 1


def test_failed_session_is_enqueued(client: TestClient, inbox: FakeInbox) -> None:
    """L4: a failed session is queued so its compute is released."""
    response = post(client, "failed", webhook_id="msg_failed")
    assert response.json() == {"status": "enqueued"}
    assert inbox.jobs == [Job("sess_1", "msg_failed", "agent.session.failed", "evt_test")]


def test_duplicate_delivery_is_acknowledged_once(client: TestClient, inbox: FakeInbox, clock: FakeClock) -> None:
    """L5: a retried delivery (same webhook-id, re-signed later) is acknowledged, not queued twice."""
    assert post(client, "environment_connection", webhook_id="msg_dup").json() == {"status": "enqueued"}
    clock.advance(60)
    again = post(client, "environment_connection", webhook_id="msg_dup", timestamp=NOW + 60)
    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert len(inbox.jobs) == 1


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("function_call", "other_required_action"),
        ("mcp_approval_request", "other_required_action"),
        ("created", "session_created"),
        ("in_progress", "late_signal"),
        ("environment.connected", "environment_report"),
        ("environment.ready", "environment_report"),
        ("response.completed", "unknown_type"),
    ],
)
def test_other_events_are_ignored(client: TestClient, inbox: FakeInbox, name: str, reason: str) -> None:
    """L4, L9, L10: verified events that ask for no work are acknowledged (200) and dropped."""
    response = post(client, name)
    assert (response.status_code, response.json()) == (200, {"status": "ignored", "reason": reason})
    assert inbox.attempts == 0


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda h, b: ({}, b), id="no-headers"),
        pytest.param(lambda h, b: ({**h, "webhook-signature": "v1,AAAA"}, b), id="wrong-signature"),
        pytest.param(lambda h, b: (h, b.replace(b"sess_1", b"sess_2")), id="tampered-body"),
        pytest.param(lambda h, b: ({**h, "webhook-timestamp": str(NOW - 301)}, b), id="stale"),
        pytest.param(lambda h, b: ({**h, "webhook-timestamp": "yesterday"}, b), id="garbled-timestamp"),
        pytest.param(lambda h, b: ({**h, "webhook-id": "msg_\xe9".encode("latin-1")}, b), id="non-ascii"),
        pytest.param(lambda h, b: ({**h, "webhook-signature": "v1," + "A" * 5000}, b), id="huge"),
        pytest.param(
            lambda h, b: ({**h, "webhook-signature": signed(b, secret="other")[0]["webhook-signature"]}, b),
            id="other-secret",
        ),
    ],
)
def test_unverified_deliveries_are_rejected_unparsed(client: TestClient, inbox: FakeInbox, tamper: Any) -> None:
    """L3: a delivery that fails verification gets 401 and nothing is parsed or stored."""
    headers, body = tamper(*signed(SAMPLE_ENVELOPES["environment_connection"]))
    response = client.post("/webhooks", content=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["reason"] == "signature"
    assert inbox.attempts == 0


def test_unsigned_garbage_is_401_not_400(client: TestClient) -> None:
    """L3: verification comes first, so an unsigned non-JSON body is a signature problem."""
    assert client.post("/webhooks", content=b"\xff not json").status_code == 401


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"type": "agent.session.failed", "data": {}}', b"\xff"])
def test_verified_malformed_body_is_400(client: TestClient, inbox: FakeInbox, body: bytes) -> None:
    """L3: a genuine delivery whose body is not a usable envelope gets 400 and changes nothing."""
    headers, raw = signed(body)
    response = client.post("/webhooks", content=raw, headers=headers)
    assert (response.status_code, response.json()["reason"]) == (400, "payload")
    assert inbox.attempts == 0


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_wrong_method_is_405(client: TestClient, method: str) -> None:
    """L3: only POST delivers."""
    assert client.request(method, "/webhooks").status_code == 405


def test_body_over_the_cap_is_413(client: TestClient, inbox: FakeInbox) -> None:
    """L3: a (signed) body above max_body_bytes is refused before verification."""
    headers, body = signed({**SAMPLE_ENVELOPES["failed"], "pad": "x" * LIMIT})
    response = client.post("/webhooks", content=body, headers=headers)
    assert (response.status_code, response.json()["reason"]) == (413, "too_large")
    assert inbox.attempts == 0


def test_body_at_the_cap_is_read(client: TestClient) -> None:
    """L3: exactly max_body_bytes is still read (and then verified)."""
    body = b" " * (LIMIT - 2) + b"{}"
    headers, raw = signed(body)
    assert client.post("/webhooks", content=raw, headers=headers).status_code == 400  # verified, not an event


def test_declared_length_over_the_cap_is_refused_up_front(client: TestClient) -> None:
    """L3: an over-cap Content-Length is refused without reading the body."""
    pulled: list[int] = []

    def body() -> Iterator[bytes]:
        for i in range(3):
            pulled.append(i)
            yield b"x" * 10

    response = client.post("/webhooks", content=body(), headers={**WELL_FORMED, "content-length": str(10 * LIMIT)})
    assert response.status_code == 413
    assert response.headers["connection"] == "close"
    assert pulled == []


def test_chunked_body_without_length_is_413(client: TestClient, inbox: FakeInbox) -> None:
    """L3: a chunked body with no Content-Length is refused once it passes the cap."""

    def body() -> Iterator[bytes]:
        for _ in range(LIMIT // 1024 + 1):
            yield b"x" * 1024

    response = client.post("/webhooks", content=body(), headers=WELL_FORMED)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert inbox.attempts == 0


def test_streamed_body_is_cut_off_while_arriving(inbox: FakeInbox, clock: FakeClock) -> None:
    """L3: reading stops as soon as more than max_body_bytes arrived (raw ASGI: TestClient buffers)."""
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT))
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": pulled < 10_000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/webhooks",
        "raw_path": b"/webhooks",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"transfer-encoding", b"chunked"), *WIRE_HEADERS],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    anyio.run(app, scope, receive, send)
    assert sent[0]["status"] == 413
    assert pulled == LIMIT // 1024 + 1
    assert inbox.attempts == 0


@pytest.mark.parametrize("length", ["abc", "-1", "1e3", "٣"])
def test_garbled_content_length_is_400(client: TestClient, length: str) -> None:
    """L3: a Content-Length that is not a number is malformed (400)."""
    response = client.post("/webhooks", content=b"{}", headers={**WELL_FORMED, "content-length": length.encode()})
    assert response.status_code == 400


def test_inbox_down_is_503_with_retry_after(client: TestClient, inbox: FakeInbox, metrics: Metrics) -> None:
    """L5: when the job cannot be confirmed queued, answer 503 + Retry-After so the sender retries."""
    inbox.unavailable = True
    inbox.retry_after = 2.2
    response = post(client, "environment_connection")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    assert response.json() == {"status": "unavailable"}
    assert inbox.jobs == []
    assert metrics.value(WEBHOOKS_TOTAL, outcome="unavailable", reason="inbox") == 1


def test_failed_submit_is_processed_on_retry(client: TestClient, inbox: FakeInbox, clock: FakeClock) -> None:
    """L5: a delivery whose enqueue failed is queued when the sender retries it."""
    inbox.unavailable = True
    assert post(client, "environment_connection", webhook_id="msg_retry").status_code == 503
    inbox.unavailable = False
    clock.advance(30)
    retry = post(client, "environment_connection", webhook_id="msg_retry", timestamp=NOW + 30)
    assert (retry.status_code, retry.json()) == (200, {"status": "enqueued"})
    assert [job.webhook_id for job in inbox.jobs] == ["msg_retry"]


def test_ignored_events_are_acknowledged_even_when_inbox_is_down(client: TestClient, inbox: FakeInbox) -> None:
    """L4, L5: dropping needs no queue, so it never turns into a 503."""
    inbox.unavailable = True
    assert post(client, "in_progress").status_code == 200


class BrokenInbox(FakeInbox):
    async def submit(self, job: Job) -> Any:
        raise RuntimeError("a bug in our code")


def test_a_bug_answers_503_and_is_logged(clock: FakeClock, log_output: io.StringIO) -> None:
    """L5: an unexpected error must not lose the event: 503 (the sender retries), logged with a traceback."""
    metrics = Metrics()
    app = create_app(ReceiverServices(Verifier([SECRET]), BrokenInbox(), clock, LIMIT, metrics))
    with TestClient(app) as client:
        response = post(client, "environment_connection", webhook_id="msg_bug")
    assert response.status_code == 503
    assert response.json() == {"status": "error"}
    assert response.headers["retry-after"] == "5"
    assert metrics.value(WEBHOOKS_TOTAL, outcome="error", reason="bug") == 1
    (line,) = [line for line in lines_of(log_output) if line["event"] == "webhook.error"]
    assert "RuntimeError: a bug in our code" in line["traceback"]
    assert (line["webhook_id"], line["session_id"], line["level"]) == ("msg_bug", "sess_1", "error")


class RefusedInbox(FakeInbox):
    async def submit(self, job: Job) -> Any:
        raise RedisPasswordRefused("CONTROLLER_REDIS_URL", "the Redis master at redis:6379", "WRONGPASS")


def test_a_setting_the_store_refuses_answers_503_and_says_which(clock: FakeClock, log_output: io.StringIO) -> None:
    """L5: a store that refuses the configured password loses no event (503, the sender retries
    once the setting is fixed), and the line says it is the configuration, naming the setting: no
    traceback, not counted as a bug."""
    metrics = Metrics()
    app = create_app(ReceiverServices(Verifier([SECRET]), RefusedInbox(), clock, LIMIT, metrics))
    with TestClient(app) as client:
        response = post(client, "environment_connection", webhook_id="msg_cfg")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert metrics.value(WEBHOOKS_TOTAL, outcome="unavailable", reason="config") == 1
    assert metrics.value(WEBHOOKS_TOTAL, outcome="error", reason="bug") == 0
    (line,) = [line for line in lines_of(log_output) if line["event"].startswith("webhook.")]
    assert (line["event"], line["reason"], line["level"]) == ("webhook.unavailable", "config", "error")
    assert "CONTROLLER_REDIS_URL" in line["error"] and "traceback" not in line
    assert (line["webhook_id"], line["session_id"]) == ("msg_cfg", "sess_1")


def test_readyz_follows_the_inbox(client: TestClient, inbox: FakeInbox) -> None:
    """L5: not ready while the queue is unavailable; alive all the same."""
    assert client.get("/readyz").status_code == 200
    inbox.unavailable = True
    unready = client.get("/readyz")
    assert unready.status_code == 503 and unready.headers["retry-after"] == "5"  # every 503 says when
    assert client.get("/healthz").status_code == 200


class UnreachableInbox(FakeInbox):
    async def ready(self) -> bool:
        raise ConnectionError("store unreachable")


def test_readyz_is_503_when_the_check_itself_fails(clock: FakeClock) -> None:
    """L5: a readiness check that raises means not ready (503), never a 500."""
    app = create_app(ReceiverServices(Verifier([SECRET]), UnreachableInbox(), clock, LIMIT))
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 503


def test_one_log_line_per_outcome_with_bound_ids(client: TestClient, log_output: io.StringIO) -> None:
    """L2, L3: one line per delivery with the bound ids; no secret or signature value in the output."""
    headers, body = signed(SAMPLE_ENVELOPES["environment_connection"], webhook_id="msg_a")
    client.post("/webhooks", content=body, headers=headers)
    client.post("/webhooks", content=body, headers=headers)
    post(client, "in_progress", webhook_id="msg_b")
    client.post("/webhooks", content=body, headers={**headers, "webhook-signature": "v1,Zm9yZ2Vk"})
    client.get("/healthz")

    lines = lines_of(log_output)
    assert [(line["event"], line["outcome"]) for line in lines] == [
        ("webhook.enqueued", "enqueued"),
        ("webhook.duplicate", "duplicate"),
        ("webhook.ignored", "ignored"),
        ("webhook.rejected", "rejected"),
    ]
    assert (lines[0]["webhook_id"], lines[0]["event_id"], lines[0]["session_id"]) == (
        "msg_a",
        "evt_test",
        "sess_1",
    )
    assert (lines[2]["webhook_id"], lines[2]["reason"]) == ("msg_b", "late_signal")
    assert "webhook_id" not in lines[3]  # unverified header values are not logged
    output = log_output.getvalue()
    for needle in (
        SECRET,
        SECRET.removeprefix("whsec_"),
        headers["webhook-signature"].partition(",")[2],
        "Zm9yZ2Vk",
    ):
        assert needle not in output


def test_outcomes_are_counted_and_metrics_are_not_on_the_public_app(client: TestClient, metrics: Metrics) -> None:
    """L5: outcomes are counted for Prometheus, in the registry ``serve`` exposes on
    CONTROLLER_METRICS_PORT; the public app has no ``/metrics`` (a client of the webhook
    endpoint gets no 10 KB answer for a 40-byte request)."""
    post(client, "environment_connection")
    post(client, "in_progress", webhook_id="msg_late")
    post(client, "idle", webhook_id="msg_idle")
    assert client.get("/metrics").status_code == 404
    text = metrics.render().decode()
    assert 'controller_webhooks_total{outcome="enqueued",reason="environment_connection"} 1.0' in text
    assert 'controller_webhooks_total{outcome="ignored",reason="late_signal"} 1.0' in text
    assert 'controller_webhooks_total{outcome="enqueued",reason="session_idle"} 1.0' in text


def test_with_prestart_a_creation_is_enqueued(inbox: FakeInbox, clock: FakeClock) -> None:
    """L9's eager mode: a receiver told some agents pre-start queues a self-hosted session's
    creation (the worker decides whether its agent is one of them)."""
    settings = WebhookSettings(secrets=(Secret(SECRET),))
    services = ReceiverServices.from_settings(settings, inbox, clock, prestart=True)
    with TestClient(create_app(services)) as client:
        assert post(client, "created", webhook_id="msg_created").json() == {"status": "enqueued"}
    assert inbox.jobs == [Job("sess_1", "msg_created", "agent.session.created", "evt_test")]


def test_services_from_settings(inbox: FakeInbox, clock: FakeClock) -> None:
    """L3: settings' secrets (several, during rotation) build the verifier."""
    settings = WebhookSettings(secrets=(Secret(OTHER_SECRET), Secret(SECRET)), max_body_bytes=1024)
    services = ReceiverServices.from_settings(settings, inbox, clock)
    assert services.max_body_bytes == 1024
    with TestClient(create_app(services)) as client:
        assert post(client, "failed").json() == {"status": "enqueued"}


@pytest.mark.parametrize(
    ("hint", "seconds"),
    [(None, 5), (0, 1), (0.1, 1), (2.0, 2), (2.5, 3), (float("inf"), 5), (float("nan"), 5), (1e9, 600)],
)
def test_retry_after_is_whole_seconds(hint: float | None, seconds: int) -> None:
    """L5: Retry-After is a whole number of seconds within sane bounds."""
    assert retry_after_seconds(hint) == seconds


# -- cheap rejections: headers before the body, a deadline on the body ---------------------------


def raw_post(app: Any, headers: list[tuple[bytes, bytes]], receive: Any) -> list[dict[str, Any]]:
    """Drive the ASGI app directly (TestClient reads the whole body before the app runs)."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    anyio.run(app, asgi_scope(headers), receive, send)
    return sent


def asgi_scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/webhooks",
        "raw_path": b"/webhooks",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="none"),
        pytest.param({k: v for k, v in WELL_FORMED.items() if k != "webhook-signature"}, id="no-signature"),
        pytest.param({k: v for k, v in WELL_FORMED.items() if k != "webhook-id"}, id="no-id"),
        pytest.param({**WELL_FORMED, "webhook-timestamp": str(NOW - 301)}, id="stale"),
        pytest.param({**WELL_FORMED, "webhook-timestamp": str(NOW + 301)}, id="future"),
        pytest.param({**WELL_FORMED, "webhook-timestamp": "soon"}, id="garbled-timestamp"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v2,abc"}, id="no-v1-entry"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v1," + "A" * 5000}, id="huge"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v1,not*base64!"}, id="not-base64"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v1,AAAA"}, id="short-digest"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v1," + "A" * 43 + "*"}, id="digest-length-not-base64"),
        pytest.param({**WELL_FORMED, "webhook-signature": "v1," + "A" * 43}, id="digest-without-padding"),
    ],
)
def test_headers_that_cannot_be_genuine_are_refused_before_the_body(
    inbox: FakeInbox, clock: FakeClock, headers: dict[str, str]
) -> None:
    """L3: missing or malformed signature headers, or a timestamp outside the window, get 401
    without a single body byte read, and the connection is closed (the body is never drained)."""
    metrics = Metrics()
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics))
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": True}

    sent = raw_post(app, [(k.encode(), v.encode()) for k, v in headers.items()], receive)
    assert sent[0]["status"] == 401
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["reason"] == "signature"
    assert pulled == 0
    assert inbox.attempts == 0
    assert metrics.value(WEBHOOKS_TOTAL, outcome="rejected", reason="signature") == 1


def test_a_flood_of_refused_deliveries_writes_one_line_per_reason(
    inbox: FakeInbox, clock: FakeClock, log_output: io.StringIO
) -> None:
    """L3: 200 unsigned deliveries (forged, stale) and 50 that find every slot taken cost one
    warning per reason (``LOG_EVERY_SECONDS``), not one each: a client without the secret cannot
    fill the log; the metric counts every one."""
    metrics = Metrics()
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics, max_in_flight=1))

    async def never() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def scenario() -> None:
        stale = {**WELL_FORMED, "webhook-timestamp": str(NOW - 3600)}
        for headers in [{**WELL_FORMED, "webhook-signature": "v1,forged"}, stale] * 100:
            wire = [(k.encode(), v.encode()) for k, v in headers.items()]
            await app(asgi_scope(wire), never, _discard)
        async with anyio.create_task_group() as group:
            group.start_soon(app, asgi_scope(WIRE_HEADERS), never, _discard)  # holds the only slot
            await anyio.sleep(0.01)
            for _ in range(50):
                await app(asgi_scope(WIRE_HEADERS), never, _discard)
            group.cancel_scope.cancel()

    anyio.run(scenario)
    lines = [(line["event"], line["reason"], line.get("count")) for line in lines_of(log_output)]
    assert lines == [("webhook.rejected", "signature", 1), ("webhook.unavailable", "busy", 1)]
    assert metrics.value(WEBHOOKS_TOTAL, outcome="rejected", reason="signature") == 200
    assert metrics.value(WEBHOOKS_TOTAL, outcome="unavailable", reason="busy") == 50


async def _discard(message: dict[str, Any]) -> None:
    pass


def test_a_body_that_stalls_is_cut_off_at_the_deadline(inbox: FakeInbox, clock: FakeClock) -> None:
    """L3: a well-formed delivery whose body stops arriving gets 408 once the body deadline
    passes; the connection is closed and nothing is queued."""
    metrics = Metrics()
    services = ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics, body_timeout_seconds=0.2)
    app = create_app(services)
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled > 3:
            await anyio.sleep_forever()  # a slow client: the only way out is the deadline
        return {"type": "http.request", "body": b"{", "more_body": True}

    sent = raw_post(app, WIRE_HEADERS, receive)
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["reason"] == "timeout"
    assert pulled == 4
    assert inbox.attempts == 0
    assert metrics.value(WEBHOOKS_TOTAL, outcome="rejected", reason="timeout") == 1


def test_body_timeout_comes_from_settings(inbox: FakeInbox, clock: FakeClock) -> None:
    """L3: CONTROLLER_WEBHOOK_BODY_TIMEOUT_SECONDS reaches the receiver."""
    settings = WebhookSettings(secrets=(Secret(SECRET),), body_timeout_seconds=2.5)
    assert ReceiverServices.from_settings(settings, inbox, clock).body_timeout_seconds == 2.5


# -- verified deliveries the queue can never hold -------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "detail"),
    [
        pytest.param("\ud800", "session_id is not encodable text (lone surrogate)", id="lone-surrogate"),
        pytest.param("sess_\udfff_x", "session_id is not encodable text (lone surrogate)", id="low-surrogate"),
        pytest.param(
            "s" * (MAX_SESSION_ID_CHARS + 1),
            f"session id is longer than {MAX_SESSION_ID_CHARS} characters",
            id="too-long",
        ),
    ],
)
def test_a_verified_delivery_that_can_never_be_queued_is_422(
    client: TestClient, inbox: FakeInbox, metrics: Metrics, log_output: io.StringIO, session_id: str, detail: str
) -> None:
    """L5: a genuine delivery whose job no retry could queue gets 422 with a reason, not 503
    (which the sender would retry for 72 hours); it is counted and logged as rejected."""
    body = json.dumps(action_required("environment_connection", session_id)).encode()  # "\ud800" escaped
    headers, raw = signed(body, webhook_id="msg_bad_id")
    response = client.post("/webhooks", content=raw, headers=headers)
    assert response.status_code == 422
    assert response.json() == {"status": "rejected", "reason": "unqueueable", "detail": detail}
    assert inbox.attempts == 0
    assert metrics.value(WEBHOOKS_TOTAL, outcome="rejected", reason="unqueueable") == 1
    (line,) = [line for line in lines_of(log_output) if line["event"] == "webhook.rejected"]
    assert (line["reason"], line["webhook_id"]) == ("unqueueable", "msg_bad_id")
    assert len(line["session_id"]) <= 257 and line["session_id"].encode("utf-8")  # escaped, cut: still a log line


def test_an_unqueueable_session_id_that_is_ignored_anyway_is_200(client: TestClient, inbox: FakeInbox) -> None:
    """L9: an event that asks for no work is acknowledged whatever its session id holds."""
    headers, raw = signed(json.dumps(session_event("agent.session.in_progress", "\ud800")).encode())
    assert client.post("/webhooks", content=raw, headers=headers).json() == {
        "status": "ignored",
        "reason": "late_signal",
    }
    assert inbox.attempts == 0


def test_a_session_id_at_the_length_cap_is_queued(client: TestClient, inbox: FakeInbox) -> None:
    """L5: the cap refuses only the absurd; a long but plausible id is queued."""
    headers, raw = signed(action_required("environment_connection", "s" * MAX_SESSION_ID_CHARS))
    assert client.post("/webhooks", content=raw, headers=headers).json() == {"status": "enqueued"}
    assert inbox.jobs[0].session_id == "s" * MAX_SESSION_ID_CHARS


def test_a_lone_surrogate_against_the_redis_inbox_is_422_not_503(clock: FakeClock) -> None:
    """L5: the case that used to be a 503 for ever: the Redis inbox cannot encode the id (its
    key would fail to encode), so the receiver refuses it before submitting; a good delivery
    through the same inbox is queued."""
    import fakeredis

    from controller.store.redis import RedisInbox

    server = fakeredis.FakeServer()

    class NoReplicas:
        """fakeredis's async client with the pipelined client's script call: no replica to wait for."""

        def __init__(self) -> None:
            self._client = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)

        def register_script(self, text: str) -> Any:
            script = self._client.register_script(text)

            async def call(keys: Any = (), args: Any = (), replicated: bool = False) -> Any:
                return await script(keys=keys, args=args)

            return call

    def inbox() -> RedisInbox:
        return RedisInbox(NoReplicas(), "q", 3600)  # type: ignore[arg-type]

    with pytest.raises(UnicodeEncodeError):  # what the receiver used to turn into a 503
        anyio.run(inbox().submit, Job("\ud800", "msg_direct", "agent.session.action_required"))
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox(), clock, LIMIT))
    queued = fakeredis.FakeRedis(server=server, decode_responses=True)
    with TestClient(app) as test_client:
        headers, raw = signed(json.dumps(action_required("environment_connection", "\ud800")).encode())
        response = test_client.post("/webhooks", content=raw, headers=headers)
        assert (response.status_code, response.json()["reason"]) == (422, "unqueueable")
        assert queued.llen("q") == 0
        good = post(test_client, "environment_connection", webhook_id="msg_good")
        assert (good.status_code, good.json()) == (200, {"status": "enqueued"})
        (message,) = queued.lrange("q", 0, -1)
        assert json.loads(base64.b64decode(json.loads(message)["body"]))[0] == ["sess_1"]


def test_deliveries_beyond_max_in_flight_get_503_before_their_body_is_read(
    inbox: FakeInbox, clock: FakeClock, metrics: Metrics
) -> None:
    """L5: while max_in_flight deliveries are being read, another gets 503 + Retry-After (the
    sender retries) without a body byte read, and its connection is closed; junk headers are
    still a 401; once the slot is free, deliveries are accepted again."""
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics, max_in_flight=1))
    headers, body = signed(SAMPLE_ENVELOPES["environment_connection"], webhook_id="msg_slow")
    wire = [(k.encode(), v.encode()) for k, v in headers.items()]
    answers: dict[str, list[dict[str, Any]]] = {}
    pulled = {"busy": 0, "junk": 0, "after": 0}

    async def scenario() -> None:
        release = anyio.Event()
        started = anyio.Event()

        async def slow_receive() -> dict[str, Any]:
            started.set()
            await release.wait()
            return {"type": "http.request", "body": body, "more_body": False}

        def counting(name: str) -> Any:
            async def receive() -> dict[str, Any]:
                pulled[name] += 1
                return {"type": "http.request", "body": body, "more_body": False}

            return receive

        async def call(name: str, headers: list[tuple[bytes, bytes]], receive: Any) -> None:
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            await app(asgi_scope(headers), receive, send)
            answers[name] = sent

        async with anyio.create_task_group() as group:
            group.start_soon(call, "slow", wire, slow_receive)
            await started.wait()
            await call("busy", wire, counting("busy"))
            await call("junk", [], counting("junk"))
            release.set()
        await call(
            "after",
            [(k.encode(), v.encode()) for k, v in signed(body, webhook_id="msg_after")[0].items()],
            counting("after"),
        )

    anyio.run(scenario)
    busy = answers["busy"][0]
    assert busy["status"] == 503
    assert (b"connection", b"close") in busy["headers"] and (b"retry-after", b"5") in busy["headers"]
    assert pulled["busy"] == 0
    assert pulled["junk"] == 0 and answers["junk"][0]["status"] == 401
    assert answers["slow"][0]["status"] == 200
    assert answers["after"][0]["status"] == 200
    assert [job.webhook_id for job in inbox.jobs] == ["msg_slow", "msg_after"]
    assert metrics.value(WEBHOOKS_TOTAL, outcome="unavailable", reason="busy") == 1


def test_a_small_delivery_needs_no_slot_so_a_flood_holding_them_cannot_keep_it_out(
    inbox: FakeInbox, clock: FakeClock, metrics: Metrics
) -> None:
    """L5: with every in-flight slot held by deliveries that declared 256 KiB and send nothing
    more (a flood without the secret), a genuine delivery declaring its few-KiB body is read
    without a slot and accepted (its body is no more than the server holds for any connection:
    ``SLOTLESS_BODY_BYTES``); one declaring a body over that still gets 503 before its body."""
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, 256 * 1024, metrics, max_in_flight=2))
    headers, body = signed(SAMPLE_ENVELOPES["environment_connection"], webhook_id="msg_genuine")
    genuine = [(k.encode(), v.encode()) for k, v in headers.items()] + [(b"content-length", b"%d" % len(body))]
    big = receiver_module.SLOTLESS_BODY_BYTES + 1
    flood = [*WIRE_HEADERS, (b"content-length", b"%d" % big)]
    answers: dict[str, int] = {}

    async def stalled() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    async def whole() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def call(name: str, wire: list[tuple[bytes, bytes]], receive: Any) -> None:
        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answers[name] = message["status"]

        await app(asgi_scope(wire), receive, send)

    async def scenario() -> None:
        async with anyio.create_task_group() as group:
            for index in range(2):
                group.start_soon(call, f"flood{index}", flood, stalled)
            await anyio.sleep(0.01)
            await call("genuine", genuine, whole)
            await call("large", flood, stalled)
            group.cancel_scope.cancel()

    anyio.run(scenario)
    assert {name: answers[name] for name in ("genuine", "large")} == {"genuine": 200, "large": 503}
    assert [job.webhook_id for job in inbox.jobs] == ["msg_genuine"]


def test_max_in_flight_comes_from_settings(inbox: FakeInbox, clock: FakeClock) -> None:
    """L5: CONTROLLER_WEBHOOK_MAX_IN_FLIGHT reaches the receiver."""
    settings = WebhookSettings(secrets=(Secret(SECRET),), max_in_flight=7)
    assert ReceiverServices.from_settings(settings, inbox, clock).max_in_flight == 7


def test_a_delivery_reading_its_body_too_long_is_cut_off_for_a_newer_one(
    inbox: FakeInbox, clock: FakeClock, metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L5: with every in-flight slot held by a delivery still reading its body past the grace
    (a client trickling it), a new delivery takes the slot at once: the old one is cut off with
    408 (reason ``timeout``), the new one is accepted; a reader within the grace is never cut."""
    monkeypatch.setattr(receiver_module, "READING_GRACE_SECONDS", 0.2)
    app = create_app(ReceiverServices(Verifier([SECRET]), inbox, clock, LIMIT, metrics, max_in_flight=1))
    _, body = signed(SAMPLE_ENVELOPES["environment_connection"], webhook_id="msg_trickled")
    answers: dict[str, int] = {}

    async def scenario() -> None:
        started = anyio.Event()

        async def never_finishes() -> dict[str, Any]:
            started.set()
            await anyio.sleep(30)
            return {"type": "http.request", "body": body, "more_body": False}

        async def call(name: str, webhook_id: str, receive: Any) -> None:
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            wire = [(k.encode(), v.encode()) for k, v in signed(body, webhook_id=webhook_id)[0].items()]
            await app(asgi_scope(wire), receive, send)
            answers[name] = sent[0]["status"]

        async def whole() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(call, "trickled", "msg_trickled", never_finishes)
                await started.wait()
                await call("too_soon", "msg_too_soon", whole)  # within the grace: 503, nothing cut
                await anyio.sleep(0.3)
                await call("genuine", "msg_genuine", whole)

    anyio.run(scenario)
    assert answers == {"trickled": 408, "too_soon": 503, "genuine": 200}
    assert [job.webhook_id for job in inbox.jobs] == ["msg_genuine"]
    assert metrics.value(WEBHOOKS_TOTAL, outcome="rejected", reason="timeout") == 1
