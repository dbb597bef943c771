"""The chaos tier's seeded schedule (``tests/chaos/schedule.py``): replayable from its seed,
a story in which every step names a session that exists by then, and a default set of faults
that leaves role flips out until they are switched on."""

from __future__ import annotations

import itertools
import re

import pytest

from tests.chaos.schedule import (
    CHECKPOINT_FAULTS,
    CI_MINUTES,
    CI_RUNS,
    CI_SEEDS,
    CRASH_LOOP,
    DEFAULT_FAULTS,
    DELETION_CONFIRM_SECONDS,
    DELETION_FAULTS,
    FAULTS,
    GRACE_SECONDS,
    LEADER_AFTER_INPUT_SECONDS,
    LIFETIME_CYCLES,
    LIFETIME_FAULTS,
    LIFETIME_RUN_FAULTS,
    LIFETIME_SECONDS,
    LINEAGE_SLACK_SECONDS,
    LONE_OPENING_SECONDS,
    MAX_LIVE_SESSIONS,
    NO_404_SECONDS,
    OPERATOR_RELEASE_SECONDS,
    OPT_IN_FAULTS,
    PLACED_FAULTS,
    QUIET_EVERY_SECONDS,
    QUIET_SECONDS,
    STALE_FAULTS,
    STALE_WORKER_SECONDS,
    SUSPEND_CYCLES,
    SUSPEND_FAULTS,
    WEDGED_BOUND_SECONDS,
    Step,
    draw,
    select,
)
from tests.chaos.world import CHECKPOINT_IDLE_TIMEOUT_SECONDS


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert draw(7, 2, DEFAULT_FAULTS) == draw(7, 2, DEFAULT_FAULTS)
    assert draw(7, 2, DEFAULT_FAULTS).steps != draw(8, 2, DEFAULT_FAULTS).steps


def test_switching_a_fault_off_removes_its_steps_and_keeps_the_first_sessions() -> None:
    """Sessions come from their own random stream: the sessions a run starts with do not
    depend on the faults chosen."""
    full, without = draw(3, 3, DEFAULT_FAULTS), draw(3, 3, DEFAULT_FAULTS - {"webhook-duplicate"})
    assert [s for s in full.steps if s.kind == "create"][:3] == [s for s in without.steps if s.kind == "create"][:3]
    assert not any(s.kind == "webhook-duplicate" for s in without.steps)


@pytest.mark.parametrize("seed", range(20))
def test_every_step_names_a_session_that_exists_then(seed: int) -> None:
    schedule = draw(seed, 5, DEFAULT_FAULTS)
    born: dict[str, float] = {}
    gone: dict[str, float] = {}
    bursts: set[str] = set()
    for step in schedule.steps:
        if step.kind in ("create", "stale-worker"):  # a stale-worker fault creates its own session
            assert step.subject not in born
            born[step.subject] = step.at
            if step.value == "prestart":
                bursts.add(step.subject)
        elif step.kind in ("delete", "fail"):
            gone[step.subject] = step.at
    for step in schedule.steps:
        if re.fullmatch(r"s\d+", step.subject) and step.kind != "create":
            assert born[step.subject] <= step.at, step
        if step.kind == "input":
            assert step.subject not in bursts, step  # nobody asks for a pre-started sandbox
            assert gone.get(step.subject, float("inf")) > step.at, step
    alive_at_most = max(
        sum(1 for name, at in born.items() if at <= t and gone.get(name, float("inf")) > t and name not in bursts)
        for t in [s.at for s in schedule.steps]
    )
    assert alive_at_most <= MAX_LIVE_SESSIONS + 1  # a fresh session for a link drop may add one


def test_a_long_run_draws_every_default_fault() -> None:
    kinds = {s.kind for s in draw(11, 30, DEFAULT_FAULTS).steps}
    assert {"api-fault", "link-drop", "kill-executor", "kill", "redis-kill", "redis-pause", "skew"} <= kinds
    assert {"webhook-duplicate", "webhook-hold", "role-flip", "create", "input", "delete", "fail"} <= kinds


def test_fault_durations_stay_in_their_ranges() -> None:
    for step in draw(5, 30, DEFAULT_FAULTS).steps:
        if step.kind == "link-drop":
            assert 0.5 <= step.seconds <= 10
        elif step.kind == "api-fault" and step.value.endswith(":404"):
            assert step.seconds <= (4 if step.subject != "*" else 5) < DELETION_CONFIRM_SECONDS
        elif step.kind == "role-flip":
            assert 2.5 <= step.seconds <= 3.5
        elif step.kind == "skew":
            assert step.value in ("+30", "-30")


@pytest.mark.parametrize("seed", range(10))
def test_no_session_reads_404_for_as_long_as_the_deletion_confirmation(seed: int) -> None:
    """404 windows (on one session or on all) never touch: back to back they would make a
    session that exists look deleted by the controller's own rule."""
    windows = sorted((s.at, s.at + s.seconds) for s in draw(seed, 10, {"api-404"}).steps if s.value.endswith(":404"))
    assert len(windows) > 10
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert start - end >= NO_404_SECONDS > DELETION_CONFIRM_SECONDS


def test_the_default_set_is_the_catalogue_but_the_opt_in_faults_and_faults_are_switched_by_name() -> None:
    assert set(FAULTS) - OPT_IN_FAULTS == DEFAULT_FAULTS and "role-flip" in DEFAULT_FAULTS
    assert {
        "api-404-partial",
        "delete-several",
        "api-404-recheck",
        "lone-404",
        "wrong-key",
        "stale-worker",
        "crash-loop",
        "wedged-link",
        "failing-start-404",
        "suspend-cycles",
        "corrupt-checkpoint",
        "orphan-child",
        "fill-volume",
        "lifetime-cycles",
    } == OPT_IN_FAULTS
    assert not OPT_IN_FAULTS & DEFAULT_FAULTS
    assert select("+api-404-partial,+delete-several") == DEFAULT_FAULTS | {"api-404-partial", "delete-several"}
    assert select("+" + ",+".join(sorted(OPT_IN_FAULTS))) == DEFAULT_FAULTS | OPT_IN_FAULTS
    assert select(None) == select("") == select("default") == DEFAULT_FAULTS
    assert select("-role-flip") == DEFAULT_FAULTS - {"role-flip"}
    assert select("-role-flip,-skew,+skew") == DEFAULT_FAULTS - {"role-flip"}
    assert select("link-drop,api-404") == {"link-drop", "api-404"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [("+nope", "unknown nope"), ("link-drop,+skew", "not both"), ("typo", "unknown typo")],
)
def test_a_bad_fault_selection_is_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select(spec)


def test_some_link_drops_come_twice_in_one_turn_each_shorter_than_the_grace() -> None:
    """Issue 25, item 4: two drops of one session's link with input just before the second,
    the link up 3–5 s between them; each shorter than the grace (10 s), the two together
    longer, the second covering the moment a clock run from the first would pass the grace."""
    pairs = []
    for seed in range(10):
        steps = draw(seed, 10, {"link-drop"}).steps
        inputs = {(s.subject, s.at) for s in steps if s.kind == "input"}
        firsts = [s for s in steps if s.kind == "link-drop" and s.value == "1 of 2"]
        seconds = [s for s in steps if s.kind == "link-drop" and s.value == "2 of 2"]
        assert len(firsts) == len(seconds)
        for first, second in zip(firsts, seconds, strict=True):
            assert first.subject == second.subject
            assert (second.subject, round(second.at - 0.3, 2)) in inputs
            assert 3.0 <= round(second.at - (first.at + first.seconds), 2) <= 5.0
            pairs.append((first, second))
    assert len(pairs) >= 5
    for first, second in pairs:
        assert first.seconds < GRACE_SECONDS and second.seconds < GRACE_SECONDS
        assert first.at + GRACE_SECONDS + 1 < second.at + second.seconds


@pytest.mark.parametrize("seed", range(5))
def test_long_runs_leave_fault_free_stretches_and_ci_runs_do_not_change(seed: int) -> None:
    """Issue 25, item 6: a long run has a fault-free stretch of ``QUIET_SECONDS`` (past every
    fault's own duration) at least every ``QUIET_EVERY_SECONDS`` + the stretch, so invariants 2
    (30 s) and 7 (15 s past the idle timeout) can be judged during the run; a CI run (45 s) is
    drawn as before (no stretch)."""
    schedule = draw(seed, 10, DEFAULT_FAULTS)
    faults = sorted(schedule.fault_steps())
    quiet = []
    busy_until = 0.0
    for step in faults:
        if step.at - busy_until >= QUIET_SECONDS - 0.1:  # times are drawn to 0.01 s
            quiet.append((busy_until, step.at))
        busy_until = max(busy_until, step.at + step.seconds)
    assert len(quiet) >= 2, quiet  # at about 150 s and 350 s of a 600-s run
    starts = [0.0] + [end for _, end in quiet]
    assert max(b - a for a, b in itertools.pairwise(starts)) <= QUIET_EVERY_SECONDS + 60
    short = draw(seed, 0.75, DEFAULT_FAULTS)
    assert not any(b.at - (a.at + a.seconds) >= QUIET_SECONDS for a, b in itertools.pairwise(short.fault_steps()))


def test_the_opt_in_faults_leave_what_cis_seeds_draw_as_it_was() -> None:
    """CI's seeds (0.75 min) draw from the default set: the opt-in faults, being out of it,
    change none of their steps (the mutants' results hold for those very schedules)."""
    for seed in CI_SEEDS:
        kinds = {s.kind for s in draw(seed, 0.75, DEFAULT_FAULTS).steps}
        assert draw(seed, 0.75, DEFAULT_FAULTS) == draw(seed, 0.75, select(None))
        assert len(kinds) > 5


def _partial_storms(seed: int) -> list[list[Step]]:
    steps = [s for s in draw(seed, 10, {"api-404-partial"}).steps if s.kind == "api-fault"]
    storms: dict[float, list[Step]] = {}
    for step in steps:
        storms.setdefault(step.at, []).append(step)
    return list(storms.values())


@pytest.mark.parametrize("seed", range(10))
def test_a_partial_404_storm_takes_some_sessions_never_all_and_is_shorter_than_the_confirmation(seed: int) -> None:
    """Issue 25: a partial 404 storm answers 404 for at least two sessions at once, never for
    every session alive, each for 2–5 s: shorter than the deletion confirmation."""
    schedule = draw(seed, 10, {"api-404-partial"})
    born = {s.subject: s.at for s in schedule.steps if s.kind == "create"}
    gone = {s.subject: s.at for s in schedule.steps if s.kind in ("delete", "fail")}
    bursts = {s.subject for s in schedule.steps if s.kind == "create" and s.value}
    storms = _partial_storms(seed)
    assert storms
    for storm in storms:
        at = storm[0].at
        alive = {n for n, b in born.items() if b <= at and gone.get(n, float("inf")) > at and n not in bursts}
        names = {s.subject for s in storm}
        assert len(names) == len(storm) >= 2
        assert names < alive  # some, never all
        assert {s.seconds for s in storm} == {storm[0].seconds}
        assert 2.0 <= storm[0].seconds <= 5.0 < DELETION_CONFIRM_SECONDS
        assert {s.value for s in storm} == {"retrieve_session:404"}


@pytest.mark.parametrize("seed", range(10))
def test_404_windows_of_every_kind_never_touch(seed: int) -> None:
    """With one-session, every-session and partial 404 windows and flaps together, no two
    storms touch: back to back they would add up to a deletion by the controller's rule."""
    steps = draw(seed, 10, {"api-404", "api-404-partial", "api-404-flap"}).steps
    windows = sorted({(s.at, s.at + s.seconds) for s in steps if s.value.endswith(":404")})
    assert len(windows) > 10
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert start - end >= NO_404_SECONDS


@pytest.mark.parametrize("seed", range(10))
def test_several_sessions_are_deleted_at_once_never_more_than_half_of_those_alive(seed: int) -> None:
    """Issue 25: 2–3 sessions deleted at the same moment, at most half of those alive, so the
    sessions still readable outvote them and each deletion is released, not held."""
    schedule = draw(seed, 10, {"delete-several"})
    plain = draw(seed, 10, set())
    born = {s.subject: s.at for s in schedule.steps if s.kind == "create"}
    ends = [s for s in schedule.steps if s.kind in ("delete", "fail")]
    own = {(s.at, s.subject) for s in plain.steps if s.kind in ("delete", "fail")}
    assert {(s.at, s.subject) for s in schedule.steps if s.kind == "input"} == {
        (s.at, s.subject) for s in plain.steps if s.kind == "input"
    }  # the story's own steps are kept (but the ends it moves earlier)
    together: dict[float, set[str]] = {}
    for step in ends:
        if step.kind == "delete" and (step.at, step.subject) not in own:
            together.setdefault(step.at, set()).add(step.subject)
    assert together
    gone = {s.subject: s.at for s in ends}
    assert len(gone) == len(ends)  # no session ends twice
    bursts = {s.subject for s in schedule.steps if s.kind == "create" and s.value}
    for at, names in together.items():
        assert 2 <= len(names) <= 3
        alive = {n for n, b in born.items() if b <= at and gone.get(n, float("inf")) >= at and n not in bursts}
        assert names <= alive and 2 * len(names) <= len(alive)


def test_cis_seeds_draw_every_fault_a_mutant_needs_to_be_seen() -> None:
    """Issue 25, item 6: between them, CI's seeds draw what each mutant of the product
    (``tests/chaos/mutants.py``) needs to show itself: two link drops in one turn on a session
    older than the grace (``grace-from-start``), the binary missing while a session is created
    (``start-failure-dropped``), a pre-start burst larger than the budget of 3
    (``prestart-budget-ignored``), a session's reads answering 404 (``delete-at-first-404``),
    and deletions (``release-leaves-executor``). A change to the catalogue that takes one away
    fails here: then move CI's seeds (and rerun ``scripts/test chaos --mutants``)."""
    steps = [step for seed in CI_SEEDS for step in draw(seed, CI_MINUTES, DEFAULT_FAULTS).steps]
    per_seed = [draw(seed, CI_MINUTES, DEFAULT_FAULTS).steps for seed in CI_SEEDS]
    twice = [
        (drop, created)
        for seed_steps in per_seed
        for drop in seed_steps
        if drop.kind == "link-drop" and drop.value == "2 of 2"
        for created in seed_steps
        if created.kind == "create" and created.subject == drop.subject and drop.at - created.at > GRACE_SECONDS
    ]
    assert twice
    missing_while_created = [
        (gap, created)
        for seed_steps in per_seed
        for gap in seed_steps
        if gap.kind == "executor-missing"
        for created in seed_steps
        if created.kind == "create" and gap.at < created.at < gap.at + gap.seconds
    ]
    assert missing_while_created
    assert any(
        sum(1 for s in seed_steps if s.kind == "create" and s.value == "prestart") > 3 for seed_steps in per_seed
    )
    assert any(s.value.endswith(":404") for s in steps if s.kind in ("api-fault", "api-flap"))
    assert any(s.kind in ("delete", "fail") for s in steps)


@pytest.mark.parametrize("seed", range(10))
def test_the_binary_goes_missing_while_a_session_is_created(seed: int) -> None:
    """An ``executor-missing`` creates a session of its own while the binary is gone (its first
    start fails, and must be retried), deleted 60–75 s later, one such session at a time: a gap
    drawn while the last one's session is still to come or alive makes none."""
    steps = draw(seed, 10, {"executor-missing"}).steps
    story = {(s.at, s.subject) for s in draw(seed, 10, set()).steps if s.kind == "create"}
    gaps = [s for s in steps if s.kind == "executor-missing"]
    made = [s for s in steps if s.kind == "create" and (s.at, s.subject) not in story]
    deleted = {s.subject: s.at for s in steps if s.kind == "delete"}
    assert made and gaps
    for session in made:
        assert any(g.at + 0.5 <= session.at <= g.at + g.seconds - 1.5 + 0.01 for g in gaps), session
        assert 60.0 <= deleted[session.subject] - session.at <= 75.0 + 0.01
    assert all(b.at > deleted[a.subject] for a, b in itertools.pairwise(made))  # one at a time

    def made_in(gap: Step) -> list[Step]:
        return [m for m in made if gap.at + 0.5 <= m.at <= gap.at + gap.seconds - 1.5 + 0.01]

    for gap in gaps:  # its own session, or the one of an earlier gap is still to come or alive
        earlier = [m for g in gaps if g.at < gap.at for m in made_in(g) if deleted[m.subject] > gap.at]
        assert made_in(gap) or earlier, gap


@pytest.mark.parametrize("seed", range(10))
def test_a_stale_worker_fault_makes_its_own_session_one_at_a_time(seed: int) -> None:
    """``stale-worker`` (opt-in) names a session of its own, which no step creates (the fault's
    handler creates it, its first read armed to be held), and nothing else made for a fault is
    alive meanwhile; the sessions' own story is the same as without it."""
    schedule = draw(seed, 5, {"stale-worker", "executor-missing"})
    story = [s for s in draw(seed, 5, set()).steps if s.kind in ("create", "input", "delete", "fail")]
    stale = [s for s in schedule.steps if s.kind == "stale-worker"]
    created = {s.subject for s in schedule.steps if s.kind == "create"}
    assert stale and "stale-worker" in OPT_IN_FAULTS
    assert all(s.seconds == STALE_WORKER_SECONDS and s.subject not in created for s in stale)
    assert set(story) <= set(schedule.steps)
    made = sorted(
        [(s.at, s.at + s.seconds) for s in stale]
        + [
            (s.at, next(d.at for d in schedule.steps if d.kind == "delete" and d.subject == s.subject))
            for s in schedule.steps
            if s.kind == "create" and s not in story
        ]
    )
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(made))  # one at a time


# --- the deletion faults (issue 25, defects 1, 2 and 5) -------------------------------------------


def _ends(steps: tuple[Step, ...]) -> dict[str, float]:
    """When each session ends: deleted or failed by the story, or deleted by a ``wrong-key``."""
    ends = {s.subject: s.at for s in steps if s.kind in ("delete", "fail", "wrong-key")}
    assert len(ends) == sum(1 for s in steps if s.kind in ("delete", "fail", "wrong-key"))  # ends once
    return ends


@pytest.mark.parametrize("seed", range(10))
def test_a_recheck_404_lands_past_the_confirmation_with_only_failed_reads_between(seed: int) -> None:
    """Issue 25, defect 1: after a one-shot 404 the session's reads answer 503 for longer than the
    deletion confirmation (so the next 404, on the re-check, is a period after the first, with
    no read finding the session between): two 404 reads, never three spread over the period.
    The session outlives the fault (its story does not delete it meanwhile)."""
    steps = draw(seed, 10, {"api-404-recheck"}).steps
    ends = _ends(steps)
    rechecks = [s for s in steps if s.kind == "api-404-recheck"]
    assert rechecks
    for step in rechecks:
        assert step.value == "retrieve_session:503"
        assert DELETION_CONFIRM_SECONDS + 1.5 <= step.seconds <= DELETION_CONFIRM_SECONDS + 4.0
        assert ends.get(step.subject, float("inf")) > step.at + step.seconds + 15.0
    windows = sorted((s.at, s.at + s.seconds + 5.0) for s in rechecks)
    for (_, end), (start, _) in itertools.pairwise(windows):
        assert start - end >= NO_404_SECONDS


@pytest.mark.parametrize("seed", range(10))
def test_the_lone_opening_has_one_session_alone_404_for_longer_than_the_confirmation(seed: int) -> None:
    """Issue 25, defect 2: with ``lone-404`` a run opens with one session (``s0``, given input)
    and nothing else: no other session, no other fault, until ``LONE_OPENING_SECONDS``; its reads
    then answer 404 for longer than the deletion confirmation (it must be held, not released).
    Without it, nothing moves."""
    schedule = draw(seed, 1, select("lone-404,api-404-recheck,wrong-key,link-drop"))
    opening = [s for s in schedule.steps if s.at < LONE_OPENING_SECONDS]
    assert [(s.kind, s.subject) for s in opening] == [("create", "s0"), ("input", "s0"), ("lone-404", "s0")]
    lone = opening[-1]
    assert lone.value == "retrieve_session:404"
    assert DELETION_CONFIRM_SECONDS + 4.0 <= lone.seconds <= DELETION_CONFIRM_SECONDS + 8.0
    assert lone.at + lone.seconds < LONE_OPENING_SECONDS
    assert schedule.opening == LONE_OPENING_SECONDS and draw(seed, 1, {"link-drop"}).opening == 0.0


@pytest.mark.parametrize("seed", range(10))
def test_a_wrong_key_window_covers_a_hold_and_an_operators_release_and_its_victim_ends_there(seed: int) -> None:
    """Issue 25, defect 5: every session read answers 404 long enough for a hold (the
    confirmation and a margin of reads) and an operator's release judged within
    ``OPERATOR_RELEASE_SECONDS`` before the window ends; the session deleted in it is given
    input just before (its executor runs), at least one other is alive, and the story ends the
    deleted one nowhere else. No other 404 window touches it."""
    schedule = draw(seed, 10, select(DELETION_FAULTS))
    steps = schedule.steps
    windows = [s for s in steps if s.kind == "wrong-key"]
    assert windows
    born = {s.subject: s.at for s in steps if s.kind == "create"}
    ends = _ends(steps)
    for window in windows:
        assert window.value == "retrieve_session:404"
        assert window.seconds >= DELETION_CONFIRM_SECONDS + 3 * 3.0 + OPERATOR_RELEASE_SECONDS
        assert Step(round(window.at - 0.5, 2), "input", window.subject) in steps
        later = {s.kind for s in steps if s.subject == window.subject and s.at > window.at}
        assert later <= {"input"}  # the story's later inputs are refused by the API (logged as not taken)
        alive = [n for n, b in born.items() if b <= window.at and ends.get(n, float("inf")) >= window.at]
        assert len(alive) >= 2
    spans = sorted(
        [(s.at, s.at + s.seconds) for s in windows]
        + [(s.at, s.at + s.seconds + 5.0) for s in steps if s.kind == "api-404-recheck"]
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start - end >= NO_404_SECONDS


def test_cis_deletion_run_draws_what_each_deletion_mutant_needs() -> None:
    """CI's third run (``CI_RUNS``; ``scripts/test chaos --mutants`` runs the same) opens with a
    lone session's 404s (``lone-session-not-held``), then draws a re-check 404 after failed reads
    (``deletion-by-two-404s``) and a wrong-key window with an operator's release
    (``release-ignored``, ``release-not-noted``); its first two runs are the default set on CI's
    seeds. A change to the catalogue that takes one away fails here: move the seed."""
    assert [(seed, faults) for seed, faults, _ in CI_RUNS[:2]] == [(s, "default") for s in CI_SEEDS]
    assert all(minutes == CI_MINUTES for _, _, minutes in CI_RUNS[:2])
    seed, faults, minutes = CI_RUNS[2]
    assert select(faults) == {"lone-404", "api-404-recheck", "wrong-key"}
    schedule = draw(seed, minutes, select(faults))
    kinds = [s.kind for s in schedule.fault_steps()]
    assert kinds[0] == "lone-404" and "api-404-recheck" in kinds and "wrong-key" in kinds
    assert schedule.seconds < 120  # CI's chaos tier stays near 4 minutes in all


def test_invariant_9_states_the_time_the_injector_gives_the_operators_release() -> None:
    from tests.chaos.checker import INVARIANTS

    assert f"within {OPERATOR_RELEASE_SECONDS:g} s" in INVARIANTS[9]


def test_cis_fourth_run_draws_a_stale_worker_a_crash_loop_a_wedged_link_and_failing_starts() -> None:
    """CI's fourth run (``CI_RUNS``; ``scripts/test chaos --mutants`` runs it too) draws the
    stale-worker fault, which ``lease-not-checked`` needs (a worker frozen between its read and
    its start past its lease); one crash loop, which ``crash-loop-no-backoff`` needs (an
    executor that exits at start for longer than a few back-offs); one wedged link, which
    ``blind-spots-unbounded`` needs (down for longer than the bound, with input just before); and
    one failing-start-404, which ``found-not-before-acting`` needs; and the orphan-child, placed,
    which ``stop-spares-detached`` needs. A change that takes one away fails here: move the seed."""
    seed, faults, minutes = CI_RUNS[3]
    assert faults == STALE_FAULTS
    assert select(faults) == {"stale-worker", "crash-loop", "wedged-link", "failing-start-404", "orphan-child"}
    schedule = draw(seed, minutes, select(faults))
    kinds = ["crash-loop", "failing-start-404", "orphan-child", "stale-worker", "wedged-link"]
    assert sorted(s.kind for s in schedule.fault_steps()) == kinds
    [loop] = [s for s in schedule.steps if s.kind == "crash-loop"]
    assert loop.seconds >= CRASH_LOOP[0] and not any(s.subject == loop.subject for s in schedule.steps if s is not loop)
    [wedged] = [s for s in schedule.steps if s.kind == "wedged-link"]
    assert wedged.seconds > WEDGED_BOUND_SECONDS
    assert any(s.kind == "input" and s.subject == wedged.subject and s.at < wedged.at for s in schedule.steps)
    assert not any(s.kind in ("delete", "fail") and s.subject == wedged.subject for s in schedule.steps)
    # The failing starts' binary gap (its first 404s take 5-10 s) comes before the crash loop
    # (which must see its own refusals), on another session than the wedged one.
    [failing] = [s for s in schedule.steps if s.kind == "failing-start-404"]
    assert failing.subject != wedged.subject and loop.at - failing.at >= 10.0
    assert not any(s.kind in ("delete", "fail") and s.subject == failing.subject for s in schedule.steps)
    assert schedule.seconds < 60


def test_cis_default_runs_kill_a_running_executors_launcher() -> None:
    """``stop-signals-leader-only`` needs the npm launcher killed while its native codex runs:
    CI's default runs draw a leader-only executor kill, each just after input to its session."""
    per_seed = [draw(seed, CI_MINUTES, DEFAULT_FAULTS).steps for seed in CI_SEEDS]
    kills = [
        (kill, steps) for steps in per_seed for kill in steps if kill.kind == "kill-executor" and kill.value == "leader"
    ]
    assert kills
    for kill, steps in kills:
        assert any(
            s.kind == "input" and s.subject == kill.subject and 0 < kill.at - s.at <= LEADER_AFTER_INPUT_SECONDS
            for s in steps
        )


def test_a_thawed_stale_worker_would_start_past_the_checkers_limit() -> None:
    """The frozen worker is thawed later after its session's end than the checker lets an
    executor start (invariant 5): what it would start is always judged a stale start."""
    from tests.chaos.checker import STALE_START_SECONDS
    from tests.chaos.schedule import STALE_AFTER_END_SECONDS

    assert STALE_START_SECONDS < STALE_AFTER_END_SECONDS


def test_placed_faults_leave_what_a_seed_draws_alone() -> None:
    """The faults made for issue 37's sandboxes are one step each at a fixed time, with a session
    made for it that no other fault picks: naming them leaves every other step a seed draws
    where it was (only the names of sessions made for faults move), so CI's runs that add one
    still reach what their mutants need."""
    placed_names = ",".join(sorted(PLACED_FAULTS))
    for seed in (5, 93, 173):
        for base in ("default", "stale-worker,crash-loop,wedged-link,failing-start-404"):
            plain = draw(seed, 0.75, select(base))
            spec = "+" + placed_names.replace(",", ",+") if base == "default" else f"{base},{placed_names}"
            placed = draw(seed, 0.75, select(spec))
            added = [s for s in placed.steps if s.kind in PLACED_FAULTS]
            assert sorted(s.kind for s in added) == sorted(PLACED_FAULTS)
            made = {s.subject for s in added}
            others = [s for s in placed.steps if s not in added]
            assert not any(s.subject in made for s in others)  # nothing else acts on their sessions

            def shape(steps: list[Step]) -> list[tuple[float, str, float, str]]:
                return sorted((s.at, s.kind, s.seconds, s.value) for s in steps)

            assert shape(others) == shape(list(plain.steps))


def test_cis_fifth_run_checkpoints_and_draws_short_suspensions_and_a_cut_checkpoint() -> None:
    """CI's fifth run is the default set in a world that checkpoints its idle sandboxes, with
    many short suspensions of one session (``restore-clocks-kept`` needs the fourth or later)
    and a cut checkpoint (``cut-checkpoint-waits``); it lasts long enough for every cycle."""
    seed, faults, minutes = CI_RUNS[4]
    assert faults == SUSPEND_FAULTS and select(faults) == DEFAULT_FAULTS | (CHECKPOINT_FAULTS - LIFETIME_FAULTS)
    schedule = draw(seed, minutes, select(faults))
    [cycles] = [s for s in schedule.steps if s.kind == "suspend-cycles"]
    assert int(cycles.value) == SUSPEND_CYCLES >= 5
    assert cycles.seconds >= SUSPEND_CYCLES * (CHECKPOINT_IDLE_TIMEOUT_SECONDS + 15.0)
    assert [s.kind for s in schedule.steps if s.kind == "corrupt-checkpoint"] == ["corrupt-checkpoint"]
    assert schedule.seconds >= cycles.at + cycles.seconds


def test_cis_sixth_run_draws_suspensions_across_a_maximum_lifetime() -> None:
    """CI's sixth run names ``lifetime-cycles`` alone (``restore-starts-lineage``): a world that
    checkpoints and has a maximum lifetime, and enough cycles that, at an idle timeout and a
    turn each, a turn comes past the lifetime and its slack (16 judges it, or says it judged
    nothing); the fault lasts long enough for them."""
    seed, faults, minutes = CI_RUNS[5]
    assert faults == LIFETIME_RUN_FAULTS and select(faults) == LIFETIME_FAULTS <= CHECKPOINT_FAULTS
    schedule = draw(seed, minutes, select(faults))
    [cycles] = [s for s in schedule.steps if s.kind == "lifetime-cycles"]
    assert int(cycles.value) == LIFETIME_CYCLES
    # the first cycle's turn comes inside the lifetime, the last past it and the slack
    assert CHECKPOINT_IDLE_TIMEOUT_SECONDS + 5.0 < LIFETIME_SECONDS
    assert LIFETIME_CYCLES * CHECKPOINT_IDLE_TIMEOUT_SECONDS > LIFETIME_SECONDS + LINEAGE_SLACK_SECONDS
    assert cycles.seconds >= LIFETIME_CYCLES * (CHECKPOINT_IDLE_TIMEOUT_SECONDS + 15.0)
    assert schedule.seconds >= cycles.at + cycles.seconds
