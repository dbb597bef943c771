"""The coalesced, fenced loop (``work``) over fakes; the decisions it carries out (``decide``)
are tests/unit/test_decide.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decide import Decision, Verdict
from controller.errors import ApiUnavailable, Fenced
from controller.lifecycle import Routing, work
from controller.model import Health, SandboxSpec, SessionStatus
from controller.store.base import Busy
from tests.support.fakes import GRACE, T0, World, make_session, new_session, verdicts

# --- work: the loop under a lease ------------------------------------------------------------


@pytest.fixture
def world() -> World:
    return World()


def test_work_start_saves_record_and_ensures_once(world: World) -> None:
    """L1/L7/L8: START ensures exactly one sandbox with the session's environment and saves the mapping."""
    world.sessions.put(make_session())
    assert verdicts(world.deliver()) == [Verdict.START]
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    assert world.runner.spec_of("sess_1") == SandboxSpec(
        session_id="sess_1",
        environment_id="env_1",
        remote_url="https://api.openai.com/v1/agents/env",
        workspace_directory="/workspace",
    )
    saved = world.store.record("sess_1")
    assert saved is not None
    assert saved.environment_id == "env_1"
    assert saved.handle == world.runner.live["sess_1"].handle
    assert saved.started_at == T0
    assert world.store.counters("sess_1") == (1, 1)
    assert world.store.holder("sess_1") is None


def test_work_again_without_new_want_does_nothing(world: World) -> None:
    """L1: a second work for the generation already done neither looks up nor acts."""
    world.sessions.put(make_session())
    world.deliver()
    gets = world.sessions.gets
    assert work("sess_1", world.deps) == []
    assert world.sessions.gets == gets
    assert world.runner.calls == [("ensure", "sess_1", 1)]


def test_repeated_delivery_keeps_the_healthy_sandbox(world: World) -> None:
    """L1/L14: a retried delivery for a session whose sandbox is up does not start another."""
    world.sessions.put(make_session())
    world.deliver()
    world.sessions.connected["env_1"] = True
    world.clock.advance(10 * GRACE)
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert [c[0] for c in world.runner.calls] == ["ensure"]
    assert world.runner.max_live["sess_1"] == 1


def test_work_wanted_during_a_round_is_done_in_a_second_round(world: World) -> None:
    """L1: deliveries arriving while a session is worked are coalesced into one more round."""
    world.sessions.put(make_session())
    rounds: list[str] = []

    def during_round(session_id: str) -> None:
        rounds.append(session_id)
        if len(rounds) == 1:  # two deliveries arrive during the first round, none later
            world.store.want(session_id)
            world.store.want(session_id)

    world.sessions.on_get = during_round
    assert verdicts(world.deliver()) == [Verdict.START, Verdict.KEEP]
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    assert world.store.counters("sess_1") == (3, 3)
    assert world.store.holder("sess_1") is None
    assert len(rounds) == 2


def test_second_worker_is_busy_while_the_first_holds_the_session(world: World) -> None:
    """L1: two workers never act on one session at once; the second is told to retry."""
    world.sessions.put(make_session())
    seen: list[list[Decision] | Busy] = []
    world.sessions.on_get = lambda sid: seen.append(world.deliver(sid)) if not seen else None
    assert verdicts(world.deliver()) == [Verdict.START, Verdict.KEEP]
    assert isinstance(seen[0], Busy)
    assert world.runner.calls == [("ensure", "sess_1", 1)]


def test_replace_releases_the_old_sandbox_before_ensuring_the_next_generation(world: World) -> None:
    """L14/L1: a failed sandbox is replaced by exactly one new one; never two live at once."""
    world.sessions.put(make_session())
    world.deliver()
    old = world.runner.live["sess_1"].handle
    world.runner.set_health(old, Health.FAILED)
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    assert world.runner.calls == [("ensure", "sess_1", 1), ("release", "sess_1", 1), ("ensure", "sess_1", 2)]
    assert world.runner.max_live["sess_1"] == 1
    saved = world.store.record("sess_1")
    assert saved is not None and saved.handle.generation == 2 and saved.handle.uid != old.uid


def test_replace_after_grace_without_connection(world: World) -> None:
    """L14: running but never connected past the grace period → one replacement, old one released first."""
    world.sessions.put(make_session())
    world.deliver()
    world.sessions.connected["env_1"] = False
    world.clock.advance(GRACE + 1)
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    assert world.runner.calls[1:] == [("release", "sess_1", 1), ("ensure", "sess_1", 2)]
    assert world.runner.max_live["sess_1"] == 1
    assert world.store.record("sess_1").started_at == T0 + GRACE + 1  # type: ignore[union-attr]


def test_environment_id_change_replaces_with_the_new_id(world: World) -> None:
    """L8/L14: a new environment id gets one new sandbox dialling out with that id."""
    world.sessions.put(make_session())
    world.deliver()
    world.sessions.put(make_session(env_id="env_2"))
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    assert world.runner.spec_of("sess_1").environment_id == "env_2"
    assert world.store.record("sess_1").environment_id == "env_2"  # type: ignore[union-attr]
    assert world.runner.max_live["sess_1"] == 1


def test_failed_session_releases_and_forgets(world: World) -> None:
    """L7: a failed session's sandbox is released and its mapping removed."""
    world.sessions.put(make_session())
    world.deliver()
    world.sessions.put(make_session(status=SessionStatus.FAILED, actions=()))
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert world.runner.calls[1:] == [("release", "sess_1", 1), ("discard", "sess_1", 0)]
    assert world.runner.live == {}
    assert world.store.record("sess_1") is None
    assert world.store.session_ids() == []


def test_deleted_session_releases_and_forgets(world: World) -> None:
    """L17: a deleted session (404) with a sandbox has it released and its mapping removed."""
    world.sessions.put(make_session())
    world.deliver()
    del world.sessions.sessions["sess_1"]
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert world.runner.live == {}
    assert world.store.record("sess_1") is None


def test_unrecorded_live_sandbox_is_adopted_not_duplicated(world: World) -> None:
    """L1/L14: a worker died between ensure and save; the next round adopts the live sandbox."""
    world.sessions.put(make_session())
    world.store.want("sess_1")
    taken = world.store.acquire("sess_1")
    assert not isinstance(taken, Busy) and taken is not None
    orphan = world.runner.ensure(SandboxSpec("sess_1", "env_1", "https://api.example.test/v1/agents/env"), 1)
    world.store.expire("sess_1")  # the worker died holding the lease; it lapses
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.handle == orphan and saved.environment_id == "env_1"


def test_late_signals_never_start_compute(world: World) -> None:
    """L9/L10: a delivery for a session without an environment_connection action starts nothing."""
    world.sessions.put(make_session(status=SessionStatus.IN_PROGRESS, actions=()))
    assert verdicts(world.deliver()) == [Verdict.IGNORE]
    assert world.runner.calls == []
    assert world.store.record("sess_1") is None


def test_other_handlers_sessions_are_never_started(world: World) -> None:
    """L6: a session routed elsewhere is looked at, logged via on_decision, and left alone."""
    world.deps.routing = Routing(agent_ids=("agent_other",))
    world.sessions.put(make_session())
    assert verdicts(world.deliver()) == [Verdict.IGNORE]
    assert world.decisions[0][1].reason.startswith("not ours")
    assert world.runner.calls == []


def test_lost_lease_prevents_any_runner_call(world: World) -> None:
    """L12 fencing: a worker whose lease lapsed mid-round must not start or stop anything."""
    world.sessions.put(make_session())
    world.sessions.on_get = world.store.expire
    with pytest.raises(Fenced):
        world.deliver()
    assert world.runner.calls == []
    assert world.store.record("sess_1") is None
    want, done = world.store.counters("sess_1")
    assert done < want  # the work is still owed: a retry will do it


def test_lost_lease_prevents_release(world: World) -> None:
    """L12 fencing: a release decided under a lost lease is discarded."""
    world.sessions.put(make_session())
    world.deliver()
    world.sessions.put(make_session(status=SessionStatus.FAILED, actions=()))
    world.sessions.on_get = world.store.expire
    with pytest.raises(Fenced):
        world.deliver()
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    assert world.store.record("sess_1") is not None


def test_lease_taken_over_during_a_round_fences_the_old_holder(world: World) -> None:
    """L12 fencing/L1: after a lapse another worker takes the session; the first one's writes fail."""
    world.sessions.put(make_session())
    other: list[list[Decision] | Busy] = []

    def lapse_then_take_over(session_id: str) -> None:
        world.sessions.on_get = None
        world.store.expire(session_id)
        other.append(work(session_id, world.deps))  # the second worker does the job

    world.sessions.on_get = lapse_then_take_over
    with pytest.raises(Fenced):
        world.deliver()
    assert verdicts(other[0]) == [Verdict.START]
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    assert world.runner.max_live["sess_1"] == 1


@pytest.mark.parametrize("failure", ["api", "runner"])
def test_exception_abandons_the_lease_and_keeps_the_work_owed(world: World, failure: str) -> None:
    """L1/L7: a failed round releases the lease without marking the work done, so a retry redoes it."""
    world.sessions.put(make_session())
    if failure == "api":
        world.sessions.unavailable = True
        expected: type[Exception] = ApiUnavailable
    else:
        world.runner.fail_ensure = RuntimeError("backend refused")
        expected = RuntimeError
    with pytest.raises(expected):
        world.deliver()
    assert len(world.store.abandoned) == 1
    assert world.store.holder("sess_1") is None
    assert world.store.counters("sess_1") == (1, 0)

    world.sessions.unavailable = False
    world.runner.fail_ensure = None
    assert verdicts(work("sess_1", world.deps)) == [Verdict.START]
    assert world.store.counters("sess_1") == (1, 1)
    assert world.store.record("sess_1") is not None


def test_nothing_wanted_means_nothing_done(world: World) -> None:
    """L1: work without a delivery (want == done) acquires nothing and returns no decisions."""
    world.sessions.put(make_session())
    assert work("sess_1", world.deps) == []
    assert world.sessions.gets == 0


def test_record_fields_follow_the_clock(world: World) -> None:
    """L14: the grace period counts from when the sandbox was (re)started, per the injected clock."""
    world.clock.advance(123.5)
    world.sessions.put(make_session())
    world.deliver()
    rec = world.store.record("sess_1")
    assert rec is not None
    assert rec == replace(rec, started_at=T0 + 123.5)


# --- pre-start: a sandbox at the session's creation (L9's eager mode) ----------------------------


def test_a_prestarted_sandbox_nobody_uses_is_stopped_by_the_idle_timeout() -> None:
    """L9, L11: the creation's job starts the sandbox of a pre-start agent's session (and only
    that agent's); nothing asks for it, and once the session has been idle for the idle timeout
    the timer's look stops it, keeping its workspace, like any idle sandbox."""
    world = World(idle_timeout=600.0, prestart_agent_ids=("agent_1",))
    world.sessions.put(new_session(last_active_at=int(T0 - 2)))
    assert verdicts(world.deliver()) == [Verdict.START]
    assert world.runner.calls == [("ensure", "sess_1", 1)]
    world.sessions.put(new_session(session_id="sess_2", agent_id="agent_2"))
    assert verdicts(world.deliver("sess_2")) == [Verdict.IGNORE]

    world.clock.advance(300)
    assert verdicts(world.deliver()) == [Verdict.IGNORE]  # idle within the timeout: kept
    world.clock.advance(400)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.stopped == ["idle"]


def test_every_agent_prestarts_with_a_star() -> None:
    """``*`` pre-starts every agent this controller serves; a list names them one by one."""
    from controller.config import LifecycleSettings

    assert LifecycleSettings(prestart_agent_ids=("*",)).prestarts_agent("anyone")
    assert LifecycleSettings(prestart_agent_ids=("*",)).prestarts_agent(None)
    listed = LifecycleSettings(prestart_agent_ids=("agent_a",))
    assert listed.prestarts_agent("agent_a") and not listed.prestarts_agent("agent_b")
    assert not LifecycleSettings().prestarts and not LifecycleSettings().prestarts_agent("agent_a")
