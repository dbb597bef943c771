"""Which stop suspends (issue 29): only the idle rule's, and only with a runner that can."""

from __future__ import annotations

from dataclasses import dataclass, replace

from controller.decide import Verdict
from controller.model import Handle, SessionStatus
from controller.runners.base import Suspends
from tests.support.fakes import T0, FakeRunner, World, make_session, verdicts


@dataclass
class SuspendingRunner(FakeRunner):
    """``FakeRunner`` that also suspends: a suspended sandbox is gone like a released one."""

    def suspend(self, handle: Handle) -> None:
        self.calls.append(("suspend", handle.session_id, handle.generation))
        current = self.live.get(handle.session_id)
        if current is not None and current.handle.uid == handle.uid:
            del self.live[handle.session_id]


def world_with(runner: FakeRunner, **settings: float) -> World:
    world = World(**settings)  # type: ignore[arg-type]
    world.runner = runner
    world.deps = replace(world.deps, runner=runner)
    return world


def test_the_idle_rule_suspends_with_a_runner_that_can() -> None:
    """L11, issue 29: an idle session past the timeout: its sandbox is suspended, not released;
    the workspace is kept and the record says stopped, as after any idle stop."""
    runner = SuspendingRunner()
    assert isinstance(runner, Suspends)
    world = world_with(runner, idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert runner.calls == [("suspend", "sess_1", 1)]
    assert world.stopped == ["idle"]
    record = world.store.record("sess_1")
    assert record is not None and record.stopped_at is not None


def test_a_stop_for_age_releases_even_with_a_runner_that_suspends() -> None:
    """L11, issue 29: only idleness suspends; a sandbox past its lifetime is stopped for good."""
    runner = SuspendingRunner()
    world = world_with(runner, max_lifetime=100.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(200)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.stopped == ["lifetime"]
    assert runner.calls == [("release", "sess_1", 1)]


def test_a_runner_that_cannot_suspend_is_released_by_the_idle_rule() -> None:
    """L11: without ``suspend`` (the Kubernetes runner) the idle rule releases, as before."""
    world = World(idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.runner.calls == [("release", "sess_1", 1)]
