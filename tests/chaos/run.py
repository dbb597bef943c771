"""One chaos run: the world started, the schedule carried out while the checker samples, then a
quiet end (every surviving session gets a final turn that must read its whole marker file;
then every executor must go: deleted or failed sessions' are released, and the others', idle
after their final turns, stop at the idle timeout, which the checker sees happen or reports as
late), the end checks, the teardown, and the report.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

import pytest

from tests.chaos import observe
from tests.chaos.book import Book
from tests.chaos.checker import ASK_SECONDS, INVARIANTS, LATE_SECONDS, Checker, Violation
from tests.chaos.eventlog import EventLog
from tests.chaos.inject import Injector
from tests.chaos.schedule import (
    CHECKPOINT_FAULTS,
    DEFAULT_FAULTS,
    DELETION_CONFIRM_SECONDS,
    GRACE_SECONDS,
    LIFETIME_FAULTS,
    LIFETIME_SECONDS,
    LINEAGE_SLACK_SECONDS,
    Schedule,
    draw,
)
from tests.chaos.world import (
    FULL_SWEEP_INTERVAL_SECONDS,
    LEASE_TTL_SECONDS,
    PRESTART_BUDGET,
    ChaosWorld,
    executor_command,
)
from tests.support import faketime
from tests.support.criu import criu_binary
from tests.support.processes import wait_for
from tests.system.loop import API_KEY

FINAL_TURN_SECONDS = ASK_SECONDS + 30.0
RELEASE_SECONDS = DELETION_CONFIRM_SECONDS + FULL_SWEEP_INTERVAL_SECONDS + 20.0
IDLE_STOP_MARGIN_SECONDS = LATE_SECONDS + 5.0
"""After the final turns, every idle sandbox must have stopped within its idle timeout and this
(invariant 7's lateness and a margin): each run sees idle sandboxes stop, or fails."""


@dataclass
class Result:
    schedule: Schedule
    log: EventLog
    violations: list[Violation] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    def replay(self) -> str:
        """The command that runs the same schedule again (``--faults`` as changes to the
        default set, or as the list itself when that is shorter)."""
        faults = self.schedule.faults
        spec = ""
        if faults != DEFAULT_FAULTS:
            changes = [f"+{n}" for n in sorted(faults - DEFAULT_FAULTS)] + [
                f"-{n}" for n in sorted(DEFAULT_FAULTS - faults)
            ]
            listed = sorted(faults)
            spec = f" --faults {','.join(listed if len(listed) < len(changes) else changes)}"
        return f"scripts/test chaos --seed {self.schedule.seed} --minutes {self.schedule.minutes:g}{spec}"

    def report(self) -> str:
        lines = [f"chaos seed {self.schedule.seed}, {self.schedule.minutes:g} min (replay: {self.replay()})"]
        lines += [f"  {line}" for line in self.summary]
        if self.violations:
            lines.append(f"  {len(self.violations)} violation(s):")
            lines += [f"    {v.describe(self.log.t0)}" for v in self.violations]
        else:
            lines.append("  violations: none")
        if self.errors:
            lines.append("  harness errors:")
            lines += [f"    {e}" for e in self.errors]
        return "\n".join(lines)

    def failure(self) -> str:
        return f"{self.report()}\n  event log:\n{self.log.text()}"


def require_codex(real_codex: bool, environ: Mapping[str, str]) -> None:
    """Under ``CI=true`` a run without the real codex fails at once: the stand-in runs no
    commands, so invariant 4 (workspaces) would go unjudged in silence."""
    if not real_codex and environ.get("CI") == "true":
        pytest.fail(
            "CI=true but codex is not installed: the stand-in runs no commands, so invariant 4 "
            "(no workspace of a live session discarded) cannot be judged; install it (scripts/test does)"
        )


class Stoppable(Protocol):
    def stop(self) -> None: ...


def teardown(world: Stoppable, checker: Checker, directory: Path) -> None:
    """6: stop the world; a process its teardown found left in the state directory (it kills
    it, then says so) is a violation, and so is anything left after it (``check_nothing_left``)."""
    try:
        world.stop()
    except AssertionError as exc:
        checker.violate(("6", "teardown"), 6, "the run", f"left running after the teardown: {exc}")
    checker.check_nothing_left(directory)


def exit_on_signal(signum: int, frame: FrameType | None) -> None:
    """A signal handler that ends the main thread through its ``finally`` blocks."""
    raise SystemExit(128 + signum)


@contextmanager
def terminated_as_exit() -> Iterator[None]:
    """While a run goes on, SIGTERM (a CI job cancelled, ``timeout``, a helper's kill) raises
    ``SystemExit`` in the main thread (``exit_on_signal``), so the run ends through its
    ``finally``: the world torn down, nothing of it left running (without it, Python exits at
    once and leaves them all)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(directory: Path, seed: int, minutes: float, faults: frozenset[str]) -> Result:
    with terminated_as_exit():
        return _run(directory, seed, minutes, faults)


def _run(directory: Path, seed: int, minutes: float, faults: frozenset[str]) -> Result:
    schedule = draw(seed, minutes, faults)
    executor, real_codex = executor_command()
    require_codex(real_codex, os.environ)
    try:
        faketime.library()  # built once with the system's C compiler (fails the run under CI=true)
        can_skew = True
    except pytest.skip.Exception:
        can_skew = False
    criu = criu_binary() if faults & CHECKPOINT_FAULTS else None  # skipped (failed under CI) without one
    max_lifetime = LIFETIME_SECONDS if faults & LIFETIME_FAULTS else None
    directory.mkdir(parents=True, exist_ok=True)
    world = ChaosWorld(
        directory / "world",
        executor,
        role_flip="role-flip" in faults,
        run_seconds=schedule.seconds,
        criu=criu,
        max_lifetime=max_lifetime,
    )
    log = EventLog(directory / "events.log")
    result = Result(schedule, log)
    book = Book()
    simulator = observe.Simulator(world.simulator_url, API_KEY)
    checker = Checker(
        simulator,
        book,
        log,
        grace_seconds=GRACE_SECONDS,
        idle_timeout_seconds=world.idle_timeout_seconds,
        prestart_budget=PRESTART_BUDGET,
        max_lifetime_seconds=max_lifetime,
        controller_logs=lambda: [p.log_path for p in (*world.workers, world.scheduler, world.standby) if p is not None],
    )
    injector = Injector(world, book, log, can_skew, before_deletion=checker.before_deletion, judge=checker)
    checked_commands = checked_deliveries = checked_rounds = idle_stops = checked_refusals = checked_restores = 0
    checked_lineages = 0
    try:
        world.start()
        log.t0 = time.time()  # the schedule's times count from here
        log.add("note", f"seed {seed}, {minutes:g} min, faults: {', '.join(sorted(faults))}")
        log.add(
            "note", f"executor: {'codex' if real_codex else 'the STAND-IN (runs no commands: markers not checked)'}"
        )
        if criu is not None:
            log.add("note", f"idle sandboxes are checkpointed ({criu}), idle timeout {world.idle_timeout_seconds:g}s")
        if max_lifetime is not None:
            log.add("note", f"every sandbox's lineage has a maximum lifetime of {max_lifetime:g}s")
        if world.unknown_settings:
            log.add("note", f"not set (the controller does not know them yet): {', '.join(world.unknown_settings)}")
        if not can_skew:
            log.add("note", "no C compiler to build the clock shim (tests/support/skew): skew steps are skipped")
        checker.start()
        injector.run(schedule)
        log.add("note", "the schedule is over: final turns, then the end checks")
        _final_turns(injector, simulator, book, log)
        idle_stops = _wait_stopped(checker, book, log, world.idle_timeout_seconds + IDLE_STOP_MARGIN_SECONDS)
        checker.stop()
        if real_codex:
            checked_commands = checker.check_markers()
        checked_deliveries = checker.check_deliveries()
        checker.check_ended_sessions_released()
        checker.check_idle_stopped()
        checked_refusals = checker.check_crash_loops()
        checked_rounds = checker.check_leases([w.log_path for w in world.workers], LEASE_TTL_SECONDS)
        schedulers = [s.log_path for s in (world.scheduler, world.standby) if s is not None]
        checked_restores = checker.check_restores([w.log_path for w in world.workers] + schedulers)
        checked_lineages = checker.check_lineages(LINEAGE_SLACK_SECONDS)
    finally:
        checker.stop()
        teardown(world, checker, directory)
        simulator.close()
    result.violations = list(checker.violations)
    result.errors = injector.errors + checker.errors
    counts = ", ".join(f"{kind} {n}" for kind, n in schedule.counts().items())
    per_invariant = {i: sum(1 for v in checker.violations if v.invariant == i) for i in INVARIANTS}
    result.summary = [
        f"steps: {counts}",
        f"sessions: {len(book.all())}; executors seen: {len(checker.executors)} (at most {checker.most_executors} "
        f"at once; pre-started at most {checker.most_prestarted}); samples: {checker.samples}",
        f"marker commands checked: {checked_commands}; acknowledged connection deliveries checked: "
        f"{checked_deliveries}; tasks' tries checked for their lease: {checked_rounds}; idle stops seen at the "
        f"end: {idle_stops}; refused registrations checked: {checked_refusals}; restores checked: {checked_restores}; "
        f"turns past a maximum lifetime checked: {checked_lineages}; "
        f"faults injected: {log.count('fault')}",
        "violations by invariant: " + ", ".join(f"{i}: {n}" for i, n in per_invariant.items()),
        f"took {time.time() - log.t0:.0f}s after start-up; event log: {directory / 'events.log'}",
    ]
    return result


def _final_turns(injector: Injector, simulator: observe.Simulator, book: Book, log: EventLog) -> None:
    """Every session that still exists gets a turn that reads its marker file (it asks for a
    connection, so 2 judges it too); wait for them to finish (bounded)."""
    states = simulator.sessions()
    pending = []
    for session in book.all():
        state = states.get(session.id)
        if session.ended_at is not None or session.prestart or state is None or state["status"] == "failed":
            continue
        turn = injector.give_input(session, final=True)
        if turn is not None:
            pending.append((session.id, turn.id))

    def finished() -> bool:
        for session_id, turn_id in pending:
            turns = {t["id"]: t for t in simulator.turns(session_id)}
            turn = turns.get(turn_id)
            if turn is not None and turn["status"] != "finished":
                return False
        return True

    try:
        wait_for(finished, FINAL_TURN_SECONDS, "the final turns to finish", interval=0.5)
        log.add("note", f"{len(pending)} final turns finished")
    except AssertionError:
        log.add("note", f"final turns not all finished after {FINAL_TURN_SECONDS:g}s (judged by 2 and 4)")


def _wait_stopped(checker: Checker, book: Book, log: EventLog, idle_stop_seconds: float) -> int:
    """Every executor must go: deleted and failed sessions' are released (deletion confirmation,
    a full sweep and a margin), and the others', idle after their final turns, stop (or are
    suspended) at the idle timeout (``idle_stop_seconds``; the checker's sampling judges a late
    one by 7 meanwhile).
    5 and 7 judge what is left (``check_ended_sessions_released``, ``check_idle_stopped``).
    Returns how many executors of sessions that still exist stopped meanwhile."""
    failed = {s["id"] for s in checker.sim.sessions().values() if s["status"] == "failed"}
    ended = [s for s in book.all() if s.ended_at is not None or s.id in failed]
    alive = {s.environment_id for s in book.all() if s not in ended}
    running = {e for e in checker.scan() if e in alive}

    def stopped() -> bool:
        return not any(checker.live_executors(s.environment_id) for s in ended) and not (running & set(checker.scan()))

    try:
        wait_for(
            stopped, max(RELEASE_SECONDS, idle_stop_seconds), "every executor to stop or be released", interval=0.5
        )
    except AssertionError:
        log.add("note", "executors still run after the final turns' idle timeout (judged by 5 and 7)")
    left = set(checker.scan())
    stops = len(running - left)
    log.add("note", f"{stops} of the {len(running)} executors of sessions that still exist stopped at the end")
    return stops
