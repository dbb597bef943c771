"""Lifecycle decisions (``decide``) and the coalesced, fenced loop (``work``) over fakes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decide import FIRST_LOOK_SECONDS, PRESTART_WINDOW_SECONDS, Decision, Verdict, decide, not_ours
from controller.errors import ApiUnavailable, Fenced
from controller.lifecycle import Routing, work
from controller.model import Handle, Health, Record, SandboxSpec, Session, SessionStatus
from controller.store.base import Busy
from tests.support.clock import FakeClock
from tests.support.fakes import GRACE, T0, World, make_session, verdicts

ROUTING = Routing()


def record(env_id: str = "env_1", started_at: float = T0, generation: int = 1) -> Record:
    handle = Handle(session_id="sess_1", name=f"sandbox-g{generation}", generation=generation, uid=f"u{generation}")
    return Record(session_id="sess_1", environment_id=env_id, handle=handle, started_at=started_at)


def verdict(
    session=make_session(),  # noqa: B008 - frozen dataclass, safe as a default
    rec: Record | None = None,
    health: Health | None = None,
    connected: bool | None = None,
    now: float = T0,
    routing: Routing = ROUTING,
) -> Verdict:
    return decide(session, rec, health, connected, now, GRACE, routing).verdict


# --- decide: the decision table ------------------------------------------------------------


def test_start_when_connection_wanted_and_no_sandbox() -> None:
    """L7: a self-hosted session listing environment_connection without a sandbox gets one."""
    assert verdict(make_session(), None, None) is Verdict.START


@pytest.mark.parametrize("health", [Health.RUNNING, Health.STARTING])
def test_keep_when_healthy_and_connected(health: Health) -> None:
    """L14: a healthy sandbox whose executor is connected is kept, never duplicated."""
    assert verdict(make_session(), record(), health, connected=True, now=T0 + 10 * GRACE) is Verdict.KEEP


def test_grace_edge_exactly_at_grace_keeps_past_grace_replaces() -> None:
    """L14: a running but unconnected sandbox is kept up to the grace period, replaced after
    (a new sandbox is recorded as not connected since its start)."""
    clock = FakeClock(T0)
    rec = replace(record(started_at=clock.now()), disconnected_at=clock.now())
    clock.advance(GRACE)
    assert verdict(make_session(), rec, Health.RUNNING, connected=False, now=clock.now()) is Verdict.KEEP
    clock.advance(0.001)
    assert verdict(make_session(), rec, Health.RUNNING, connected=False, now=clock.now()) is Verdict.REPLACE


def test_unknown_connection_never_replaces() -> None:
    """L14/L15: an unknown link state (the API could not tell) is no reason to replace a sandbox,
    however long it has been down; the decision looks again within the grace period."""
    down = replace(record(), disconnected_at=T0)
    for rec in (record(), down):
        decision = decide(make_session(), rec, Health.RUNNING, None, T0 + 10 * GRACE, GRACE, ROUTING)
        assert decision.verdict is Verdict.KEEP
        assert decision.recheck_at is not None and decision.recheck_at <= T0 + 11 * GRACE + 1


def test_grace_counts_from_the_first_observed_disconnect_not_from_the_start() -> None:
    """L14/L15: an executor that was connected and dropped its link a second ago is kept for
    the grace period from that moment, even though the sandbox is older than the grace period;
    the first observation is stored on the record (``update``) and a recheck is armed."""
    old = record(started_at=T0)
    now = T0 + 8 * GRACE
    first = decide(make_session(), old, Health.RUNNING, False, now, GRACE, ROUTING)
    assert first.verdict is Verdict.KEEP
    assert first.update == replace(old, disconnected_at=now)
    assert first.recheck_at is not None and now + GRACE < first.recheck_at <= now + GRACE + 1
    seen = first.update
    assert decide(make_session(), seen, Health.RUNNING, False, now + GRACE, GRACE, ROUTING).verdict is Verdict.KEEP
    late = decide(make_session(), seen, Health.RUNNING, False, now + GRACE + 0.5, GRACE, ROUTING)
    assert late.verdict is Verdict.REPLACE
    back = decide(make_session(), seen, Health.RUNNING, True, now + 1, GRACE, ROUTING)
    assert back.verdict is Verdict.KEEP and back.update == replace(seen, disconnected_at=None, seen_connected=True)


@pytest.mark.parametrize("health", [Health.GONE, Health.FAILED, Health.TERMINATING, None])
def test_replace_when_sandbox_gone_failed_terminating_or_unknown(health: Health | None) -> None:
    """L14: a sandbox that is gone, failed or terminating is never reused, even if 'connected'."""
    assert verdict(make_session(), record(), health, connected=True, now=T0) is Verdict.REPLACE


def test_replace_when_environment_id_changed() -> None:
    """L8/L14: a sandbox dialled out for another environment id cannot serve this one."""
    session = make_session(env_id="env_2")
    assert verdict(session, record(env_id="env_1"), Health.RUNNING, connected=True) is Verdict.REPLACE


def test_deleted_session_releases_its_compute_or_is_ignored() -> None:
    """L7/L17: a deleted session (404) with a sandbox is released; without one, ignored."""
    assert verdict(None, record(), Health.RUNNING) is Verdict.RELEASE
    assert verdict(None, None, None) is Verdict.IGNORE


def test_failed_session_releases_its_compute_or_is_ignored() -> None:
    """L7: a failed session's compute is released; with no compute there is nothing to do."""
    failed = make_session(status=SessionStatus.FAILED, actions=())
    assert verdict(failed, record(), Health.RUNNING, connected=True) is Verdict.RELEASE
    assert verdict(failed, None, None) is Verdict.IGNORE
    # Failed wins over a stale environment_connection action.
    still_listed = make_session(status=SessionStatus.FAILED)
    assert verdict(still_listed, record(), Health.RUNNING) is Verdict.RELEASE


@pytest.mark.parametrize(
    "actions", [(), ("function_call",), ("mcp_approval_request",), ("computer_use_approval_request",)]
)
def test_no_environment_connection_action_starts_nothing(actions: tuple[str, ...]) -> None:
    """L9/L10/L13: only an environment_connection action asks for compute; late signals never start it."""
    for status in (SessionStatus.IDLE, SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION):
        session = make_session(status=status, actions=actions)
        assert verdict(session, None, None) is Verdict.IGNORE
        # A running sandbox is left alone (L13: idle alone never stops anything) ...
        assert verdict(session, record(), Health.RUNNING, connected=False, now=T0 + 10 * GRACE) is Verdict.IGNORE
        # ... and a dead one is never replaced without a connection request (at most its mapping goes).
        for health in (Health.GONE, Health.FAILED, Health.TERMINATING):
            assert verdict(session, record(), health) not in (Verdict.START, Verdict.REPLACE, Verdict.KEEP)


def test_missing_environment_id_or_remote_url_is_ignored() -> None:
    """L8: the executor needs the session's environment id and remote url to dial out."""
    assert verdict(make_session(env_id=None), None, None) is Verdict.IGNORE
    assert verdict(make_session(remote_url=None), None, None) is Verdict.IGNORE
    assert verdict(make_session(remote_url=""), None, None) is Verdict.IGNORE


@pytest.mark.parametrize(
    ("session", "routing", "why"),
    [
        (make_session(env_type="openai_hosted"), Routing(), "not self_hosted"),
        (make_session(env_type="none"), Routing(), "not self_hosted"),
        (make_session(workspace="/other"), Routing(), "workspace"),
        (make_session(agent_id="agent_9"), Routing(agent_ids=("agent_1", "agent_2")), "agent"),
        (make_session(agent_id=None), Routing(agent_ids=("agent_1",)), "agent"),
        (make_session(metadata={"team": "b"}), Routing(metadata_key="team", metadata_value="a"), "metadata"),
        (make_session(metadata={}), Routing(metadata_key="team", metadata_value="a"), "metadata"),
    ],
)
def test_sessions_of_other_handlers_are_ignored(session, routing: Routing, why: str) -> None:
    """L6: a session for another handler is ignored, with or without a stored sandbox."""
    assert why in (not_ours(session, routing) or "")
    decision = decide(session, None, None, None, T0, GRACE, routing)
    assert decision == Decision(Verdict.IGNORE, decision.reason)
    assert decision.reason.startswith("not ours")
    assert verdict(session, record(), Health.GONE, routing=routing) is Verdict.IGNORE


def test_sessions_matching_every_route_are_ours() -> None:
    """L6: workspace, agent id and metadata all match → the session is served."""
    routing = Routing(workspace_directory="/srv/ws", agent_ids=("agent_1",), metadata_key="team", metadata_value="a")
    session = make_session(workspace="/srv/ws", agent_id="agent_1", metadata={"team": "a"})
    assert not_ours(session, routing) is None
    assert verdict(session, None, None, routing=routing) is Verdict.START


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


def new_session(agent_id: str = "agent_1", age: float = 2.0, **more: object) -> Session:
    """A self-hosted session created ``age`` seconds before ``T0``, asking for nothing yet."""
    fields: dict[str, object] = {"status": SessionStatus.IDLE, "actions": (), "agent_id": agent_id, **more}
    return make_session(created_at=int(T0 - age), **fields)  # type: ignore[arg-type]


def test_a_new_session_of_a_prestart_agent_gets_its_sandbox_before_it_asks() -> None:
    """L9: with the eager mode on for its agent, a self-hosted session created moments ago with
    no sandbox gets one (a START that needs room in the pre-start budget, looked at again soon to
    see its executor connected), though it asks for no connection yet; without it, or for
    another agent, nothing starts (L9, L4)."""
    decision = decide(new_session(), None, None, None, T0, GRACE, ROUTING, prestart=True)
    assert decision.verdict is Verdict.START and decision.reason.startswith("pre-start") and decision.prestart
    assert decision.recheck_at == T0 + FIRST_LOOK_SECONDS
    assert decide(new_session(), None, None, None, T0, GRACE, ROUTING).verdict is Verdict.IGNORE


def test_prestart_never_starts_an_old_a_refused_a_foreign_or_a_failed_session() -> None:
    """L9, L2, L6: a creation seen after the pre-start window (a backlog, the sender's retries)
    starts nothing; nor does a session with no environment id, an untrusted remote_url, another
    workspace directory, or a failed one; a session that already had a sandbox (stopped, its
    workspace kept) is not started again without a connection request (L16)."""

    def prestarted(session: Session, rec: Record | None = None, health: Health | None = None) -> Verdict:
        return decide(session, rec, health, None, T0, GRACE, ROUTING, prestart=True).verdict

    assert prestarted(new_session(age=PRESTART_WINDOW_SECONDS + 1)) is Verdict.IGNORE
    assert prestarted(make_session(status=SessionStatus.IDLE, actions=())) is Verdict.IGNORE  # created_at unknown
    assert prestarted(new_session(env_id=None)) is Verdict.IGNORE
    refused = decide(
        new_session(remote_url="https://evil.example/v1"), None, None, None, T0, GRACE, ROUTING, prestart=True
    )
    assert refused.verdict is Verdict.IGNORE and refused.refused is not None
    assert prestarted(new_session(workspace="/elsewhere")) is Verdict.IGNORE
    assert prestarted(new_session(status=SessionStatus.FAILED)) is Verdict.IGNORE
    stopped = replace(record(), stopped_at=T0 - 1)
    assert prestarted(new_session(), stopped) is Verdict.IGNORE


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
