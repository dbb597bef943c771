"""Carries a schedule's steps out against the world, each at its time, and writes them down.

Session actions run at once, in order; each fault runs in a thread of its own (so a restart
that waits for a worker to be ready holds up nothing else) and opens a disturbance window in
the event log that it closes once the fault is over and what it broke is back (a process
restarted and ready, Redis answering, the API's fault expired). Two faults never work on one
process (or on Redis) at once: the later one is skipped and says so. A fault's own trouble
(Redis not coming back, a clock that did not move) is a harness error, kept apart from the
system's violations.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import redis

from tests.chaos import observe
from tests.chaos.book import Book, Session, Turn
from tests.chaos.eventlog import EventLog
from tests.chaos.schedule import (
    DELETION_CONFIRM_SECONDS,
    FALLBACK_SECONDS,
    FIRST_404S_SECONDS,
    HOLD_MIB,
    OPERATOR_RELEASE_SECONDS,
    ORPHAN_SECONDS,
    STALE_AFTER_END_SECONDS,
    WEDGED_BOUND_SECONDS,
    WEDGED_EVERY_SECONDS,
    WEDGED_FAILS_SECONDS,
    WRITE_MIB,
    Schedule,
    Step,
)
from tests.chaos.world import API_HOLD_SECONDS, MARKER, PRESTART_AGENT, ChaosWorld
from tests.support import faketime
from tests.support.keeper import ASK, KEEPER
from tests.support.processes import python_module

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}
SKEW_TOLERANCE_SECONDS = 2.0
OPENINGS = frozenset({"lone-404"})
"""Faults carried out in the schedule's own thread: the steps after them wait until they end."""
LEADER_WAIT_SECONDS = 15.0
"""A leader-only executor kill waits this long at most for its session's executor to run."""
READY_SECONDS = 60.0
"""How long a fault waits for its session's executor to run (and its turn to end) before it
starts; past that it is not carried out (a harness error: what it would judge goes unjudged)."""


class Judge(Protocol):
    """What the injector asks of the checker (``checker.Checker``)."""

    def live_executors(self, environment_id: str) -> list[int]: ...

    def judge_release(
        self, session: Session, workspace: Path, asked_at: float, within: float, refused: str | None
    ) -> None: ...

    def judge_wedged(self, session: Session, wedged: list[int], dropped_at: float, within: float) -> None: ...

    def judge_fallback(self, session: Session, asked_at: float, within: float) -> None: ...

    def judge_orphans(self, session: Session, children: dict[int, int], killed_at: float, within: float) -> None: ...

    def judge_write(self, session: Session, turn_id: str, mib: int) -> None: ...


def marker_command(token: str) -> list[str]:
    """Print what the workspace's marker file holds, then add ``token`` to it."""
    return ["sh", "-c", f"cat {MARKER} 2>/dev/null; echo {token} >> {MARKER}"]


KEEP_COMMAND = ["sh", "-c", f"setsid -f python3 -c '{KEEPER}' >/dev/null 2>&1"]
"""Start a background process that keeps a token only in memory (``tests/support/keeper.py``)."""
ASK_COMMAND = ["python3", "-c", ASK]
"""Print that process's token, counter and pid (fails when none answers)."""
ORPHAN_COMMAND = ["sh", "-c", "setsid -f sleep 3600 </dev/null >/dev/null 2>&1"]
"""A detached child: a session of its own, as a dev server an agent starts."""
HOLD_COMMAND = [
    "sh",
    "-c",
    f"setsid -f python3 -c 'import os, time; kept = bytearray(os.urandom({HOLD_MIB} * 2**20)); "
    "open(chr(104), chr(119)).close(); time.sleep(10**9)' >/dev/null 2>&1",
]
"""A background process holding ``HOLD_MIB`` of memory; it writes the file ``h`` once filled."""
WRITE_COMMAND = ["sh", "-c", f"head -c {WRITE_MIB}M /dev/zero > volume-fill; s=$?; rm -f volume-fill; exit $s"]
"""Write ``WRITE_MIB`` to the workspace (and remove it): fails with the volume full."""
STOPPED = frozenset({"executor suspended", "executor stopped", "unrecorded sandbox stopped"})
"""What a worker (or, for a sandbox whose start was cut short, the sweep) logs once as a
session's sandbox goes: suspended, or stopped (a checkpoint refused or failed is followed by
"executor stopped", so it is not counted apart)."""
TURN_WAIT_SECONDS = 60.0
SUSPEND_WAIT_SECONDS = 60.0
"""How long a placed fault waits for its session's turn to end, or for its sandbox to be
suspended (past that it is not carried further: noted; what it judges is judged as far as it got)."""

STALE_HOLD_SECONDS = 1.0
"""How long the simulator holds the read the stale-worker fault freezes a worker in (less than
the controller's API timeout: the frozen round gets its answer, the session as it stood)."""
STALE_SETTLE_SECONDS = 3.0


class Injector:
    def __init__(
        self,
        world: ChaosWorld,
        book: Book,
        log: EventLog,
        can_skew: bool,
        before_deletion: Callable[[Session], None] | None = None,
        judge: Judge | None = None,
    ) -> None:
        """``before_deletion`` is called with a session just before the harness deletes it;
        ``judge`` (the checker) says which executors run, and judges an operator's release."""
        self.judge = judge
        self.world = world
        self.book = book
        self.log = log
        self.can_skew = can_skew
        self.before_deletion = before_deletion
        self.errors: list[str] = []
        self._threads: list[threading.Thread] = []
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._turns = 0

    # -- running a schedule -------------------------------------------------------------------

    def run(self, schedule: Schedule) -> None:
        """Every step at its time (seconds after the log's ``t0``); returns once every fault is over."""
        for step in schedule.steps:
            delay = self.log.t0 + step.at - time.time()
            if delay > 0:
                time.sleep(delay)
            if step.kind in ("create", "input", "delete", "fail"):
                self._guarded(step, self._session_action)
            elif step.kind in OPENINGS:
                self._guarded(step, self._fault)
            else:
                thread = threading.Thread(target=self._guarded, args=(step, self._fault), daemon=True)
                thread.start()
                self._threads.append(thread)
        for thread in self._threads:
            thread.join(timeout=300)
            if thread.is_alive():
                self.errors.append("a fault did not end within 300 s")

    def _guarded(self, step: Step, carry_out: Any) -> None:
        try:
            carry_out(step)
        except Exception as exc:
            message = f"harness error in {step.describe()}: {type(exc).__name__}: {exc}"
            self.errors.append(message)
            self.log.add("note", message)

    def _claim(self, subject: str, step: Step) -> bool:
        with self._lock:
            if subject in self._busy:
                self.log.add("note", f"skipped {step.describe()}: {subject} is in another fault")
                return False
            self._busy.add(subject)
            return True

    def _release(self, subject: str) -> None:
        with self._lock:
            self._busy.discard(subject)

    # -- sessions -----------------------------------------------------------------------------

    def _session_action(self, step: Step) -> None:
        if step.kind == "create":
            self.create(step.subject, prestart=step.value == "prestart")
            return
        session = self.book.get(step.subject)
        if session is None:
            self.log.add("note", f"skipped {step.describe()}: the session was never created")
            return
        if step.kind == "input":
            self.give_input(session)
        elif step.kind == "delete":
            self.delete(session)
        elif step.kind == "fail":
            answer = self.world.admin("POST", f"/admin/sessions/{session.id}/fail", {"error": "failed by chaos"})
            session.failed_at = time.time()
            self.log.add("session", f"fail {session.name} ({session.id}): {answer.status_code}")

    def delete(self, session: Session) -> None:
        """The API's DELETE of ``session`` (its markers and history read just before)."""
        if self.before_deletion is not None:
            self.before_deletion(session)
        with self.world.api() as client:
            answer = client.delete(f"/v1/agents/sessions/{session.id}")
        session.deleted_at = time.time()
        self.log.add("session", f"delete {session.name} ({session.id}): {answer.status_code}")

    def create(self, name: str, prestart: bool = False) -> Session:
        body: dict[str, Any] = {"environment": SELF_HOSTED}
        if prestart:
            body["agent_id"] = PRESTART_AGENT
        with self.world.api() as client:
            answer = client.post("/v1/agents/sessions", json=body)
        answer.raise_for_status()
        created = answer.json()
        session = Session(name, created["id"], created["environment"]["id"], time.time(), prestart=prestart)
        self.book.add(session)
        kind = " (agent of the pre-start list, no input)" if prestart else ""
        self.log.add("session", f"create {name} = {session.id}, environment {session.environment_id}{kind}")
        return session

    def give_input(
        self,
        session: Session,
        final: bool = False,
        then: list[list[str]] | None = None,
        memory: bool = False,
        lineage: bool = False,
    ) -> Turn | None:
        """A turn whose command reads the marker file and adds this turn's token to it; ``then``:
        commands it runs after that one; ``memory``: its second command asks the session's
        background process for its token (``Session.memory_turns``); ``lineage``: the same, judged
        against the maximum lifetime (``Session.lineage_turns``)."""
        self._turns += 1
        token = f"{session.name}-final" if final else f"{session.name}-t{self._turns}"
        commands = [marker_command(token), *(then or []), *([ASK_COMMAND] if memory or lineage else [])]
        answer = self.world.admin("POST", f"/admin/sessions/{session.id}/turns", {"commands": commands})
        if answer.status_code != 202:
            self.log.add("session", f"input {session.name}: {answer.status_code} (not taken)")
            return None
        turn = Turn(str(answer.json()["id"]), token, time.time())
        session.turns.append(turn)
        if memory:
            session.memory_turns.append(turn.id)
        if lineage:
            session.lineage_turns.append(turn.id)
        self.log.add("session", f"input {session.name}: turn {turn.id} writes {token}")
        return turn

    # -- faults -------------------------------------------------------------------------------

    def _alive(self, step: Step) -> Session | None:
        """The session ``step`` names, or None (noted as skipped) when it was never created or
        has ended by now."""
        session = self.book.get(step.subject)
        if session is None or session.ended_at is not None:
            self.log.add("note", f"skipped {step.describe()}: no such session now")
            return None
        return session

    def _fault(self, step: Step) -> None:
        handlers = {
            "api-fault": self._api_fault,
            "api-flap": self._api_flap,
            "api-404-recheck": self._recheck,
            "lone-404": self._lone_404,
            "wrong-key": self._wrong_key,
            "executor-missing": self._executor_missing,
            "link-drop": self._link_drop,
            "kill-executor": self._kill_executor,
            "kill": self._kill,
            "redis-kill": self._redis_kill,
            "redis-pause": self._redis_pause,
            "role-flip": self._role_flip,
            "skew": self._skew,
            "stale-worker": self._stale_worker,
            "crash-loop": self._crash_loop,
            "wedged-link": self._wedged_link,
            "failing-start-404": self._failing_start_404,
            "suspend-cycles": self._suspend_cycles,
            "lifetime-cycles": self._lifetime_cycles,
            "corrupt-checkpoint": self._corrupt_checkpoint,
            "orphan-child": self._orphan_child,
            "fill-volume": self._fill_volume,
            "webhook-duplicate": self._duplicate,
            "webhook-hold": self._hold,
        }
        handlers[step.kind](step)

    def _api_fault(self, step: Step) -> None:
        target, status = step.value.split(":")
        body: dict[str, Any] = {"target": target, "seconds": step.seconds}
        hold = 0.0
        if status == "timeout":
            body.update(kind="timeout", hold_seconds=API_HOLD_SECONDS)
            hold = API_HOLD_SECONDS
        else:
            body["status"] = int(status)
            if status == "429":
                body["retry_after"] = 1
        scope = "every session"
        if step.subject != "*":
            session = self.book.get(step.subject)
            if session is None:
                self.log.add("note", f"skipped {step.describe()}: the session was never created")
                return
            body["object_id"] = session.id if target == "retrieve_session" else session.environment_id
            scope = f"{session.name} ({session.id})"
        window = self.log.disturbed(step.describe())
        self.world.admin("POST", "/admin/faults", body).raise_for_status()
        self.log.add("fault", f"{target} answers {status} for {step.seconds:.1f}s: {scope}")
        time.sleep(step.seconds + hold)  # a held answer outlasts its fault by the hold
        self.log.ended(window)
        self.log.add("restore", f"{target} answers again ({scope})")

    def _api_flap(self, step: Step) -> None:
        """Two one-shot 404s of one session's reads, ``step.seconds`` apart: each is taken by the
        next read of that session, whichever process makes it."""
        session = self._alive(step)
        if session is None:
            return
        window = self.log.disturbed(step.describe())
        body = {"target": "retrieve_session", "status": 404, "count": 1, "object_id": session.id}
        for index in range(2):
            if index:
                time.sleep(step.seconds)
            self.world.admin("POST", "/admin/faults", body).raise_for_status()
            self.log.add("fault", f"the next read of {session.name} ({session.id}) answers 404 (one-shot {index + 1})")
        time.sleep(2.0)
        self.log.ended(window)
        self.log.add("restore", f"{session.name} reads again")

    # -- the deletion faults (issue 25, defects 1, 2 and 5) ------------------------------------

    def _armed(self, session_id: str) -> bool:
        """Whether a fault narrowed to this session's reads is still armed at the simulator."""
        listed = self.world.admin("GET", "/admin/faults").json()["data"]
        return any(f.get("object_id") == session_id and f.get("target") == "retrieve_session" for f in listed)

    def _wait(self, check: Callable[[], bool], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.25)
        return check()

    def _ready(self, session: Session, idle: bool) -> bool:
        """Wait (bounded) until ``session``'s executor runs (and, with ``idle``, its turn ended)."""
        assert self.judge is not None
        judge = self.judge

        def ready() -> bool:
            if not judge.live_executors(session.environment_id):
                return False
            if not idle:
                return True
            listed = self.world.admin("GET", "/admin/sessions").json()["data"]
            return any(s["id"] == session.id and s["status"] == "idle" for s in listed)

        return self._wait(ready, READY_SECONDS)

    def _logged(self, session: Session, events: frozenset[str], schedulers: bool = False) -> int:
        """How many lines of ``events`` about ``session`` the workers (and, with ``schedulers``,
        the schedulers) logged."""
        processes = [*self.world.workers, *((self.world.scheduler, self.world.standby) if schedulers else ())]
        return sum(
            1
            for process in processes
            if process is not None
            for line in process.log_lines()
            if line.get("event") in events and line.get("session_id") == session.id
        )

    def _held(self, session: Session) -> bool:
        """Whether a worker logged the deletion of ``session`` as held."""
        return bool(self._logged(session, frozenset({"deletions held"})))

    def _recheck(self, step: Step) -> None:
        """One-shot 404, reads answering 503 for ``step.seconds``, one more one-shot 404 on the
        re-check past the confirmation period, then readable (issue 25, defect 1). Each one-shot
        is armed only once the previous fault of that session is taken or over; the second one
        replaces the 503s a moment before they end, so no read lands between them."""
        session = self._alive(step)
        if session is None:
            return
        window = self.log.disturbed(step.describe())
        one_shot = {"target": "retrieve_session", "status": 404, "count": 1, "object_id": session.id}
        self.world.admin("POST", "/admin/faults", one_shot).raise_for_status()
        self.log.add("fault", f"the next read of {session.name} ({session.id}) answers 404 (one-shot 1 of 2)")
        if not self._wait(lambda: not self._armed(session.id), 15.0):
            self.errors.append(f"{step.describe()}: the first one-shot 404 was not taken within 15 s")
        failing = {"target": "retrieve_session", "status": 503, "seconds": step.seconds, "object_id": session.id}
        self.world.admin("POST", "/admin/faults", failing).raise_for_status()
        self.log.add("fault", f"reads of {session.name} answer 503 for {step.seconds:.1f}s")
        time.sleep(max(0.0, step.seconds - 0.3))
        self.world.admin("POST", "/admin/faults", one_shot).raise_for_status()  # replaces the 503s
        self.log.add("fault", f"the next read of {session.name} answers 404 (one-shot 2 of 2, the re-check)")
        if not self._wait(lambda: not self._armed(session.id), 15.0):
            self.errors.append(f"{step.describe()}: the second one-shot 404 was not taken within 15 s")
        time.sleep(2.0)
        self.log.ended(window)
        self.log.add("restore", f"{session.name} reads again")

    def _failing_start_404(self, step: Step) -> None:
        """Issue 37, defect 1: the session's reads answer 404 for ``FIRST_404S_SECONDS`` (less
        than the confirmation period), long enough for two of the three spread reads a deletion
        needs; as soon as a worker logs the second, its executor is SIGKILLed, the executor
        binary moved away and input given, so that it reads fine in rounds that want a start
        whose start fails; once the confirmation period since the first 404 read is over, one
        more one-shot 404; then the binary is back. The good reads between count: no deletion
        (its workspace is judged by 4 at its final turn)."""
        session = self._alive(step)
        link = self.world.executor_link
        if session is None:
            return
        if link is None:
            self.log.add("note", f"skipped {step.describe()}: the executor is not a file the run can move")
            return
        if not self._claim("executor", step):
            return
        window = self.log.disturbed(step.describe())
        away = link.with_name(link.name + ".away")
        moved = False
        try:
            failing = {
                "target": "retrieve_session",
                "status": 404,
                "seconds": FIRST_404S_SECONDS,
                "object_id": session.id,
            }
            self.world.admin("POST", "/admin/faults", failing).raise_for_status()
            self.log.add("fault", f"reads of {session.name} ({session.id}) answer 404 for {FIRST_404S_SECONDS:g}s")
            first: list[float] = []
            if not self._wait(lambda: self._spread_404s(session, 2, first), FIRST_404S_SECONDS + 1.0):
                self.log.add("note", f"{step.describe()}: no second spread 404 read of {session.name}: not carried out")
                return
            link.rename(away)
            moved = True
            sids = sorted({p.sid for p in self._executors_of(session)})
            self._sigkill(session, sids, time.time())
            self.give_input(session)
            self.log.add(
                "fault",
                f"two spread 404 reads of {session.name} logged (the first at +{first[0] - self.log.t0:.1f}s); SIGKILL "
                f"of its executor {sids}, the executor binary missing, input given: it reads fine in rounds whose "
                "start fails",
            )
            time.sleep(max(FIRST_404S_SECONDS, first[0] + DELETION_CONFIRM_SECONDS + 1.0 - time.time()))
            one_shot = {"target": "retrieve_session", "status": 404, "count": 1, "object_id": session.id}
            self.world.admin("POST", "/admin/faults", one_shot).raise_for_status()
            self.log.add("fault", f"the next read of {session.name} answers 404 (past the confirmation period)")
            if not self._wait(lambda: not self._armed(session.id), 15.0):
                self.log.add("note", f"{step.describe()}: the last one-shot 404 was not taken within 15 s")
            time.sleep(1.0)
        finally:
            if moved:
                away.rename(link)
                self.log.add("restore", "executor binary back")
            self._release("executor")
            self.log.ended(window)
        self.log.add("restore", f"{session.name} reads again")

    def _spread_404s(self, session: Session, reads: int, first: list[float]) -> bool:
        """Whether a worker logged the ``reads``-th spread 404 read of ``session``; ``first`` gets
        the time of its first (the worker's clock)."""
        found = [
            line
            for worker in self.world.workers
            for line in worker.log_lines()
            if line.get("event") == "session looked up"
            and line.get("session_id") == session.id
            and line.get("status") == "not found"
        ]
        found.sort(key=lambda line: float(str(line["time"])))
        ones = [line for line in found if "(1 of " in str(line.get("reason"))]
        if ones:
            first[:] = [float(str(ones[-1]["time"]))]
        return any(f"({reads} of " in str(line.get("reason")) for line in found)

    def _lone_404(self, step: Step) -> None:
        """The opening of ``lone-404``: once the one session's executor runs and its turn ended,
        every read of it answers 404 for ``step.seconds`` (no other session is mapped to compare
        with): it must be held (issue 25, defect 2). Carried out in the schedule's own thread,
        so the story waits for it."""
        session = self.book.get(step.subject)
        if session is None or self.judge is None:
            self.errors.append(f"{step.describe()}: no session or no judge to carry it out")
            return
        if not self._ready(session, idle=True):
            self.errors.append(f"{step.describe()}: {session.name} had no executor, idle, within {READY_SECONDS:g}s")
            return
        window = self.log.disturbed(step.describe())
        body = {"target": "retrieve_session", "status": 404, "seconds": step.seconds, "object_id": session.id}
        self.world.admin("POST", "/admin/faults", body).raise_for_status()
        self.log.add(
            "fault",
            f"every read of {session.name} ({session.id}), the one session, answers 404 for {step.seconds:.1f}s",
        )
        time.sleep(step.seconds)
        self.log.ended(window)
        held = "its deletion was held" if self._held(session) else "no hold was logged"
        self.log.add("restore", f"{session.name} reads again ({held})")

    def _wrong_key(self, step: Step) -> None:
        """Every session read answers 404 for ``step.seconds``; ``step.subject`` (its executor
        running) is deleted at the API, and once its hold shows in the worker log the operator's
        ``sandbox-controller release SID --yes`` runs; the checker judges 9 during the window."""
        if self.judge is None:
            self.log.add("note", f"skipped {step.describe()}: no such session now")
            return
        session = self._alive(step)
        if session is None:
            return
        if not self._ready(session, idle=False):
            self.errors.append(f"{step.describe()}: {session.name} had no executor within {READY_SECONDS:g}s")
            return
        window = self.log.disturbed(step.describe())
        body = {"target": "retrieve_session", "status": 404, "seconds": step.seconds}
        self.world.admin("POST", "/admin/faults", body).raise_for_status()
        ends = time.time() + step.seconds
        self.log.add("fault", f"every session read answers 404 for {step.seconds:.1f}s (a wrong key)")
        try:
            time.sleep(1.0)
            self.delete(session)
            latest = ends - OPERATOR_RELEASE_SECONDS - 2.0  # judged before the window ends
            if not self._wait(lambda: self._held(session), max(0.0, latest - time.time())):
                self.errors.append(
                    f"{step.describe()}: no hold of {session.name} logged in time: the operator's release is unjudged"
                )
                return
            self._operator_release(session)
        finally:
            time.sleep(max(0.0, ends - time.time()))
            self.log.ended(window)
            self.log.add("restore", "session reads answer again")

    def _operator_release(self, session: Session) -> None:
        """``sandbox-controller release SID --yes``, as an operator would run it (the world's
        settings), written down; then 9 is judged."""
        assert self.judge is not None
        # The local runner's layout: sessions/<id (path-safe, 40 chars)>-<hash>/workspace.
        found = sorted((self.world.state_directory / "sessions").glob(f"{session.id[:40]}-*/workspace"))
        if len(found) != 1 or not found[0].is_dir():
            self.errors.append(f"operator's release of {session.name}: its workspace is not there to judge ({found})")
            return
        command = [*python_module("controller", "release", session.id, "--yes")]
        asked = time.time()
        done = subprocess.run(command, env=self.world.controller_env(), capture_output=True, text=True, timeout=60)
        said = (done.stdout or done.stderr).strip().splitlines()
        line = said[-1] if said else ""
        self.log.add(
            "operator",
            f"sandbox-controller release {session.name} ({session.id}) --yes: exit {done.returncode}: {line}",
        )
        refused = None if done.returncode == 0 else line
        self.judge.judge_release(session, found[0], asked, OPERATOR_RELEASE_SECONDS, refused)

    def _executor_missing(self, step: Step) -> None:
        """The executor binary is away for ``step.seconds`` (renamed), then back."""
        link = self.world.executor_link
        if link is None:
            self.log.add("note", f"skipped {step.describe()}: the executor is not a file the run can move")
            return
        if not self._claim("executor", step):
            return
        away = link.with_name(link.name + ".away")
        window = self.log.disturbed(step.describe())
        try:
            link.rename(away)
            self.log.add("fault", f"executor binary missing for {step.seconds:.1f}s ({link})")
            time.sleep(step.seconds)
        finally:
            away.rename(link)
            self._release("executor")
        self.log.ended(window)
        self.log.add("restore", "executor binary back")

    def _stale_worker(self, step: Step) -> None:
        """A worker frozen mid-round, past its lease, then thawed after its session ended.

        The session made for it (``step.subject``) is created with the webhooks held a moment,
        so that its first read can be armed to be held (``timeout``, ``STALE_HOLD_SECONDS``) before
        any worker makes it. The pool process that waits for that read (found by its socket,
        ``GET /admin/held``) is SIGSTOPped: it has read the session wanting a connection and not
        yet started anything. Its lease expires; another worker takes the session and starts its
        executor. Once that executor is connected the session is failed, and once the executor
        is gone the frozen process waits ``STALE_AFTER_END_SECONDS`` more before SIGCONT. Whatever
        it does next comes from a read made before the session ended, by a worker whose lease is
        long gone: it must start nothing (invariant 5 fails an executor that starts that late)."""
        name = step.subject
        deadline = time.monotonic() + step.seconds
        window = self.log.disturbed(step.describe())
        frozen: tuple[str, int] | None = None
        try:
            self.world.admin("POST", "/admin/webhooks/hold", {"seconds": 1.0}).raise_for_status()
            session = self.create(name)
            held = {"target": "retrieve_session", "kind": "timeout", "count": 1, "object_id": session.id}
            self.world.admin("POST", "/admin/faults", {**held, "hold_seconds": STALE_HOLD_SECONDS}).raise_for_status()
            self.give_input(session)
            frozen = self._freeze_reader(session, step)
            if frozen is None:
                return
            worker, pid = frozen
            self.log.add("fault", f"SIGSTOP of {worker}'s pool process {pid}, in its round of {name} after the read")
            if not self._wait(lambda: self._connected(session), deadline - time.monotonic()):
                self.log.add("note", f"{step.describe()}: no other worker connected {name} in time")
                return
            answer = self.world.admin("POST", f"/admin/sessions/{session.id}/fail", {"error": "failed by chaos"})
            session.failed_at = time.time()
            self.log.add("session", f"fail {name} ({session.id}): {answer.status_code}")
            if not self._wait(lambda: not self._executors_of(session), deadline - time.monotonic()):
                self.log.add("note", f"{step.describe()}: the executor of {name} was not released in time")
            time.sleep(max(0.0, session.failed_at + STALE_AFTER_END_SECONDS - time.time()))
        finally:
            if frozen is not None:
                os.kill(frozen[1], signal.SIGCONT)
                self.log.add("restore", f"SIGCONT of {frozen[0]}'s pool process {frozen[1]}")
                time.sleep(STALE_SETTLE_SECONDS)  # what it does next happens inside the window
                self._release(frozen[0])
            self.log.ended(window)

    def _crash_loop(self, step: Step) -> None:
        """A session made for it whose environment's registrations answer 503 for
        ``step.seconds``: codex exits at each refusal, so every start fails at once until then.
        The webhooks are held a moment while the fault is armed, so that no start comes first."""
        window = self.log.disturbed(step.describe())
        try:
            self.world.admin("POST", "/admin/webhooks/hold", {"seconds": 1.0}).raise_for_status()
            session = self.create(step.subject)
            refusal = {
                "target": "register",
                "status": 503,
                "seconds": step.seconds,
                "object_id": session.environment_id,
            }
            self.world.admin("POST", "/admin/faults", refusal).raise_for_status()
            self.log.add(
                "fault",
                f"registrations of {session.name}'s environment answer 503 for {step.seconds:.1f}s "
                "(codex exits at each refusal)",
            )
            self.give_input(session)
            time.sleep(step.seconds)
        finally:
            self.log.ended(window)
        self.log.add("restore", f"registrations of {step.subject}'s environment accepted again")

    def _wedged_link(self, step: Step) -> None:
        """The session's link down for ``step.seconds`` while its executor lives (wedged), its
        environment's reads answering 503 for ``WEDGED_FAILS_SECONDS`` of every
        ``WEDGED_EVERY_SECONDS`` meanwhile (from 1 s after the drop); the executors running at
        the drop must be gone ``WEDGED_BOUND_SECONDS`` after it (judged by the checker, 12)."""
        session = self._alive(step)
        if session is None:
            return
        assert self.judge is not None
        self._wait(lambda: bool(self._executors_of(session)) or session.ended_at is not None, LEADER_WAIT_SECONDS)
        wedged = sorted({p.sid for p in self._executors_of(session)})
        if not wedged:
            self.log.add("note", f"skipped {step.describe()}: {session.name} has no executor now")
            return
        window = self.log.disturbed(step.describe())
        try:
            answer = self.world.admin(
                "POST", f"/admin/environments/{session.environment_id}/drop", {"seconds": step.seconds}
            )
            dropped = time.time()
            closed = answer.json().get("closed") if answer.status_code == 200 else answer.status_code
            self.log.add(
                "fault",
                f"link of {session.name} down for {step.seconds:.1f}s, its executor {wedged} wedged (WebSockets "
                f"closed: {closed}); its environment's reads answer 503 for {WEDGED_FAILS_SECONDS:g}s of every "
                f"{WEDGED_EVERY_SECONDS:g}s",
            )
            judged = threading.Thread(
                target=self.judge.judge_wedged,
                args=(session, wedged, dropped, WEDGED_BOUND_SECONDS),
                name="chaos-wedged",
                daemon=True,
            )
            judged.start()
            failing = dropped + 1.0
            while failing + WEDGED_FAILS_SECONDS <= dropped + step.seconds:
                time.sleep(max(0.0, failing - time.time()))
                fault = {
                    "target": "retrieve_environment",
                    "status": 503,
                    "seconds": WEDGED_FAILS_SECONDS,
                    "object_id": session.environment_id,
                }
                self.world.admin("POST", "/admin/faults", fault).raise_for_status()
                failing += WEDGED_EVERY_SECONDS
            time.sleep(max(0.0, dropped + step.seconds - time.time()))
            judged.join(timeout=WEDGED_BOUND_SECONDS + 30)
        finally:
            self.log.ended(window)
        self.log.add("restore", f"link of {session.name} may come back")

    def _freeze_reader(self, session: Session, step: Step) -> tuple[str, int] | None:
        """SIGSTOP the worker pool process whose read of ``session`` the simulator holds; the
        worker's name and the pid, or None (said in the log) when it cannot be done."""
        found: list[dict[str, Any]] = []

        def held() -> bool:
            calls = self.world.admin("GET", "/admin/held").json()["data"]
            found[:] = [h for h in calls if h["object_id"] == session.id]
            return bool(found)

        if not self._wait(held, 15.0):
            self.log.add("note", f"skipped {step.describe()}: no read of {session.name} was held")
            return None
        host, _, port = str(found[0]["client"]).rpartition(":")
        pid = observe.socket_owner(host, int(port))
        owner = observe.parent(pid) if pid is not None else None
        worker = next((f"worker{i}" for i, w in enumerate(self.world.workers) if w.alive() and w.pid == owner), None)
        if pid is None or worker is None:
            self.log.add("note", f"skipped {step.describe()}: the read's caller ({found[0]['client']}) is no worker's")
            return None
        if not self._claim(worker, step):
            return None
        os.kill(pid, signal.SIGSTOP)
        return worker, pid

    def _connected(self, session: Session) -> bool:
        environments = self.world.admin("GET", "/admin/environments").json()["data"]
        return any(e["id"] == session.environment_id and e["status"] == "connected" for e in environments)

    # -- issue 37's sandboxes: suspensions, a cut checkpoint, a detached child ---------------------

    def _finished(self, session: Session, turn: Turn | None) -> bool:
        """Wait (bounded) until ``turn`` of ``session`` finished; False if it did not (or was not taken)."""
        if turn is None:
            return False

        def done() -> bool:
            found = {t["id"]: t for t in self.world.admin("GET", f"/admin/sessions/{session.id}/turns").json()["data"]}
            return bool(found.get(turn.id, {}).get("status") == "finished")

        return self._wait(done, TURN_WAIT_SECONDS)

    def _suspensions(self, session: Session) -> int:
        """How many times a worker logged the session's sandbox suspended (checkpointed)."""
        return self._logged(session, frozenset({"executor suspended"}))

    def _suspended(self, session: Session, times: int) -> bool:
        """Wait (bounded) until the session's sandbox went ``times`` times (suspended, or stopped
        when its checkpoint was refused or failed) and its executor is gone."""
        return self._wait(
            lambda: self._stops(session) >= times and not self._executors_of(session), SUSPEND_WAIT_SECONDS
        )

    def _suspend_cycles(self, step: Step) -> None:
        """A session made for it: its first turn starts a background process that keeps a token
        only in memory; then, ``step.value`` times, once its sandbox is suspended at the idle
        timeout (or stopped: a checkpoint refused, a start cut short), input at once, each turn
        asking that process for its token (13: the restores reconnect at once, the token is the
        same throughout unless a fallback was logged). Not a disturbance: this is how a session
        is used."""
        self._cycles(step, lineage=False)

    def _lifetime_cycles(self, step: Step) -> None:
        """The same cycles in a world with a maximum lifetime, across it: once the lineage of
        the session's first sandbox is past its lifetime, its sandbox is stopped or its restore
        refused, and a turn finds its background process gone (16). Not a disturbance either."""
        self._cycles(step, lineage=True)

    def _cycles(self, step: Step, lineage: bool) -> None:
        session = self.create(step.subject)
        cycles = int(step.value)
        if not self._finished(session, self.give_input(session, then=[KEEP_COMMAND])):
            self.log.add("note", f"{step.describe()}: {session.name}'s first turn did not finish: not carried out")
            return
        for cycle in range(1, cycles + 1):
            if not self._suspended(session, cycle):
                self.log.add(
                    "note", f"{step.describe()}: {session.name} not suspended a {cycle}th time: not carried further"
                )
                return
            turn = self.give_input(session, memory=not lineage, lineage=lineage)
            self.log.add("fault", f"{session.name} suspended ({cycle} of {cycles}): input at once (a restore)")
            if not self._finished(session, turn):
                self.log.add("note", f"{step.describe()}: {session.name}'s turn after suspension {cycle} unfinished")
                return

    def _corrupt_checkpoint(self, step: Step) -> None:
        """A session made for it, given input; once its sandbox is suspended, the largest pages
        image of its checkpoint cut to half its length (a disk that filled during the dump),
        then input: connected within ``FALLBACK_SECONDS`` (13, by a fresh start on its
        workspace: 4 judges the workspace at its final turn, 6 what the cut tree left)."""
        assert self.judge is not None
        session = self.create(step.subject)
        if not self._finished(session, self.give_input(session)) or not self._suspended(session, 1):
            self.log.add("note", f"{step.describe()}: {session.name} was not suspended: not carried out")
            return
        # The local runner's layout: sessions/<id (path-safe, 40 chars)>-<hash>/checkpoint.
        pages = sorted(
            (self.world.state_directory / "sessions").glob(f"{session.id[:40]}-*/checkpoint/pages-*.img"),
            key=lambda path: path.stat().st_size,
        )
        if not pages:
            if self._suspensions(session):
                self.errors.append(f"{step.describe()}: {session.name} was suspended, but no pages image is there")
            else:  # its checkpoint was refused or failed (logged, counted): a plain stop, nothing to cut
                self.log.add("note", f"{step.describe()}: {session.name} was stopped, not suspended: not carried out")
            return
        size = pages[-1].stat().st_size
        os.truncate(pages[-1], size // 2)
        self.log.add("fault", f"{session.name}'s checkpoint cut: {pages[-1].name} from {size} to {size // 2} bytes")
        asked = time.time()
        self.give_input(session)
        self.judge.judge_fallback(session, asked, FALLBACK_SECONDS)

    def _stops(self, session: Session) -> int:
        """How many times the session's sandbox went (``STOPPED``), by the workers' and the schedulers' logs."""
        return self._logged(session, STOPPED, schedulers=True)

    def _fill_volume(self, step: Step) -> None:
        """``step.value`` sessions made for it whose turns start a background process holding
        ``HOLD_MIB`` (an image larger than the cap); once their sandboxes are gone (suspended,
        or stopped with their image refused), a session made for it writes ``WRITE_MIB`` to its
        workspace on the same volume: the write must succeed (15)."""
        assert self.judge is not None
        holders = [self.create(f"{step.subject}h{index}") for index in range(int(step.value))]
        turns = [self.give_input(holder, then=[HOLD_COMMAND]) for holder in holders]
        if not all(self._finished(holder, turn) for holder, turn in zip(holders, turns, strict=True)):
            self.log.add("note", f"{step.describe()}: a holder's turn did not finish: not carried out")
            return
        gone = self._wait(
            lambda: all(self._stops(h) and not self._executors_of(h) for h in holders), SUSPEND_WAIT_SECONDS
        )
        if not gone:
            self.log.add("note", f"{step.describe()}: the holders' sandboxes were not gone: not carried out")
            return
        self.log.add("fault", f"{len(holders)} sessions holding {HOLD_MIB} MiB each gone idle: {WRITE_MIB} MiB written")
        writer = self.create(step.subject)
        turn = self.give_input(writer, then=[WRITE_COMMAND])
        if not self._finished(writer, turn):
            self.log.add("note", f"{step.describe()}: the writer's turn did not finish")
            return
        assert turn is not None
        self.judge.judge_write(writer, turn.id, WRITE_MIB)

    def _orphan_child(self, step: Step) -> None:
        """A session made for it whose turn starts a detached child (a session of its own);
        then SIGKILL of its executor's process group (an OOM kill) and input: the child must be
        gone ``ORPHAN_SECONDS`` after the kill (14)."""
        assert self.judge is not None
        session = self.create(step.subject)
        if not self._finished(session, self.give_input(session, then=[ORPHAN_COMMAND])):
            self.log.add("note", f"{step.describe()}: {session.name}'s turn did not finish: not carried out")
            return
        found = sorted((self.world.state_directory / "sessions").glob(f"{session.id[:40]}-*/workspace"))
        children = {
            pid: ticks
            for pid in observe.processes_in(found[0] if found else Path("/nonexistent"), ["sleep", "3600"])
            if (ticks := observe.start_ticks(pid)) is not None
        }
        sids = sorted({p.sid for p in self._executors_of(session)})
        if not children or not sids:
            self.errors.append(f"{step.describe()}: no detached child ({children}) or no executor ({sids}) to kill")
            return
        window = self.log.disturbed(step.describe())
        killed = time.time()
        self._sigkill(session, sids, killed)
        self.log.ended(window)
        self.log.add(
            "fault",
            f"SIGKILL of {session.name}'s executor (session {sids}), its detached child {sorted(children)} running; "
            "input given",
        )
        self.give_input(session)
        self.judge.judge_orphans(session, children, killed, ORPHAN_SECONDS)

    def _sigkill(self, session: Session, sids: list[int], at: float, leader_only: bool = False) -> None:
        """SIGKILL the executor process sessions ``sids`` of ``session`` (each its process group,
        or with ``leader_only`` its leader alone: the npm launcher, the native codex living on),
        booked as the chaos's kills at ``at`` (so their end is blamed on nobody)."""
        for sid in sids:
            self.book.kill(session.environment_id, sid, at)
            try:
                if leader_only:
                    os.kill(sid, signal.SIGKILL)
                else:
                    os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _executors_of(self, session: Session) -> list[observe.Process]:
        processes = observe.executor_processes(self.world.simulator_url)
        return [p for p in processes if p.environment_id == session.environment_id]

    def _link_drop(self, step: Step) -> None:
        session = self._alive(step)
        if session is None:
            return
        window = self.log.disturbed(step.describe())
        answer = self.world.admin(
            "POST", f"/admin/environments/{session.environment_id}/drop", {"seconds": step.seconds}
        )
        closed = answer.json().get("closed") if answer.status_code == 200 else answer.status_code
        self.log.add("fault", f"link of {session.name} down for {step.seconds:.1f}s (WebSockets closed: {closed})")
        time.sleep(step.seconds)
        self.log.ended(window)
        self.log.add("restore", f"link of {session.name} may come back")

    def _kill_executor(self, step: Step) -> None:
        session = self.book.get(step.subject)
        if session is None:
            return
        if step.value == "leader":  # given input just before: wait (bounded) for its executor
            self._wait(lambda: bool(self._executors_of(session)) or session.ended_at is not None, LEADER_WAIT_SECONDS)
        sids = sorted({p.sid for p in self._executors_of(session)})
        if not sids:
            self.log.add("note", f"{step.describe()}: {session.name} has no executor now")
            return
        window = self.log.disturbed(step.describe())
        self._sigkill(session, sids, time.time(), leader_only=step.value == "leader")
        self.log.ended(window)
        what = "its leader" if step.value == "leader" else "its whole process group"
        self.log.add("fault", f"SIGKILL of {session.name}'s executor (session {sids}): {what}")

    def _kill(self, step: Step) -> None:
        name = step.subject
        if not self._claim(name, step):
            return
        try:
            window = self.log.disturbed(step.describe())
            self.world.process(name).kill(signal.SIGKILL)
            self.log.add("fault", f"SIGKILL of {name}; back in {step.seconds:.1f}s")
            time.sleep(step.seconds)
            self.world.restart(name)
            self.log.ended(window)
            self.log.add("restore", f"{name} started again and ready")
        finally:
            self._release(name)

    def _redis_kill(self, step: Step) -> None:
        if not self._claim("redis", step):
            return
        try:
            window = self.log.disturbed(step.describe())
            process = self.world.redis.process
            assert process is not None
            process.kill(signal.SIGKILL)
            self.log.add("fault", f"SIGKILL of redis-server; restarted from its AOF in {step.seconds:.1f}s")
            time.sleep(step.seconds)
            self.world.redis.start()
            self.log.ended(window)
            self.log.add("restore", "redis-server answers again")
        finally:
            self._release("redis")

    def _redis_pause(self, step: Step) -> None:
        if not self._claim("redis", step):
            return
        try:
            process = self.world.redis.process
            assert process is not None
            window = self.log.disturbed(step.describe())
            os.kill(process.pid, signal.SIGSTOP)
            self.log.add("fault", f"SIGSTOP of redis-server for {step.seconds:.1f}s")
            try:
                time.sleep(step.seconds)
            finally:
                os.kill(process.pid, signal.SIGCONT)
            self.log.ended(window)
            self.log.add("restore", "SIGCONT of redis-server")
        finally:
            self._release("redis")

    def _role_flip(self, step: Step) -> None:
        """A failover and back, as Sentinel would do it while clients keep the old address: the
        replica is promoted and the primary made its replica (read-only, ``READONLY`` errors)
        for ``step.seconds``; then the primary is promoted again and the replica follows it.
        What the primary had acknowledged but not yet replicated is lost, as in a real failover."""
        replica = self.world.replica
        if replica is None:
            self.errors.append("role-flip drawn without a replica (the world was built without role flips)")
            return
        if not self._claim("redis", step):
            return
        primary = redis.Redis(port=self.world.redis.port, socket_timeout=5)
        standby = redis.Redis(port=replica.port, socket_timeout=5)
        try:
            window = self.log.disturbed(step.describe())
            standby.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
            primary.execute_command("REPLICAOF", "127.0.0.1", str(replica.port))  # type: ignore[no-untyped-call]
            self.log.add("fault", f"redis-server is a replica of 127.0.0.1:{replica.port} for {step.seconds:.1f}s")
            try:
                time.sleep(step.seconds)
            finally:
                primary.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
                standby.execute_command("REPLICAOF", "127.0.0.1", str(self.world.redis.port))  # type: ignore[no-untyped-call]
            self.log.ended(window)
            self.log.add("restore", "redis-server is a primary again (REPLICAOF NO ONE); the replica follows it")
        finally:
            primary.close()
            standby.close()
            self._release("redis")

    def _skew(self, step: Step) -> None:
        name = step.subject
        if not self.can_skew:
            self.log.add("note", f"skipped {step.describe()}: no C compiler to build the clock shim")
            return
        if not self._claim(name, step):
            return
        offset = int(step.value)
        try:
            window = self.log.disturbed(f"restart of {name} with its clock {offset:+d}s")
            self.world.process(name).stop()
            size = self.world.log_size(name)
            started = time.time()
            self.world.restart(name, faketime.skewed(offset))
            ready = time.time()
            self.log.ended(window)
            # Its first log line was written between its start and its being ready: its clock's
            # offset lies between the line's time minus each of those.
            stamp = self.world.first_log_time_after(name, size)
            low, high = (stamp - ready, stamp - started) if stamp is not None else (None, None)
            says = "no time" if low is None or high is None else f"{low:+.1f}s to {high:+.1f}s"
            self.log.add(
                "fault",
                f"{name} runs with its clock {offset:+d}s for {step.seconds:.1f}s (its first log line says {says})",
            )
            if (
                low is None
                or high is None
                or not low - SKEW_TOLERANCE_SECONDS <= offset <= high + SKEW_TOLERANCE_SECONDS
            ):
                self.errors.append(f"{name}'s clock did not move by {offset:+d}s (its first log line says {says})")
            time.sleep(step.seconds)
            window = self.log.disturbed(f"restart of {name} with the true time")
            self.world.process(name).stop()
            self.world.restart(name)
            self.log.ended(window)
            self.log.add("restore", f"{name} runs with the true time again")
        finally:
            self._release(name)

    def _duplicate(self, step: Step) -> None:
        session = self.book.get(step.subject)
        if session is None:
            return
        events = self.world.admin("GET", "/admin/events").json()["data"]
        mine = [e for e in events if e["data"].get("id") == session.id][-int(step.value) :]
        for event in mine:
            self.world.admin("POST", f"/admin/webhooks/resend/{event['id']}").raise_for_status()
        window = self.log.disturbed(step.describe())
        self.log.ended(window)
        kinds = ", ".join(e["type"].removeprefix("agent.session.") for e in mine)
        self.log.add("fault", f"{session.name}'s latest events delivered again, same webhook-id: {kinds or 'none'}")

    def _hold(self, step: Step) -> None:
        window = self.log.disturbed(step.describe())
        seed = zlib.crc32(f"{step.at}:{step.describe()}".encode())  # the same for the same schedule
        self.world.admin(
            "POST", "/admin/webhooks/hold", {"seconds": step.seconds, "order": step.value, "seed": seed}
        ).raise_for_status()
        self.log.add("fault", f"deliveries held for {step.seconds:.1f}s, then sent {step.value}")
        time.sleep(step.seconds + 1.0)  # the held ones go out one by one after the hold
        self.log.ended(window)
        self.log.add("restore", "held deliveries sent")
