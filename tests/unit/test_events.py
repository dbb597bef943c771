"""Parsing verified envelopes and deciding what to enqueue (controller/events.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.errors import BadPayload
from controller.events import HANDLED_TYPES, Disposition, Event, classify, handled_types, parse
from tests.support.deliveries import SAMPLE_ENVELOPES, envelope

ENQUEUE_CONNECTION = Disposition(True, "environment_connection")
ENQUEUE_FAILED = Disposition(True, "session_failed")


def disposition_of(name: str) -> Disposition:
    return classify(parse(json.dumps(SAMPLE_ENVELOPES[name]).encode()))


def test_environment_connection_is_enqueued() -> None:
    """L4: an action_required event asking for an environment_connection is enqueued."""
    assert disposition_of("environment_connection") == ENQUEUE_CONNECTION


def test_failed_session_is_enqueued() -> None:
    """L4: agent.session.failed is enqueued so the worker releases the session's compute."""
    assert disposition_of("failed") == ENQUEUE_FAILED


@pytest.mark.parametrize(
    "name", ["function_call", "mcp_approval_request", "computer_use_approval_request", "future_action"]
)
def test_other_required_actions_are_dropped(name: str) -> None:
    """L4: function calls, MCP and computer-use approvals are not ours: acknowledge and drop."""
    assert disposition_of(name) == Disposition(False, "other_required_action")


@pytest.mark.parametrize(
    ("name", "reason"),
    [("created", "session_created"), ("in_progress", "late_signal")],
)
def test_late_signals_never_start_compute(name: str, reason: str) -> None:
    """L9: without pre-start, created and in_progress never enqueue a start."""
    assert disposition_of(name) == Disposition(False, reason)


def test_with_prestart_a_self_hosted_sessions_creation_is_enqueued() -> None:
    """L9's eager mode: with pre-start on, a self-hosted session's creation is work (the worker
    decides whether its agent pre-starts); another environment type's is still dropped, and
    in_progress stays a late signal."""
    created = parse(json.dumps(SAMPLE_ENVELOPES["created"]).encode())
    assert created.data["environment_type"] == "self_hosted"
    assert classify(created, prestart=True) == Disposition(True, "session_created_prestart")
    hosted = parse(json.dumps(envelope("agent.session.created", {"id": "sess_1", "environment_type": "none"})).encode())
    assert classify(hosted, prestart=True) == Disposition(False, "session_created")
    odd = parse(
        json.dumps(envelope("agent.session.created", {"id": "bad id!", "environment_type": "self_hosted"})).encode()
    )
    assert classify(odd, prestart=True) == Disposition(False, "malformed_session_id")
    in_progress = parse(json.dumps(SAMPLE_ENVELOPES["in_progress"]).encode())
    assert classify(in_progress, prestart=True) == Disposition(False, "late_signal")


def test_idle_is_enqueued_as_a_timer_signal() -> None:
    """L11/L13: an idle event asks for a look (the worker re-reads and arms the idle check);
    whether anything starts or stops is decided from the re-read session, never from the event."""
    assert disposition_of("idle") == Disposition(True, "session_idle")


@pytest.mark.parametrize(
    "name",
    [
        "environment.ready",
        "environment.failed",
        "environment.suspended",
        "environment.expired",
        "environment.connected",
        "environment.disconnected",
        "environment.pending",
    ],
)
def test_connection_events_are_reports(name: str) -> None:
    """L10: environment events report on the link; they never ask for compute."""
    assert disposition_of(name) == Disposition(False, "environment_report")


@pytest.mark.parametrize("name", ["response.completed", "future_session_event"])
def test_unknown_types_are_acknowledged(name: str) -> None:
    """L4: an event type this controller does not know is acknowledged and dropped."""
    assert disposition_of(name) == Disposition(False, "unknown_type")


def test_only_three_kinds_are_ever_enqueued() -> None:
    """L4, L9, L10, L13: across every sample, exactly the connection request, the failure and the
    idle signal (a timer signal: it asks for a look, never for compute) enqueue."""
    enqueued = {name for name in SAMPLE_ENVELOPES if disposition_of(name).enqueue}
    assert enqueued == {"environment_connection", "failed", "idle"}


@pytest.mark.parametrize("prestart", [False, True])
def test_handled_types_are_exactly_what_classify_enqueues(prestart: bool) -> None:
    """L4: the webhook subscription (``handled_types``) and ``classify`` are one truth, with and
    without pre-start: every type some sample enqueues is subscribed, and every subscribed type
    has a sample that enqueues."""
    envelopes = [parse(json.dumps(raw).encode()) for raw in SAMPLE_ENVELOPES.values()]
    enqueued_types = {event.type for event in envelopes if classify(event, prestart).enqueue}
    assert enqueued_types == set(handled_types(prestart))
    assert len(handled_types(prestart)) == len(set(handled_types(prestart)))
    assert handled_types(False) == HANDLED_TYPES


def test_parse_keeps_ids_and_raw_data() -> None:
    """L4: the event carries what the job needs: ids and the action type."""
    raw = envelope(
        "agent.session.action_required",
        {"id": "sess_9", "required_action": {"type": "environment_connection", "extra": [1, 2]}},
        event_id="evt_9",
        created_at=1750861210,
    )
    event = parse(json.dumps(raw).encode())
    assert event == Event(
        id="evt_9",
        type="agent.session.action_required",
        created_at=1750861210,
        session_id="sess_9",
        required_action_type="environment_connection",
        data=raw["data"],
    )
    assert hash(event) == hash(event)  # frozen and hashable despite the raw dict


def test_environment_events_carry_no_session_id() -> None:
    """L10: an environment event's data.id is an environment, not a session."""
    event = parse(json.dumps(SAMPLE_ENVELOPES["environment.ready"]).encode())
    assert (event.session_id, event.required_action_type) == (None, None)


def test_unknown_fields_are_tolerated() -> None:
    """L4: an envelope that grows new fields still parses; missing id/created_at default."""
    body = {"type": "agent.session.failed", "data": {"id": "sess_1", "new": {"x": 1}}, "new_field": True}
    event = parse(json.dumps(body).encode())
    assert (event.id, event.created_at, event.session_id) == ("", 0, "sess_1")


def test_classify_without_session_id_drops() -> None:
    """L4: a hand-built event without a session id is never enqueued."""
    event = Event("evt", "agent.session.failed", 0, None, None, {})
    assert classify(event) == Disposition(False, "no_session")


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xff\xfe{}", id="not-utf8"),
        pytest.param(b"", id="empty"),
        pytest.param(b"{", id="truncated"),
        pytest.param(b"not json", id="text"),
        pytest.param(b'{"type": "agent.session.failed", "data": {"id": "s"}, "x": NaN}', id="nan"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deeply-nested"),
        pytest.param(_json([1, 2]), id="array"),
        pytest.param(_json("agent.session.failed"), id="string"),
        pytest.param(_json(None), id="null"),
        pytest.param(_json({"data": {"id": "s"}}), id="no-type"),
        pytest.param(_json({"type": "", "data": {}}), id="empty-type"),
        pytest.param(_json({"type": 7, "data": {}}), id="int-type"),
        pytest.param(_json({"type": "agent.session.failed"}), id="no-data"),
        pytest.param(_json({"type": "agent.session.failed", "data": ["sess_1"]}), id="data-list"),
        pytest.param(_json({"type": "agent.session.failed", "data": {}}), id="failed-no-session"),
        pytest.param(_json({"type": "agent.session.failed", "data": {"id": 12}}), id="int-session"),
        pytest.param(_json({"type": "agent.session.idle", "data": {"id": ""}}), id="empty-session"),
        pytest.param(_json({"type": "agent.session.action_required", "data": {"id": "s"}}), id="no-action"),
        pytest.param(
            _json({"type": "agent.session.action_required", "data": {"id": "s", "required_action": "x"}}),
            id="action-not-object",
        ),
        pytest.param(
            _json({"type": "agent.session.action_required", "data": {"id": "s", "required_action": {}}}),
            id="action-no-type",
        ),
        pytest.param(_json({"id": 5, "type": "agent.session.failed", "data": {"id": "s"}}), id="int-id"),
        pytest.param(
            _json({"created_at": "now", "type": "agent.session.failed", "data": {"id": "s"}}),
            id="str-created",
        ),
        pytest.param(
            _json({"created_at": True, "type": "agent.session.failed", "data": {"id": "s"}}),
            id="bool-created",
        ),
    ],
)
def test_malformed_envelopes_are_bad_payload(body: bytes) -> None:
    """L3: a verified but malformed body is rejected with 400, never enqueued."""
    with pytest.raises(BadPayload) as caught:
        parse(body)
    assert caught.value.status_code == 400
