"""``recovery.recover`` over an in-memory backlog: every overdue session enqueued once a pass."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from controller import recovery
from controller.errors import QueueUnavailable


class Backlog:
    """Hands out overdue ids in batches, each once (as the store marks them enqueued)."""

    def __init__(self, overdue: list[str]) -> None:
        self.overdue = list(overdue)
        self.limits: list[int] = []

    def take_overdue(self, limit: int) -> list[str]:
        self.limits.append(limit)
        taken, self.overdue = self.overdue[:limit], self.overdue[limit:]
        return taken


def test_every_overdue_session_is_enqueued_once_across_batches() -> None:
    """L1: wanted work whose job was lost is enqueued again, each session once per pass."""
    backlog = Backlog([f"sess_{n}" for n in range(7)])
    batches: list[list[str]] = []
    assert recovery.recover(backlog, lambda ids: batches.append(list(ids)), batch=3) == recovery.Recovered(enqueued=7)
    assert batches == [["sess_0", "sess_1", "sess_2"], ["sess_3", "sess_4", "sess_5"], ["sess_6"]]  # one publish each
    assert backlog.limits == [3, 3, 3]  # stops after the first short batch


def test_nothing_overdue_enqueues_nothing() -> None:
    enqueued: list[str] = []
    assert recovery.recover(Backlog([]), enqueued.extend) == recovery.Recovered(enqueued=0)
    assert enqueued == []


def test_a_pass_is_bounded() -> None:
    """A huge backlog is worked through over several passes, not in one unbounded loop."""
    backlog = Backlog([f"sess_{n}" for n in range(100)])
    enqueued: list[str] = []
    assert recovery.recover(backlog, enqueued.extend, batch=10, max_batches=3).enqueued == 30
    assert len(backlog.overdue) == 70


def test_a_broker_failure_ends_the_pass_and_is_raised() -> None:
    """The scheduler logs it and retries next round; the sessions stay in the store's index."""
    backlog = Backlog(["sess_a", "sess_b"])

    def refuse(session_ids: Sequence[str]) -> None:
        raise QueueUnavailable("broker refused", retry_after=2)

    with pytest.raises(QueueUnavailable):
        recovery.recover(backlog, refuse)
