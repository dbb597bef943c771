"""The judge of a chaos run. Not the controller's code, and it imports none: it samples ``/proc``
and the simulator's admin endpoints twice a second, reads what the turns' commands printed,
and checks ``INVARIANTS`` throughout the run and at its end.

How each is seen from outside:

1. Executors are process sessions whose command line dials the simulator with an environment
   id (``observe.executors``); two at once for one environment is a violation, and so is an
   environment with two executor WebSockets open at the simulator.
2. A session asking for a connection (``requires_action``, ``wants_connection``) for more than
   30 s with no fault disturbing the system over those 30 s (``EventLog.quiet_since``).
3. An executor that ended while its session was busy (in a turn, or asking for a connection,
   as the session stood when the executor was found gone) and that the chaos did not kill:
   the simulator's record of the link says how long it had been down by then (since it was
   last connected; since the executor started, if it never was; if it had come back only
   just before, the outage it came back from). Less than the grace is a violation, whether or
   not a new executor took its place.
4. Each turn's command prints the workspace's marker file, then adds its own token to it.
   Every token a finished command added must be printed by every command that starts later,
   until the session is deleted or fails — the final turn of each session that still exists
   included (a session's turns are read just before the harness deletes it).
5. Every ``environment_connection`` delivery that a receiver answered 2xx: the request it
   carried must have been resolved (the simulator clears it only when an executor connects),
   for a session deleted or failed later too, unless it ended within 30 s of asking (the
   simulator's own connect deadline is set past the run, so a lost request cannot turn into
   "failed" and escape); a deleted or failed session's executor must be gone by the end; and
   none may start more than ``STALE_START_SECONDS`` after its session was deleted or failed
   (only a worker acting on a read from before that end, its lease lost, could start it).
6. After the teardown, no executor and no process of the run is left.
7. An executor ending while its session was idle: not before the idle timeout (L11); and an
   idle session's executor still running 15 s past the timeout, with nothing disturbing the
   system meanwhile, is a late stop (issue 16's item 3: a skewed clock stops early or late).
   Every run ends with idle sandboxes that must stop (the final turns, then
   ``run._wait_stopped``): one still running 15 s past the timeout then is late too
   (``check_idle_stopped``), so an idle timeout that is never applied fails every run.
8. The sessions of the pre-start burst (never given input) hold no more live executors than
   the pre-start budget.
9. While every session read answers 404 (``wrong-key``), the harness deletes one session at the
   API and, once its hold shows, runs ``sandbox-controller release SID --yes`` as an operator
   would: the command must be taken, and that session's executor gone and its workspace (the
   local runner's ``sessions/<id>-<hash>/workspace``) discarded within
   ``schedule.OPERATOR_RELEASE_SECONDS`` (10 s; the injector passes it), judged before the window ends (after it, the
   sessions found again would confirm the deletion anyway and hide a release that was ignored).
10. One worker at a time acts on a session (its lease). From the workers' own logs, after the
   run (``check_leases``): a task's round of a session that lost its lease ("stale decision
   dropped", the lease's fence refusing a write) less than the lease's TTL after that task
   started had it taken by another worker while it still held it (a lease is renewed every
   third of its TTL and lapses only after a whole TTL without renewal); the round of the other
   worker that looked the session up meanwhile is named. Excused only when Redis may have lost
   the lease's key meanwhile (a ``redis-kill`` or ``role-flip`` window near the round). Both
   times are the worker's own clock, so a skewed worker is judged as any other.
11. A crash loop backs off (``crash-loop``): the simulator's record of registrations, after the
   run (``check_crash_loops``): no environment's registrations are refused (codex exits at
   each) more than ``CRASH_LOOP_MOST`` times in any ``CRASH_LOOP_WINDOW_SECONDS``
   (with the back-off, its starts come at about 0, 1, 4, 9 and 18 s; a start at each look made
   13 or more in 20 s).
12. A wedged executor is replaced within a bound (``wedged-link``): the executor running when its
   link dropped for good (40–45 s), while its environment's reads fail 5 s of every 8 s, must be
   gone ``schedule.WEDGED_BOUND_SECONDS`` (35 s; the injector passes it) after the drop
   (``judge_wedged``): blind spots delay a replacement by two graces at most.
13. A suspended sandbox resumes with its memory and at once (in a world that checkpoints idle
   sandboxes). After the run (``check_restores``): an executor of a session a worker logged
   "executor restored" for, that shows up with no registration of its environment near it (a
   restore reconnects on its original registration; a fresh start registers), has its link up
   ``RESTORE_CONNECT_SECONDS`` after the checker first saw it, unless a fault disturbed the
   system meanwhile; the ``suspend-cycles`` session's turns all find the background process
   its first turn started, with the same token (its memory), unless a worker logged that a
   checkpoint of it failed, was refused or could not be restored (the counted fallbacks). During
   the run (``judge_fallback``): the session whose checkpoint was cut (``corrupt-checkpoint``)
   is connected within ``schedule.FALLBACK_SECONDS`` of its input (the injector passes it).
14. No process of a sandbox outlives it (``orphan-child``; ``judge_orphans``): a turn's detached
   child (a session of its own) is gone ``schedule.ORPHAN_SECONDS`` after its sandbox's
   executor was SIGKILLed and its session given input (the injector passes it).
15. The state volume never blocks a live workspace (``fill-volume``; ``judge_write``): with two
   idle sessions' memory too big for the checkpoint images' cap, a write of
   ``schedule.WRITE_MIB`` to another session's workspace on the same volume succeeds.
16. A lineage never outlives its maximum lifetime (in a world that has one; ``lifetime-cycles``;
   ``check_lineages`` after the run): no turn of the session posted
   ``schedule.LINEAGE_SLACK_SECONDS`` (the run passes it) past the lifetime, counted from its
   first executor's sighting, finds the background process its first turn started (restores do not renew the
   lifetime). In such a world a sandbox stopped or replaced at its lifetime is a stop the rules
   make: 3 and 7 do not count an executor's end that a worker logged as a stop for the maximum
   lifetime (``cause: lifetime``) near when it was found gone (``LIFETIME_STOP_NEAR_SECONDS``:
   from 2 s before to 5 s after).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.chaos import observe
from tests.chaos.book import Book, Session
from tests.chaos.eventlog import EventLog
from tests.support.processes import processes_under

CRASH_LOOP_WINDOW_SECONDS = 20.0
CRASH_LOOP_MOST = 8
"""Invariant 11: refused registrations of one environment in any ``CRASH_LOOP_WINDOW_SECONDS``
at most (with the back-off, starts at about 0, 1, 4, 9 and 18 s; a start at each look made 13
or more in 20 s)."""
INVARIANTS = {
    1: "never two live executors for one session",
    2: "a session that asks for a connection has one connected executor within 30 s of the faults ending",
    3: "no live executor is replaced (or stopped) for a link down less than the grace",
    4: "no workspace of a session that still exists is discarded",
    5: "every acknowledged delivery's work is done; a failed or deleted session's executor is gone by the end, "
    "and none starts after it ended",
    6: "nothing is left running",
    7: "an idle sandbox stops at its idle timeout: not before it, and not long after it",
    8: "pre-started sandboxes nobody asked for stay within the pre-start budget",
    9: "an operator's release of a held deletion ends its sandbox (executor, workspace) within 10 s, "
    "even while every read answers 404",
    10: "one worker at a time acts on a session: no round loses its lease to another worker before the lease's TTL",
    11: "starts of a crash-looping session back off: no environment's registrations refused more than "
    f"{CRASH_LOOP_MOST} times in {CRASH_LOOP_WINDOW_SECONDS:g} s",
    12: "a wedged executor (its link down for good) is replaced within a bound, whatever the API's reads do",
    13: "a suspended sandbox resumes with its memory and its executor connected at once (a cut checkpoint: a "
    "fresh start within a bound)",
    14: "no process of a sandbox outlives it: a detached child ends with its sandbox",
    15: "the state volume never blocks a live workspace: checkpoint images leave room for a workspace's write",
    16: "a lineage never outlives its maximum lifetime: suspensions and restores do not renew it",
}
RESTORE_CONNECT_SECONDS = 3.0
"""13: a restored executor's link is up this long after the checker first saw its processes at
most (a restore reconnects 0.1–0.2 s after it is done; with codex's reconnect backoff kept
asleep in the image, the fourth of many short suspensions reconnected after 7.9 s)."""
REGISTERED_NEAR_SECONDS = (5.0, 30.0)
"""An executor with a registration of its environment this long before or after it showed up is
a fresh start (it registers), not a restore."""
FALLBACKS = frozenset(
    {
        "restore impossible, starting a fresh executor",
        "checkpoint failed, executor stopped instead",
        "checkpoint refused, executor stopped instead",
        "unrecorded sandbox stopped",
    }
)
"""What a worker (or the sweep, for a sandbox whose start was cut short) logs when a session's
memory is given up on purpose (counted, shown)."""
LIFETIME_STOP_NEAR_SECONDS = (2.0, 5.0)
"""A stop for the maximum lifetime logged this long before (after) the sample that found its
executor gone explains that end: a worker logs it once the runner has ended the sandbox (for a
replacement, once the new one started), so never much before the sample, and within seconds
after it."""
SAMPLE_SECONDS = 0.5
ASK_SECONDS = 30.0
REPLACEMENT_SECONDS = 10.0
"""An executor that ends is judged once a replacement showed up, or this long after it ended."""
STALE_START_SECONDS = 8.0
"""An executor that first shows up this long after its session was deleted or failed started on
a read from before that end: a worker that read the session and then acted with its lease gone
(a round holding its lease reads and starts within a second or two)."""
GRACE_MARGIN_SECONDS = 0.5
EARLY_MARGIN_SECONDS = 2.0
"""The API's ``last_active_at`` is whole seconds, and ``/proc`` is sampled: an idle stop up to
this much before the timeout (counted from the session's own change to idle) is on time."""
LATE_SECONDS = 15.0
DECISION_SECONDS = 3.0
"""A link back less than this before its executor went may have come back after the decision
to replace it: the outage it came back from is what the decision saw."""
RACE_SECONDS = 2.0
"""An input that lands within this of an idle stop that was due (L12's residual race) makes
the stop look like a busy session's; it is not counted against grace (3)."""


@dataclass(frozen=True)
class Violation:
    at: float
    invariant: int
    subject: str
    text: str

    def describe(self, t0: float) -> str:
        rule = INVARIANTS[self.invariant]
        return f"+{self.at - t0:.1f}s invariant {self.invariant} ({rule}): {self.subject}: {self.text}"


class Simulator(Protocol):
    """What the checker reads from the simulator (``observe.Simulator``)."""

    base_url: str

    def sessions(self) -> dict[str, dict[str, Any]]: ...
    def environments(self) -> dict[str, dict[str, Any]]: ...
    def history(self, session_id: str) -> list[dict[str, Any]]: ...
    def turns(self, session_id: str) -> list[dict[str, Any]]: ...
    def registrations(self, environment_id: str | None = None) -> list[dict[str, Any]]: ...
    def deliveries(self, event_type: str) -> list[dict[str, Any]]: ...
    def events(self) -> dict[str, dict[str, Any]]: ...


Scan = Callable[[], dict[str, dict[int, list[int]]]]
"""Executors by environment id, each process session with its pids (``observe.executors``)."""


@dataclass
class Executor:
    """One executor (a process session) of one environment, as sampled."""

    environment_id: str
    sid: int
    first_seen: float
    last_seen: float
    pids: list[int]
    gone_seen: float | None = None
    judged: bool = False


class Checker:
    def __init__(
        self,
        simulator: Simulator,
        book: Book,
        log: EventLog,
        *,
        grace_seconds: float,
        idle_timeout_seconds: float,
        prestart_budget: int,
        scan: Scan | None = None,
        clock: Callable[[], float] = time.time,
        max_lifetime_seconds: float | None = None,
        controller_logs: Callable[[], list[Path]] = list,
    ) -> None:
        """``max_lifetime_seconds``: the world's maximum lifetime (16), if it has one;
        ``controller_logs``: the workers' and schedulers' JSON logs, read for the stops it makes."""
        self.sim = simulator
        self.remote_url = simulator.base_url
        self.scan: Scan = scan or partial(observe.executors, simulator.base_url)
        self.clock = clock
        self.book = book
        self.log = log
        self.grace = grace_seconds
        self.idle_timeout = idle_timeout_seconds
        self.prestart_budget = prestart_budget
        self.max_lifetime = max_lifetime_seconds
        self.controller_logs = controller_logs
        self.violations: list[Violation] = []
        self.executors: dict[tuple[str, int], Executor] = {}
        self.samples = 0
        self.markers_checked = 0
        self.histories_before_deletion: dict[str, list[dict[str, Any]]] = {}
        """Each deleted session's history as it was just before its deletion (the API forgets it)."""
        """Commands checked by 4 just before their session was deleted."""
        self.most_executors = 0
        self.most_prestarted = 0
        self._reported: set[tuple[Any, ...]] = set()
        self._double_connections: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-checker", daemon=True)
        self.errors: list[str] = []

    # -- running ------------------------------------------------------------------------------

    def start(self) -> Checker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self.sample()
            except httpx.HTTPError as exc:
                self.log.add("note", f"checker: the simulator did not answer ({type(exc).__name__})")
            except Exception as exc:  # a checker bug must show, not end the sampling quietly
                self.errors.append(f"checker error: {type(exc).__name__}: {exc}")
                self.log.add("note", f"checker error: {type(exc).__name__}: {exc}")

    def violate(self, key: tuple[Any, ...], invariant: int, subject: str, text: str) -> None:
        """Record a violation once per ``key``; it goes into the event log too."""
        if key in self._reported:
            return
        self._reported.add(key)
        found = Violation(self.clock(), invariant, subject, text)
        self.violations.append(found)
        self.log.add("violation", f"invariant {invariant}: {subject}: {text}", at=found.at)

    def name(self, environment_id: str) -> str:
        session = self.book.by_environment(environment_id)
        return f"{session.name} ({session.id})" if session is not None else environment_id

    # -- one sample ---------------------------------------------------------------------------

    def sample(self) -> None:
        now = self.clock()
        groups = self.scan()
        sessions = self.sim.sessions()
        environments = self.sim.environments()
        self.samples += 1
        live = self._track(groups, now)
        self.most_executors = max(self.most_executors, len(live))

        for environment_id, by_sid in groups.items():  # 1: processes
            if len(by_sid) > 1:
                self.violate(
                    ("1", environment_id, tuple(sorted(by_sid))),
                    1,
                    self.name(environment_id),
                    f"{len(by_sid)} executors at once (process sessions {sorted(by_sid)})",
                )
        doubled = {e for e, info in environments.items() if int(info.get("open_connections") or 0) > 1}
        for environment_id in doubled - self._double_connections:  # 1: links
            self.violate(
                ("1c", environment_id, now),
                1,
                self.name(environment_id),
                f"{environments[environment_id]['open_connections']} executor WebSockets open at once",
            )
        self._double_connections = doubled

        quiet = self.log.quiet_since(now)  # 2
        for session in sessions.values():
            if session["status"] == "requires_action" and session["wants_connection"] and quiet is not None:
                waited = now - max(float(session["since"]), quiet)
                if waited > ASK_SECONDS:
                    self.violate(
                        ("2", session["id"], session["since"]),
                        2,
                        self._session_name(session["id"]),
                        f"asks for a connection since +{float(session['since']) - self.log.t0:.1f}s, "
                        f"unanswered {waited:.0f}s after the faults ended",
                    )

        by_environment = {s["environment_id"]: s for s in sessions.values() if s.get("environment_id")}
        for executor in live:  # 7: late stops
            idle = by_environment.get(executor.environment_id)
            if idle is None or idle["status"] != "idle" or idle["wants_connection"]:
                continue
            idle_since = float(idle["since"])
            due = idle_since + self.idle_timeout
            if now > due + LATE_SECONDS and not self.log.disturbed_between(idle_since, now):
                self.violate(
                    ("7late", executor.environment_id, idle_since),
                    7,
                    self.name(executor.environment_id),
                    f"idle since +{idle_since - self.log.t0:.1f}s, its executor still runs {now - due:.0f}s "
                    f"after the idle timeout ({self.idle_timeout:g}s) with nothing disturbing the system",
                )

        prestarted = [e for e in live if (s := self.book.by_environment(e.environment_id)) and s.prestart]
        self.most_prestarted = max(self.most_prestarted, len(prestarted))
        if len(prestarted) > self.prestart_budget:  # 8
            self.violate(
                ("8",),
                8,
                "the pre-start burst",
                f"{len(prestarted)} pre-started executors nobody asked for are running (budget {self.prestart_budget})",
            )

        for executor in list(self.executors.values()):  # 3 and 7: executors that ended
            if executor.gone_seen is None or executor.judged:
                continue
            replacement = self._replacement(executor)
            if replacement is None and now < executor.gone_seen + REPLACEMENT_SECONDS:
                continue
            executor.judged = True
            self._judge_end(executor, replacement)

    def _track(self, groups: dict[str, dict[int, list[int]]], now: float) -> list[Executor]:
        seen = []
        for environment_id, by_sid in groups.items():
            for sid, pids in by_sid.items():
                key = (environment_id, sid)
                executor = self.executors.get(key)
                if executor is None or executor.gone_seen is not None:
                    executor = self.executors[key] = Executor(environment_id, sid, now, now, pids)
                    self.log.add("note", f"executor {sid} of {self.name(environment_id)} appeared")
                    self._judge_start(executor)
                executor.last_seen, executor.pids = now, pids
                seen.append(executor)
        for executor in self.executors.values():
            if executor.gone_seen is None and executor not in seen:
                executor.gone_seen = now
                self.log.add("note", f"executor {executor.sid} of {self.name(executor.environment_id)} is gone")
        return seen

    def _judge_start(self, executor: Executor) -> None:
        """5: an executor that starts long after its session was deleted or failed."""
        session = self.book.by_environment(executor.environment_id)
        ended = session.ended_at if session is not None else None
        if session is None or ended is None or executor.first_seen - ended <= STALE_START_SECONDS:
            return
        how = "deleted" if session.deleted_at is not None else "failed"
        self.violate(
            ("5stale", executor.environment_id, executor.sid),
            5,
            f"{session.name} ({session.id})",
            f"an executor (process session {executor.sid}) started at +{executor.first_seen - self.log.t0:.1f}s, "
            f"{executor.first_seen - ended:.1f}s after the session was {how}",
        )

    def _replacement(self, ended: Executor) -> Executor | None:
        assert ended.gone_seen is not None
        return next(
            (
                e
                for e in self.executors.values()
                if e.environment_id == ended.environment_id
                and e is not ended
                and ended.last_seen - 1.0 <= e.first_seen <= ended.gone_seen + REPLACEMENT_SECONDS
            ),
            None,
        )

    def _session_name(self, session_id: str) -> str:
        session = self.book.by_id(session_id)
        return f"{session.name} ({session_id})" if session is not None else session_id

    def _judge_end(self, executor: Executor, replacement: Executor | None) -> None:
        """Why did this executor end? Only the chaos, its session's end or the rules may end it."""
        assert executor.gone_seen is not None
        session = self.book.by_environment(executor.environment_id)
        if session is None or self.book.was_killed(executor.environment_id, executor.sid):
            return
        ended = session.ended_at
        if ended is not None and ended <= executor.gone_seen:
            return  # deleted or failed by the harness: judged by 5
        history = self.sim.history(session.id)
        if any(h["status"] == "failed" and h["at"] <= executor.gone_seen for h in history):
            return
        registrations = self.sim.registrations(executor.environment_id)
        if any(
            r["status_code"] != 200 and executor.first_seen - 1 <= r["received_at"] <= executor.gone_seen
            for r in registrations
        ):
            return  # its registration failed: it exited by itself
        # The session's state when the executor was found gone: new input between the last
        # sample that saw it and that one makes a stop a busy session's (a replacement).
        state = observe.state_at(history, executor.gone_seen)
        if state is None:
            return
        name = f"{session.name} ({session.id})"
        at = f"+{executor.gone_seen - self.log.t0:.1f}s"
        lifetime = partial(self._stopped_for_lifetime, session.id, executor.gone_seen)
        excused = f"{name}: executor {executor.sid} stopped at its maximum lifetime ({at}): not judged"
        if state["status"] == "idle" and not state["wants_connection"]:
            idle_for = executor.gone_seen - float(state["at"])
            if idle_for < self.idle_timeout - EARLY_MARGIN_SECONDS and lifetime():
                self.log.add("note", excused)
            elif idle_for < self.idle_timeout - EARLY_MARGIN_SECONDS:
                self.violate(
                    ("7early", executor.environment_id, executor.sid),
                    7,
                    name,
                    f"executor {executor.sid} stopped at {at}, {idle_for:.1f}s after its session went idle "
                    f"(idle timeout {self.idle_timeout:g}s)",
                )
            return
        before = [h for h in history if h["at"] < state["at"]]
        idle, busy_since = observe.idle_before(history, executor.gone_seen)
        if (
            idle is not None
            and busy_since - float(idle["at"]) >= self.idle_timeout - EARLY_MARGIN_SECONDS
            and executor.gone_seen - busy_since < RACE_SECONDS
        ):
            self.log.add("note", f"{name}: an idle stop that was due met new input (L12's race): not judged by 3")
            return
        links = self.sim.environments().get(executor.environment_id, {}).get("links") or []
        until = executor.gone_seen
        since = observe.down_since(links, until)
        up = observe.up_since(links, until) if since is None else None
        if up is not None and until - up < DECISION_SECONDS:
            # Back only just before it went: the decision was taken while it was down.
            until, since = up, observe.down_since(links, up - 0.001)
        down = 0.0 if since is None else until - max(since, executor.first_seen - SAMPLE_SECONDS)
        if down < self.grace - GRACE_MARGIN_SECONDS and lifetime():
            self.log.add("note", excused)
        elif down < self.grace - GRACE_MARGIN_SECONDS:
            link = "its link up" if since is None else f"its link down for {down:.1f}s"
            what = f"replaced by executor {replacement.sid}" if replacement is not None else "stopped"
            earlier = f", {before[-1]['status']} before that" if before else ""
            self.violate(
                ("3", executor.environment_id, executor.sid),
                3,
                name,
                f"executor {executor.sid} {what} at {at} while its session was {state['status']} "
                f"(since +{float(state['at']) - self.log.t0:.1f}s{earlier}; {link}; grace {self.grace:g}s)",
            )

    def _stopped_for_lifetime(self, session_id: str, gone_seen: float) -> bool:
        """Whether a worker or scheduler logged a stop of the session's sandbox for its maximum
        lifetime near ``gone_seen`` (``LIFETIME_STOP_NEAR_SECONDS``), waiting until the end of
        that window for the line to be written. Asked only of an end that would otherwise be a
        violation."""
        if self.max_lifetime is None:
            return False
        before, after = LIFETIME_STOP_NEAR_SECONDS
        waited_until = time.monotonic() + max(0.0, gone_seen + after - self.clock())
        while True:
            if any(
                line.get("event") == "sandbox stopped"
                and line.get("cause") == "lifetime"
                and line.get("session_id") == session_id
                and gone_seen - before <= float(line.get("time", 0.0)) <= gone_seen + after
                for path in self.controller_logs()
                for line in _json_lines(path)
            ):
                return True
            if time.monotonic() >= waited_until:
                return False
            time.sleep(SAMPLE_SECONDS)

    # -- an operator's release ----------------------------------------------------------------

    def judge_release(
        self, session: Session, workspace: Path, asked_at: float, within: float, refused: str | None
    ) -> None:
        """9: ``sandbox-controller release SID --yes`` ran at ``asked_at`` for a held deletion
        (``refused``: what the command said when it exited non-zero); within ``within`` seconds
        the session's executor must be gone and its ``workspace`` discarded (the executor of a
        session deleted at the API may end by itself; the workspace stays while the hold does).
        Waits (bounded) and judges."""
        name = f"{session.name} ({session.id})"
        if refused is not None:
            self.violate(("9", session.id), 9, name, f"the operator's release was refused: {refused}")
            return

        def left() -> list[str]:
            running = self.live_executors(session.environment_id)
            return ([f"executor (process sessions {running})"] if running else []) + (
                [f"workspace {workspace}"] if workspace.exists() else []
            )

        if self._until(lambda: not left(), asked_at + within):
            self.log.add("note", f"{name}: released {self.clock() - asked_at:.1f}s after the operator asked")
            return
        still = left()
        if still:
            self.violate(
                ("9", session.id),
                9,
                name,
                f"released by an operator at +{asked_at - self.log.t0:.1f}s; its {' and '.join(still)} still "
                f"there {within:g}s later, while every read answers 404",
            )

    def _until(self, done: Callable[[], bool], deadline: float) -> bool:
        """Sample ``done`` until it holds (True) or the checker's clock reaches ``deadline`` (False)."""
        while self.clock() < deadline:
            if done():
                return True
            time.sleep(SAMPLE_SECONDS / 2)
        return False

    # -- suspend, containment and the state volume (issue 37) ---------------------------------

    def judge_fallback(self, session: Session, asked_at: float, within: float) -> None:
        """13: the session whose checkpoint was cut, given input at ``asked_at``, must have its
        link up (a fresh start on its workspace) within ``within`` seconds. Waits, then judges."""
        name = f"{session.name} ({session.id})"

        def connected() -> float | None:
            links = self.sim.environments().get(session.environment_id, {}).get("links") or []
            ups = [float(up) for up, _ in links if up is not None and float(up) >= asked_at]
            return min(ups, default=None)

        if self._until(lambda: connected() is not None, asked_at + within):
            up = connected()
            assert up is not None
            self.log.add("note", f"{name}: connected {up - asked_at:.1f}s after the input, its checkpoint cut")
            return
        if connected() is None and session.ended_at is None:
            self.violate(
                ("13cut", session.id),
                13,
                name,
                f"its checkpoint cut, given input at +{asked_at - self.log.t0:.1f}s: no executor connected "
                f"{within:g}s later (a restore that cannot finish must fall back to a fresh start at once)",
            )

    def judge_orphans(self, session: Session, children: dict[int, int], killed_at: float, within: float) -> None:
        """14: the detached ``children`` (pid: start ticks) of the session's sandbox, whose
        executor was SIGKILLed at ``killed_at``, must be gone ``within`` seconds later. Waits,
        then judges."""
        name = f"{session.name} ({session.id})"

        def alive() -> list[int]:
            return sorted(pid for pid, ticks in children.items() if observe.start_ticks(pid) == ticks)

        if self._until(lambda: not alive(), killed_at + within):
            self.log.add("note", f"{name}: its detached child gone {self.clock() - killed_at:.1f}s after the kill")
            return
        left = alive()
        if left:
            self.violate(
                ("14", session.id),
                14,
                name,
                f"its executor SIGKILLed at +{killed_at - self.log.t0:.1f}s; its detached child (pids {left}) "
                f"still runs {within:g}s later (executors of the session now: "
                f"{self.live_executors(session.environment_id)})",
            )

    def judge_write(self, session: Session, turn_id: str, mib: int) -> None:
        """15: the command that wrote ``mib`` MiB to the session's workspace (the second of turn
        ``turn_id``) succeeded."""
        turn = {t["id"]: t for t in self.sim.turns(session.id)}.get(turn_id)
        commands = turn["commands"] if turn else []
        write = commands[1] if len(commands) > 1 else None
        name = f"{session.name} ({session.id})"
        if write is not None and write["status"] == "completed" and write["exit_code"] == 0:
            self.log.add("note", f"{name}: wrote {mib} MiB to its workspace beside the checkpoint images")
            return
        said = "not run" if write is None else f"{write['status']}, exit {write['exit_code']}: {write['stderr']!r}"
        self.violate(("15", session.id), 15, name, f"a write of {mib} MiB to its workspace failed ({said})")

    # -- a wedged executor ----------------------------------------------------------------------

    def judge_wedged(self, session: Session, wedged: list[int], dropped_at: float, within: float) -> None:
        """12: the executors ``wedged`` (process sessions) of ``session`` whose link dropped at
        ``dropped_at`` and stays down, while its environment's reads fail now and then, must be
        gone ``within`` seconds of the drop (unless the session ended meanwhile). Waits, then judges."""
        time.sleep(max(0.0, dropped_at + within - self.clock()))
        if session.ended_at is not None:
            return
        left = sorted(set(wedged) & set(self.live_executors(session.environment_id)))
        if left:
            self.violate(
                ("12", session.id, dropped_at),
                12,
                f"{session.name} ({session.id})",
                f"its link down since +{dropped_at - self.log.t0:.1f}s (reads of its environment failing now "
                f"and then), its executor (process sessions {left}) still runs {within:g}s later: not replaced",
            )
        else:
            self.log.add("note", f"{session.name}: its wedged executor was gone within {within:g}s of the drop")

    # -- at the end ---------------------------------------------------------------------------

    def check_leases(self, worker_logs: list[Path], lease_ttl_seconds: float) -> int:
        """10: from the workers' JSON logs, a round fenced (its lease gone) less than the lease's
        TTL after its task started, with no Redis fault that could lose the lease's key near it.
        Returns how many tries of tasks were checked."""
        lines = [_json_lines(path) for path in worker_logs]
        looked_up = [
            (float(line["time"]), str(line.get("task_id")), worker)
            for worker, found in enumerate(lines)
            for line in found
            if line.get("event") == "session looked up"
        ]
        sessions_looked_up = {
            str(line.get("task_id")): str(line.get("session_id")) for found in lines for line in found
        }
        lossy = [w for w in self.log.windows if w.what.startswith(("redis-kill", "role-flip"))]
        checked = 0
        for worker, found in enumerate(lines):
            started: dict[str, float] = {}
            for line in found:
                event, task = line.get("event"), str(line.get("task_id"))
                if event == "task started":
                    started[task] = float(line["time"])
                    continue
                if event not in _TASK_ENDS or task not in started:
                    continue
                began, ended = started.pop(task), float(line["time"])
                checked += 1
                if event != _FENCED or ended - began >= lease_ttl_seconds:
                    continue
                near = 2 * lease_ttl_seconds + 40.0  # a skewed worker's clock is off by up to 30 s
                if any(w.start <= ended + near and (w.end is None or w.end >= began - near) for w in lossy):
                    continue
                session_id = str(line.get("session_id"))
                other = next(
                    (
                        (at, t, w)
                        for at, t, w in looked_up
                        if t != task and sessions_looked_up.get(t) == session_id and began <= at <= ended
                    ),
                    None,
                )
                by = (
                    f"; meanwhile worker{other[2]}'s task {other[1]} looked the session up ({other[0] - began:.2f}s in)"
                    if other is not None
                    else ""
                )
                self.violate(
                    ("10", task, began),
                    10,
                    self._session_name(session_id),
                    f"worker{worker}'s task {task} lost the lease {ended - began:.2f}s after it started "
                    f"(TTL {lease_ttl_seconds:g}s): {line.get('reason')}{by}",
                )
        return checked

    def check_restores(self, logs: list[Path]) -> int:
        """13 after the run: each restored executor connected at once, and the memory of the
        sessions whose turns asked for it (``Session.memory_turns``) kept, from the workers' and
        schedulers' logs (``logs``). Returns how many restored executors were checked."""
        lines = [line for path in logs for line in _json_lines(path)]
        restored = {str(line.get("session_id")) for line in lines if line.get("event") == "executor restored"}
        fallbacks = {str(line.get("session_id")) for line in lines if line.get("event") in FALLBACKS}
        registered: dict[str, list[float]] = {}
        for registration in self.sim.registrations():
            registered.setdefault(str(registration["environment_id"]), []).append(float(registration["received_at"]))
        environments = self.sim.environments()
        checked = 0
        for executor in sorted(self.executors.values(), key=lambda e: e.first_seen):
            session = self.book.by_environment(executor.environment_id)
            if session is None or session.id not in restored:
                continue
            before, after = REGISTERED_NEAR_SECONDS
            near = [
                r
                for r in registered.get(executor.environment_id, [])
                if executor.first_seen - before <= r <= executor.first_seen + after
            ]
            if near:
                continue  # a fresh start: it registered
            checked += 1
            bound = executor.first_seen + RESTORE_CONNECT_SECONDS
            links = environments.get(executor.environment_id, {}).get("links") or []
            ups = [float(up) for up, _ in links if up is not None and float(up) >= executor.first_seen - 1.0]
            up = min(ups, default=None)
            if up is not None and up <= bound:
                continue
            if (executor.gone_seen is not None and executor.gone_seen <= bound + SAMPLE_SECONDS) or (
                self.book.was_killed(executor.environment_id, executor.sid)
                or self.log.disturbed_between(executor.first_seen - 1.0, bound)
            ):
                continue  # ended or disturbed before it could be judged
            when = "never" if up is None else f"{up - executor.first_seen:.1f}s after it showed up"
            self.violate(
                ("13", executor.environment_id, executor.sid),
                13,
                f"{session.name} ({session.id})",
                f"executor {executor.sid}, restored at +{executor.first_seen - self.log.t0:.1f}s, connected {when} "
                f"(bound {RESTORE_CONNECT_SECONDS:g}s)",
            )
        for session in self.book.all():
            if session.memory_turns and session.ended_at is None:
                self._check_memory(session, fallbacks)
        return checked

    def _answers(self, session: Session, turn_ids: list[str]) -> list[tuple[str, str | None]]:
        """What each of these turns' second command (``ASK_COMMAND``) got from the session's
        background process: its token, or None when none answered; turns not run are left out
        (the session ended, the run ended first)."""
        by_id = {t["id"]: t for t in self.sim.turns(session.id)}
        answers = []
        for turn_id in turn_ids:
            turn = by_id.get(turn_id)
            commands = turn["commands"] if turn else []
            if len(commands) < 2 or commands[1]["status"] != "completed":
                continue
            printed = str(commands[1]["stdout"]).split()
            answers.append((turn_id, printed[0] if printed and commands[1]["exit_code"] == 0 else None))
        return answers

    def _check_memory(self, session: Session, fallbacks: set[str]) -> None:
        """13: every turn of ``session.memory_turns`` found the background process of its first
        turn with the same token, unless its memory was given up on purpose (``fallbacks``)."""
        answers = self._answers(session, session.memory_turns)
        tokens = {token for _, token in answers}
        if len(tokens) <= 1 and None not in tokens:
            self.log.add("note", f"{session.name}: {len(answers)} turns found the same background process in memory")
            return
        if session.id in fallbacks:
            self.log.add("note", f"{session.name}: its memory was given up on purpose (a worker logged why)")
            return
        self.violate(
            ("13memory", session.id),
            13,
            f"{session.name} ({session.id})",
            "its background process (a token kept only in memory) was lost with no fallback logged: the turns "
            f"found {[token or 'none answering' for _, token in answers]}",
        )

    def check_lineages(self, slack_seconds: float) -> int:
        """16 after the run: no turn of ``Session.lineage_turns`` posted ``slack_seconds``
        (``schedule.LINEAGE_SLACK_SECONDS``; the run passes it) past the maximum lifetime, from
        the session's first executor's sighting, got the token a turn inside the lifetime got.
        Returns how many turns were judged past it; a session whose cycles reached no turn past
        it is a harness error (the check would judge nothing)."""
        if self.max_lifetime is None:
            return 0
        judged = 0
        for session in self.book.all():
            if not session.lineage_turns:
                continue
            name = f"{session.name} ({session.id})"
            sighted = [e.first_seen for e in self.executors.values() if e.environment_id == session.environment_id]
            if not sighted:
                self.errors.append(f"{name}: lifetime cycles with no executor seen")
                continue
            first = min(sighted)
            posted = {t.id: t.posted_at for t in session.turns}
            answers = [(posted[turn_id], token) for turn_id, token in self._answers(session, session.lineage_turns)]
            inside = [token for at, token in answers if at <= first + self.max_lifetime and token is not None]
            bound = first + self.max_lifetime + slack_seconds
            late = [(at, token) for at, token in answers if at > bound]
            if not late:
                self.errors.append(f"{name}: no turn came {slack_seconds:g}s past the lifetime: 16 judged nothing")
                continue
            if not inside:
                self.log.add("note", f"{name}: no turn inside the lifetime found the background process: 16 not judged")
                continue
            judged += len(late)
            for at, token in late:
                if token == inside[0]:
                    self.violate(
                        ("16", session.id, at),
                        16,
                        name,
                        f"a turn posted at +{at - self.log.t0:.1f}s, {at - first:.1f}s after its first executor was "
                        f"seen (maximum lifetime {self.max_lifetime:g}s), found the first lineage's background process "
                        f"(token {token}): its lineage outlived the lifetime",
                    )
        return judged

    def live_executors(self, environment_id: str) -> list[int]:
        return sorted(self.scan().get(environment_id, {}))

    def check_markers(self) -> int:
        """4 for every session given turns and not deleted (a deleted one was checked just before
        its deletion: ``check_session_markers``). Returns how many commands were checked in all."""
        checked = self.markers_checked
        for session in self.book.all():
            if not session.prestart and session.deleted_at is None:
                checked += self.check_session_markers(session)
        return checked

    def check_session_markers(self, session: Session) -> int:
        """4 for one session: every token a finished command wrote is printed by every command
        started after it, until the session failed (its workspace may go then). Returns how many
        commands were checked."""
        history = self.sim.history(session.id)
        ends = [float(h["at"]) for h in history if h["status"] == "failed"]
        until = min([*ends, *([session.failed_at] if session.failed_at is not None else [])], default=float("inf"))
        by_id = {t["id"]: t for t in self.sim.turns(session.id)}
        done = []
        for turn in session.turns:
            found = by_id.get(turn.id)
            command = found["commands"][0] if found and found["commands"] else None
            ran = command is not None and command["status"] == "completed" and command["exit_code"] == 0
            if command is not None and ran and float(command["started_at"]) < until:
                done.append((float(command["started_at"]), float(command["finished_at"]), turn.token, command))
        for started, _, token, command in done:
            wanted = [t for s, finished, t, _ in done if finished < started]
            printed = set(str(command["stdout"]).split())
            missing = [t for t in wanted if t not in printed]
            if missing:
                self.violate(
                    ("4", session.id),
                    4,
                    f"{session.name} ({session.id})",
                    f"the command of {token} (started +{started - self.log.t0:.1f}s) found the workspace "
                    f"without {', '.join(missing)}: it printed {sorted(printed) or 'nothing'}",
                )
                break
        return len(done)

    def before_deletion(self, session: Session) -> None:
        """The harness is about to delete ``session`` (the API then forgets its turns and its
        history): check 4 for it now, and keep its history for 5 (``check_deliveries``)."""
        try:
            self.histories_before_deletion[session.id] = self.sim.history(session.id)
        except Exception as exc:  # a harness error, not a verdict
            self.errors.append(f"history of {session.name} before its deletion: {exc}")
        if not session.prestart:
            self.markers_checked += self.check_session_markers(session)

    def check_deliveries(self) -> int:
        """5: each acknowledged environment_connection delivery's request was resolved. Returns
        how many acknowledged deliveries were checked."""
        events = self.sim.events()
        histories: dict[str, list[dict[str, Any]]] = {}
        checked = 0
        for delivery in self.sim.deliveries("agent.session.action_required"):
            acknowledged = [a for a in delivery["attempts"] if a["status_code"] and 200 <= a["status_code"] < 300]
            event = events.get(delivery["event_id"])
            if not acknowledged or event is None:
                continue
            data = event["data"]
            if (data.get("required_action") or {}).get("type") != "environment_connection":
                continue
            session = self.book.by_id(str(data.get("id")))
            if session is None:
                continue
            if session.id not in histories:
                histories[session.id] = self.sim.history(session.id) or self.histories_before_deletion.get(
                    session.id, []
                )
            history = histories[session.id]
            failed = [h["at"] for h in history if h["status"] == "failed"]
            ends = [t for t in (session.ended_at, failed[0] if failed else None) if t is not None]
            checked += 1
            attempt = acknowledged[0]
            acked_at = float(attempt["started_at"]) + float(attempt["duration_seconds"] or 0)
            asks = [h for h in history if h["wants_connection"] and h["at"] <= acked_at]
            if not asks:
                continue
            if ends and min(ends) - asks[-1]["at"] < ASK_SECONDS:
                continue  # deleted or failed before its connection was owed
            served = (
                h["at"] > asks[-1]["at"] and not h["wants_connection"] and h["status"] != "failed" for h in history
            )
            if not any(served):
                self.violate(
                    ("5", session.id),
                    5,
                    f"{session.name} ({session.id})",
                    f"delivery {delivery['id']} of {event['id']} acknowledged at +{acked_at - self.log.t0:.1f}s; "
                    f"the connection it asked for (since +{asks[-1]['at'] - self.log.t0:.1f}s) never came",
                )
        return checked

    def check_ended_sessions_released(self) -> None:
        """5: no executor left for a session that was deleted or failed."""
        failed = {s["id"] for s in self.sim.sessions().values() if s["status"] == "failed"}
        groups = self.scan()
        for session in self.book.all():
            if session.ended_at is None and session.id not in failed:
                continue
            left = sorted(groups.get(session.environment_id, {}))
            if left:
                how = "deleted" if session.deleted_at is not None else "failed"
                self.violate(
                    ("5gone", session.id),
                    5,
                    f"{session.name} ({session.id})",
                    f"{how}, and its executor (process sessions {left}) still runs at the end",
                )

    def check_crash_loops(self) -> int:
        """11: refused registrations (codex exits at each) of one environment, at most
        ``CRASH_LOOP_MOST`` in any ``CRASH_LOOP_WINDOW_SECONDS``. Returns how many refused
        registrations were checked."""
        refused: dict[str, list[float]] = {}
        for registration in self.sim.registrations():
            if int(registration.get("status_code") or 0) >= 400:
                refused.setdefault(str(registration["environment_id"]), []).append(float(registration["received_at"]))
        for environment_id, times in refused.items():
            times.sort()
            for index, first in enumerate(times):
                within = [t for t in times[index:] if t - first <= CRASH_LOOP_WINDOW_SECONDS]
                if len(within) > CRASH_LOOP_MOST:
                    self.violate(
                        ("11", environment_id),
                        11,
                        self.name(environment_id),
                        f"{len(within)} refused registrations (each an executor start that exited) within "
                        f"{within[-1] - first:.1f}s from +{first - self.log.t0:.1f}s: no back-off",
                    )
                    break
        return sum(len(times) for times in refused.values())

    def check_idle_stopped(self) -> None:
        """7 at the end: an executor of an idle session (its final turn done) still running
        ``LATE_SECONDS`` past the idle timeout (the faults are over by then)."""
        now = self.clock()
        groups = self.scan()
        for session in self.sim.sessions().values():
            left = sorted(groups.get(str(session.get("environment_id")), {}))
            if not left or session["status"] != "idle" or session["wants_connection"]:
                continue
            late = now - float(session["since"]) - self.idle_timeout
            if late > LATE_SECONDS:
                self.violate(
                    ("7late", session["environment_id"], float(session["since"])),
                    7,
                    self._session_name(session["id"]),
                    f"idle since +{float(session['since']) - self.log.t0:.1f}s, its executor (process sessions "
                    f"{left}) still runs at the end, {late:.0f}s after the idle timeout ({self.idle_timeout:g}s)",
                )

    def check_nothing_left(self, directory: Path, wait_seconds: float = 15.0) -> None:
        """6: no executor dialling the simulator and no process of the run's directory remain
        (whatever is found is killed after being reported)."""
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            left_executors = observe.executor_processes(self.remote_url)
            left = processes_under(directory)
            if not left_executors and not left:
                return
            time.sleep(0.2)
        details = [f"executor pid {p.pid} of {self.name(p.environment_id)}" for p in left_executors] + left
        self.violate(("6",), 6, "the run", f"left running after the teardown: {details}")
        for process in left_executors:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for entry in left:
            try:
                os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


_FENCED = "stale decision dropped; looking again"
_TASK_ENDS = frozenset(
    {
        "task done",
        _FENCED,
        "will retry",
        "session busy elsewhere; will look again",
        "giving up on session",
        "retries exhausted; left to the recovery pass",
    }
)
"""What a worker logs as a task's try ends (``controller/worker.py``)."""


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """A process's JSON log lines, in the order written (other lines skipped)."""
    found = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    for raw in text.splitlines():
        if raw.startswith("{"):
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict) and isinstance(line.get("time"), int | float):
                found.append(line)
    return found
