"""The receiver's side of the queue: de-duplicate on ``webhook-id``, enqueue, confirm.

``Inbox.submit`` returns only once the job is durably queued (L5) or known to be a
duplicate of one that was; it raises ``Transient`` (``StoreUnavailable`` /
``QueueUnavailable``) when that cannot be confirmed, so the receiver answers 503 and the
sender retries. An id is remembered only once its job is queued, so a retry of a
delivery whose enqueue failed is processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True)
class Job:
    """What the worker needs: ids only. The worker re-reads the session (L7)."""

    session_id: str
    webhook_id: str
    event_type: str
    event_id: str = ""
    received_at: float = field(default=0.0, compare=False)
    """When the receiver took the delivery (Unix seconds; 0 for jobs the scheduler makes). Not
    part of a job's identity: two deliveries of one event make the same job."""


class Outcome(StrEnum):
    ENQUEUED = "enqueued"
    DUPLICATE = "duplicate"


class Inbox(Protocol):
    """Awaited on the receiver's event loop (no thread per delivery)."""

    async def submit(self, job: Job) -> Outcome: ...

    async def ready(self) -> bool:
        """True when the store and broker answer (for /readyz)."""
        ...
