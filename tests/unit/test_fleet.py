"""``status`` and ``explain``: they report what ``act`` would do, and they never act."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from controller import fleet
from controller.decide import Verdict
from controller.model import Health, LastDecision, SessionStatus
from tests.support.fakes import GRACE, World, make_session


def _fresh(world: World) -> None:
    world.sessions.put(make_session())


def _mapped_healthy(world: World) -> None:
    world.sessions.put(make_session())
    world.mapped()
    world.sessions.connected["env_1"] = True


def _mapped_dead(world: World) -> None:
    world.sessions.put(make_session())
    world.mapped()
    world.runner.live["sess_1"].health = Health.FAILED


def _never_connected(world: World) -> None:
    world.sessions.put(make_session())
    world.mapped()
    world.clock.advance(GRACE + 1)


def _deleted_with_sandbox(world: World) -> None:
    world.mapped()


def _failed_session(world: World) -> None:
    world.sessions.put(make_session(status=SessionStatus.FAILED, actions=()))
    world.mapped()


def _orphan(world: World) -> None:
    world.sessions.put(make_session())
    world.orphan()
    world.sessions.connected["env_1"] = True


def _not_ours(world: World) -> None:
    world.sessions.put(make_session(workspace="/elsewhere"))


SCENARIOS: dict[str, Callable[[World], None]] = {
    "fresh": _fresh,
    "mapped_healthy": _mapped_healthy,
    "mapped_dead": _mapped_dead,
    "never_connected": _never_connected,
    "deleted_with_sandbox": _deleted_with_sandbox,
    "failed_session": _failed_session,
    "orphan": _orphan,
    "not_ours": _not_ours,
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_explain_says_what_act_then_does_and_does_nothing_itself(name: str) -> None:
    """L1: explain reads only — no runner call, no record written, no work wanted — and its
    verdict and reason are exactly those of the worker's next round on the same observations."""
    world = World()
    SCENARIOS[name](world)
    records_before = dict(world.store.records)
    counters_before = world.store.counters("sess_1")

    explained = fleet.explain("sess_1", world.deps)

    assert world.runner.calls == []
    assert world.store.records == records_before
    assert world.store.counters("sess_1") == counters_before
    assert world.decisions == []  # on_decision is the worker's, not explain's
    world.deliver()
    [(_, acted)] = world.decisions
    assert (explained.decision.verdict, explained.decision.reason) == (acted.verdict, acted.reason)


def test_explain_agrees_with_act_on_an_idle_session_past_its_timeout() -> None:
    """L11/L12: with an idle timeout set, explain says what the worker's round then does to an
    idle session whose timeout has passed (stop), not what it would do without the timeout."""
    world = World(idle_timeout=1800.0)
    _mapped_healthy(world)
    world.sessions.put(
        replace(make_session(status=SessionStatus.IDLE, actions=()), last_active_at=int(world.clock.now()))
    )
    world.clock.advance(1801)

    explained = fleet.explain("sess_1", world.deps)

    world.deliver()
    [(_, acted)] = world.decisions
    assert acted.verdict is Verdict.STOP
    assert (explained.decision.verdict, explained.decision.reason) == (acted.verdict, acted.reason)


def test_explain_shows_what_it_observed() -> None:
    """The observations behind the verdict are part of the answer."""
    world = World()
    _orphan(world)
    found = fleet.explain("sess_1", world.deps)
    assert found.observed["sandbox"]["recorded"] is False
    assert found.observed["health"] == "running"
    assert found.observed["executor_connected"] is True
    assert found.observed["session"]["wants_connection"] is True


class _Decisions:
    def __init__(self, known: dict[str, LastDecision], timers: dict[str, float] | None = None) -> None:
        self.known = known
        self.timers = timers or {}

    def last_decision(self, session_id: str) -> LastDecision | None:
        return self.known.get(session_id)

    def timer(self, session_id: str) -> float | None:
        return self.timers.get(session_id)


def test_status_lists_every_mapped_session_with_its_last_decision() -> None:
    """Each mapped session appears once, with its sandbox's health and age; totals add up."""
    world = World()
    world.mapped("sess_1")
    world.clock.advance(30)
    world.mapped("sess_2")
    world.runner.live["sess_2"].health = Health.FAILED
    last = {"sess_1": LastDecision("keep", "executor is connected", world.clock.now())}
    timers = {"sess_1": world.clock.now() + 65}

    rows = fleet.status(world.store, _Decisions(last, timers), world.runner, "local", world.clock.now() + 5)

    by_id = {r.session_id: r for r in rows}
    assert set(by_id) == {"sess_1", "sess_2"}
    assert (by_id["sess_1"].health, by_id["sess_1"].age_seconds, by_id["sess_1"].generation) == ("running", 35, 1)
    assert by_id["sess_1"].last == last["sess_1"]
    assert (by_id["sess_2"].health, by_id["sess_2"].last) == ("failed", None)
    assert (by_id["sess_1"].next_timer_in_seconds, by_id["sess_2"].next_timer_in_seconds) == (60, None)
    assert fleet.totals(rows) == {
        "sessions": 2,
        "by_health": {"failed": 1, "running": 1},
        "by_last_verdict": {"keep": 1, "none": 1},
        "deletions_held": 0,
        "checkpoint_bytes": 0,
    }
    assert world.runner.calls == []


def test_status_and_explain_show_a_crash_loop_with_its_restarts_and_the_time_left() -> None:
    """L14 (issue 37, item 2): a session whose executor exited twice in a row is backing off:
    ``status`` and ``explain`` show the exits in a row and the seconds until the next start, as
    Kubernetes shows a CrashLoopBackOff; ``explain`` decides the same wait as ``act``, and
    neither starts anything."""
    world = World()
    world.sessions.put(make_session())
    world.deliver()
    for _ in range(2):  # two exits in a row: the second backs off
        saved = world.store.record("sess_1")
        assert saved is not None
        world.runner.set_health(saved.handle, Health.FAILED)
        world.clock.advance(1)
        world.deliver()
    calls = list(world.runner.calls)
    explained = fleet.explain("sess_1", world.deps)
    assert explained.observed["crash_loop"] == {"restarts": 2, "next_start_in_seconds": 2.0}
    assert explained.decision.verdict is Verdict.KEEP and "crash loop back-off" in explained.decision.reason
    [row] = fleet.status(world.store, _Decisions({}), world.runner, "local", world.clock.now() + 0.5)
    assert row.crash_loop == {"restarts": 2, "next_start_in_seconds": 1.5}
    assert row.to_json()["crash_loop"] == row.crash_loop
    assert world.runner.calls == calls
