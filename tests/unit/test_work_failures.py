"""``lifecycle.work`` when a round fails: what stays wanted, what is given up (in memory)."""

from __future__ import annotations

import pytest

from controller import lifecycle
from controller.decide import Verdict
from controller.errors import ApiRejected, ApiUnavailable, Fenced, RunnerRejected, SpecRefused, StartFailed
from controller.model import SessionStatus
from controller.store.base import Lease
from tests.support.clock import FakeClock
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


def failing_start(
    error: Exception,
) -> tuple[FakeStore, FakeSessions, FakeRunner, lifecycle.Deps, list[tuple[str, bool]]]:
    """A session asking for a connection whose sandbox start raises ``error``."""
    store, sessions, runner = FakeStore(), FakeSessions(), FakeRunner()
    sessions.put(make_session("sess_1"))
    runner.fail_ensure = error
    failures: list[tuple[str, bool]] = []
    deps = lifecycle.Deps(
        sessions=sessions,
        store=store,
        runner=runner,
        clock=FakeClock(),
        on_start_failed=lambda sid, reason, permanent: failures.append((reason, permanent)),
    )
    return store, sessions, runner, deps, failures


@pytest.mark.parametrize(
    "reason",
    [
        "cannot start the executor '/opt/codex/bin/codex': No such file or directory",
        "every uid of CONTROLLER_LOCAL_EXECUTOR_UIDS (200000-200001) is held by a session",
        "Kubernetes admission refused to create pods: exceeded quota: compute",
        "grant the controller's service account 'create' on 'pods' in namespace sandboxes",
    ],
)
def test_a_start_that_may_succeed_later_is_retried_until_the_session_stops_asking(reason: str) -> None:
    """L7/L15: a start that fails for a reason that may pass (the executor binary missing for a
    moment, the uid range full, a quota or admission 403) is a ``Transient`` failure: the work
    stays wanted (the task retries with backoff, the recovery pass enqueues it again), each
    attempt is counted and noted with its reason; once the cause is gone the next round starts
    the sandbox. A session that no longer asks is then left alone."""
    store, _, runner, deps, failures = failing_start(RunnerRejected(reason))
    store.want("sess_1")
    for attempt in range(1, 4):
        with pytest.raises(StartFailed, match="retried while the session asks"):
            lifecycle.work("sess_1", deps)
        assert store.counters("sess_1") == (1, 0) and store.holder("sess_1") is None  # still owed
        assert failures == [(reason, False)] * attempt
    runner.fail_ensure = None  # the binary is back, a uid was freed, the quota raised
    decisions = lifecycle.work("sess_1", deps)
    assert isinstance(decisions, list) and [d.verdict for d in decisions] == [Verdict.START]
    assert store.counters("sess_1") == (1, 1) and "sess_1" in runner.live

    # Failing while the session asks, then it stops asking: the round that reads it ends the work.
    store2, sessions2, runner2, deps2, _ = failing_start(RunnerRejected(reason))
    store2.want("sess_1")
    with pytest.raises(StartFailed):
        lifecycle.work("sess_1", deps2)
    sessions2.put(make_session("sess_1", status=SessionStatus.IDLE, actions=()))
    assert [d.verdict for d in lifecycle.work("sess_1", deps2)] == [Verdict.IGNORE]  # type: ignore[union-attr]
    assert store2.counters("sess_1") == (1, 1) and runner2.live == {}


def test_an_unsafe_spec_is_dropped_with_its_reason() -> None:
    """L2: a spec the runner must never start (an id or remote URL unsafe to use) is permanent:
    the round is given up (no retry can help), counted and noted as refused."""
    store, _, _, deps, failures = failing_start(SpecRefused("refused to start a sandbox: environment id is unsafe"))
    store.want("sess_1")
    with pytest.raises(SpecRefused):
        lifecycle.work("sess_1", deps)
    assert store.counters("sess_1") == (1, 1)
    assert failures == [("refused to start a sandbox: environment id is unsafe", True)]
