"""Validation of request bodies, with errors the way the API words them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents_simulator.errors import bad_request
from agents_simulator.state import DEFAULT_WORKSPACE

ENVIRONMENT_TYPES = ("none", "openai_hosted", "self_hosted")
MAX_METADATA_PAIRS = 16


@dataclass(frozen=True)
class NewSession:
    environment_type: str
    workspace_directory: str
    capability_directories: list[str]
    agent: dict[str, Any] | None
    agent_id: str | None
    has_input: bool
    metadata: dict[str, str]
    vault_ids: list[str]
    review: str | None


def new_session(body: Any) -> NewSession:
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    if body.get("stream"):
        raise bad_request("Streaming is not supported by the simulator.", "stream")
    environment = body.get("environment")
    if not isinstance(environment, dict) or environment.get("type") not in ENVIRONMENT_TYPES:
        raise bad_request(
            "'environment' is required and its 'type' must be one of 'none', 'openai_hosted', 'self_hosted'.",
            "environment",
        )
    workspace = environment.get("workspace_directory") or DEFAULT_WORKSPACE
    if not isinstance(workspace, str) or not workspace.startswith("/"):
        raise bad_request("'workspace_directory' must be an absolute path.", "environment.workspace_directory")
    capability_directories = environment.get("capability_directories") or []
    if not _strings(capability_directories):
        raise bad_request("'capability_directories' must be a list of strings.", "environment.capability_directories")
    agent = body.get("agent")
    agent_id = body.get("agent_id")
    if agent is not None and agent_id is not None:
        raise bad_request("Give either 'agent' or 'agent_id', not both.", "agent_id")
    if agent is not None and not isinstance(agent, dict):
        raise bad_request("'agent' must be an object.", "agent")
    if agent_id is not None and (not isinstance(agent_id, str) or not agent_id):
        raise bad_request("'agent_id' must be a non-empty string.", "agent_id")
    review = body.get("review")
    if review not in (None, "none", "auto_review"):
        raise bad_request("'review' must be 'none' or 'auto_review'.", "review")
    vault_ids = body.get("vault_ids") or []
    if not _strings(vault_ids):
        raise bad_request("'vault_ids' must be a list of strings.", "vault_ids")
    return NewSession(
        environment_type=environment["type"],
        workspace_directory=workspace,
        capability_directories=list(capability_directories),
        agent=agent,
        agent_id=agent_id,
        has_input=has_input(body.get("input")),
        metadata=metadata(body.get("metadata")),
        vault_ids=list(vault_ids),
        review=review,
    )


def has_input(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, list):
        return bool(value)
    raise bad_request("'input' must be a string or a list of messages.", "input")


def metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise bad_request("'metadata' must map strings to strings.", "metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise bad_request(f"'metadata' may hold at most {MAX_METADATA_PAIRS} pairs.", "metadata")
    if any(not 1 <= len(k) <= 64 or len(v) > 512 for k, v in value.items()):
        raise bad_request("'metadata' keys must be 1-64 characters and values at most 512.", "metadata")
    return dict(value)


def input_events(body: Any) -> list[dict[str, Any]]:
    """The ``events`` list of ``POST /v1/agents/sessions/{id}/events``."""
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list) or not events:
        raise bad_request("'events' must be a non-empty list.", "events")
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise bad_request("Each event must be an object with a 'type'.", "events")
    return events


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
