"""Faults armed through ``/admin/faults``: calls of one kind fail, or hang, for a while.

A fault names a ``target`` (a kind of call) and lasts either for the next ``count`` calls or
for ``seconds`` from the moment it is armed. Its ``kind`` says what those calls get:

* ``status`` (the default): an error answer with ``status`` (4xx/5xx; 429 and 5xx carry
  ``Retry-After`` when ``retry_after`` is given);
* ``timeout``: the answer is held back for ``hold_seconds`` (past the client's timeout) and
  then given as usual, as an overloaded API does. Only the public ``/v1`` calls can hang.

``object_id`` narrows a fault to calls about one session (session targets) or one environment
(``retrieve_environment``); a narrowed fault wins over a fault on the whole target. Arming a
fault for a (target, object) that already has one replaces it.

While a ``timeout`` fault holds a call's answer, the call is listed in ``Faults.held`` with the
client's address (``GET /admin/held``): a test can tell which process is waiting for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.clock import Clock

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
EXECUTOR_TARGETS = frozenset({"register", "validate"})
"""Calls an executor makes: they fail with a status, never hang (``kind`` ``timeout`` is refused)."""
KINDS = ("status", "timeout")
DEFAULT_HOLD_SECONDS = 30.0


@dataclass
class Fault:
    target: str
    status: int
    remaining: int | None
    """Calls left, for a counted fault; None for a fault that lasts ``until``."""
    until: float | None = None
    """When a timed fault ends (the simulator's clock); None for a counted one."""
    retry_after: float | None = None
    kind: str = "status"
    hold_seconds: float = 0.0
    object_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "status": self.status,
            "remaining": self.remaining,
            "until": self.until,
            "retry_after": self.retry_after,
            "hold_seconds": self.hold_seconds,
            "object_id": self.object_id,
        }


@dataclass(frozen=True)
class Held:
    """A call whose answer a ``timeout`` fault holds back right now."""

    target: str
    object_id: str | None
    client: str
    """The caller's address, ``host:port`` (empty when the server does not know it)."""
    since: float

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "object_id": self.object_id, "client": self.client, "since": self.since}


class Faults:
    """Armed faults by (target, object); expired ones are dropped as they are looked at."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._armed: dict[tuple[str, str | None], Fault] = {}
        self.held: list[Held] = []
        """Calls being held by a ``timeout`` fault now, oldest first."""

    def holding(self, target: str, object_id: str | None, client: str) -> Held:
        """Note a call held from now on; ``release`` it when its answer goes out."""
        held = Held(target, object_id, client, self._clock.now())
        self.held.append(held)
        return held

    def release(self, held: Held) -> None:
        if held in self.held:
            self.held.remove(held)

    def arm(
        self,
        target: str,
        status: int = 500,
        count: int | None = None,
        retry_after: float | None = None,
        *,
        seconds: float | None = None,
        kind: str = "status",
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
        object_id: str | None = None,
    ) -> Fault:
        """Arm a fault for the next ``count`` calls (default 1) or, with ``seconds``, for that long."""
        if target not in TARGETS:
            raise ValueError(f"unknown fault target {target!r}; one of {sorted(TARGETS)}")
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {list(KINDS)}")
        if kind == "status" and not 400 <= status <= 599:
            raise ValueError("fault status must be a 4xx or 5xx code")
        if kind == "timeout" and target in EXECUTOR_TARGETS:
            raise ValueError(f"a timeout fault applies to the API's calls, not to {target!r}")
        if kind == "timeout" and not 0 < hold_seconds <= 600:
            raise ValueError("hold_seconds must be between 0 and 600")
        if count is not None and seconds is not None:
            raise ValueError("give either a count or seconds, not both")
        if seconds is not None and not 0 < seconds <= 24 * 3600:
            raise ValueError("fault seconds must be between 0 and 86400")
        if seconds is None and count is None:
            count = 1
        if count is not None and count < 1:
            raise ValueError("fault count must be at least 1")
        if object_id is not None and not object_id:
            raise ValueError("object_id, when given, must not be empty")
        fault = Fault(
            target=target,
            status=status,
            remaining=count,
            until=self._clock.now() + seconds if seconds is not None else None,
            retry_after=retry_after,
            kind=kind,
            hold_seconds=hold_seconds if kind == "timeout" else 0.0,
            object_id=object_id,
        )
        self._armed[(target, object_id)] = fault
        return fault

    def take(self, target: str, object_id: str | None = None) -> Fault | None:
        """The fault to apply to this call about ``object_id``, if one is armed (a counted one
        loses one use); the one narrowed to the object first, then the target's."""
        keys = [(target, object_id), (target, None)] if object_id is not None else [(target, None)]
        for key in keys:
            fault = self._armed.get(key)
            if fault is None:
                continue
            if fault.until is not None and self._clock.now() >= fault.until:
                del self._armed[key]
                continue
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    del self._armed[key]
            return fault
        return None

    def clear(self) -> None:
        self._armed.clear()

    def to_json(self) -> list[dict[str, Any]]:
        now = self._clock.now()
        for key in [k for k, f in self._armed.items() if f.until is not None and now >= f.until]:
            del self._armed[key]
        return [f.to_json() for f in self._armed.values()]
