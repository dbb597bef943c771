"""Sessions, environments and registrations as the simulator stores them, and their JSON.

Plain records, no I/O. ``engine.py`` moves them through the state machine; the JSON
renderers produce exactly what the official ``openai`` client parses into ``AgentSession``,
``AgentSessionDeleted`` and ``EnvironmentInfo``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

DEFAULT_MODEL = "gpt-5.5"
DEFAULT_WORKSPACE = "/workspace"


def new_id(prefix: str) -> str:
    """An id in OpenAI's style, e.g. ``sess_6f1c…``."""
    return f"{prefix}_{secrets.token_hex(12)}"


class SessionStatus(StrEnum):
    IDLE = "idle"
    IN_PROGRESS = "in_progress"
    REQUIRES_ACTION = "requires_action"
    FAILED = "failed"


class EnvironmentStatus(StrEnum):
    PENDING = "pending"
    READY = "ready"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    FAILED = "failed"


@dataclass
class SimEnvironment:
    id: str
    type: str  # "self_hosted" | "openai_hosted"
    status: EnvironmentStatus
    workspace_directory: str = DEFAULT_WORKSPACE
    capability_directories: list[str] = field(default_factory=list)
    session_id: str | None = None
    tokens: set[str] = field(default_factory=set, repr=False)
    deleted: bool = False


@dataclass
class SimSession:
    id: str
    agent: dict[str, Any]
    environment_type: str  # "none" | "openai_hosted" | "self_hosted"
    environment_id: str | None
    metadata: dict[str, str]
    created_at: int
    last_active_at: int
    vault_ids: list[str] = field(default_factory=list)
    review: str | None = None
    status: SessionStatus = SessionStatus.IDLE
    wants_connection: bool = False
    pending_inputs: int = 0
    error: str | None = None
    idempotency_keys: set[str] = field(default_factory=set)
    remote_url: str | None = None  # set through the admin API; None: the simulator's own URL

    @property
    def self_hosted(self) -> bool:
        return self.environment_type == "self_hosted"


@dataclass(frozen=True)
class Registration:
    """One call to ``/cloud/environment/{id}/register``; never holds the key itself."""

    id: str
    environment_id: str
    received_at: float
    key_matched: bool
    environment_known: bool
    status_code: int
    security_profile: str | None
    executor_public_key_present: bool
    scheme: str = "http"
    """``https`` when the registration came over the TLS listener."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "environment_id": self.environment_id,
            "received_at": self.received_at,
            "key_matched": self.key_matched,
            "environment_known": self.environment_known,
            "status_code": self.status_code,
            "security_profile": self.security_profile,
            "executor_public_key_present": self.executor_public_key_present,
            "scheme": self.scheme,
        }


def make_agent(agent: dict[str, Any] | None, agent_id: str | None) -> dict[str, Any]:
    """The resolved ``agent`` object for a session (defaults filled in as the API does)."""
    given = agent or {}
    return {
        "id": agent_id or new_id("agent"),
        "name": given.get("name"),
        "instructions": given.get("instructions"),
        "model": given.get("model") or DEFAULT_MODEL,
        "multi_agent": given.get("multi_agent") or {"enabled": False, "max_concurrent_subagents": None},
        "reasoning": given.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": given.get("service_tier") or "auto",
        "text": given.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": list(given.get("tools") or []),
    }


def session_json(session: SimSession, environment: SimEnvironment | None, remote_url: str) -> dict[str, Any]:
    """The ``agent.session`` object."""
    body: dict[str, Any] = {
        "id": session.id,
        "object": "agent.session",
        "status": session.status.value,
        "required_actions": (
            [{"type": "environment_connection", "environment_id": session.environment_id}]
            if session.wants_connection
            else []
        ),
        "environment": environment_json(session.environment_type, environment, remote_url),
        "agent": session.agent,
        "metadata": session.metadata,
        "created_at": session.created_at,
        "last_active_at": session.last_active_at,
        "error": session.error,
        "usage": None,
        "vault_ids": session.vault_ids,
        "prompt_cache_options": None,
    }
    if session.review is not None:
        body["review"] = session.review
    return body


def environment_json(kind: str, environment: SimEnvironment | None, remote_url: str) -> dict[str, Any]:
    """A session's ``environment`` field, by type."""
    if kind == "none" or environment is None:
        return {"type": "none"}
    if kind == "self_hosted":
        return {
            "type": "self_hosted",
            "id": environment.id,
            "remote_url": remote_url,
            "workspace_directory": environment.workspace_directory,
            "capability_directories": environment.capability_directories,
        }
    return {
        "type": "openai_hosted",
        "id": environment.id,
        "capability_directories": environment.capability_directories,
        "files": [],
        "network": {"access": "disabled", "allowed_domains": []},
        "packages": {"npm": [], "python": [], "system": []},
        "plugins": [],
        "skills": [],
        "container_size": None,
        "desktop": None,
    }


def environment_info_json(environment: SimEnvironment) -> dict[str, Any]:
    """The ``agent.environment`` object (``GET /v1/agents/environments/{id}``)."""
    return {
        "id": environment.id,
        "object": "agent.environment",
        "type": environment.type,
        "status": environment.status.value,
        "files": [],
        "plugins": [],
        "skills": [],
    }


def deleted_json(session_id: str) -> dict[str, Any]:
    return {"id": session_id, "object": "agent.session.deleted", "deleted": True}
