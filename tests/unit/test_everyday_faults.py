"""Live work under everyday faults (issue 16), over the fakes and a fake clock.

- The executor's grace period counts only while its link is down (L14): a drop shorter than
  the grace never replaces a live executor, whenever it comes.
- A 404 is not a deletion until its reads have answered 404 for the confirmation period, and
  never when most sessions read to confirm it answer 404 too (L7, L17).
- Pre-start has a budget of sandboxes not yet used (L9).

The one clock (Redis's ``TIME``) is proven against Redis (tests/contract) and with skewed
worker clocks (tests/system); here the fake clock stands for it. ``decide`` alone, for these
rules too, is tests/unit/test_decide.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from controller.decide import BLIND_SPOT_GRACES, FIRST_LOOK_SECONDS, HELD_RECHECK_MAX_SECONDS, OUTAGE_LOOKS, Verdict
from controller.errors import ApiUnavailable, RunnerRejected, StartFailed
from controller.model import Health, Session, SessionStatus
from tests.support.fakes import GRACE, T0, World, make_session, verdicts

WANTS = make_session()
RUNNING = make_session(status=SessionStatus.IN_PROGRESS, actions=())
IDLE = make_session(status=SessionStatus.IDLE, actions=())
CONFIRM = 60.0


def started(world: World, connect_after: float = 0.5) -> None:
    """A connection request starts a sandbox; its executor connects ``connect_after`` later."""
    world.sessions.put(WANTS)
    assert verdicts(world.deliver()) == [Verdict.START]
    world.sessions.connected["env_1"] = False
    world.clock.advance(connect_after)
    world.sessions.connected["env_1"] = True


def run_timers_until(world: World, until: float) -> list[Verdict]:
    """Fire the session's timer each time it falls due, up to ``until`` (seconds after T0)."""
    seen: list[Verdict] = []
    while (due := world.store.timer("sess_1")) is not None and due <= T0 + until:
        world.clock.advance(max(0.0, due - world.clock.now()))
        seen += world.fire_timers().get("sess_1", [])
    world.clock.advance(max(0.0, T0 + until - world.clock.now()))
    return seen


def link_drops(world: World, session_then: Session = WANTS) -> list[Verdict]:
    """The link goes down and the session reads as ``session_then`` (by default the API asks for
    a connection again); its delivery comes at once, as the API's webhook would."""
    world.sessions.connected["env_1"] = False
    world.sessions.put(session_then)
    return verdicts(world.deliver())


def link_back(world: World, session_after: Session = RUNNING) -> None:
    """The link is up again and the session reads as ``session_after``; no webhook says so."""
    world.sessions.connected["env_1"] = True
    world.sessions.put(session_after)


def in_a_turn(world: World, grace: float = 10.0) -> list[Verdict]:
    """Grace ``grace``; a sandbox started, its executor connected and the session in a long
    turn, its timers fired up to 20 s after T0 (the verdicts seen so far)."""
    world.deps.grace_seconds = grace
    started(world)
    world.sessions.put(RUNNING)
    return run_timers_until(world, 20.0)


def drop(world: World, at: float, seconds: float, session_then: Session, session_after: Session) -> list[Verdict]:
    """The link drops at ``at`` (seconds after T0) for ``seconds``; the session reads as
    ``session_then`` during the drop (a delivery comes at once, as the API's webhook would) and
    as ``session_after`` once it is back. Returns every verdict up to 3 grace periods later."""
    seen = run_timers_until(world, at)
    seen += link_drops(world, session_then)
    seen += run_timers_until(world, at + seconds)
    link_back(world, session_after)
    seen += verdicts(world.deliver())
    seen += run_timers_until(world, at + seconds + 3 * GRACE)
    return seen


# --- the grace clock (L14) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "at", "then", "after"),
    [
        ("before the first look", 0.8, WANTS, RUNNING),
        ("during a turn", 8.0, WANTS, RUNNING),
        ("while idle", 30.0, WANTS, IDLE),
        ("while a request is pending", 5.0, WANTS, WANTS),
    ],
)
def test_a_drop_shorter_than_the_grace_never_replaces_a_live_executor(
    phase: str, at: float, then: Session, after: Session
) -> None:
    """L14: a link that drops for less than the grace period is never a reason to replace the
    executor, whatever the session was doing when it dropped; the sandbox started once."""
    world = World()
    started(world)
    world.sessions.put(RUNNING if phase != "while idle" else IDLE)
    seen = drop(world, at, GRACE - 10, then, after)
    assert Verdict.REPLACE not in seen, phase
    assert world.count("ensure") == 1 and world.count("release") == 0


def test_the_first_look_after_a_start_finding_a_turn_clears_the_grace_clock() -> None:
    """L14: the case that replaced live executors: the first look after a start finds the session
    in a turn (no connection wanted); it still sees the executor connected and stops the clock
    that started with the sandbox, so a blip 8 s after connecting (grace 5 s) is kept."""
    world = World()
    world.deps.grace_seconds = 5.0
    started(world, connect_after=0.3)
    world.sessions.put(RUNNING)
    assert run_timers_until(world, 1.0) == [Verdict.IGNORE]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.seen_connected and saved.disconnected_at is None
    world.clock.advance(7.3)  # 8 s after connecting
    world.sessions.connected["env_1"] = False
    world.sessions.put(WANTS)  # the link dropped during the turn: the API asks again
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    world.clock.advance(1.5)
    world.sessions.connected["env_1"] = True
    assert Verdict.REPLACE not in run_timers_until(world, 40.0)
    assert world.count("ensure") == 1


@pytest.mark.parametrize(("api_says", "replaced"), [("disconnected", False), ("pending", True)])
def test_a_drop_between_a_new_sandboxs_first_looks_is_timed_from_the_look_that_finds_it(
    api_says: str, replaced: bool
) -> None:
    """L14 (found by the seeded schedule, seed 30): a new sandbox's executor connects 17 s after
    its start and loses its link 3 s later, between two of the first looks (16 s and 32 s), so no
    look sees it up. The API reports the link ``disconnected`` (held, then lost): the grace clock
    runs from the look that finds it so, not from the sandbox's start, and a drop shorter than
    the grace replaces nothing. A link the API reports never held (``pending``) is still timed
    from the start, and replaced once the grace is over."""
    world = World()
    world.sessions.put(WANTS)
    assert verdicts(world.deliver()) == [Verdict.START]
    world.sessions.connected["env_1"] = False
    seen = run_timers_until(world, 17.0)
    if api_says == "disconnected":
        world.sessions.dropped.add("env_1")  # up from 17 s to 20 s, unseen
    seen += run_timers_until(world, 20.0 + GRACE - 10)
    world.sessions.connected["env_1"] = True
    seen += run_timers_until(world, 20.0 + 3 * GRACE)
    assert (Verdict.REPLACE in seen) is replaced
    assert world.count("ensure") == (2 if replaced else 1)


@pytest.mark.parametrize(("first", "up", "second"), [(2.0, 6.0, 5.0), (2.4, 5.5, 3.1), (5.5, 3.0, 3.0)])
def test_two_drops_each_shorter_than_the_grace_never_replace_a_live_executor(
    first: float, up: float, second: float
) -> None:
    """L14 (issue 25, item 4): grace 10 s, a long turn; the link drops for ``first`` s and comes
    back with no delivery to cause a look; ``up`` s later it drops again for ``second`` s (the
    API asks for a connection again at each drop). No outage reaches the grace, though the two
    together span more than it: the looks made while the clock runs see the link come back, and
    the live executor is kept."""
    world = World()
    seen = in_a_turn(world)
    seen += link_drops(world)  # the first drop
    seen += run_timers_until(world, 20.0 + first)
    link_back(world)  # back: no webhook says so
    seen += run_timers_until(world, 20.0 + first + up)
    seen += link_drops(world)  # the second drop
    seen += run_timers_until(world, 20.0 + first + up + second)
    link_back(world)
    seen += run_timers_until(world, 20.0 + first + up + second + 30.0)
    assert Verdict.REPLACE not in seen
    assert world.count("ensure") == 1 and world.count("release") == 0


def test_a_drop_after_a_stretch_the_link_could_not_be_read_is_timed_from_the_look_that_sees_it() -> None:
    """L14 (found by the 30-minute seeded run, seed 32): grace 10 s; the link drops at 20 s for
    2.8 s while the environment's reads hang (20.5–26.5 s), so no look sees it come back; it
    drops again at 27 s for 5 s. The looks that could not read the link leave a blind spot: the
    look that next sees it down starts the clock again, and the live executor is kept."""
    world = World()
    seen = in_a_turn(world)
    seen += link_drops(world)  # the first drop
    seen += run_timers_until(world, 20.5)
    del world.sessions.connected["env_1"]  # environment reads hang: the link cannot be read
    world.sessions.put(RUNNING)
    seen += run_timers_until(world, 26.5)
    world.sessions.connected["env_1"] = True  # readable again: up (since 22.8 s, unseen)
    seen += run_timers_until(world, 27.0)
    seen += link_drops(world)  # the second drop
    seen += run_timers_until(world, 32.0)
    link_back(world)
    seen += run_timers_until(world, 60.0)
    assert Verdict.REPLACE not in seen
    assert world.count("ensure") == 1


def test_a_look_whose_reads_took_seconds_is_a_blind_spot_for_the_grace() -> None:
    """L14 (found by a 30-minute seeded run, seed 25): grace 10 s; the link drops at 20 s. The
    look due at 22.5 s finds every session read hanging (an API incident): its read is retried
    until 27 s. Meanwhile the link came back (22.8 s, unseen) and dropped again (24.4 s) for
    6.7 s. The look that finally reads it down comes long after the last one did, so it starts
    the clock again: no replacement for two outages each shorter than the grace (the round's
    time is when it saw the link, not when it began)."""
    world = World()
    seen = in_a_turn(world)
    seen += link_drops(world)  # the first drop, at 20 s

    def slow_read(session_id: str) -> None:
        world.sessions.on_get = None
        world.clock.advance(T0 + 27.0 - world.clock.now())  # retried through the incident
        world.sessions.connected["env_1"] = False  # back at 22.8 s, down again at 24.4 s: unseen

    seen += run_timers_until(world, 22.0)
    world.sessions.on_get = slow_read
    seen += run_timers_until(world, 24.4 + 6.7)
    link_back(world)
    seen += run_timers_until(world, 60.0)
    assert Verdict.REPLACE not in seen
    assert world.count("ensure") == 1 and world.count("release") == 0


def test_a_link_down_for_good_through_slow_reads_is_still_replaced() -> None:
    """L14: slow reads are not a reason never to replace: with every session read taking 2 s
    (each look sees the link that much later than it was armed for), a link down for good from
    20 s is replaced by 38 s, a grace and a look or two after the first look that saw it down."""
    world = World()
    seen = in_a_turn(world)
    world.sessions.on_get = lambda session_id: world.clock.advance(2.0)
    seen += link_drops(world)
    seen += run_timers_until(world, 38.0)
    assert seen.count(Verdict.REPLACE) == 1 and world.count("ensure") == 2


def test_a_drop_after_the_sessions_reads_answered_404_is_timed_from_the_look_that_sees_it() -> None:
    """L14 (the run's second case): between two short drops the session's reads answer 404 for
    2.8 s (a partial incident): those looks read no link, a blind spot; the look that next sees
    the link down starts the clock again, and the live executor is kept."""
    world = World(deletion_confirm=6.0)
    seen = in_a_turn(world)
    seen += link_drops(world)  # the first drop
    seen += run_timers_until(world, 21.0)
    del world.sessions.sessions["sess_1"]  # its reads answer 404
    seen += run_timers_until(world, 26.5)
    link_back(world)  # up since 22.5 s, unseen
    seen += run_timers_until(world, 27.0)
    seen += link_drops(world)  # the second drop
    seen += run_timers_until(world, 32.0)
    link_back(world)
    seen += run_timers_until(world, 60.0)
    assert Verdict.REPLACE not in seen and Verdict.RELEASE not in seen
    assert world.count("ensure") == 1


def unreadable(world: World, at: float) -> None:
    """A round at ``at`` (seconds after T0) whose session read fails outright (5xx, 429, a
    timeout: ``ApiUnavailable``): the task's retry, or the timer that fell due."""
    world.clock.advance(max(0.0, T0 + at - world.clock.now()))
    with pytest.raises(ApiUnavailable):
        world.deliver()


def test_a_drop_after_a_stretch_the_session_could_not_be_read_is_timed_from_the_look_that_sees_it() -> None:
    """L14 (issue 25, item 4; the seeded run's first case): grace 10 s; the link drops at 20 s
    for 2.8 s while every session read fails (5xx from 20.5 s to 27.5 s: those rounds fail and
    are retried), so no look sees it come back; it drops again at 27 s for 5 s. A round that
    could not read the session leaves a blind spot like one that could not read the link: the
    look that next sees the link down (27.5 s) starts the clock again, and the live executor is
    kept."""
    world = World()
    world.deps.grace_seconds = 10.0
    started(world)
    world.sessions.put(RUNNING)
    seen = run_timers_until(world, 20.0)
    world.sessions.connected["env_1"] = False  # the first drop
    world.sessions.put(WANTS)
    seen += verdicts(world.deliver())
    seen += run_timers_until(world, 20.5)
    world.sessions.unavailable = True  # every session read fails
    for at in (21.5, 22.5, 24.5, 26.5):
        if at == 22.5:
            world.sessions.connected["env_1"] = True  # up since 22.8 s: nothing can see it
        unreadable(world, at)
    world.sessions.connected["env_1"] = False  # the second drop, at 27 s
    world.sessions.put(WANTS)
    world.clock.advance(T0 + 27.5 - world.clock.now())
    world.sessions.unavailable = False
    seen += verdicts(world.deliver())  # the retry that reads again: the link is down
    seen += run_timers_until(world, 32.0)
    world.sessions.connected["env_1"] = True
    world.sessions.put(RUNNING)
    seen += run_timers_until(world, 60.0)
    assert Verdict.REPLACE not in seen
    assert world.count("ensure") == 1 and world.count("release") == 0


def test_a_link_down_for_good_through_an_api_outage_is_replaced_by_the_first_look_that_reads_it() -> None:
    """L14: a blind spot delays a replacement, never past its bound: a link down for good (seen
    down before the outage and after it) through 30 s of failing session reads is replaced by
    the first look that reads it again, once, since its outage was first seen more than
    ``BLIND_SPOT_GRACES`` graces before."""
    world = World()
    world.deps.grace_seconds = 10.0
    started(world)
    world.sessions.put(RUNNING)
    run_timers_until(world, 20.0)
    world.sessions.connected["env_1"] = False
    world.sessions.put(WANTS)
    world.deliver()
    run_timers_until(world, 21.0)
    world.sessions.unavailable = True
    for at in range(22, 52, 3):
        unreadable(world, at)
    world.sessions.unavailable = False
    world.clock.advance(T0 + 52.0 - world.clock.now())
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    assert world.count("ensure") == 2


def test_a_wedged_executor_is_replaced_within_two_graces_while_the_api_fails_a_read_every_few_seconds() -> None:
    """L14/L15 (issue 37, item 3): grace 20 s; an executor that had connected is wedged (its link
    down for good) while the API fails three environment reads every 8 s. Each failed read is a
    blind spot that restarts the grace clock, so the clock alone never reaches the grace; but
    blind spots extend it at most ``BLIND_SPOT_GRACES`` graces from the first look that saw the
    link down: the executor is replaced once, at most two graces and a look after that look,
    well inside the API's five minutes — not at the end of the connection window."""
    world = World()
    seen = in_a_turn(world, grace=20.0)
    seen += link_drops(world)  # wedged from 20 s on: the link never comes back
    first_seen = world.clock.now()
    replaced_at = None
    for _ in range(1000):  # bounded: a timer that fell due again at once would spin
        if world.clock.now() >= T0 + 300 or replaced_at is not None:
            break
        cycle = world.clock.now() - first_seen
        readable = cycle % 8 >= 3  # the environment's reads fail for 3 s of every 8
        if readable:
            world.sessions.connected["env_1"] = False
        else:
            world.sessions.connected.pop("env_1", None)
        due = world.store.timer("sess_1")
        assert due is not None
        world.clock.advance(max(0.0, min(due, world.clock.now() + 1.0) - world.clock.now()))
        if due <= world.clock.now():
            fired = world.fire_timers().get("sess_1", [])
            if Verdict.REPLACE in fired:
                replaced_at = world.clock.now()
    assert Verdict.REPLACE not in seen
    assert replaced_at is not None and replaced_at - first_seen <= BLIND_SPOT_GRACES * 20.0 + 20.0 / OUTAGE_LOOKS + 1
    assert world.count("ensure") == 2


def test_an_executor_whose_link_no_look_can_read_is_replaced_within_two_graces_of_the_request() -> None:
    """L14/L15 (issue 37, item 3): grace 20 s; an executor that had connected is wedged, the API
    asks for a connection again, and every read of the environment fails whenever a look comes
    (an environments endpoint that is down, or failures that happen to meet every look): no
    look ever sees the link down. The API's own request for a connection is the evidence the
    outage began; unreadable links delay the replacement at most ``BLIND_SPOT_GRACES`` graces
    from the first look that met that request, then the executor is replaced once — not at the
    end of the connection window."""
    world = World()
    seen = in_a_turn(world, grace=20.0)
    world.sessions.connected.pop("env_1", None)  # every link read fails from now on
    world.sessions.put(WANTS)
    seen += verdicts(world.deliver())
    asked = world.clock.now()
    replaced_at = []
    for _ in range(1000):  # bounded: a timer that fell due again at once would spin
        due = world.store.timer("sess_1")
        if due is None or due > T0 + 300:
            break
        world.clock.advance(max(0.0, due - world.clock.now()))
        replaced_at += [world.clock.now()] * world.fire_timers().get("sess_1", []).count(Verdict.REPLACE)
    assert Verdict.REPLACE not in seen
    assert len(replaced_at) == 1, replaced_at
    assert replaced_at[0] - asked <= BLIND_SPOT_GRACES * 20.0 + 20.0 + 1
    assert world.count("ensure") == 2


def test_a_link_down_for_good_is_replaced_once_its_reads_answer_again() -> None:
    """L14: the blind spot delays a replacement, never prevents it: a link down for good whose
    reads fail for a while is replaced a grace after the first look that reads it again."""
    world = World()
    in_a_turn(world)
    link_drops(world)
    run_timers_until(world, 21.0)
    del world.sessions.connected["env_1"]
    run_timers_until(world, 24.0)
    world.sessions.connected["env_1"] = False
    assert Verdict.REPLACE not in run_timers_until(world, 33.0)  # not timed across the blind spot
    assert run_timers_until(world, 38.0).count(Verdict.REPLACE) == 1 and world.count("ensure") == 2


def test_a_link_down_past_the_grace_is_still_replaced_once() -> None:
    """L14: a link that stays down past the grace while a connection is wanted is replaced by
    exactly one new sandbox, timed from the first look that saw it down (the looks the grace
    clock arms while it runs see it down all along)."""
    world = World()
    started(world)
    run_timers_until(world, 2.0)  # seen connected
    world.sessions.connected["env_1"] = False
    world.sessions.put(WANTS)
    world.clock.advance(100)
    assert verdicts(world.deliver()) == [Verdict.KEEP]  # the first look that sees it down
    seen = run_timers_until(world, 102.5 + GRACE + 2)
    assert seen.count(Verdict.REPLACE) == 1
    assert world.count("ensure") == 2 and world.runner.max_live["sess_1"] == 1


# --- a 404 is not a deletion until it is confirmed (L7, L17) --------------------------------------


def gone_world(confirm: float = CONFIRM, others: tuple[str, ...] = ("sess_2",)) -> World:
    """sess_1 has a connected sandbox; ``others`` too; then sess_1's reads answer 404."""
    world = World(deletion_confirm=confirm)
    for sid in ("sess_1", *others):
        world.sessions.put(make_session(sid, env_id=f"env_{sid}"))
        assert verdicts(world.deliver(sid)) == [Verdict.START]
        world.sessions.connected[f"env_{sid}"] = True
    del world.sessions.sessions["sess_1"]
    return world


def fire_until(world: World, until: float, readable: Callable[[float], bool] | None = None) -> dict[str, list[Verdict]]:
    """Fire every timer as it falls due up to ``until`` (seconds after T0); sess_1 answers (its
    read finds it) at a time ``t`` after T0 only when ``readable(t)``, 404 otherwise."""
    seen: dict[str, list[Verdict]] = {}
    again = make_session("sess_1", env_id="env_sess_1")
    while world.store.timers and (due := min(world.store.timers.values())) <= T0 + until:
        world.clock.advance(max(0.0, due - world.clock.now()))
        if readable is not None:
            if readable(world.clock.now() - T0):
                world.sessions.put(again)
            else:
                world.sessions.sessions.pop("sess_1", None)
        for sid, fired in world.fire_timers().items():
            seen.setdefault(sid, []).extend(fired)
    world.clock.advance(max(0.0, T0 + until - world.clock.now()))
    return seen


def test_a_single_404_destroys_nothing_and_a_later_read_forgets_it() -> None:
    """L7/L17: the first 404 only arms a timer (the next of the reads spread over the
    confirmation period); the sandbox and its workspace stay. A session found again (a
    transient fault, a wrong URL fixed) is as if nothing happened."""
    world = gone_world()
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert "sess_1" in world.runner.live and world.runner.keeps_workspace("sess_1")
    assert world.store.missing == {"sess_1": T0}
    assert world.store.timer("sess_1") == T0 + CONFIRM / 2
    world.clock.advance(30)
    world.sessions.put(make_session("sess_1", env_id="env_sess_1"))
    world.deliver()
    assert world.store.missing == {} and world.count("release") == 0 and world.count("discard") == 0


def test_a_deletion_counts_once_its_reads_answer_404_for_the_confirmation_period() -> None:
    """L17/L16: reads that answer 404 for the whole period (three, spread over it, the last
    after its end), while another session answers, mean the session was deleted: its sandbox
    and workspace go then, not before."""
    world = gone_world()
    world.deliver()
    assert fire_until(world, CONFIRM - 1)["sess_1"] == [Verdict.KEEP]  # the read half-way
    assert verdicts(world.deliver()) == [Verdict.KEEP]  # a delivery just before the end
    assert world.count("release") == 0
    assert fire_until(world, CONFIRM + 1)["sess_1"] == [Verdict.RELEASE]
    assert world.count("release") == 1 and world.count("discard") == 1
    assert world.store.record("sess_1") is None and world.store.missing == {}
    assert world.stopped == ["deleted"] and world.held == 0


def test_a_session_readable_between_two_404s_is_not_deleted() -> None:
    """L7/L17: 404, then the session reads fine, then 404 again at the end of the confirmation
    period (a flapping API, a partial incident): not 404s for the whole period, so nothing is
    destroyed. The read half-way through the period finds the session and starts over."""
    world = gone_world()
    assert verdicts(world.deliver()) == [Verdict.KEEP]  # the first one-shot 404
    readable = lambda t: 1.0 <= t < CONFIRM - 1  # noqa: E731
    seen = fire_until(world, 2 * CONFIRM - 1.5, readable)
    assert Verdict.RELEASE not in seen.get("sess_1", []), seen
    assert world.count("release") == 0 and world.count("discard") == 0 and "sess_1" in world.runner.live
    fire_until(world, 4 * CONFIRM, readable)  # 404s for a whole period since it was last found
    assert world.count("release") == 1


def test_when_most_sessions_read_answer_404_no_deletion_is_acted_on() -> None:
    """L17: a wrong API key (another project's) or base URL makes every read answer 404: each
    deletion that would be confirmed compares with other sessions, finds most of them missing
    too, and is held (an error, a metric); nothing is released, however long it lasts. Fixed,
    every session is found again and nothing was lost."""
    world = gone_world(others=("sess_2", "sess_3", "sess_4"))
    world.sessions.sessions.clear()  # every read answers 404 now
    for sid in ("sess_1", "sess_2", "sess_3", "sess_4"):
        world.deliver(sid)
    held_at: list[float] = []
    while world.clock.now() < T0 + 4 * 3600:  # four hours of a wrong key
        world.clock.advance(min(world.store.timers.values()) - world.clock.now())
        fired = world.fire_timers()
        assert all(v == [Verdict.KEEP] for v in fired.values()), fired
        if "sess_1" in fired and world.decisions[-1][1].held:
            held_at.append(world.clock.now() - T0)
    assert world.count("release", "sess_1") == 0 and len(world.runner.live) == 4 and world.stopped == []
    held = [d for sid, d in world.decisions if d.held]
    assert world.held == len(held) > 0 and "wrong CONTROLLER_API_KEY" in held[-1].reason
    # Looked at again after as long as it has answered 404 (at most an hour): not every minute.
    assert held_at[:5] == [61, 122, 244, 488, 976], held_at
    assert max(b - a for a, b in itertools.pairwise(held_at)) == HELD_RECHECK_MAX_SECONDS
    for sid in ("sess_1", "sess_2", "sess_3", "sess_4"):  # the key is fixed
        world.sessions.put(make_session(sid, env_id=f"env_{sid}"))
    world.clock.advance(max(world.store.timers.values()) - world.clock.now())
    world.fire_timers()
    assert world.store.missing == {} and len(world.runner.live) == 4


def test_with_the_confirmation_off_a_wrong_key_still_holds_every_deletion() -> None:
    """L7/L17: CONTROLLER_DELETION_CONFIRM_SECONDS=0 makes the first 404 count, but it is still
    compared with other sessions: when they answer 404 too (a wrong key), nothing is released."""
    world = gone_world(confirm=0.0, others=("sess_2", "sess_3"))
    world.sessions.sessions.clear()
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert world.count("release") == 0 and world.held == 1


def test_many_real_deletions_are_confirmed_when_the_sessions_compared_answer() -> None:
    """L17: deleting most sessions at once is not mistaken for a wrong key: the sessions read to
    confirm a deletion are those not known to answer 404 first, and they answer."""
    world = gone_world(others=("sess_2", "sess_3", "sess_4", "sess_5"))
    for sid in ("sess_2", "sess_3", "sess_4"):
        del world.sessions.sessions[sid]
    for sid in ("sess_1", "sess_2", "sess_3", "sess_4"):
        world.deliver(sid)
    fired = fire_until(world, CONFIRM + 1)
    assert {sid: fired[sid][-1] for sid in ("sess_1", "sess_2", "sess_3", "sess_4")} == {
        sid: Verdict.RELEASE for sid in ("sess_1", "sess_2", "sess_3", "sess_4")
    }
    assert list(world.runner.live) == ["sess_5"] and world.held == 0


def test_a_lone_session_answering_404_is_held_until_an_operator_releases_it() -> None:
    """L7/L17: with no other session to compare with, 404s alone are no evidence of a deletion
    (a wrong key or base URL looks the same): the deletion is held, however long it lasts,
    and said so. The operator's release (``sandbox-controller release``) ends the hold at the
    next look; a session that answers again meanwhile forgets the release asked."""
    world = gone_world(others=())
    world.deliver()
    fire_until(world, 3 * 3600)
    assert world.count("release") == 0 and "sess_1" in world.runner.live and world.held > 0
    held = [d for _, d in world.decisions if d.held]
    assert "no other session to compare with" in held[-1].reason and "release SESSION_ID" in held[-1].reason
    assert world.store.ask_release("sess_2", world.clock.now()) is False  # not known to answer 404
    assert world.store.ask_release("sess_1", world.clock.now()) is True
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert world.count("release") == 1 and world.count("discard") == 1 and world.store.missing == {}
    assert world.stopped == ["deleted"]


def test_a_release_asked_is_forgotten_when_the_session_answers_again() -> None:
    """L7/L17: the operator's release applies only to a session that still answers 404."""
    world = gone_world(others=())
    world.deliver()
    assert world.store.ask_release("sess_1", world.clock.now())
    world.sessions.put(make_session("sess_1", env_id="env_sess_1"))
    world.deliver()
    del world.sessions.sessions["sess_1"]
    world.deliver()
    assert world.count("release") == 0 and world.store.releases == {}


def found_by_failing_rounds(world: World, release_asked: bool = False) -> None:
    """sess_1 answered 404 twice (two of the three spread reads counted: at T0 and half-way), and
    an operator asked for its release when ``release_asked``; from T0 + 35 s it reads fine and asks
    for a connection, but its executor has exited and each round's replacement fails to start (the
    executor binary is being replaced): four rounds that raise."""
    assert verdicts(world.deliver()) == [Verdict.KEEP]  # the first 404
    assert fire_until(world, CONFIRM / 2 + 1)["sess_1"] == [Verdict.KEEP]  # the second, half-way
    assert world.store.not_found("sess_1") is not None
    if release_asked:
        assert world.store.ask_release("sess_1", world.clock.now())
    world.sessions.put(make_session("sess_1", env_id="env_sess_1"))
    sandbox = world.store.record("sess_1")
    assert sandbox is not None
    world.runner.set_health(sandbox.handle, Health.FAILED)
    world.runner.fail_ensure = RunnerRejected("exec failed: the executor binary is being replaced")
    for at in (35.0, 40.0, 45.0, 50.0):
        world.clock.advance(T0 + at - world.clock.now())
        with pytest.raises(StartFailed):
            world.deliver()
    world.runner.fail_ensure = None


@pytest.mark.parametrize("release_asked", [False, True], ids=["marks", "release-asked"])
def test_a_good_read_forgets_the_404s_even_when_its_round_fails(release_asked: bool) -> None:
    """L7/L17 (issue 37, item 1): 404, 404, then the session reads fine (``requires_action``) in
    rounds that each fail (the replacement's start fails), then one more 404 after the period:
    that is one 404, not a deletion. A good read forgets the session's 404 marks before its round
    acts, whatever the round does next; so does an operator's release asked meanwhile (it applies
    to a session that still answers 404, never to a later one). The sandbox's record and
    workspace stay, and the next read that finds the session starts its executor."""
    world = gone_world()
    found_by_failing_rounds(world, release_asked)
    del world.sessions.sessions["sess_1"]  # one 404, a period after the first
    world.clock.advance(T0 + CONFIRM + 5 - world.clock.now())
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert world.count("discard") == 0 and world.runner.keeps_workspace("sess_1")
    assert world.store.record("sess_1") is not None and world.stopped == []
    assert world.store.missing == {"sess_1": world.clock.now()} and world.store.releases == {}  # a first 404
    world.sessions.put(make_session("sess_1", env_id="env_sess_1"))
    assert verdicts(world.deliver()) == [Verdict.REPLACE] and "sess_1" in world.runner.live


def test_a_kept_workspace_without_a_sandbox_waits_for_the_confirmation_too() -> None:
    """L16/L17: a workspace kept after its sandbox went is discarded only once the deletion of its
    session is confirmed, never at the first 404."""
    world = gone_world(others=("sess_2",))
    world.runner.kept_workspaces.add("sess_3")
    world.deliver("sess_3")
    assert world.count("discard", "sess_3") == 0 and world.store.missing["sess_3"] == T0
    fire_until(world, CONFIRM + 1)
    assert world.count("discard", "sess_3") == 1


# --- pre-start has a budget (L9) ------------------------------------------------------------------


def created(world: World, n: int, first: int = 0) -> list[Verdict]:
    """``n`` sessions of a pre-started agent are created (their creation events delivered)."""
    seen = []
    for i in range(first, first + n):
        session = make_session(f"new_{i}", env_id=f"env_new_{i}", status=SessionStatus.IDLE, actions=(),
                               created_at=int(world.clock.now()))  # fmt: skip
        world.sessions.put(session)
        seen += verdicts(world.deliver(session.id))
    return seen


def test_prestart_starts_at_most_its_budget_of_unused_sandboxes() -> None:
    """L9: 20 creations with a budget of 3 give 3 sandboxes; the rest start nothing (counted),
    and a session that asks for a connection is never held back by the budget."""
    world = World(prestart_agent_ids=("agent_1",), prestart_max=3)
    assert created(world, 20).count(Verdict.START) == 3
    assert len(world.runner.live) == 3 and world.prestarts_skipped == 17
    world.sessions.put(make_session("asks", env_id="env_asks"))
    assert verdicts(world.deliver("asks")) == [Verdict.START]
    world.sessions.put(make_session("new_10", env_id="env_new_10"))  # a skipped one asks
    assert verdicts(world.deliver("new_10")) == [Verdict.START]


def test_a_used_or_stopped_prestarted_sandbox_frees_its_room() -> None:
    """L9: the budget counts pre-started sandboxes not yet used: one whose session got input, or
    that was stopped, makes room for the next creation."""
    world = World(prestart_agent_ids=("agent_1",), prestart_max=1, idle_timeout=600)
    assert created(world, 2) == [Verdict.START, Verdict.IGNORE]
    world.sessions.put(make_session("new_0", env_id="env_new_0", status=SessionStatus.IN_PROGRESS, actions=()))
    world.sessions.connected["env_new_0"] = True
    world.deliver("new_0")  # input came: a turn runs
    saved = world.store.record("new_0")
    assert saved is not None and not saved.prestarted
    world.clock.advance(FIRST_LOOK_SECONDS)
    assert created(world, 1, first=2) == [Verdict.START]


def test_deadlines_are_looked_at_one_timer_resolution_after_they_pass() -> None:
    """L12: the decisions' margin past a deadline is the scheduler's timer resolution (the two
    modules cannot share the constant: ``decide`` imports nothing that logs)."""
    from controller import decide, timers

    assert decide.MARGIN_SECONDS == timers.RESOLUTION_SECONDS
