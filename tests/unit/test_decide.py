"""``decide``, the pure decision about one session's sandbox (controller/decide.py): a verdict,
its reason and when to look again, from what was observed. The loop that carries decisions out
(``work``) is tests/unit/test_lifecycle.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decide import (
    FIRST_LOOK_SECONDS,
    OUTAGE_LOOKS,
    PRESTART_WINDOW_SECONDS,
    Cause,
    Decision,
    Missing,
    Verdict,
    decide,
    not_ours,
)
from controller.lifecycle import Routing
from controller.model import Handle, Health, Record, Session, SessionStatus
from tests.support.clock import FakeClock
from tests.support.fakes import GRACE, T0, idle_since, make_session, new_session

ROUTING = Routing()


def record(
    env_id: str = "env_1", started_at: float = T0, generation: int = 1, stopped_at: float | None = None
) -> Record:
    handle = Handle(session_id="sess_1", name=f"sandbox-g{generation}", generation=generation, uid=f"u{generation}")
    return Record(
        session_id="sess_1", environment_id=env_id, handle=handle, started_at=started_at, stopped_at=stopped_at
    )


def verdict(
    session=make_session(),  # noqa: B008 - frozen dataclass, safe as a default
    rec: Record | None = None,
    health: Health | None = None,
    connected: bool | None = None,
    now: float = T0,
    routing: Routing = ROUTING,
) -> Verdict:
    return decide(session, rec, health, connected, now, GRACE, routing).verdict


# --- the decision table ----------------------------------------------------------------------


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
    the first observation is stored on the record (``update``) and a recheck is armed. Looks
    that keep seeing it down (each within two of the looks' intervals of the last) replace it
    once the grace is over."""
    old = record(started_at=T0)
    now = T0 + 8 * GRACE
    first = decide(make_session(), old, Health.RUNNING, False, now, GRACE, ROUTING)
    assert first.verdict is Verdict.KEEP
    assert first.update == replace(old, disconnected_at=now, link_looked_at=now, down_since=now)
    assert first.recheck_at is not None and now < first.recheck_at <= now + GRACE + 1
    seen = first.update
    step = GRACE / OUTAGE_LOOKS
    for index in range(1, OUTAGE_LOOKS + 1):
        looked = decide(make_session(), seen, Health.RUNNING, False, now + index * step, GRACE, ROUTING)
        assert looked.verdict is Verdict.KEEP
        seen = looked.update or seen
        assert seen.disconnected_at == now
    late = decide(make_session(), seen, Health.RUNNING, False, now + GRACE + 0.5, GRACE, ROUTING)
    assert late.verdict is Verdict.REPLACE
    back = decide(make_session(), seen, Health.RUNNING, True, now + 1, GRACE, ROUTING)
    assert back.verdict is Verdict.KEEP
    assert back.update == replace(seen, disconnected_at=None, seen_connected=True, link_looked_at=None, down_since=None)


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


# --- pre-start: a sandbox at the session's creation (L9's eager mode) ----------------------------


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


# --- idle: stop after the timeout (L11–L13) --------------------------------------------------

TIMEOUT = 1800.0
RETENTION = 7 * 24 * 3600.0
IDLE = make_session(status=SessionStatus.IDLE, actions=())


def decided(
    session: Session, rec: Record | None, now: float, timeout: float = TIMEOUT, retention: float = 0.0
) -> Decision:
    return decide(
        session,
        rec,
        Health.RUNNING,
        True,
        now,
        GRACE,
        Routing(),
        idle_timeout_seconds=timeout,
        retention_seconds=retention,
    )


def test_idle_past_the_timeout_stops_at_it_not_before() -> None:
    """L11/L12: an idle session with no pending action is stopped once it has been inactive for
    the whole timeout; before that the decision re-arms for ``last_active_at + timeout``."""
    session = idle_since(T0 + 100)
    before = decided(session, record(), T0 + 100 + TIMEOUT - 1)
    assert before.verdict is Verdict.IGNORE and before.recheck_at == T0 + 100 + TIMEOUT
    at = decided(session, record(), T0 + 100 + TIMEOUT)
    assert (at.verdict, at.cause, at.recheck_at) == (Verdict.STOP, Cause.IDLE, None)


@pytest.mark.parametrize("status", [SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION, SessionStatus.UNKNOWN])
def test_a_working_session_is_never_stopped(status: SessionStatus) -> None:
    """L11/L12: in_progress and requires_action (e.g. a function call) never stop, however long
    ago the last activity was; the check is re-armed a timeout later."""
    actions = ("function_call",) if status is SessionStatus.REQUIRES_ACTION else ()
    now = T0 + 10 * TIMEOUT
    decision = decided(idle_since(T0, status, actions), record(), now)
    assert decision.verdict is Verdict.IGNORE
    assert decision.recheck_at == now + TIMEOUT


def test_a_pending_connection_request_is_never_stopped() -> None:
    """L12: an idle-looking session that lists an environment_connection action keeps its sandbox."""
    session = idle_since(T0, SessionStatus.REQUIRES_ACTION, ("environment_connection",))
    decision = decided(session, record(), T0 + 10 * TIMEOUT)
    assert decision.verdict is Verdict.KEEP


def test_timeout_zero_keeps_warm_forever() -> None:
    """L11: an idle timeout of 0 keeps the sandbox warm; nothing is armed without a lifetime."""
    decision = decided(idle_since(T0), record(), T0 + 100 * TIMEOUT, timeout=0)
    assert (decision.verdict, decision.recheck_at) == (Verdict.IGNORE, None)


def test_the_timeout_counts_from_the_later_of_last_activity_and_the_start() -> None:
    """L11: a sandbox started for an old session (or with no last_active_at) gets its full timeout."""
    started = T0 + 5000
    for session in (idle_since(T0), IDLE):
        decision = decided(session, record(started_at=started), started + TIMEOUT - 1)
        assert decision.verdict is Verdict.IGNORE and decision.recheck_at == started + TIMEOUT


def test_idle_never_starts_compute() -> None:
    """L9/L13: an idle session without a sandbox gets nothing started."""
    assert decided(idle_since(T0), None, T0 + TIMEOUT).verdict is Verdict.IGNORE


# --- stopped sessions and their workspace (L16) ----------------------------------------------


def test_a_connection_request_starts_a_stopped_session_on_its_workspace() -> None:
    """L16: the next environment_connection after a stop starts a new sandbox (same workspace)."""
    decision = decided(make_session(), record(stopped_at=T0 + 10), T0 + 20)
    assert decision.verdict is Verdict.START and "kept workspace" in decision.reason
    assert decision.recheck_at == T0 + 20 + FIRST_LOOK_SECONDS


def test_retention_discards_a_stopped_workspace_after_it_not_before() -> None:
    """L16: a stopped session's workspace is kept for the retention period, then discarded;
    0 keeps it until the session is deleted or fails."""
    stopped = record(stopped_at=T0)
    kept = decided(IDLE, stopped, T0 + RETENTION - 1, retention=RETENTION)
    assert (kept.verdict, kept.recheck_at) == (Verdict.IGNORE, T0 + RETENTION)
    assert decided(IDLE, stopped, T0 + RETENTION, retention=RETENTION).verdict is Verdict.DISCARD
    forever = decided(IDLE, stopped, T0 + 100 * RETENTION, retention=0)
    assert (forever.verdict, forever.recheck_at) == (Verdict.IGNORE, None)


@pytest.mark.parametrize("ending", ["deleted", "failed"])
def test_a_stopped_session_that_ends_releases_its_workspace(ending: str) -> None:
    """L16: deleted or failed, a stopped session's workspace goes with it."""
    session = None if ending == "deleted" else make_session(status=SessionStatus.FAILED, actions=())
    decision = decided(session, record(stopped_at=T0), T0 + 1)  # type: ignore[arg-type]
    assert decision.verdict is Verdict.RELEASE


# --- the grace clock (L14) ---------------------------------------------------------------------


@pytest.mark.parametrize("status", [SessionStatus.IDLE, SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION])
def test_any_look_that_sees_the_executor_connected_stops_the_grace_clock(status: SessionStatus) -> None:
    """L14: the clock stops at a look that sees the link up, whatever the session's state."""
    session = make_session(status=status, actions=())
    down = Record("sess_1", "env_1", Handle("sess_1", "sandbox-g1", 1, "u1"), T0, disconnected_at=T0 + 5)
    decision = decide(session, down, Health.RUNNING, True, T0 + 10, GRACE, Routing())
    assert decision.update is not None and decision.update.disconnected_at is None
    assert decision.update.seen_connected
    assert decision.verdict is not Verdict.REPLACE


# --- a 404 is not a deletion until it is confirmed (L7, L17) --------------------------------------

CONFIRM = 60.0


def test_two_404s_a_period_apart_are_not_enough() -> None:
    """L7/L17: 404 reads at the start and past the end of the period alone (nothing read
    between them) do not confirm a deletion: the reads must be spread over the period."""
    rec = Record("sess_1", "env_1", Handle("sess_1", "sandbox-g1", 1, "u1"), T0)
    two = decide(None, rec, Health.RUNNING, None, T0 + CONFIRM + 1, GRACE, Routing(),
                 missing=Missing(T0, compared=3, found=3, reads=1, last_read=T0),
                 deletion_confirm_seconds=CONFIRM)  # fmt: skip
    assert two.verdict is Verdict.KEEP and two.missing_reads == (2, T0 + CONFIRM + 1)
    three = decide(None, rec, Health.RUNNING, None, T0 + CONFIRM + 1, GRACE, Routing(),
                   missing=Missing(T0, compared=3, found=3, reads=2, last_read=T0 + CONFIRM / 2),
                   deletion_confirm_seconds=CONFIRM)  # fmt: skip
    assert three.verdict is Verdict.RELEASE
    crowded = decide(None, rec, Health.RUNNING, None, T0 + CONFIRM + 1, GRACE, Routing(),
                     missing=Missing(T0, compared=3, found=3, reads=2, last_read=T0 + CONFIRM),
                     deletion_confirm_seconds=CONFIRM)  # fmt: skip
    assert crowded.verdict is Verdict.KEEP  # a read a second after the last one does not count


def test_the_confirmation_table() -> None:
    """L17: ``decide`` for a session that answered 404, with what the round saw."""
    rec = Record("sess_1", "env_1", Handle("sess_1", "sandbox-g1", 1, "u1"), T0)

    def deleted(missing: Missing, now: float, record: Record | None = rec) -> tuple[Verdict, bool]:
        decision = decide(None, record, Health.RUNNING, None, now, GRACE, Routing(), missing=missing,
                          deletion_confirm_seconds=CONFIRM)  # fmt: skip
        return decision.verdict, decision.held

    def spread(compared: int = 0, found: int = 0, not_found: int = 0) -> Missing:
        return Missing(T0, compared, found, not_found, reads=2, last_read=T0 + CONFIRM / 2)

    assert deleted(Missing(), T0) == (Verdict.KEEP, False)  # the first 404
    assert deleted(Missing(T0), T0 + CONFIRM - 0.5) == (Verdict.KEEP, False)
    assert deleted(spread(), T0 + CONFIRM - 0.5) == (Verdict.KEEP, False)
    assert deleted(spread(), T0 + CONFIRM) == (Verdict.KEEP, True)  # nothing to compare with: held
    assert deleted(spread(3, found=2, not_found=1), T0 + CONFIRM) == (Verdict.RELEASE, False)
    assert deleted(spread(3, found=1, not_found=2), T0 + CONFIRM) == (Verdict.KEEP, True)
    assert deleted(spread(3, found=1, not_found=1), T0 + CONFIRM) == (Verdict.KEEP, True)
    assert deleted(spread(2, found=0, not_found=0), T0 + CONFIRM) == (Verdict.KEEP, True)  # unknown
    assert deleted(spread(3, found=3), T0 + CONFIRM, None) == (Verdict.IGNORE, False)
    confirmed = decide(None, None, None, None, T0 + CONFIRM, GRACE, Routing(), missing=spread(3, found=3),
                       deletion_confirm_seconds=CONFIRM)  # fmt: skip
    assert confirmed.gone and confirmed.missing_since is None
    waiting = decide(None, None, None, None, T0, GRACE, Routing(), missing=Missing(),
                     deletion_confirm_seconds=CONFIRM)  # fmt: skip
    assert not waiting.gone and waiting.missing_since == T0 and waiting.missing_reads == (1, T0)


# --- maximum lifetime, and mappings without compute (L17) ----------------------------------------

LIFETIME = 3600.0
WANTS = make_session()


def verdict_seen(
    session=WANTS,
    rec: Record | None = None,
    health: Health | None = None,
    connected: bool | None = True,
    now: float = T0,
    max_lifetime: float | None = None,
) -> Verdict:
    """``decide``'s verdict, the link seen up unless told (``connected``), with a maximum lifetime."""
    return decide(session, rec, health, connected, now, GRACE, Routing(), max_lifetime).verdict


@pytest.mark.parametrize(
    ("session", "before"), [(WANTS, Verdict.KEEP), (IDLE, Verdict.IGNORE)], ids=["connection-pending", "idle"]
)
def test_max_lifetime_exactly_at_the_limit_keeps_past_it_stops_or_replaces(session, before: Verdict) -> None:
    """L17/L15: a sandbox is stopped once it is past its maximum lifetime, not at it; while a
    connection is requested it is replaced, never released with nothing started."""
    clock = FakeClock(T0)
    rec = record(started_at=clock.now())
    clock.advance(LIFETIME)
    at_limit = decide(session, rec, Health.RUNNING, True, clock.now(), GRACE, Routing(), LIFETIME)
    assert at_limit.verdict is before
    assert at_limit.recheck_at is not None and T0 + LIFETIME < at_limit.recheck_at <= T0 + LIFETIME + 1
    clock.advance(0.001)
    decision = decide(session, rec, Health.RUNNING, True, clock.now(), GRACE, Routing(), LIFETIME)
    if session is WANTS:
        assert decision == Decision(
            Verdict.REPLACE,
            "sandbox is past its maximum lifetime; connection requested",
            cause=Cause.LIFETIME,
            recheck_at=clock.now() + FIRST_LOOK_SECONDS,
        )
    else:
        assert decision == Decision(Verdict.STOP, "sandbox is past its maximum lifetime", cause=Cause.LIFETIME)


@pytest.mark.parametrize("no_limit", [0, 0.0, None])
def test_max_lifetime_zero_or_none_is_no_limit(no_limit: float | None) -> None:
    """L17: 0 (the setting's default) and None mean sandboxes live as long as they are wanted."""
    ancient = T0 + 10 * 365 * 86400
    assert verdict_seen(WANTS, record(), Health.RUNNING, now=ancient, max_lifetime=no_limit) is Verdict.KEEP
    assert verdict_seen(IDLE, record(), Health.RUNNING, now=ancient, max_lifetime=no_limit) is Verdict.IGNORE


def test_max_lifetime_needs_compute_to_release() -> None:
    """L17: without a mapping there is nothing to release; a connection request still starts one."""
    assert verdict_seen(WANTS, None, None, now=T0 + 10 * LIFETIME, max_lifetime=LIFETIME) is Verdict.START
    assert verdict_seen(IDLE, None, None, now=T0 + 10 * LIFETIME, max_lifetime=LIFETIME) is Verdict.IGNORE


def test_max_lifetime_does_not_override_routing() -> None:
    """L6: a session of another handler is left alone, whatever its age."""
    other = make_session(workspace="/elsewhere")
    assert (
        verdict_seen(other, record(), Health.RUNNING, now=T0 + 10 * LIFETIME, max_lifetime=LIFETIME) is Verdict.IGNORE
    )


@pytest.mark.parametrize("health", [Health.GONE, Health.FAILED])
@pytest.mark.parametrize(
    "status", [SessionStatus.IDLE, SessionStatus.IN_PROGRESS, SessionStatus.REQUIRES_ACTION, SessionStatus.UNKNOWN]
)
def test_mapping_of_a_gone_or_failed_sandbox_is_stopped(health: Health, status: SessionStatus) -> None:
    """L16/L17: with no connection pending, a mapping whose sandbox is gone or failed becomes a
    stopped one (the workspace is kept; its retention removes it)."""
    session = make_session(status=status, actions=("function_call",) if status is SessionStatus.REQUIRES_ACTION else ())
    decision = decide(session, record(), health, None, T0, GRACE, Routing())
    assert decision == Decision(Verdict.STOP, f"sandbox is {health.value}; workspace kept", cause=Cause.FAILED)


@pytest.mark.parametrize("health", [Health.GONE, Health.FAILED])
def test_gone_sandbox_with_a_connection_pending_is_replaced_not_released(health: Health) -> None:
    """L14 vs L17: if the session asks for a connection, the dead sandbox is replaced by one new one."""
    assert verdict_seen(WANTS, record(), health) is Verdict.REPLACE


@pytest.mark.parametrize("health", [Health.TERMINATING, Health.RUNNING, Health.STARTING])
def test_terminating_or_live_sandbox_without_a_connection_pending_is_left_alone(health: Health) -> None:
    """L13/L17: TERMINATING is on its way out by itself; a live one is kept (idle alone stops nothing)."""
    assert verdict_seen(IDLE, record(), health, connected=False, now=T0 + 10 * GRACE) is Verdict.IGNORE
