"""``lifecycle.work`` when a round fails: what stays wanted, what is given up (in memory)."""

from __future__ import annotations

import pytest

from controller import lifecycle
from controller.clock import FakeClock
from controller.errors import ApiRejected, ApiUnavailable, Fenced
from controller.store.base import Lease
from tests.support.fakes import FakeRunner, FakeSessions, FakeStore, make_session


def deps_of(store: FakeStore, sessions: FakeSessions) -> lifecycle.Deps:
    return lifecycle.Deps(sessions=sessions, store=store, runner=FakeRunner(), clock=FakeClock())


def test_a_transient_failure_leaves_the_work_wanted() -> None:
    """L1: a round that fails transiently releases the lease and marks nothing done, so the
    task's retry, or the scheduler's recovery pass if that retry is lost, still finds it."""
    store, sessions = FakeStore(), FakeSessions()
    sessions.put(make_session("sess_1"))
    sessions.unavailable = True
    store.want("sess_1")
    with pytest.raises(ApiUnavailable):
        lifecycle.work("sess_1", deps_of(store, sessions))
    assert store.counters("sess_1") == (1, 0)
    assert store.holder("sess_1") is None


def test_a_permanent_failure_gives_up_its_round_but_not_later_deliveries() -> None:
    """L1: a round that can never succeed (the API said 4xx) is marked done, so recovery does
    not retry it forever; a delivery that arrived during that round is still owed."""
    store, sessions = FakeStore(), FakeSessions()
    store.want("sess_1")

    def rejected(session_id: str) -> None:
        store.want(session_id)  # a delivery during the round
        raise ApiRejected("the Agents API answered 403")

    sessions.on_get = rejected
    with pytest.raises(ApiRejected):
        lifecycle.work("sess_1", deps_of(store, sessions))
    assert store.counters("sess_1") == (2, 1)
    assert store.holder("sess_1") is None


def test_a_permanent_failure_after_the_lease_was_lost_changes_nothing() -> None:
    """L12: giving up needs the lease too: a round that lost it leaves the work to the holder."""
    store, sessions = FakeStore(), FakeSessions()
    store.want("sess_1")

    def lost_then_rejected(session_id: str) -> None:
        store.expire(session_id)
        raise ApiRejected("the Agents API answered 403")

    sessions.on_get = lost_then_rejected
    with pytest.raises(ApiRejected):
        lifecycle.work("sess_1", deps_of(store, sessions))
    assert store.counters("sess_1") == (1, 0)
    with pytest.raises(Fenced):
        store.check(Lease("sess_1", 1, 1))
