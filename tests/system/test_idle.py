"""Idle shutdown with real parts on loopback: receivers, Celery workers, the scheduler (two of
them, one standing by), redis-server with its append-only file, the simulator and the real
codex executor. The idle timeout is a few seconds so that a "day" fits in a test.

Tests run in file order and share one world. FIGURE lines are printed for RELIABILITY.md.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.runners.local.procfs import proc_stat
from tests.support.codex import codex_binary
from tests.support.processes import Managed, python_module, wait_for
from tests.support.simulator import run_turn
from tests.system.loop import Loop, stops, wait_idle, workspace_of

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

TIMEOUT = 3  # CONTROLLER_IDLE_TIMEOUT_SECONDS in this world
SESSIONS = int(os.environ.get("IDLE_RACE_SESSIONS", "10"))
ROUNDS = int(os.environ.get("IDLE_RACE_ROUNDS", "10"))
STANDBY: list[Managed] = []  # the second scheduler of the module's world


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    world = Loop(
        tmp_path_factory.mktemp("idle"),
        codex_binary(),
        extra_env={"CONTROLLER_IDLE_TIMEOUT_SECONDS": str(TIMEOUT)},
    )
    standby: Managed | None = None
    try:
        world.start()
        standby = Managed(
            "scheduler-standby",
            python_module("controller", "scheduler"),
            {
                **world.controller_env(),
                "CONTROLLER_RECONCILE_INTERVAL_SECONDS": "3",
            },
            world.directory / "scheduler-standby.log",
        ).start()
        STANDBY[:] = [standby]
        yield world
    finally:
        if standby is not None:
            standby.stop()
        world.stop()


# -- helpers --------------------------------------------------------------------------------------


def starts(loop: Loop, session_id: str) -> list[dict[str, Any]]:
    return loop.worker_lines("executor process started", session_id)


def executors_in(workspace: Path) -> int:
    """Distinct executors (process sessions) with a process working in this workspace."""
    sids = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
        except OSError:
            continue
        if cwd == str(workspace):
            found = proc_stat(int(entry.name))
            if found is not None and found.running:
                sids.add(found.sid)
    return len(sids)


class Watch:
    """Samples, in the background, how many executors each session has at once (processes in
    its workspace, and open WebSockets at the simulator): the most ever seen must stay 1."""

    def __init__(self, loop: Loop, session_ids: list[str]) -> None:
        self.loop = loop
        self.workspaces = {sid: workspace_of(loop, sid) for sid in session_ids}
        self.most_processes: dict[str, int] = defaultdict(int)
        self.most_connections: dict[str, int] = defaultdict(int)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for sid, workspace in self.workspaces.items():
                self.most_processes[sid] = max(self.most_processes[sid], executors_in(workspace))
            try:
                listing = httpx.get(f"{self.loop.simulator_url}/admin/environments", timeout=10).json()["data"]
            except httpx.HTTPError:
                continue
            for environment in listing:
                sid = environment.get("session_id")
                if sid in self.workspaces:
                    self.most_connections[sid] = max(self.most_connections[sid], environment["open_connections"])
            self.samples += 1


# -- the tests ------------------------------------------------------------------------------------


def test_an_idle_session_is_stopped_after_the_timeout_and_keeps_its_workspace(loop: Loop) -> None:
    """L11/L16: after its turn the session goes idle; its timer stops the executor once
    ``last_active_at + timeout`` has passed (logged once, with last_active_at and the timeout);
    the workspace and the stopped mapping stay."""
    with loop.api() as client:
        session = loop.create_session(client)
    sid = session["id"]
    idle = wait_idle(loop, sid)
    wait_for(lambda: loop.live_executors()[sid] == 0, 60, "the idle executor to be stopped")
    [stop] = wait_for(lambda: stops(loop, sid), 30, "the stop to be logged")
    assert stop["cause"] == "idle" and stop["idle_timeout_seconds"] == TIMEOUT
    assert stop["last_active_at"] == idle["last_active_at"]
    assert workspace_of(loop, sid).is_dir()
    print(f"\nFIGURE idle stop, one session: {lateness(loop, [sid])[0]:.2f}s after its deadline")
    assert loop.redis.client().hget(f"sc:rec:{sid}", "stopped_at")


def test_stop_then_a_new_connection_finds_the_file_written_before_the_stop(loop: Loop) -> None:
    """L16: a file written into the workspace (as the executor would) survives the idle stop;
    the next input's environment_connection starts a new executor on the same workspace."""
    with loop.api() as client:
        session = loop.create_session(client)
    sid = session["id"]
    wait_idle(loop, sid)
    workspace = workspace_of(loop, sid)
    (workspace / "notes.txt").write_text("written before the stop\n")
    wait_for(lambda: stops(loop, sid), 60, "the idle stop")
    wait_for(lambda: loop.live_executors()[sid] == 0, 30, "the executor to be gone")
    loop.submit(sid)
    wait_for(lambda: len(starts(loop, sid)) == 2, 90, "a new executor to start")
    wait_for(lambda: loop.live_executors()[sid] == 1, 30, "the new executor to run")
    assert (workspace / "notes.txt").read_text() == "written before the stop\n"
    assert executors_in(workspace) == 1  # the new executor works in that same directory
    wait_idle(loop, sid)


def test_a_file_written_by_a_command_in_turn_1_is_read_in_turn_2_after_an_idle_stop(loop: Loop) -> None:
    """L11, L16 (issue 12): turn 1's command, run by the simulator over the executor's link,
    writes a file in the workspace; the session goes idle and its timer stops the executor
    (cause idle); turn 2's input asks for a connection, a new executor starts on the same
    workspace, and turn 2's command reads the file."""
    with loop.api() as client:
        session = loop.create_session(client, input_text=None)
    sid, environment_id = session["id"], session["environment"]["id"]
    first = run_turn(loop.simulator_url, sid, [["sh", "-c", "echo kept > notes.txt"]])
    [write] = first["commands"]
    assert (write["status"], write["exit_code"]) == ("completed", 0), write
    assert write["cwd"] == str(workspace_of(loop, sid))

    wait_idle(loop, sid)
    [stop] = wait_for(lambda: stops(loop, sid), 60, "the idle stop")
    assert stop["cause"] == "idle"
    wait_for(lambda: loop.live_executors()[sid] == 0, 30, "the executor to be gone")
    wait_for(lambda: loop.environment_status(environment_id) == "disconnected", 30, "the link to drop")
    assert len(starts(loop, sid)) == 1

    second = run_turn(loop.simulator_url, sid, [["cat", "notes.txt"]])
    [read] = second["commands"]
    assert (read["status"], read["stdout"], read["exit_code"]) == ("completed", "kept\n", 0), read
    assert read["cwd"] == write["cwd"]
    assert len(starts(loop, sid)) == 2  # a new executor served turn 2
    registered = [r for r in loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200]
    assert len(registered) == 2
    wait_idle(loop, sid)


def test_idle_event_after_the_connection_was_resolved_stops_nothing(loop: Loop) -> None:
    """L13: an idle event can arrive after a new input's connection request was resolved but
    before (or while) its turn runs. Here the previous turn's idle event is delivered again and
    again while the new input is taken up: the worker re-reads a session that is at work (or
    freshly active) and stops nothing; the only stop comes a full timeout after the last turn."""
    with loop.api() as client:
        session = loop.create_session(client)
    sid = session["id"]
    wait_idle(loop, sid)
    time.sleep(TIMEOUT - 1.5)  # the previous turn is nearly a timeout old
    loop.submit(sid)
    second_input = time.time()
    for _ in range(8):  # late idle events of the previous turn, through the real receivers
        headers, body = loop.delivery(sid, event_type="agent.session.idle")
        assert loop.post(loop.receiver_ports[0], headers, body).status_code == 200
        time.sleep(0.25)
    wait_idle(loop, sid)
    wait_for(lambda: stops(loop, sid), 60, "the stop a timeout after the last turn")
    time.sleep(2)
    [stop] = stops(loop, sid)
    assert stop["last_active_at"] >= int(second_input)  # decided on the newest activity, not the stale event
    assert len(starts(loop, sid)) == 1  # the executor served both turns: nothing stopped in between


def test_idle_timer_racing_new_input(loop: Loop) -> None:
    """L12/L15: the idle timer falls due at (randomly) about the same moment as new input
    arrives, ``SESSIONS x ROUNDS`` times: no input fails, no session ever has two executors,
    and every connection comes well inside the five-minute window (the worst is printed)."""
    with loop.api() as client:
        sessions = [loop.create_session(client)["id"] for _ in range(SESSIONS)]
    for sid in sessions:
        wait_idle(loop, sid, timeout=240)
    results: list[tuple[str, float, bool]] = []  # (session, seconds to connected, restarted)
    failures: list[str] = []
    lock = threading.Lock()

    def rounds(sid: str) -> None:
        rng = random.Random(sid)
        for _ in range(ROUNDS):
            idle = wait_idle(loop, sid, timeout=240)
            record = loop.redis.client().hgetall(f"sc:rec:{sid}")
            started = float(record["started_at"]) if record and not record.get("stopped_at") else 0.0
            due = max(float(idle["last_active_at"]), started) + TIMEOUT
            time.sleep(max(0.0, due + rng.uniform(-1.0, 1.0) - time.time()))
            sent = time.monotonic()
            loop.submit(sid)
            restarted, connected = False, None
            deadline = sent + 300
            while time.monotonic() < deadline:
                status = loop.session(sid)["status"]
                if status == "failed":
                    with lock:
                        failures.append(sid)
                    return
                restarted = restarted or status == "requires_action"
                if connected is None and status in ("in_progress", "idle"):
                    connected = time.monotonic() - sent
                if status == "idle":
                    break
                time.sleep(0.1)
            else:
                with lock:
                    failures.append(sid)
                return
            assert connected is not None
            with lock:
                results.append((sid, connected, restarted))

    with Watch(loop, sessions) as watch, ThreadPoolExecutor(max_workers=SESSIONS) as pool:
        list(pool.map(rounds, sessions))
    assert failures == []
    assert len(results) == SESSIONS * ROUNDS
    assert watch.samples > 0
    assert max(watch.most_processes.values()) <= 1, dict(watch.most_processes)
    assert max(watch.most_connections.values(), default=0) <= 1, dict(watch.most_connections)
    assert all(loop.session(sid)["status"] != "failed" for sid in sessions)
    times = sorted(seconds for _, seconds, _ in results)
    restarted = sum(1 for *_, r in results if r)
    print(
        f"\nFIGURE idle race: {len(results)} trials ({SESSIONS} sessions x {ROUNDS}), 0 inputs failed, "
        f"0 sessions with two executors; {restarted} inputs found the sandbox stopped and got a new one, "
        f"{len(results) - restarted} found it running; input→connected p50 {statistics.median(times):.2f}s, "
        f"worst {times[-1]:.2f}s"
    )


def _timer_sessions(loop: Loop, count: int) -> list[str]:
    """Sessions whose executors are running and whose idle timers are armed."""
    with loop.api() as client:
        sessions = [loop.create_session(client)["id"] for _ in range(count)]
    for sid in sessions:
        wait_idle(loop, sid, timeout=240)
    return sessions


def lateness(loop: Loop, sessions: list[str]) -> list[float]:
    """Seconds from each idle deadline (as the controller computes it) to the stop it logged."""
    late = []
    for sid in sessions:
        [stop] = stops(loop, sid)
        deadline = max(float(stop["last_active_at"]), float(stop["started_at"])) + TIMEOUT
        late.append(float(stop["time"]) - deadline)
    return late


def leader(loop: Loop) -> Managed:
    """The scheduler process that says it leads (the other stands by)."""
    candidates = [p for p in [loop.scheduler, *STANDBY] if p is not None and p.alive()]
    leading = [p for p in candidates if "leading: sweeping" in p.output()]
    assert len(leading) == 1, [p.name for p in leading]
    return leading[0]


def test_timers_fire_once_after_the_scheduler_is_killed(loop: Loop) -> None:
    """Durable timers: the active scheduler is SIGKILLed while idle timers are pending; the
    standby takes over once the lease (3 s) has lapsed, and every timer fires once:
    each executor is stopped, exactly once."""
    sessions = _timer_sessions(loop, 4)
    active = leader(loop)
    active.kill()  # SIGKILL: no clean hand-over
    for sid in sessions:
        wait_for(lambda sid=sid: loop.live_executors()[sid] == 0, 60, "the standby's timers to stop the executor")
    time.sleep(2 * TIMEOUT)
    assert all(len(stops(loop, sid)) == 1 for sid in sessions), {sid: len(stops(loop, sid)) for sid in sessions}
    late = lateness(loop, sessions)
    print(
        f"\nFIGURE scheduler SIGKILL with {len(sessions)} timers pending: each fired once; "
        f"late by at most {max(late):.2f}s"
    )
    active.start()  # back, as the standby now


def test_timers_fire_once_after_redis_restarts_from_its_append_only_file(loop: Loop) -> None:
    """Durable timers: Redis is killed (SIGKILL) and restarted from its AOF while idle timers are
    pending; every timer still fires once (each executor stopped exactly once)."""
    sessions = _timer_sessions(loop, 4)
    assert loop.redis.process is not None
    loop.redis.process.kill()
    time.sleep(1)
    loop.redis.start()
    for sid in sessions:
        wait_for(lambda sid=sid: loop.live_executors()[sid] == 0, 90, "the timers to stop the executor")
    time.sleep(2 * TIMEOUT)
    assert all(len(stops(loop, sid)) == 1 for sid in sessions), {sid: len(stops(loop, sid)) for sid in sessions}
    for sid in sessions:
        assert loop.redis.client().hget(f"sc:rec:{sid}", "stopped_at")
    late = lateness(loop, sessions)
    print(
        f"\nFIGURE redis SIGKILL + AOF restart with {len(sessions)} timers pending: each fired once; "
        f"late by at most {max(late):.2f}s"
    )
