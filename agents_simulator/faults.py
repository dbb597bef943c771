"""Faults armed through ``/admin/faults``: the next N calls of one kind fail with a status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TARGETS = frozenset(
    {
        "create_session",
        "retrieve_session",
        "list_sessions",
        "delete_session",
        "create_events",
        "retrieve_environment",
        "register",
        "validate",
        "create_webhook_endpoint",
        "list_webhook_endpoints",
        "retrieve_webhook_endpoint",
        "update_webhook_endpoint",
        "delete_webhook_endpoint",
        "rotate_webhook_secret",
        "test_webhook_endpoint",
        "list_webhook_event_types",
    }
)


@dataclass
class Fault:
    target: str
    status: int
    remaining: int
    retry_after: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "status": self.status,
            "remaining": self.remaining,
            "retry_after": self.retry_after,
        }


class Faults:
    """At most one armed fault per target; arming again replaces it."""

    def __init__(self) -> None:
        self._armed: dict[str, Fault] = {}

    def arm(self, target: str, status: int, count: int, retry_after: float | None = None) -> Fault:
        if target not in TARGETS:
            raise ValueError(f"unknown fault target {target!r}; one of {sorted(TARGETS)}")
        if not 400 <= status <= 599:
            raise ValueError("fault status must be a 4xx or 5xx code")
        if count < 1:
            raise ValueError("fault count must be at least 1")
        fault = Fault(target, status, count, retry_after)
        self._armed[target] = fault
        return fault

    def take(self, target: str) -> Fault | None:
        """The fault to apply to this call, if one is armed (consumes one use)."""
        fault = self._armed.get(target)
        if fault is None:
            return None
        fault.remaining -= 1
        if fault.remaining <= 0:
            del self._armed[target]
        return fault

    def clear(self) -> None:
        self._armed.clear()

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self._armed.values()]
