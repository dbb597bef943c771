"""In-memory fakes that honour the controller's protocols (no mocks), and a fake sender."""

from __future__ import annotations

import json
import threading
from typing import Any

from controller.errors import QueueUnavailable
from controller.inbox import Job, Outcome
from controller.signing import sign_headers


class FakeInbox:
    """An ``Inbox`` in memory: de-duplicates on ``webhook_id``, remembering an id only
    after its job was queued (so a failed submit is processed on retry, L5).

    Set ``unavailable = True`` to make ``submit`` raise ``QueueUnavailable`` (with
    ``retry_after``) and ``ready`` answer False, as a broker outage would.
    """

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.attempts = 0
        self.unavailable = False
        self.retry_after: float | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, job: Job) -> Outcome:
        with self._lock:
            self.attempts += 1
            if self.unavailable:
                raise QueueUnavailable("fake broker is down", retry_after=self.retry_after)
            if job.webhook_id in self._seen:
                return Outcome.DUPLICATE
            self.jobs.append(job)
            self._seen.add(job.webhook_id)
            return Outcome.ENQUEUED

    def ready(self) -> bool:
        return not self.unavailable


# --- A fake sender: the Agents API's envelopes and signed deliveries --------------------

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
