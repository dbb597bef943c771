"""A fake sender: the Agents API's event envelopes and signed webhook deliveries."""

from __future__ import annotations

import json
from typing import Any

from controller.signing import sign_headers

SECRET = "whsec_" + "dGVzdCBzaWduaW5nIHNlY3JldCBmb3IgdW5pdCB0ZXN0cw=="  # b64("test signing secret for unit tests")


def envelope(
    event_type: str, data: dict[str, Any], event_id: str = "evt_test", created_at: int = 1_700_000_000
) -> dict[str, Any]:
    """An event envelope as the Agents API sends it."""
    return {"id": event_id, "object": "event", "created_at": created_at, "type": event_type, "data": data}


def action_required(action_type: str, session_id: str = "sess_1") -> dict[str, Any]:
    return envelope("agent.session.action_required", {"id": session_id, "required_action": {"type": action_type}})


def session_event(event_type: str, session_id: str = "sess_1") -> dict[str, Any]:
    data = {"id": session_id, "environment_type": "self_hosted", "environment_id": "env_1"}
    return envelope(event_type, data)


SAMPLE_ENVELOPES: dict[str, dict[str, Any]] = {
    "created": envelope(
        "agent.session.created",
        {
            "id": "sess_1",
            "environment_type": "self_hosted",
            "environment_id": "env_1",
            "connect": {"remote_url": "https://api.openai.com/v1/agents/env"},
        },
    ),
    "environment_connection": action_required("environment_connection"),
    "function_call": action_required("function_call"),
    "mcp_approval_request": action_required("mcp_approval_request"),
    "computer_use_approval_request": action_required("computer_use_approval_request"),
    "future_action": action_required("some_future_action"),
    "in_progress": session_event("agent.session.in_progress"),
    "idle": session_event("agent.session.idle"),
    "failed": session_event("agent.session.failed"),
    "environment.ready": envelope("agent.environment.ready", {"id": "env_1"}),
    "environment.failed": envelope("agent.environment.failed", {"id": "env_1"}),
    "environment.suspended": envelope("agent.environment.suspended", {"id": "env_1"}),
    "environment.expired": envelope("agent.environment.expired", {"id": "env_1"}),
    "environment.connected": envelope("environment.connected", {"id": "env_1"}),
    "environment.disconnected": envelope("environment.disconnected", {"id": "env_1"}),
    "environment.pending": envelope("environment.pending", {"id": "env_1"}),
    "response.completed": envelope("response.completed", {"id": "resp_123"}),
    "future_session_event": session_event("agent.session.something_new"),
}
"""One envelope per event type the contract names, plus unknown future ones."""


def signed(
    body: bytes | dict[str, Any],
    webhook_id: str = "msg_1",
    timestamp: int = 1_700_000_000,
    secret: str = SECRET,
) -> tuple[dict[str, str], bytes]:
    """Headers and raw body of a genuine delivery."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return sign_headers(secret, webhook_id, timestamp, raw), raw
