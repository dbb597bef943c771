"""The chaos checker's judgement on made-up observations (``tests/chaos/checker.py``): each
invariant is seen broken when it is, and not when the rules allow what happened. The judge
must not be the controller's code: its modules import none of it."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import observe
from tests.chaos.book import Book, Session, Turn
from tests.chaos.checker import STALE_START_SECONDS, Checker, Violation
from tests.chaos.eventlog import EventLog, Window
from tests.chaos.run import require_codex, teardown

T0 = 1_000_000.0
GRACE = 10.0
IDLE = 20.0


class FakeSimulator:
    base_url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.summaries: dict[str, dict[str, Any]] = {}
        self.links: dict[str, list[list[float | None]]] = {}
        self.histories: dict[str, list[dict[str, Any]]] = {}
        self.turn_log: dict[str, list[dict[str, Any]]] = {}
        self.registration_log: list[dict[str, Any]] = []
        self.delivery_log: list[dict[str, Any]] = []
        self.event_log: dict[str, dict[str, Any]] = {}

    def sessions(self) -> dict[str, dict[str, Any]]:
        return self.summaries

    def environments(self) -> dict[str, dict[str, Any]]:
        return {
            env: {"id": env, "links": links, "open_connections": 1 if links and links[-1][1] is None else 0}
            for env, links in self.links.items()
        }

    def history(self, session_id: str) -> list[dict[str, Any]]:
        return self.histories.get(session_id, [])

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        return self.turn_log.get(session_id, [])

    def registrations(self, environment_id: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.registration_log if environment_id in (None, r["environment_id"])]

    def deliveries(self, event_type: str) -> list[dict[str, Any]]:
        return self.delivery_log

    def events(self) -> dict[str, dict[str, Any]]:
        return self.event_log

    # -- building the story -------------------------------------------------------------------

    def session(self, book: Book, name: str, changes: list[tuple[float, str, bool]]) -> Session:
        session = Session(name, f"sess_{name}", f"env_{name}", T0)
        book.add(session)
        self.histories[session.id] = [{"at": T0 + at, "status": s, "wants_connection": w} for at, s, w in changes]
        at, status, wants = changes[-1]
        self.summaries[session.id] = {
            "id": session.id,
            "status": status,
            "wants_connection": wants,
            "environment_id": session.environment_id,
            "since": T0 + at,
        }
        self.links[session.environment_id] = []
        return session

    def acknowledged_request(self, session: Session) -> None:
        """The webhook of ``session``'s connection request, delivered and acknowledged (200) at 1.2."""
        event = f"evt_{session.name}"
        self.event_log[event] = {
            "id": event,
            "data": {"id": session.id, "required_action": {"type": "environment_connection"}},
        }
        self.delivery_log.append(
            {
                "id": f"dlv_{session.name}",
                "event_id": event,
                "attempts": [{"status_code": 200, "started_at": T0 + 1.2, "duration_seconds": 0.01}],
            }
        )


class World:
    """A checker on a fake simulator, a fake /proc and a clock the test moves."""

    def __init__(self, max_lifetime: float | None = None, controller_logs: list[Path] | None = None) -> None:
        self.now = T0
        self.sim = FakeSimulator()
        self.book = Book()
        self.log = EventLog(t0=T0)
        self.processes: dict[str, dict[int, list[int]]] = {}
        self.checker = Checker(
            self.sim,
            self.book,
            self.log,
            grace_seconds=GRACE,
            idle_timeout_seconds=IDLE,
            prestart_budget=2,
            scan=lambda: {env: dict(groups) for env, groups in self.processes.items() if groups},
            clock=lambda: self.now,
            max_lifetime_seconds=max_lifetime,
            controller_logs=lambda: list(controller_logs or []),
        )

    def at(self, seconds: float) -> None:
        """Move the clock to ``T0 + seconds`` and take a sample."""
        self.now = T0 + seconds
        self.checker.sample()

    def run(self, env: str, sid: int | None) -> None:
        self.processes[env] = {sid: [sid]} if sid is not None else {}

    def violations(self, invariant: int | None = None) -> list[Violation]:
        return [v for v in self.checker.violations if invariant is None or v.invariant == invariant]


def _busy_session_with_a_link_drop(world: World, down_for: float) -> Session:
    """s0 asks at 0, connects at 1 and runs a turn; its link drops at 30 (it asks again);
    the controller replaces its executor ``down_for`` seconds later."""
    session = world.sim.session(
        world.book,
        "s0",
        [(0, "idle", False), (0.1, "requires_action", True), (1, "in_progress", False), (30, "requires_action", True)],
    )
    world.sim.links[session.environment_id] = [[T0 + 1, T0 + 30]]
    world.run(session.environment_id, 100)
    world.at(0.5)
    world.at(29.8)
    world.at(30 + down_for - 0.2)
    world.run(session.environment_id, 200)
    world.at(30 + down_for + 0.3)
    return session


def test_a_short_link_drop_that_gets_a_busy_executor_replaced_breaks_3() -> None:
    world = World()
    _busy_session_with_a_link_drop(world, down_for=1.5)
    [found] = world.violations()
    assert found.invariant == 3 and "replaced by executor 200" in found.text and "link down for 1.8s" in found.text


def test_a_replacement_for_input_after_a_short_drop_while_idle_breaks_3_not_7() -> None:
    """Idle since 3, the link drops at 10, input at 12.1 asks for a connection and the
    executor is replaced at once: judged by the session's state when it was found gone."""
    world = World()
    session = world.sim.session(
        world.book,
        "s0",
        [(0, "idle", False), (1, "in_progress", False), (3, "idle", False), (12.1, "requires_action", True)],
    )
    world.sim.links[session.environment_id] = [[T0 + 1, T0 + 10]]
    world.run(session.environment_id, 100)
    world.at(2)
    world.at(11.9)
    world.run(session.environment_id, 200)
    world.at(12.4)
    [found] = world.violations()
    assert found.invariant == 3 and "link down for 2.4s" in found.text


def test_a_replacement_after_the_grace_is_allowed() -> None:
    world = World()
    _busy_session_with_a_link_drop(world, down_for=GRACE + 1)
    assert world.violations() == []


def test_a_replacement_decided_before_the_link_came_back_is_judged_by_the_outage() -> None:
    """Down from 30 to 41.5 (past the grace), back at 41.5, replaced at 42: the decision saw
    the outage. Back at 36 after 6 s down and replaced at 42: a live executor replaced."""
    for back, broken in ((41.5, False), (36.0, True)):
        world = World()
        session = world.sim.session(
            world.book,
            "s0",
            [
                (0, "idle", False),
                (0.1, "requires_action", True),
                (1, "in_progress", False),
                (30, "requires_action", True),
                (back, "in_progress", False),
            ],
        )
        world.sim.links[session.environment_id] = [[T0 + 1, T0 + 30], [T0 + back, None]]
        world.run(session.environment_id, 100)
        world.at(0.5)
        world.at(41.8)
        world.run(session.environment_id, 200)
        world.at(42.2)
        assert [v.invariant for v in world.violations()] == ([3] if broken else [])


def test_an_idle_stop_that_was_due_and_met_new_input_is_not_a_replacement() -> None:
    """L12's residual race: idle for the timeout, the stop takes the executor's link down, input
    lands (the session asks, then a new executor connects and the turn starts): not 3. The same
    with an idle stretch shorter than the timeout is a busy executor stopped: 3."""
    for idle_for, broken in ((IDLE - 0.1, False), (IDLE - 5, True)):
        world = World()
        start = 3 + idle_for
        session = world.sim.session(
            world.book,
            "s0",
            [
                (0, "idle", False),
                (1, "in_progress", False),
                (3, "idle", False),
                (start, "requires_action", True),
                (start + 0.3, "in_progress", False),
            ],
        )
        world.sim.links[session.environment_id] = [[T0 + 1, T0 + start - 0.1], [T0 + start + 0.3, None]]
        world.run(session.environment_id, 100)
        world.at(2)
        world.at(start - 0.2)
        world.run(session.environment_id, 200)
        world.at(start + 0.5)
        assert [v.invariant for v in world.violations()] == ([3] if broken else [])


def test_an_executor_the_chaos_killed_may_be_replaced_at_once() -> None:
    world = World()
    world.book.kill("env_s0", 100, T0 + 30)
    _busy_session_with_a_link_drop(world, down_for=0.5)
    assert world.violations() == []


def test_a_drop_that_came_back_briefly_still_counts_from_its_start() -> None:
    """Up for 0.5 s in the middle of a long outage: nothing is bound to have seen it."""
    assert observe.down_since([[1.0, 30.0], [35.0, 35.5]], 45.0) == 30.0
    assert observe.down_since([[1.0, 30.0], [35.0, 40.0]], 45.0) == 40.0
    assert observe.down_since([[1.0, None]], 45.0) is None
    assert observe.down_since([], 45.0) == float("-inf")


def _idle_stop_at(world: World, stop_after: float) -> Session:
    """s0 busy from 1, idle from 3; its executor found gone ``stop_after`` seconds after that."""
    session = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "in_progress", False), (3, "idle", False)])
    world.run(session.environment_id, 100)
    world.at(2)
    world.at(3 + stop_after - 0.3)
    world.run(session.environment_id, None)
    world.at(3 + stop_after + 0.2)
    world.at(3 + stop_after + 11)
    return session


def test_an_idle_stop_before_the_timeout_breaks_7_and_one_after_it_does_not() -> None:
    for stop_after, broken in ((5.0, True), (IDLE + 0.5, False)):
        world = World()
        _idle_stop_at(world, stop_after)
        assert [v.invariant for v in world.violations()] == ([7] if broken else [])


def test_an_idle_executor_left_running_long_after_the_timeout_breaks_7_unless_something_disturbed_it() -> None:
    for disturbed, broken in ((False, True), (True, False)):
        world = World()
        session = world.sim.session(
            world.book, "s0", [(0, "idle", False), (1, "in_progress", False), (3, "idle", False)]
        )
        if disturbed:
            world.log.windows.append(Window("redis-kill", T0 + 25, T0 + 27))
        world.run(session.environment_id, 100)
        world.at(3 + IDLE + 16)
        assert [v.invariant for v in world.violations()] == ([7] if broken else [])


def test_two_executors_of_one_session_break_1() -> None:
    world = World()
    session = world.sim.session(world.book, "s0", [(0, "idle", False)])
    world.processes[session.environment_id] = {100: [100, 101], 200: [200]}
    world.at(1)
    [found] = world.violations()
    assert found.invariant == 1 and "2 executors at once" in found.text


def test_an_unanswered_request_breaks_2_only_30_s_after_the_faults_ended() -> None:
    world = World()
    world.sim.session(world.book, "s0", [(0, "idle", False), (1, "requires_action", True)])
    world.log.windows.append(Window("api-fault", T0 + 5, T0 + 20))
    world.at(10)  # a fault lasts
    world.at(45)  # 25 s after it ended
    assert world.violations() == []
    world.at(51)
    [found] = world.violations()
    assert found.invariant == 2


def test_a_token_missing_from_a_later_command_breaks_4() -> None:
    world = World()
    session = world.sim.session(world.book, "s0", [(0, "idle", False)])
    session.turns = [Turn("turn_1", "s0-t1", T0), Turn("turn_2", "s0-t2", T0 + 10), Turn("turn_3", "s0-final", T0 + 20)]

    def command(started: float, stdout: str) -> dict[str, Any]:
        command = {"status": "completed", "exit_code": 0, "started_at": T0 + started, "finished_at": T0 + started + 1}
        return {"commands": [{**command, "stdout": stdout}]}

    world.sim.turn_log[session.id] = [
        {"id": "turn_1", **command(1, "")},
        {"id": "turn_2", **command(11, "s0-t1\n")},
        {"id": "turn_3", **command(21, "s0-t2\n")},  # a new, empty workspace got only t2
    ]
    assert world.checker.check_markers() == 3
    [found] = world.violations()
    assert found.invariant == 4 and "without s0-t1" in found.text


def test_markers_count_until_the_session_fails_and_a_deleted_one_is_checked_before_its_deletion() -> None:
    """After a failure the workspace may go; a deleted session's turns are read just before
    the deletion (the API forgets them) and a missing token then breaks 4 all the same."""
    world = World()
    failed = world.sim.session(world.book, "s0", [(0, "idle", False), (30, "failed", False)])
    failed.failed_at = T0 + 30
    failed.turns = [Turn("turn_1", "s0-t1", T0), Turn("turn_2", "s0-t2", T0 + 40)]
    world.sim.turn_log[failed.id] = [
        {"id": "turn_1", "commands": [_command(1, "")]},
        {"id": "turn_2", "commands": [_command(41, "")]},  # after the failure: not judged
    ]
    assert world.checker.check_markers() == 1
    deleted = world.sim.session(world.book, "s1", [(0, "idle", False)])
    deleted.turns = [Turn("turn_3", "s1-t3", T0), Turn("turn_4", "s1-t4", T0 + 10)]
    world.sim.turn_log[deleted.id] = [
        {"id": "turn_3", "commands": [_command(1, "")]},
        {"id": "turn_4", "commands": [_command(11, "")]},
    ]
    world.checker.before_deletion(deleted)
    deleted.deleted_at = T0 + 20
    world.sim.turn_log.pop(deleted.id)
    assert world.checker.check_markers() == 1 + 2
    [found] = world.violations()
    assert found.invariant == 4 and found.subject.startswith("s1") and "without s1-t3" in found.text


def _command(started: float, stdout: str) -> dict[str, Any]:
    return {
        "status": "completed",
        "exit_code": 0,
        "started_at": T0 + started,
        "finished_at": T0 + started + 1,
        "stdout": stdout,
    }


def test_an_acknowledged_request_that_never_got_its_executor_breaks_5() -> None:
    world = World()
    asking = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "requires_action", True)])
    served = world.sim.session(
        world.book, "s1", [(0, "idle", False), (1, "requires_action", True), (2, "in_progress", False)]
    )
    for session in (asking, served):
        world.sim.acknowledged_request(session)
    assert world.checker.check_deliveries() == 2
    [found] = world.violations()
    assert found.invariant == 5 and found.subject.startswith("s0")


def test_an_acknowledged_request_of_a_session_deleted_or_failed_later_is_judged_too() -> None:
    """5: a session that asked, was acknowledged, never got its executor and was deleted (or
    failed) 40 s later breaks 5; one deleted 10 s after asking, or served before its deletion,
    does not."""
    world = World()
    lost = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "requires_action", True)])
    lost.deleted_at = T0 + 41
    failed = world.sim.session(
        world.book, "s1", [(0, "idle", False), (1, "requires_action", True), (41, "failed", False)]
    )
    soon = world.sim.session(world.book, "s2", [(0, "idle", False), (1, "requires_action", True)])
    soon.deleted_at = T0 + 11
    served = world.sim.session(
        world.book, "s3", [(0, "idle", False), (1, "requires_action", True), (2, "in_progress", False)]
    )
    served.deleted_at = T0 + 60
    for session in (lost, failed, soon, served):
        world.sim.acknowledged_request(session)
    assert world.checker.check_deliveries() == 4
    assert sorted(v.subject[:2] for v in world.violations(5)) == ["s0", "s1"]


def test_a_deleted_session_is_judged_by_its_history_from_before_the_deletion() -> None:
    """5 (issue 25, item 6; a mutant survived through this): the API forgets a deleted session's
    history, so the judge keeps it when the harness deletes the session; a request acknowledged,
    never served, and deleted 60 s later still breaks 5."""
    world = World()
    lost = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "requires_action", True)])
    event = "evt_s0"
    world.sim.event_log[event] = {
        "id": event,
        "data": {"id": lost.id, "required_action": {"type": "environment_connection"}},
    }
    world.sim.delivery_log.append(
        {
            "id": "dlv_s0",
            "event_id": event,
            "attempts": [{"status_code": 200, "started_at": T0 + 1.2, "duration_seconds": 0.01}],
        }
    )
    world.checker.before_deletion(lost)
    del world.sim.histories[lost.id]  # deleted: the API answers 404 for its history
    lost.deleted_at = T0 + 61
    assert world.checker.check_deliveries() == 1
    assert [v.subject[:2] for v in world.violations(5)] == ["s0"]


def test_eventlog_quiet_since_and_disturbances() -> None:
    log = EventLog(t0=T0)
    log.windows += [Window("a", T0 + 1, T0 + 4), Window("b", T0 + 3, None)]
    assert log.quiet_since(T0 + 2) is None  # a lasts
    assert log.quiet_since(T0 + 3.5) is None  # b lasts
    log.windows[1].end = T0 + 5
    assert log.quiet_since(T0 + 6) == T0 + 5
    assert log.disturbed_between(T0 + 4.5, T0 + 10) and not log.disturbed_between(T0 + 5.5, T0 + 10)


JUDGE = ("checker.py", "observe.py", "book.py", "eventlog.py")


def test_the_judge_imports_no_controller_code() -> None:
    """The checker, what it observes with, and what it keeps, import nothing of ``controller``."""
    directory = Path(__file__).resolve().parents[1] / "chaos"
    for name in JUDGE:
        tree = ast.parse((directory / name).read_text())
        imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names] + [
            node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        ]
        assert not [m for m in imported if m == "controller" or m.startswith("controller.")], name
        assert not [m for m in imported if m.startswith("tests.chaos.") and m.split(".")[-1] + ".py" not in JUDGE], name


class _LeavesAProcess:
    def stop(self) -> None:
        raise AssertionError("a process of the state directory was left running: 4242 sleep 600")


def test_a_process_the_teardown_found_left_breaks_6(tmp_path: Path) -> None:
    """6: what the teardown had to kill (a process left in the state directory) fails the run;
    it is not only noted."""
    world = World()
    teardown(_LeavesAProcess(), world.checker, tmp_path)
    [violation] = world.violations(6)
    assert "4242 sleep 600" in violation.text


def test_a_run_under_ci_without_codex_fails() -> None:
    """4 cannot be judged with the stand-in (it runs no commands): under CI=true the run fails
    at once instead of skipping it in silence; elsewhere it runs, labelled."""
    with pytest.raises(pytest.fail.Exception, match="CI=true but codex is not installed"):
        require_codex(False, {"CI": "true"})
    require_codex(False, {})
    require_codex(True, {"CI": "true"})


def test_an_executor_that_starts_long_after_its_session_ended_breaks_5() -> None:
    """5 (the stale-worker fault's judge): an executor first seen more than ``STALE_START_SECONDS``
    after its session failed (or was deleted) came from a read made before that end, by a worker
    whose lease was gone; one that shows up just after the end (a round that read the session
    and started it as it ended) does not break it."""
    world = World()
    stale = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "requires_action", True)])
    racing = world.sim.session(world.book, "s1", [(0, "idle", False), (1, "requires_action", True)])
    stale.failed_at = T0 + 2
    racing.deleted_at = T0 + 2
    world.at(3)
    world.run("env_s1", 300)
    world.at(2 + STALE_START_SECONDS)
    assert world.violations() == []
    world.run("env_s0", 301)
    world.at(2 + STALE_START_SECONDS + 0.5)
    [found] = world.violations()
    assert found.invariant == 5 and found.subject.startswith("s0") and "after the session was failed" in found.text


# -- 9: an operator's release ---------------------------------------------------------------------


def _released_later(world: World, monkeypatch: pytest.MonkeyPatch, gone_after: float | None, workspace: Path) -> None:
    """The clock moves a second a look; the executor (and the workspace) go ``gone_after``
    seconds after the operator asked (never, with None)."""
    monkeypatch.setattr("tests.chaos.checker.time.sleep", lambda seconds: None)
    asked = world.now

    def clock() -> float:
        world.now += 1.0
        if gone_after is not None and world.now - asked >= gone_after:
            world.run("env_s0", None)
            if workspace.exists():
                workspace.rmdir()
        return world.now

    world.checker.clock = clock


@pytest.mark.parametrize(("gone_after", "caught"), [(3.0, False), (None, True), (12.0, True)])
def test_an_operators_release_must_end_the_sandbox_within_its_time(
    gone_after: float | None, caught: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """9: after ``sandbox-controller release --yes`` of a held deletion, the session's executor
    must be gone and its workspace discarded within the time given (10 s); still there then
    (the worker ignored the release, or it was never noted) is a violation."""
    world = World()
    session = world.sim.session(world.book, "s0", [(0.0, "idle", False)])
    world.run("env_s0", 4242)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    _released_later(world, monkeypatch, gone_after, workspace)
    world.checker.judge_release(session, workspace, world.now, 10.0, None)
    assert [v.subject for v in world.violations(9)] == (["s0 (sess_s0)"] if caught else [])
    if caught:
        assert "still there 10s later" in world.violations(9)[0].text


def test_an_operators_release_refused_by_the_command_is_a_violation(tmp_path: Path) -> None:
    """9: the command itself refused the release (exit status not 0) of a held deletion."""
    world = World()
    session = world.sim.session(world.book, "s0", [(0.0, "idle", False)])
    world.checker.judge_release(session, tmp_path, world.now, 10.0, "session sess_s0 no longer answers 404")
    assert "refused" in world.violations(9)[0].text


def test_an_idle_executor_still_running_at_the_end_breaks_7_and_a_stopped_one_does_not() -> None:
    """The end check after the final turns (``run._wait_stopped``): an idle session's executor
    still running 15 s past the idle timeout is late (an idle timeout never applied)."""
    world = World()
    late = world.sim.session(world.book, "s0", [(0, "idle", False), (1, "in_progress", False), (3, "idle", False)])
    stopped = world.sim.session(world.book, "s1", [(0, "idle", False), (1, "in_progress", False), (3, "idle", False)])
    busy = world.sim.session(world.book, "s2", [(0, "idle", False), (1, "in_progress", False)])
    world.run(late.environment_id, 100)
    world.run(busy.environment_id, 300)
    world.now = T0 + 3 + IDLE + 16
    world.checker.check_idle_stopped()
    [found] = world.violations()
    assert found.invariant == 7 and found.subject.startswith("s0") and "still runs at the end" in found.text
    assert stopped.environment_id not in world.processes


def _log(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _task(task: str, started: float, ended: float, end: str, looked_up: float | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [
        {"time": T0 + started, "event": "task started", "task_id": task, "session_id": "sess_s0"}
    ]
    if looked_up is not None:
        lines.append({"time": T0 + looked_up, "event": "session looked up", "task_id": task, "session_id": "sess_s0"})
    reason = {"reason": "lease of session sess_s0 lost; timer not armed"} if "stale" in end else {}
    lines.append({"time": T0 + ended, "event": end, "task_id": task, "session_id": "sess_s0", **reason})
    return lines


FENCED = "stale decision dropped; looking again"


def test_a_round_that_loses_its_lease_before_the_ttl_breaks_10_and_names_the_other_worker(tmp_path: Path) -> None:
    """10: two workers acting on one session at once. The first worker's round is fenced 0.6 s
    after its task started (TTL 10 s): another worker's round took the lease it still held."""
    world = World()
    world.sim.session(world.book, "s0", [(0, "idle", False)])
    first = _log(tmp_path / "worker0.log", _task("t1", 1.0, 1.6, FENCED, looked_up=1.2))
    second = _log(tmp_path / "worker1.log", _task("t2", 1.1, 1.9, "task done", looked_up=1.3))
    assert world.checker.check_leases([first, second], 10.0) == 2
    [found] = world.violations()
    assert found.invariant == 10 and "worker0's task t1 lost the lease 0.60s after it started" in found.text
    assert "worker1's task t2 looked the session up" in found.text


def test_a_lease_lost_after_the_ttl_or_near_a_redis_fault_or_a_busy_session_is_no_violation(tmp_path: Path) -> None:
    """10: a round frozen past the TTL (the stale-worker fault) may lose its lease; so may one
    whose lease's key Redis lost (a SIGKILL, a failover); a task that found the session busy
    held no lease."""
    world = World()
    world.sim.session(world.book, "s0", [(0, "idle", False)])
    lines = [
        *_task("t1", 1.0, 12.0, FENCED),
        *_task("t2", 1.0, 1.2, "session busy elsewhere; will look again"),
        *_task("t3", 100.0, 100.5, FENCED),
        *_task("t4", 1.5, 3.0, "task done"),
    ]
    world.log.windows.append(Window("redis-kill redis for 2.0s", T0 + 99, T0 + 101))
    assert world.checker.check_leases([_log(tmp_path / "worker0.log", lines)], 10.0) == 4
    assert world.violations() == []


def test_refused_registrations_without_a_back_off_break_11() -> None:
    """11: 9 refused registrations of one environment within 20 s is a crash loop restarted at
    every look; 5 in 20 s (0, 1, 4, 9, 18 s: the back-off) and accepted ones are not."""
    world = World()
    looping = world.sim.session(world.book, "s0", [(0, "requires_action", True)])
    backing_off = world.sim.session(world.book, "s1", [(0, "requires_action", True)])
    for at in [1.5 * n for n in range(9)]:
        world.sim.registration_log.append(
            {"environment_id": looping.environment_id, "status_code": 503, "received_at": T0 + at}
        )
    for at in (0, 1, 4, 9, 18, 40, 41, 44, 49, 58):
        world.sim.registration_log.append(
            {"environment_id": backing_off.environment_id, "status_code": 503, "received_at": T0 + at}
        )
    for at in range(20):
        world.sim.registration_log.append(
            {"environment_id": backing_off.environment_id, "status_code": 200, "received_at": T0 + at}
        )
    assert world.checker.check_crash_loops() == 19
    [found] = world.violations()
    assert found.invariant == 11 and found.subject.startswith("s0") and "9 refused registrations" in found.text


def test_a_wedged_executor_still_running_past_the_bound_breaks_12_and_a_replaced_one_does_not() -> None:
    """12: the executor running when the link dropped must be gone by the bound (a replacement
    of its own may run then)."""
    for replaced, broken in ((False, True), (True, False)):
        world = World()
        session = world.sim.session(world.book, "s0", [(0, "requires_action", True)])
        world.run(session.environment_id, 200 if replaced else 100)
        world.now = T0 + 36
        world.checker.judge_wedged(session, [100], T0 + 1, 35.0)
        assert [v.invariant for v in world.violations()] == ([12] if broken else [])


def _restored_session(world: World, tmp_path: Path, connects_after: float) -> tuple[Session, Path]:
    """s0 registered and connected at 1, idle, suspended at 40 (its executor gone), asking again
    at 59.8 and restored at 60 (a worker logged it): the restored executor's processes show up
    at 60 and its link comes up ``connects_after`` seconds later, on its original registration
    (none near 60)."""
    changes = [(0, "requires_action", True), (1, "idle", False), (59.8, "requires_action", True), (61, "idle", False)]
    session = world.sim.session(world.book, "s0", changes)
    world.sim.registration_log.append(
        {"environment_id": session.environment_id, "received_at": T0 + 0.5, "status_code": 200}
    )
    world.sim.links[session.environment_id] = [[T0 + 1, T0 + 39], [T0 + 60 + connects_after, None]]
    world.run(session.environment_id, 100)
    world.at(1)
    world.run(session.environment_id, None)
    world.at(40)
    world.run(session.environment_id, 200)
    world.at(60)
    world.at(75)
    log = tmp_path / "worker0.log"
    log.write_text(json.dumps({"time": T0 + 60.4, "event": "executor restored", "session_id": session.id}) + "\n")
    return session, log


def test_13_a_restore_that_reconnects_late_is_a_violation_and_one_at_once_is_not(tmp_path: Path) -> None:
    """13: a restored executor (no registration near it) must have its link up within
    ``RESTORE_CONNECT_SECONDS`` of showing up: 0.4 s passes, 7.9 s (codex's backoff kept asleep
    in the image, the fourth short suspension before issue 37's fix) does not."""
    on_time = World()
    _, log = _restored_session(on_time, tmp_path, 0.4)
    assert on_time.checker.check_restores([log]) == 1 and not on_time.violations()
    late = World()
    _, log = _restored_session(late, tmp_path, 7.9)
    assert late.checker.check_restores([log]) == 1
    [violation] = late.violations(13)
    assert "connected 7.9s after it showed up" in violation.text


def test_13_an_executor_that_registered_is_a_fresh_start_not_a_restore(tmp_path: Path) -> None:
    """13 judges restores only: an executor with a registration of its environment near it
    started afresh (it registers; a restore reconnects on its original registration)."""
    world = World()
    session, log = _restored_session(world, tmp_path, 7.9)
    world.sim.registration_log.append(
        {"environment_id": session.environment_id, "received_at": T0 + 61.0, "status_code": 200}
    )
    assert world.checker.check_restores([log]) == 0 and not world.violations()


def test_13_a_late_reconnect_while_a_fault_disturbed_the_system_is_not_judged(tmp_path: Path) -> None:
    world = World()
    _, log = _restored_session(world, tmp_path, 7.9)
    world.log.windows.append(Window("link-drop s0 for 5.0s", T0 + 59.0, T0 + 64.0))
    world.checker.check_restores([log])
    assert not world.violations()


def _memory_turns(world: World, session: Session, answers: list[tuple[str, int]]) -> None:
    """Turns of ``session`` whose second command asked the background process: (stdout, exit code)."""
    session.memory_turns = [f"turn_{i}" for i in range(len(answers))]
    world.sim.turn_log[session.id] = [
        {
            "id": f"turn_{i}",
            "commands": [
                {"status": "completed", "exit_code": 0, "stdout": ""},
                {"status": "completed", "exit_code": code, "stdout": stdout},
            ],
        }
        for i, (stdout, code) in enumerate(answers)
    ]


def test_13_every_turn_after_a_suspension_finds_the_same_memory_unless_it_was_given_up_on_purpose(
    tmp_path: Path,
) -> None:
    """13: the suspend-cycles session's turns must all reach the same background process (its
    token, kept only in memory); a different token, or none answering, is memory lost, unless
    a worker logged a fallback for the session (a restore impossible, a checkpoint refused)."""
    kept = World()
    session = kept.sim.session(kept.book, "s0", [(0, "idle", False)])
    _memory_turns(kept, session, [("abc 10 7", 0), ("abc 90 7", 0), ("abc 140 7", 0)])
    kept.checker.check_restores([tmp_path / "none.log"])
    assert not kept.violations()

    for lost in ([("abc 10 7", 0), ("def 3 9", 0)], [("abc 10 7", 0), ("", 1)]):
        world = World()
        session = world.sim.session(world.book, "s0", [(0, "idle", False)])
        _memory_turns(world, session, lost)
        world.checker.check_restores([tmp_path / "none.log"])
        [violation] = world.violations(13)
        assert "was lost" in violation.text

    excused = World()
    session = excused.sim.session(excused.book, "s0", [(0, "idle", False)])
    _memory_turns(excused, session, [("abc 10 7", 0), ("def 3 9", 0)])
    log = tmp_path / "fallback.log"
    line = {"time": T0 + 5, "event": "restore impossible, starting a fresh executor", "session_id": session.id}
    log.write_text(json.dumps(line) + "\n")
    excused.checker.check_restores([log])
    assert not excused.violations()


def test_13_a_cut_checkpoint_must_fall_back_to_a_connected_executor_within_the_bound() -> None:
    """13 (``corrupt-checkpoint``): connected 1.5 s after the input passes; never connected
    within the bound (CRIU left spinning on the cut image) is a violation."""
    world = World()
    session = world.sim.session(world.book, "s0", [(0, "idle", False)])
    world.sim.links[session.environment_id] = [[T0 + 1, T0 + 30], [T0 + 51.5, None]]
    world.now = T0 + 55
    world.checker.judge_fallback(session, T0 + 50, 20.0)
    assert not world.violations()
    world.sim.links[session.environment_id] = [[T0 + 1, T0 + 30]]
    world.now = T0 + 71
    world.checker.judge_fallback(session, T0 + 50, 20.0)
    [violation] = world.violations(13)
    assert "no executor connected 20s later" in violation.text


def test_14_a_detached_child_left_after_its_executor_was_killed_is_a_violation() -> None:
    """14: a process of the sandbox still running (same pid, same start time) past the bound
    is a violation; one whose pid now names another process (another start time) is gone."""
    world = World()
    session = world.sim.session(world.book, "s0", [(0, "idle", False)])
    me = os.getpid()
    ticks = observe.start_ticks(me)
    assert ticks is not None
    world.now = T0 + 31
    world.checker.judge_orphans(session, {me: ticks + 1}, T0, 30.0)  # the pid reused: not that process
    assert not world.violations()
    world.checker.judge_orphans(session, {me: ticks}, T0, 30.0)
    [violation] = world.violations(14)
    assert f"pids [{me}]" in violation.text


LIFETIME = 20.0
SLACK = 5.0


def test_16_a_stop_at_the_maximum_lifetime_is_not_judged_as_an_early_idle_stop(tmp_path: Path) -> None:
    """In a world with a maximum lifetime, an executor a worker logged stopping for it (cause
    ``lifetime``) just before it went is a stop the rules make, not an early idle stop (7); a
    stop logged for another cause, long before, for another session, or in a world without a
    lifetime excuses nothing."""
    log = tmp_path / "worker0.log"
    stop = {"time": T0 + 7.5, "event": "sandbox stopped", "cause": "lifetime", "session_id": "sess_s0"}
    for line, lifetime, broken in (
        (stop, LIFETIME, False),
        ({**stop, "cause": "idle"}, LIFETIME, True),
        ({**stop, "time": T0 - 20}, LIFETIME, True),
        ({**stop, "session_id": "sess_s1"}, LIFETIME, True),
        (stop, None, True),
    ):
        log.write_text(json.dumps(line) + "\n")
        world = World(max_lifetime=lifetime, controller_logs=[log])
        _idle_stop_at(world, 5.0)
        assert [v.invariant for v in world.violations()] == ([7] if broken else []), line


def _lineage_turns(world: World, session: Session, answers: list[tuple[float, str, int]]) -> None:
    """Turns of ``session`` posted at ``T0 + at`` whose second command asked the background
    process: (at, stdout, exit code)."""
    for index, (at, _, _) in enumerate(answers):
        session.turns.append(Turn(f"turn_{index}", f"s0-t{index}", T0 + at))
        session.lineage_turns.append(f"turn_{index}")
    world.sim.turn_log[session.id] = [
        {
            "id": f"turn_{index}",
            "commands": [
                {"status": "completed", "exit_code": 0, "stdout": ""},
                {"status": "completed", "exit_code": code, "stdout": stdout},
            ],
        }
        for index, (_, stdout, code) in enumerate(answers)
    ]


def _lifetime_world(answers: list[tuple[float, str, int]]) -> World:
    """s0's first executor seen at 2 (its lineage's lifetime ends at 22, judged from 27)."""
    world = World(max_lifetime=LIFETIME)
    session = world.sim.session(world.book, "s0", [(0, "idle", False)])
    world.run(session.environment_id, 100)
    world.at(2)
    _lineage_turns(world, session, answers)
    return world


def test_16_a_turn_well_past_the_lifetime_that_finds_the_first_lineage_breaks_16() -> None:
    """16: the lifetime-cycles session's turns past its maximum lifetime (and the slack) must
    not find the background process its first lineage started (issue 37, defect 7: each
    restore renewed the lifetime, the same tree ran on); a fresh start's answer, or none, is
    what the rules make; a turn inside the slack is not judged."""
    renewed = _lifetime_world([(16, "abc 10 7", 0), (26, "abc 20 7", 0), (30, "abc 30 7", 0), (44, "abc 40 7", 0)])
    assert renewed.checker.check_lineages(SLACK) == 2
    violations = renewed.violations(16)
    assert len(violations) == 2 and "28.0s after its first executor was seen" in violations[0].text

    fresh = _lifetime_world([(16, "abc 10 7", 0), (30, "", 1), (44, "def 3 9", 0)])
    assert fresh.checker.check_lineages(SLACK) == 2 and not fresh.violations()


def test_16_cycles_that_never_reached_past_the_lifetime_are_a_harness_error_not_a_pass() -> None:
    """A run whose lifetime cycles stopped early (a suspension never came) judged nothing: it
    says so as an error, so a run cannot pass 16 by not reaching it."""
    short = _lifetime_world([(16, "abc 10 7", 0), (26, "abc 20 7", 0)])
    assert short.checker.check_lineages(SLACK) == 0
    assert not short.violations() and any("judged nothing" in e for e in short.checker.errors)


def test_a_sigterm_during_a_run_ends_it_through_its_teardown(tmp_path: Path) -> None:
    """A run killed with SIGTERM (a cancelled CI job, ``timeout``) still reaches its ``finally``,
    where the world is torn down (``run.terminated_as_exit``); without it Python exits at once
    and every process of the world is left running."""
    import signal
    import subprocess
    import sys
    import time

    cleaned = tmp_path / "cleaned"
    script = (
        "import time, sys\n"
        "from pathlib import Path\n"
        "from tests.chaos.run import terminated_as_exit\n"
        "with terminated_as_exit():\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)\n"
        "    finally:\n"
        f"        Path({str(cleaned)!r}).write_text('torn down')\n"
    )
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 5
    while not cleaned.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cleaned.read_text() == "torn down"
