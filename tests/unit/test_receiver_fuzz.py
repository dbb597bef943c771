"""Hypothesis against the receiver: any delivery gets 2xx/4xx, and only verified,
enqueue-worthy, queueable events reach the inbox (controller/endpoint/app.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from controller.endpoint import ReceiverServices, create_app
from controller.endpoint.app import Unqueueable, check_queueable
from controller.errors import BadPayload, SignatureError
from controller.events import HANDLED_TYPES, MALFORMED_SESSION_ID, classify, parse
from controller.inbox import Job
from controller.signing import Verifier, secret_key, sign
from controller.trust import valid_id
from tests.support.clock import FakeClock
from tests.support.deliveries import SAMPLE_ENVELOPES, SECRET
from tests.support.fakes import FakeInbox
from tests.support.signing import verify

pytestmark = pytest.mark.timeout(120)

NOW = 1_700_000_000
LIMIT = 2048
INBOX = FakeInbox()
CLIENT = TestClient(create_app(ReceiverServices(Verifier([SECRET]), INBOX, FakeClock(NOW), LIMIT)))
ORACLE = Verifier([SECRET])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
session_ids = st.sampled_from(["sess_1", "", None, 7]) | st.text(max_size=12)
event_types = st.sampled_from(sorted({e["type"] for e in SAMPLE_ENVELOPES.values()})) | st.text(max_size=30)
action_types = st.sampled_from(["environment_connection", "function_call", "mcp_approval_request"]) | st.text()


def sometimes(draw: st.DrawFn) -> bool:
    return draw(st.sampled_from([True, False, False, False]))


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    """Valid envelopes of every type, and mutations of them."""
    base = dict(draw(st.sampled_from(list(SAMPLE_ENVELOPES.values()))))
    if sometimes(draw):
        base["data"] = {**base["data"], "id": draw(session_ids)}
    if sometimes(draw):
        base["type"] = draw(event_types)
    if sometimes(draw):
        action = draw(st.fixed_dictionaries({"type": action_types}) | json_values)
        base["data"] = {**base["data"], "required_action": action}
    if sometimes(draw):
        base[draw(st.sampled_from(["id", "created_at", "data", "type", "extra"]))] = draw(json_values)
    return base


envelope_bodies = envelopes().map(lambda v: json.dumps(v).encode())
work_bodies = st.builds(
    lambda name, session_id, event_id: json.dumps(
        {
            **SAMPLE_ENVELOPES[name],
            "id": event_id,
            "data": {**SAMPLE_ENVELOPES[name]["data"], "id": session_id},
        }
    ).encode(),
    st.sampled_from(["environment_connection", "failed"]),
    st.text(min_size=1, max_size=12)
    | st.text(st.characters(exclude_categories=()), min_size=1, max_size=6)  # lone surrogates too
    | st.integers(250, 270).map(lambda n: "s" * n),
    st.text(max_size=12),
)
"""Envelopes that ask for work, with arbitrary (non-empty) session ids, some unqueueable."""
bodies = st.one_of(
    work_bodies,
    work_bodies,
    envelope_bodies,
    envelope_bodies,
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda n: b"{" + b" " * n + b"}", st.integers(LIMIT - 10, LIMIT + 10)),
)

garbage_text = st.text(max_size=40)
garbage_bytes = st.binary(max_size=40)
huge = st.integers(4000, 9000).map(lambda n: "1" * n)
webhook_ids = st.sampled_from(["msg_1", "msg_2"]) | st.text(alphabet="abcdef_0123456789", min_size=1, max_size=16)
in_window = st.integers(NOW - 300, NOW + 300)
timestamps = st.one_of(in_window, in_window, in_window, st.sampled_from([NOW - 301, NOW + 301, 0, 2**40]))


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[tuple[str, str | bytes]], bytes]:
    """A body plus headers: missing, garbled, non-ASCII, huge, or a valid signature (with garbage)."""
    body = draw(bodies)
    webhook_id = draw(webhook_ids)
    timestamp = draw(timestamps)
    good = sign(secret_key(SECRET), webhook_id, timestamp, body)
    genuine = [("webhook-id", webhook_id), ("webhook-timestamp", str(timestamp)), ("webhook-signature", good)]
    if draw(st.sampled_from([True, True, False])):  # mostly genuine, so verified bodies get fuzzed too
        return genuine, body
    signature = draw(
        st.sampled_from([good, f"v1,bogus {good}", f"{good} v2,xyz", good + "x", good.replace("v1,", "v1;")])
        | garbage_text
        | huge
    )
    candidates: dict[str, Any] = {
        "webhook-id": draw(st.just(webhook_id) | garbage_text | garbage_bytes | huge),
        "webhook-timestamp": draw(st.just(str(timestamp)) | garbage_text | garbage_bytes | huge),
        "webhook-signature": draw(st.just(signature) | garbage_bytes),
    }
    present = draw(st.just(set(candidates)) | st.sets(st.sampled_from(sorted(candidates))))  # often all three
    return [(name, value) for name, value in candidates.items() if name in present], body


def expected(headers: list[tuple[str, str | bytes]], body: bytes) -> tuple[int, Job | None]:
    """What the receiver must do, decided by the library functions themselves."""
    # Starlette decodes header bytes as latin-1; text goes on the wire as UTF-8.
    plain = {
        name: (value if isinstance(value, bytes) else value.encode("utf-8")).decode("latin-1")
        for name, value in headers
    }
    try:
        ORACLE.precheck(plain, NOW)  # headers first: a delivery that cannot be genuine costs no body
    except SignatureError:
        return 401, None
    if len(body) > LIMIT:
        return 413, None
    try:
        verified = verify(ORACLE, plain, body, NOW)
    except SignatureError:
        return 401, None
    try:
        event = parse(body)
    except BadPayload:
        return 400, None
    disposition = classify(event)
    malformed = disposition == MALFORMED_SESSION_ID
    if not disposition.enqueue and not malformed:
        return 200, None
    assert event.session_id
    job = Job(event.session_id, verified.webhook_id, event.type, event.id)
    try:
        check_queueable(job)
    except Unqueueable:
        return 422, None
    if malformed:  # work for an id that fails the id pattern: a 4xx with a reason (L2)
        return 422, None
    return 200, job


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(deliveries())
def test_any_delivery_gets_2xx_or_4xx_and_only_genuine_work_is_queued(
    delivery: tuple[list[tuple[str, str | bytes]], bytes],
) -> None:
    """L3, L4, L5: never a 5xx for bad input; only verified, enqueue-worthy events whose job the
    queue can hold reach the inbox (an unqueueable one is a 422, never a 503 retried for ever)."""
    headers, body = delivery
    before = len(INBOX.jobs)
    wire = [(name, value.encode("utf-8") if isinstance(value, str) else value) for name, value in headers]
    response = CLIENT.post("/webhooks", content=body, headers=wire)
    status, job = expected(headers, body)
    event(f"status {status}" + (" enqueue" if job else ""))

    assert response.status_code < 500, response.text
    assert response.status_code == status, response.text
    new_jobs = INBOX.jobs[before:]
    if job is None:
        assert new_jobs == []
        if status == 200:
            assert response.json()["status"] == "ignored"
        if status == 422:
            assert response.json()["reason"] == "unqueueable"
    else:
        assert response.json()["status"] in {"enqueued", "duplicate"}
        assert new_jobs in ([job], [])  # [] only when this webhook-id was queued before
        assert job.webhook_id in {j.webhook_id for j in INBOX.jobs}
    assert all(classify_job_ok(j) for j in new_jobs)


def classify_job_ok(job: Job) -> bool:
    check_queueable(job)
    return valid_id(job.session_id) and job.event_type in HANDLED_TYPES


@settings(max_examples=100, deadline=None)
@given(
    method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    path=st.sampled_from(["/webhooks", "/x"]),
)
def test_other_methods_and_paths_are_4xx(method: str, path: str) -> None:
    """L3: anything but POST /webhooks is a 4xx (never 410, never 5xx)."""
    before = INBOX.attempts
    response = CLIENT.request(method, path)
    assert 400 <= response.status_code < 500 and response.status_code != 410
    assert INBOX.attempts == before
