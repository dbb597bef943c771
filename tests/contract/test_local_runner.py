"""``LocalRunner`` with a tiny stand-in executor: real child processes, real locks."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller import cli, wiring
from controller.config import Settings
from controller.errors import ConfigError, RunnerRejected
from controller.model import Handle, Health, SandboxSpec
from controller.runners.local import LocalRunner, RunAs, UidRange, session_key
from tests.support.codex import codex_binary
from tests.support.local_runner import live, sandbox_pids
from tests.support.other_uids import free_uid_range, python_for_others, shared_directory
from tests.support.processes import Managed, assert_no_process_left, wait_for
from tests.support.simulator import StartSimulator

EXECUTOR_KEY = "envkey-restricted-0123456789"
CONTROLLER_API_KEY = "sk-controller-must-not-leak-42"

# Ignores its arguments, leaves its pid in a directory (so clean-up finds every process ever
# started), reports its environment's *names* and its cwd, then waits.
FAKE_EXECUTOR = """
import os, sys, time
open(os.path.join({pids!r}, str(os.getpid())), "w").close()
print("cwd=" + os.getcwd(), flush=True)
print("argv=" + " ".join(sys.argv[1:]), flush=True)
print("names=" + ",".join(sorted(os.environ)), flush=True)
print("key_is_executor_key=" + str(os.environ.get("CODEX_API_KEY") == {key!r}), flush=True)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "fake_executor.py"
    (tmp_path / "pids").mkdir()
    path.write_text(FAKE_EXECUTOR.format(key=EXECUTOR_KEY, pids=str(tmp_path / "pids")))
    return path


def running(pid: int, script: Path) -> bool:
    """The fake executor ``pid`` is still running (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX" and str(script).encode() in cmdline


class Runners:
    """Every LocalRunner a test makes; all their processes are stopped and reaped at the end."""

    def __init__(self, state: Path, script: Path) -> None:
        self.state, self.script = state, script
        self.pids_dir = script.parent / "pids"
        self.made: list[LocalRunner] = []

    def started(self) -> list[int]:
        """Every fake executor process started so far (live or not)."""
        return sorted(int(p.name) for p in self.pids_dir.iterdir())

    def new(self, command: list[str] | None = None) -> LocalRunner:
        runner = LocalRunner(self.state, command or [sys.executable, str(self.script)], EXECUTOR_KEY)
        self.made.append(runner)
        return runner

    def cleanup(self) -> None:
        """Stop every executor through the runners, then kill any the runners lost track of (a leak)."""
        try:
            for runner in self.made:
                runner.stop_all()
        finally:
            leaked = [pid for pid in self.started() if running(pid, self.script)]
            for pid in leaked:
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: all(not live(r) for r in self.made), 10, "every executor to stop", interval=0.05)
        for runner in self.made:
            live(runner)  # reaps its children
        assert not leaked, f"executor processes left running after stop_all: {leaked}"


@pytest.fixture
def runners(tmp_path: Path, script: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runners]:
    monkeypatch.setenv("CONTROLLER_API_KEY", CONTROLLER_API_KEY)
    monkeypatch.setenv("CONTROLLER_REDIS_URL", "redis://:pw@localhost/0")
    made = Runners(tmp_path / "state", script)
    try:
        yield made
    finally:
        made.cleanup()


def spec(session_id: str = "sess_1", environment_id: str = "env_1") -> SandboxSpec:
    return SandboxSpec(session_id=session_id, environment_id=environment_id, remote_url="https://remote.test/env")


def pid_of(handle: Handle) -> int:
    return int(handle.uid.partition(":")[0])


def log_of(runners: Runners, session_id: str = "sess_1") -> str:
    return (runners.state / "sessions" / session_key(session_id) / "executor.log").read_text()


def wait_ready(runners: Runners, session_id: str = "sess_1") -> str:
    wait_for(lambda: "ready" in log_of(runners, session_id), 10, "the fake executor to start", interval=0.02)
    return log_of(runners, session_id)


def test_ensure_twice_starts_one_process(runners: Runners) -> None:
    """L1: ensure is idempotent: the second call returns the live sandbox."""
    runner = runners.new()
    first = runner.ensure(spec(), 1)
    second = runner.ensure(spec(), 1)
    assert first == second
    assert live(runner) == [first]
    assert first.generation == 1 and first.session_id == "sess_1"
    wait_ready(runners)
    assert log_of(runners).count("ready") == 1
    assert runners.started() == [pid_of(first)]


def test_concurrent_ensure_from_threads_and_runners_starts_one_process(runners: Runners) -> None:
    """L1: two workers (threads, separate runner instances) ensuring one session start one process."""
    shared = runners.new()
    contenders = [shared, shared, runners.new(), runners.new(), runners.new(), runners.new()]
    barrier = threading.Barrier(len(contenders))
    handles: list[Handle] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def ensure(runner: LocalRunner) -> None:
        barrier.wait()
        try:
            handle = runner.ensure(spec(), 1)
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            handles.append(handle)

    pool = [threading.Thread(target=ensure, args=(r,)) for r in contenders]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=30)
    assert not errors, errors
    assert len(handles) == len(contenders) and len(set(handles)) == 1
    assert live(shared) == [handles[0]]
    wait_ready(runners)
    assert log_of(runners).count("ready") == 1
    assert runners.started() == [pid_of(handles[0])]


def test_executor_gets_only_its_own_key_and_no_controller_settings(runners: Runners) -> None:
    """L2/L8: the child's environment is built from scratch: CODEX_API_KEY is the environment key;
    no CONTROLLER_* variable and never the controller's API key reach it; it runs in the session's
    workspace and dials out with the session's environment id."""
    runner = runners.new()
    handle = runner.ensure(spec(environment_id="env_42"), 1)
    output = wait_ready(runners)
    names = output.split("names=", 1)[1].splitlines()[0].split(",")
    assert "CODEX_API_KEY" in names
    assert not [n for n in names if n.startswith("CONTROLLER_")]
    assert "key_is_executor_key=True" in output
    assert CONTROLLER_API_KEY not in output and EXECUTOR_KEY not in output
    assert "argv=exec-server --remote https://remote.test/env --environment-id env_42" in output

    environ = Path(f"/proc/{pid_of(handle)}/environ").read_bytes().split(b"\0")
    values = {e.partition(b"=")[0].decode(): e.partition(b"=")[2].decode() for e in environ if e}
    assert values["CODEX_API_KEY"] == EXECUTOR_KEY
    assert CONTROLLER_API_KEY not in values.values()
    assert not [k for k in values if k.startswith("CONTROLLER_")]

    workspace = runners.state / "sessions" / session_key("sess_1") / "workspace"
    assert f"cwd={workspace}" in output
    assert Path(os.readlink(f"/proc/{pid_of(handle)}/cwd")) == workspace


def test_each_session_gets_its_own_process_and_workspace(runners: Runners) -> None:
    """L1/L16: sessions do not share a process or a workspace; L2: an id that could be a path
    is refused before it names a directory or reaches the executor's arguments."""
    runner = runners.new()
    a = runner.ensure(spec("sess_a"), 1)
    b = runner.ensure(spec("sess_b"), 1)
    with pytest.raises(RunnerRejected):
        runner.ensure(spec("sess_b/../odd id"), 1)
    assert a.uid != b.uid
    assert sorted(live(runner), key=lambda h: h.session_id) == sorted([a, b], key=lambda h: h.session_id)
    dirs = {p.name for p in (runners.state / "sessions").iterdir()}
    assert dirs == {session_key("sess_a"), session_key("sess_b")}


def test_status_running_then_failed_after_kill(runners: Runners) -> None:
    """L14: a sandbox whose process died is FAILED (to be replaced); an unknown handle is GONE."""
    runner = runners.new()
    handle = runner.ensure(spec(), 1)
    assert runner.status(handle) is Health.RUNNING
    os.killpg(pid_of(handle), signal.SIGKILL)
    wait_for(lambda: runner.status(handle) is Health.FAILED, 10, "the killed executor to be seen as failed")
    assert live(runner) == []
    stranger = Handle(session_id="sess_1", name=handle.name, generation=1, uid="1:1")
    assert runner.status(stranger) is Health.GONE
    assert runner.status(Handle(session_id="sess_none", name="x", generation=1, uid="1:1")) is Health.GONE

    replacement = runner.ensure(spec(), 2)  # a dead sandbox is replaced, not reused
    assert replacement.uid != handle.uid and replacement.generation == 2
    assert runner.status(replacement) is Health.RUNNING
    assert runner.status(handle) is Health.GONE


def test_killed_process_seen_by_another_runner(runners: Runners) -> None:
    """L14: a second worker (another runner instance) sees the same health from the state directory."""
    starter, observer = runners.new(), runners.new()
    handle = starter.ensure(spec(), 1)
    assert observer.status(handle) is Health.RUNNING
    assert observer.list_managed() == [handle]
    os.killpg(pid_of(handle), signal.SIGKILL)
    live(starter)  # the parent reaps its child
    wait_for(lambda: observer.status(handle) is Health.FAILED, 10, "the killed executor to be seen as failed")


def test_release_stops_the_process_and_is_idempotent(runners: Runners) -> None:
    """L17/L18: release stops the sandbox and forgets it; releasing again is fine."""
    runner = runners.new()
    handle = runner.ensure(spec(), 1)
    pid = pid_of(handle)
    runner.release(handle)
    assert live(runner) == [] and runner.list_managed() == []
    assert runner.status(handle) is Health.GONE
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    runner.release(handle)


def test_release_with_a_stale_handle_does_not_stop_the_newer_sandbox(runners: Runners) -> None:
    """L12/L18: a release decided about an older sandbox never stops its replacement."""
    runner = runners.new()
    old = runner.ensure(spec(), 1)
    runner.release(old)
    new = runner.ensure(spec(), 2)
    assert new.uid != old.uid
    runner.release(old)  # stale: names the earlier process
    assert runner.status(new) is Health.RUNNING
    assert live(runner) == [new]


def test_missing_executor_command_is_rejected(runners: Runners, tmp_path: Path) -> None:
    """A runner that cannot start its executor says so (Permanent), in the system's words, and
    leaves no sandbox behind."""
    runner = runners.new([str(tmp_path / "no-such-executor")])
    with pytest.raises(RunnerRejected) as raised:
        runner.ensure(spec(), 1)
    assert "No such file or directory" in str(raised.value)
    assert EXECUTOR_KEY not in str(raised.value)
    assert runner.list_managed() == [] and live(runner) == []


def test_the_workspace_outlives_the_process_until_discarded(runners: Runners) -> None:
    """L16: releasing the executor keeps the session's workspace (listed for the sweep);
    discard removes it once the session is released for good."""
    runner = runners.new()
    handle = runner.ensure(spec(), 1)
    wait_ready(runners)
    runner.release(handle)
    assert runner.keeps_workspace("sess_1")
    assert runner.workspaces() == ["sess_1"]
    runner.discard("sess_1")
    assert not runner.keeps_workspace("sess_1")
    assert runner.workspaces() == []


# -- executors are process groups -----------------------------------------------------------

# Starts a child that outlives it, as the npm launcher starts the native codex; both record
# their pids, then wait.
FORKING_EXECUTOR = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
for pid in (os.getpid(), child.pid):
    open(os.path.join({pids!r}, str(pid)), "w").close()
print("ready", flush=True)
time.sleep(120)
"""


def session_pids(leader: int) -> list[int]:
    """Running processes whose session id is ``leader`` (what a sandbox is)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] not in "ZX" and int(fields[3]) == leader:
                found.append(int(proc.name))
    return sorted(found)


def test_a_child_outliving_its_leader_is_failed_then_stopped_with_the_group(runners: Runners) -> None:
    """L14/L17: when the executor's leader dies but a process it started lives on, the sandbox is
    FAILED (replaced, not trusted) yet still found and listed as live; release stops the whole
    group, and a new ensure first stops what is left of the old one (L1: never two)."""
    (runners.script.parent / "forking.py").write_text(FORKING_EXECUTOR.format(pids=str(runners.pids_dir)))
    runner = runners.new([sys.executable, str(runners.script.parent / "forking.py")])
    handle = runner.ensure(spec(), 1)
    wait_ready(runners)
    leader = pid_of(handle)
    wait_for(lambda: len(session_pids(leader)) == 2, 10, "the executor and its child")
    orphan = next(p for p in session_pids(leader) if p != leader)
    os.kill(leader, signal.SIGKILL)  # the launcher dies; its child does not
    wait_for(lambda: runner.status(handle) is Health.FAILED, 10, "the sandbox to be seen as failed")
    assert session_pids(leader) == [orphan]
    assert (
        runner.find("sess_1") == handle and live(runner) == [handle] and sandbox_pids(runners.state, handle) == [orphan]
    )

    replacement = runner.ensure(spec(), 2)
    assert replacement.uid != handle.uid
    wait_for(lambda: session_pids(leader) == [], 15, "the old group to be stopped before the new one starts")
    runner.release(replacement)
    wait_for(lambda: session_pids(pid_of(replacement)) == [], 15, "the new group to be stopped by release")
    assert live(runner) == []


# Starts a daemon as the textbook makes one (fork, setsid, fork: out of the executor's session
# and group, its parent gone), as a command's background server would; both record their pids.
DAEMONIZING_EXECUTOR = """
import os, sys, time
open(os.path.join({pids!r}, str(os.getpid())), "w").close()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join({pids!r}, str(os.getpid())), "w").close()
        time.sleep(120)
    os._exit(0)
print("ready", flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup per sandbox needs root")
@pytest.mark.parametrize("end", ["release", "executor_sigkill_then_release", "executor_sigkill_then_replace"])
def test_a_daemon_that_left_the_sandboxs_session_ends_with_it(runners: Runners, end: str) -> None:
    """L17, L18, issue 37 (4): the executor starts a daemon (fork, setsid, fork), which is in no
    session or group of the sandbox. Released while it runs, or after its executor was SIGKILLed
    (nothing forwarded, no stop of its own: the sandbox FAILED, still found while the daemon
    lives) and then released or replaced, the sandbox leaves no process: the kernel kills its
    cgroup, and the cgroup is removed."""
    (runners.script.parent / "daemonizing.py").write_text(DAEMONIZING_EXECUTOR.format(pids=str(runners.pids_dir)))
    runner = runners.new([sys.executable, str(runners.script.parent / "daemonizing.py")])
    assert runner.contained, runner.containment
    handle = runner.ensure(spec(), 1)
    wait_ready(runners)
    executor = pid_of(handle)
    [daemon] = wait_for(lambda: [p for p in runners.started() if p != executor], 10, "the daemon")
    try:
        assert alive(daemon) and daemon not in session_pids(executor)
        record = json.loads((runners.state / "sessions" / session_key("sess_1") / "sandbox.json").read_text())
        cgroup = Path(record["cgroup"])
        assert sorted(sandbox_pids(runners.state, handle)) == sorted([executor, daemon])
        if end != "release":
            os.kill(executor, signal.SIGKILL)
            wait_for(lambda: runner.status(handle) is Health.FAILED, 10, "the sandbox to be seen as failed")
            assert runner.find("sess_1") == handle and sandbox_pids(runners.state, handle) == [daemon]
        if end == "executor_sigkill_then_replace":
            replacement = runner.ensure(spec(), 2)
            assert replacement.uid != handle.uid and runner.status(replacement) is Health.RUNNING
            wait_for(lambda: not alive(daemon), 10, "the old sandbox's daemon to be killed")
            assert live(runner) == [replacement]
        else:
            runner.release(handle)
            wait_for(lambda: not alive(daemon), 10, "the daemon to be killed")
            assert live(runner) == [] and not cgroup.exists()
    finally:
        if alive(daemon):  # the test failed: nothing left behind all the same
            os.kill(daemon, signal.SIGKILL)


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup per sandbox needs root")
def test_a_sandbox_whose_start_never_recorded_it_is_stopped_by_the_sweep_and_one_being_started_is_not(
    runners: Runners,
) -> None:
    """L17, issue 37: a worker killed between the executor's spawn and its ``sandbox.json`` (a
    chaos run's SIGKILL of a worker 10 ms after a start) leaves an executor that no record names:
    it connected, its session went idle, and nothing ever stopped it. Here the start is cut
    short where the worker died: its record is never written. ``end_unrecorded`` (every full
    sweep) stops it and removes its cgroup; while a start holds the session directory's lock it
    is left alone, and a recorded sandbox is never touched."""
    runner = runners.new()
    assert runner.contained, runner.containment
    kept = runner.ensure(spec("sess_kept"), 1)

    class Killed(BaseException):
        """The worker's death between the spawn and the record."""

    def killed(*args: object, **kwargs: object) -> None:
        raise Killed

    record = runner._state.record
    runner._state.record = killed  # type: ignore[method-assign]
    with pytest.raises(Killed):
        runner.ensure(spec(), 1)
    runner._state.record = record  # type: ignore[method-assign]
    wait_ready(runners)
    [cut] = [pid for pid in runners.started() if running(pid, runners.script) and pid != pid_of(kept)]
    directory = runners.state / "sessions" / session_key("sess_1")
    cgroup = Path(json.loads((directory / "starting.json").read_text())["cgroup"])
    assert not (directory / "sandbox.json").exists() and runner.find("sess_1") is None

    descriptor = os.open(directory / "lock", os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # a start under way holds it
        assert runner.end_unrecorded() == [] and running(cut, runners.script)
    finally:
        os.close(descriptor)

    assert runner.end_unrecorded() == ["sess_1"]
    wait_for(lambda: not running(cut, runners.script), 10, "the unrecorded executor to end")
    assert not cgroup.exists() and not (directory / "starting.json").exists()
    assert live(runner) == [kept] and runner.status(kept) is Health.RUNNING
    assert runner.end_unrecorded() == []


def test_launcher_sigkill_then_release_leaves_no_codex_process(tmp_path: Path, start_simulator: StartSimulator) -> None:
    """L17: the real npm ``codex`` launcher SIGKILLed while the native executor it started is
    connected: the sandbox is FAILED, and release stops every process of its group (0 orphans)."""
    binary = codex_binary()
    sim = start_simulator()
    with sim.openai() as api:
        session = api.beta.agents.sessions.create(
            environment={"type": "self_hosted", "workspace_directory": "/workspace"}, input="hello"
        )
    runner = LocalRunner(tmp_path / "state", [binary], sim.environment_key)
    handle = runner.ensure(
        SandboxSpec(
            session_id=session.id, environment_id=session.environment.id, remote_url=session.environment.remote_url
        ),
        1,
    )
    leader = pid_of(handle)
    try:
        wait_for(lambda: sim.environment_status(session.environment.id) == "connected", 30, "codex to connect")
        wait_for(lambda: len(session_pids(leader)) >= 2, 10, "the launcher and the native codex")
        os.kill(leader, signal.SIGKILL)  # the launcher only
        wait_for(lambda: runner.status(handle) is Health.FAILED, 10, "the sandbox to be seen as failed")
        survivors = session_pids(leader)
        assert survivors, "the native codex died with its launcher: the orphan case was not exercised"
        runner.release(handle)
        wait_for(lambda: session_pids(leader) == [], 15, "no process of the executor's group to be left")
        assert live(runner) == [] and runner.status(handle) is Health.GONE
        wait_for(lambda: sim.environment_status(session.environment.id) == "disconnected", 15, "codex to disconnect")
    finally:
        runner.stop_all()
        for pid in session_pids(leader):
            os.kill(pid, signal.SIGKILL)
    assert_no_process_left(tmp_path / "state")


# -- the sandbox runs apart from the controller ---------------------------------------------

requires_root = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="switching to the executor user needs root"
)

# A "worker": holds the controller's secrets in its environment and starts two executors
# as `nobody` through the runner, then waits (its pid is the executors' parent).
WORKER = """
import os, sys, time
from controller.model import SandboxSpec
from controller.runners.local import LocalRunner, RunAs
state, script, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])  # argv[5]: python
key = os.environ["CONTROLLER_EXECUTOR_KEY"]
runner = LocalRunner(state, [sys.argv[5], script], key, run_as=RunAs(uid, gid, "x"))
for sid in ("sess_a", "sess_b"):
    runner.ensure(SandboxSpec(session_id=sid, environment_id="env_" + sid, remote_url="https://remote.test/env"), 1)
print("started", flush=True)
time.sleep(300)
"""

# The executor: tries what code in a sandbox would try, and reports what it was allowed.
PROBE = """
import json, os, sys, time
state, secrets_file = {state!r}, {secrets_file!r}
worker = os.getppid()
given = open("/proc/self/environ", "rb").read().split(b"\\0")  # as started (Python may add LC_CTYPE)
names = sorted(entry.split(b"=", 1)[0].decode() for entry in given if entry)
results = {{"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "names": names}}
def attempt(name, action):
    try:
        action()
        results[name] = "allowed"
    except PermissionError:
        results[name] = "denied"
    except OSError as exc:
        results[name] = "error " + exc.__class__.__name__
attempt("worker_environ", lambda: open(f"/proc/{{worker}}/environ", "rb").read())
attempt("signal_worker", lambda: os.kill(worker, 0))
attempt("secrets_file", lambda: open(secrets_file).read())
attempt("list_state_directory", lambda: os.listdir(state))
attempt("list_sessions", lambda: os.listdir(os.path.join(state, "sessions")))
attempt("read_own_sandbox_json", lambda: open("../sandbox.json").read())
attempt("reopen_own_log", lambda: open("../executor.log", "a"))
attempt("write_own_workspace", lambda: open("mine.txt", "w").write("mine"))
print("probe=" + json.dumps(results), flush=True)
time.sleep(120)
"""


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory the executor user can traverse (pytest's tmp_path is 0700 root), removed after."""
    with shared_directory("sc-separation-") as base:
        yield base


@requires_root
def test_executor_as_another_user_cannot_read_the_workers_environ_or_secrets(shared_base: Path) -> None:
    """L2: a worker running as root starts executors as `nobody`: the executor cannot read the
    worker's /proc/<pid>/environ (which holds the controller's API key), signal it, read a
    secrets file, list the state directory or other sessions, or read the runner's files;
    it owns its own 0700 workspace. Its environment holds only what it needs."""
    nobody = pwd.getpwnam("nobody")
    state = shared_base / "state"
    secrets_file = shared_base / "api-key"
    secrets_file.write_text(CONTROLLER_API_KEY)
    secrets_file.chmod(0o600)
    probe = shared_base / "probe.py"
    probe.write_text(PROBE.format(state=str(state), secrets_file=str(secrets_file)))
    probe.chmod(0o644)
    env = {
        "PATH": os.environ["PATH"],
        "CONTROLLER_API_KEY": CONTROLLER_API_KEY,
        "CONTROLLER_WEBHOOK_SECRETS": "whsec-must-not-leak-0123456789",
        "CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY,
    }
    worker = Managed(
        "worker",
        [
            sys.executable,
            "-c",
            WORKER,
            str(state),
            str(probe),
            str(nobody.pw_uid),
            str(nobody.pw_gid),
            python_for_others(),
        ],
        env,
        shared_base / "worker.log",
    ).start()
    runner = LocalRunner(state, ["unused"], EXECUTOR_KEY, run_as=RunAs(nobody.pw_uid, nobody.pw_gid, "nobody"))
    try:
        wait_for(lambda: "started" in worker.output(), 20, "the worker to start two executors")
        assert CONTROLLER_API_KEY.encode() in Path(f"/proc/{worker.pid}/environ").read_bytes()  # what is at stake

        def probed(session_id: str) -> dict[str, object] | None:
            log = (state / "sessions" / session_key(session_id) / "executor.log").read_text()
            line = next((x for x in log.splitlines() if x.startswith("probe=")), None)
            return json.loads(line.removeprefix("probe=")) if line else None

        for session_id in ("sess_a", "sess_b"):
            results = wait_for(lambda s=session_id: probed(s), 20, "the executor's probe")
            assert results == {
                "uid": nobody.pw_uid,
                "gid": nobody.pw_gid,
                "groups": [],  # no supplementary groups
                "names": ["CODEX_API_KEY", "HOME", "PATH", "SANDBOX_WORKSPACE"],
                "worker_environ": "denied",
                "signal_worker": "denied",
                "secrets_file": "denied",
                "list_state_directory": "denied",
                "list_sessions": "denied",
                "read_own_sandbox_json": "denied",
                "reopen_own_log": "denied",
                "write_own_workspace": "allowed",
            }, results
            workspace = state / "sessions" / session_key(session_id) / "workspace"
            info = workspace.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (nobody.pw_uid, 0o700)
            assert (workspace / "mine.txt").stat().st_uid == nobody.pw_uid
            assert stat.S_IMODE((workspace / "mine.txt").stat().st_mode) == 0o600  # umask 077
            assert stat.S_IMODE((state / "sessions" / session_key(session_id) / "sandbox.json").stat().st_mode) == 0o600
        assert stat.S_IMODE(state.stat().st_mode) == 0o711
        assert len(live(runner)) == 2
    finally:
        worker.stop()
        runner.stop_all()
    assert live(runner) == []


def run_worker_cli(
    env: dict[str, str], user: int | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``sandbox-controller worker`` with ``env`` (it must refuse before it reaches Redis)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    base.update(
        {
            "CONTROLLER_REDIS_URL": "redis://127.0.0.1:1/0",
            "CONTROLLER_API_KEY": CONTROLLER_API_KEY,
            "CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY,
            **env,
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "controller", "worker"],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@requires_root
@pytest.mark.parametrize("flaw", ["owned by another uid", "world-writable", "group-writable", "a symlink"])
def test_an_unsafe_state_directory_is_refused_with_exit_2(shared_base: Path, flaw: str) -> None:
    """L2: a state directory this uid does not own, that others may write to, or a symlink
    (someone else could plant a sandbox.json naming any process to stop) is refused: the
    runner raises ConfigError and the worker exits 2 at start-up, touching nothing in it."""
    nobody = pwd.getpwnam("nobody")
    state = shared_base / "state"
    if flaw == "a symlink":
        (shared_base / "elsewhere").mkdir(mode=0o700)
        state.symlink_to(shared_base / "elsewhere")
    else:
        state.mkdir()
        state.chmod({"world-writable": 0o777, "group-writable": 0o770}.get(flaw, 0o700))
        if flaw == "owned by another uid":
            os.chown(state, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(ConfigError) as raised:
        LocalRunner(state, ["unused"], EXECUTOR_KEY)
    assert str(state) in str(raised.value)
    result = run_worker_cli({"CONTROLLER_LOCAL_STATE_DIRECTORY": str(state)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"local state directory {state}" in result.stderr
    assert not (state / "sessions").exists()
    assert CONTROLLER_API_KEY not in result.stdout + result.stderr


@requires_root
def test_a_fresh_state_directory_is_private_and_a_worker_accepts_it(shared_base: Path) -> None:
    """L2: the runner creates its state directory 0700, or 0711 (enter, not list) when executors
    run as another user; their workspaces are then the only things they may open in it."""
    LocalRunner(shared_base / "same-user", ["unused"], EXECUTOR_KEY)
    assert stat.S_IMODE((shared_base / "same-user").stat().st_mode) == 0o700
    nobody = pwd.getpwnam("nobody")
    LocalRunner(
        shared_base / "separate", ["unused"], EXECUTOR_KEY, run_as=RunAs(nobody.pw_uid, nobody.pw_gid, "nobody")
    )
    assert stat.S_IMODE((shared_base / "separate").stat().st_mode) == 0o711
    assert stat.S_IMODE((shared_base / "separate" / "sessions").stat().st_mode) == 0o711


def test_a_worker_that_is_not_root_needs_the_same_user_opt_in(
    shared_base: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """L2: a worker that cannot switch users refuses to run executors as its own uid unless told
    to: `sandbox-controller worker` exits 2 naming CONTROLLER_LOCAL_EXECUTOR_SAME_USER; with the
    opt-in the runner runs them as its own uid; the executor user is never root."""
    for key in [k for k in os.environ if k.startswith("CONTROLLER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CONTROLLER_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("CONTROLLER_API_KEY", CONTROLLER_API_KEY)
    monkeypatch.setenv("CONTROLLER_EXECUTOR_KEY", EXECUTOR_KEY)
    monkeypatch.setenv("CONTROLLER_LOCAL_STATE_DIRECTORY", str(shared_base / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # as an unprivileged worker would be
    assert cli.main(["worker"]) == 2
    assert "CONTROLLER_LOCAL_EXECUTOR_SAME_USER=true" in capsys.readouterr().err
    assert not (shared_base / "state").exists()

    monkeypatch.setenv("CONTROLLER_LOCAL_EXECUTOR_SAME_USER", "true")
    assert wiring.executor_identity(Settings.from_env(os.environ)) is None

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("CONTROLLER_LOCAL_EXECUTOR_SAME_USER")
    monkeypatch.setenv("CONTROLLER_LOCAL_EXECUTOR_USER", "root")
    with pytest.raises(ConfigError, match="is root"):
        wiring.executor_identity(Settings.from_env(os.environ))
    monkeypatch.setenv("CONTROLLER_LOCAL_EXECUTOR_USER", "no-such-user-here")
    with pytest.raises(ConfigError, match="not a user"):
        wiring.executor_identity(Settings.from_env(os.environ))


# -- the state directory must be safe all the way down ----------------------------------------


@requires_root
@pytest.mark.parametrize(
    "flaw",
    [
        "a parent owned by the executor user",
        "a world-writable parent without the sticky bit",
        "a group-writable parent",
        "a symlink on the way into a directory the executor user owns",
    ],
)
def test_a_state_directory_below_a_parent_others_control_is_refused(shared_base: Path, flaw: str) -> None:
    """L2: checking only the state directory's last component let a parent the executor user can
    write be used to swap the directory for a forged one (a ``sandbox.json`` naming a root-owned
    process the controller would then signal). Every directory on the way, as written and as its
    symlinks resolve, must be owned by root or the controller and writable by no one else: the
    runner raises ConfigError and the worker exits 2, naming the directory, creating nothing."""
    nobody = pwd.getpwnam("nobody")
    parent = shared_base / "parent"
    parent.mkdir(mode=0o755)
    state = parent / "state"
    if flaw == "a parent owned by the executor user":
        os.chown(parent, nobody.pw_uid, nobody.pw_gid)
        culprit = parent
    elif flaw == "a world-writable parent without the sticky bit":
        parent.chmod(0o777)
        culprit = parent
    elif flaw == "a group-writable parent":
        parent.chmod(0o775)
        culprit = parent
    else:
        theirs = shared_base / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        (parent / "link").symlink_to(theirs)
        state = parent / "link" / "state"
        culprit = theirs
    with pytest.raises(ConfigError) as raised:
        LocalRunner(state, ["unused"], EXECUTOR_KEY)
    assert any(str(culprit) in problem for problem in raised.value.problems), raised.value.problems
    result = run_worker_cli({"CONTROLLER_LOCAL_STATE_DIRECTORY": str(state)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{culprit} (on the way to the local state directory {state})" in result.stderr
    assert not state.exists()


@requires_root
def test_a_state_directory_under_a_sticky_world_writable_parent_is_accepted(shared_base: Path) -> None:
    """L2: like /tmp (root, 1777), a world-writable parent with the sticky bit is safe: others
    cannot move what they do not own, and the state directory is the controller's. Missing
    parents are created 0755 whatever the umask."""
    sticky = shared_base / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    old = os.umask(0)
    try:
        LocalRunner(sticky / "new" / "state", ["unused"], EXECUTOR_KEY)
    finally:
        os.umask(old)
    assert stat.S_IMODE((sticky / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((sticky / "new" / "state").stat().st_mode) == 0o700


# -- executors beside a Redis without a password ------------------------------------------------


@requires_root
def test_a_worker_refuses_executors_of_another_user_beside_redis_without_a_password(shared_base: Path) -> None:
    """L2: with executors running as another user on the machine, a Redis URL without a password
    would give their code the queue, the leases and the mapping as its admin (the README's own
    example had none): the worker refuses to start (exit 2) naming the opt-out; with a password
    (in the userinfo or as ``?password=``), with the opt-out, or with executors as the worker's
    own uid it gets past the check."""
    state = str(shared_base / "state")
    bare = run_worker_cli({"CONTROLLER_LOCAL_STATE_DIRECTORY": state, "CONTROLLER_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert "CONTROLLER_REDIS_URL has no password while executors run as another user" in bare.stderr
    assert "CONTROLLER_LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD=true" in bare.stderr
    assert "Traceback" not in bare.stderr
    for fine in (
        {"CONTROLLER_REDIS_URL": "redis://:a-password@127.0.0.1:1/0"},
        {"CONTROLLER_REDIS_URL": "unix:///nonexistent/redis.sock?password=a-password"},
        {"CONTROLLER_REDIS_URL": "redis://127.0.0.1:1/0", "CONTROLLER_LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD": "true"},
        {"CONTROLLER_REDIS_URL": "redis://127.0.0.1:1/0", "CONTROLLER_LOCAL_EXECUTOR_SAME_USER": "true"},
    ):
        settings = Settings.from_env({**fine, "CONTROLLER_LOCAL_STATE_DIRECTORY": state})
        assert not [p for p in wiring.local_runner_problems(settings) if "REDIS_URL" in p], fine


# -- one uid per session ---------------------------------------------------------------------------


# The executor, run as its session's uid: writes a file of its own, then (once the test names
# its peer) tries what one session's code would try against another, and reports.
PEER_PROBE = """
import json, os, signal, sys, time
env_id = sys.argv[sys.argv.index("--environment-id") + 1]
with open("history.txt", "a") as history:
    history.write(f"{{env_id}} uid={{os.getuid()}}\\n")
print("ready", flush=True)
targets = {targets!r}
while not os.path.exists(targets):
    time.sleep(0.05)
peer = json.load(open(targets))[env_id]
results = {{"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}}
def attempt(name, action):
    try:
        action()
        results[name] = "allowed"
    except PermissionError:
        results[name] = "denied"
    except OSError as exc:
        results[name] = "error " + exc.__class__.__name__
attempt("list_peer_workspace", lambda: os.listdir(peer["workspace"]))
attempt("read_peer_file", lambda: open(os.path.join(peer["workspace"], "history.txt")).read())
attempt("plant_in_peer_workspace", lambda: open(os.path.join(peer["workspace"], "planted.txt"), "w").write("x"))
attempt("signal_peer", lambda: os.kill(peer["pid"], 0))
attempt("kill_peer", lambda: os.kill(peer["pid"], signal.SIGKILL))
attempt("kill_peer_group", lambda: os.killpg(peer["pid"], signal.SIGKILL))
attempt("peer_environ", lambda: open(f"/proc/{{peer['pid']}}/environ", "rb").read())
attempt("read_own_history", lambda: open("history.txt").read())
print("probe=" + json.dumps(results), flush=True)
time.sleep(120)
"""

# Detaches a child from its session and group (as a sandbox's code could), then waits.
DETACHING_EXECUTOR = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(os.path.join({pids!r}, str(child.pid)), "w").close()
print("ready", flush=True)
time.sleep(120)
"""


class UidWorld:
    """A root runner giving each session a uid of ``uids``; everything stopped and discarded after."""

    def __init__(self, base: Path, uids: UidRange, script: str, **fields: str) -> None:
        self.base, self.uids = base, uids
        self.state = base / "state"
        self.pids = base / "pids"
        self.pids.mkdir(mode=0o777, exist_ok=True)
        self.pids.chmod(0o1777)
        self.script = base / "executor.py"
        self.script.write_text(script.format(pids=str(self.pids), **fields))
        self.script.chmod(0o644)
        self.made: list[LocalRunner] = []

    def runner(self) -> LocalRunner:
        runner = LocalRunner(self.state, [python_for_others(), str(self.script)], EXECUTOR_KEY, run_as=self.uids)
        self.made.append(runner)
        return runner

    def directory(self, session_id: str) -> Path:
        return self.state / "sessions" / session_key(session_id)

    def log(self, session_id: str) -> str:
        try:
            return (self.directory(session_id) / "executor.log").read_text()
        except OSError:
            return ""

    def ready(self, session_id: str, count: int = 1) -> None:
        wait_for(lambda: self.log(session_id).count("ready") >= count, 20, f"{session_id}'s executor to start")

    def close(self) -> None:
        for runner in self.made:
            runner.stop_all()
            for session_id in runner.workspaces():
                runner.discard(session_id)
        wait_for(lambda: all(not live(r) for r in self.made), 10, "every executor to stop", interval=0.05)
        for runner in self.made:
            live(runner)  # reaps the children each one started


def process_uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


@pytest.fixture
def uid_world(shared_base: Path) -> Iterator[Callable[..., UidWorld]]:
    made: list[UidWorld] = []

    def make(script: str, size: int = 8, **fields: str) -> UidWorld:
        world = UidWorld(shared_base, free_uid_range(size), script, **fields)
        made.append(world)
        return world

    try:
        yield make
    finally:
        for world in made:
            world.close()


@requires_root
def test_sessions_run_as_uids_of_their_own_and_cannot_reach_each_other(
    uid_world: Callable[..., UidWorld], shared_base: Path
) -> None:
    """L2: with CONTROLLER_LOCAL_EXECUTOR_UIDS each session's executor runs as a uid of its own
    (gid the same, no supplementary groups), owning its 0700 workspace and home: one session's
    code can neither list, read nor write another's workspace, nor signal or kill its processes,
    nor read their environment; its own files are its own."""
    targets = shared_base / "targets.json"
    world = uid_world(PEER_PROBE, targets=str(targets))
    runner = world.runner()
    a, b = runner.ensure(spec("sess_a", "env_a"), 1), runner.ensure(spec("sess_b", "env_b"), 1)
    world.ready("sess_a")
    world.ready("sess_b")
    uid_a, uid_b = process_uid(pid_of(a)), process_uid(pid_of(b))
    assert uid_a != uid_b and uid_a in world.uids and uid_b in world.uids
    for session_id, uid in (("sess_a", uid_a), ("sess_b", uid_b)):
        for name in ("workspace", "home"):
            info = (world.directory(session_id) / name).stat()
            assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, uid, 0o700)
    peers = {
        "env_a": {"workspace": str(world.directory("sess_b") / "workspace"), "pid": pid_of(b)},
        "env_b": {"workspace": str(world.directory("sess_a") / "workspace"), "pid": pid_of(a)},
    }
    targets.write_text(json.dumps(peers))
    targets.chmod(0o644)

    def probed(session_id: str) -> dict[str, object] | None:
        line = next((x for x in world.log(session_id).splitlines() if x.startswith("probe=")), None)
        return json.loads(line.removeprefix("probe=")) if line else None

    for session_id, uid in (("sess_a", uid_a), ("sess_b", uid_b)):
        results = wait_for(lambda s=session_id: probed(s), 20, "the executor's probe")
        assert results == {
            "uid": uid,
            "gid": uid,
            "groups": [],
            "list_peer_workspace": "denied",
            "read_peer_file": "denied",
            "plant_in_peer_workspace": "denied",
            "signal_peer": "denied",
            "kill_peer": "denied",
            "kill_peer_group": "denied",
            "peer_environ": "denied",
            "read_own_history": "allowed",
        }, results
    assert runner.status(a) is Health.RUNNING and runner.status(b) is Health.RUNNING  # both survived
    assert not (world.directory("sess_a") / "workspace" / "planted.txt").exists()


@requires_root
def test_a_session_keeps_its_uid_across_an_idle_stop_so_its_kept_workspace_stays_usable(
    uid_world: Callable[..., UidWorld], shared_base: Path
) -> None:
    """L11, L16: an idle stop keeps the workspace, whose files the session's uid owns (0600,
    umask 077): the next sandbox of that session runs as the same uid and goes on with them;
    only when the workspace is discarded is the uid free again."""
    world = uid_world(PEER_PROBE, targets=str(shared_base / "never"))
    runner = world.runner()
    first = runner.ensure(spec("sess_a", "env_a"), 1)
    world.ready("sess_a")
    uid = process_uid(pid_of(first))
    runner.release(first)  # the idle stop: the workspace stays
    assert runner.keeps_workspace("sess_a")
    second = runner.ensure(spec("sess_a", "env_a"), 2)
    world.ready("sess_a", count=2)
    assert process_uid(pid_of(second)) == uid
    history = (world.directory("sess_a") / "workspace" / "history.txt").read_text().splitlines()
    assert history == [f"env_a uid={uid}", f"env_a uid={uid}"]  # the second appended to the first's file
    runner.release(second)
    runner.discard("sess_a")
    assert not (world.state / "uids" / str(uid)).exists()


@requires_root
def test_concurrent_workers_give_each_session_one_sandbox_and_one_uid(
    uid_world: Callable[..., UidWorld], shared_base: Path
) -> None:
    """L1: four workers (separate runner instances, threads) ensuring six sessions at once, each
    in its own order: one sandbox per session, each with a uid no other session has."""
    world = uid_world(PEER_PROBE, size=16, targets=str(shared_base / "never"))
    runners = [world.runner() for _ in range(4)]
    sessions = [f"sess_{i}" for i in range(6)]
    barrier = threading.Barrier(len(runners))
    handles: dict[str, set[Handle]] = {s: set() for s in sessions}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(index: int, runner: LocalRunner) -> None:
        barrier.wait()
        order = sessions[index:] + sessions[:index]
        for session_id in order:
            try:
                handle = runner.ensure(spec(session_id, "env_" + session_id), 1)
            except BaseException as exc:
                errors.append(exc)
                continue
            with lock:
                handles[session_id].add(handle)

    threads = [threading.Thread(target=work, args=(i, r)) for i, r in enumerate(runners)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert all(len(found) == 1 for found in handles.values()), handles
    uids = {s: process_uid(pid_of(next(iter(found)))) for s, found in handles.items()}
    assert len(set(uids.values())) == len(sessions) and all(u in world.uids for u in uids.values())
    assert len(live(runners[0])) == len(sessions)


@requires_root
def test_stopping_a_sandbox_stops_what_it_detached_and_a_freed_uid_is_reused_clean(
    uid_world: Callable[..., UidWorld],
) -> None:
    """L17, L2: a process the sandbox detached with ``setsid`` (outside its session and group)
    still runs as the session's uid, so stopping the sandbox stops it too. A uid comes back only
    once released (the workspace discarded) and after the rest of the range; anything still
    running as it is killed before the next session gets it; with every uid held, a new
    session is refused (RunnerRejected), never given a shared one."""
    world = uid_world(DETACHING_EXECUTOR, size=2)
    runner = world.runner()
    a = runner.ensure(spec("sess_a", "env_a"), 1)
    world.ready("sess_a")
    uid_a = process_uid(pid_of(a))
    [detached] = [int(p.name) for p in world.pids.iterdir()]
    assert session_pids(pid_of(a)) == [pid_of(a)] and process_uid(detached) == uid_a  # outside its session
    runner.release(a)
    wait_for(lambda: not Path(f"/proc/{detached}").exists(), 10, "the detached process to be stopped too")

    b = runner.ensure(spec("sess_b", "env_b"), 1)
    uid_b = process_uid(pid_of(b))
    assert uid_b != uid_a  # sess_a still holds its uid: its workspace is kept
    with pytest.raises(RunnerRejected, match="every uid of CONTROLLER_LOCAL_EXECUTOR_UIDS"):
        runner.ensure(spec("sess_c", "env_c"), 1)

    runner.discard("sess_a")  # the uid is free again
    straggler = subprocess.Popen(
        ["sleep", "120"], user=uid_a, group=uid_a, extra_groups=[], start_new_session=True, cwd="/"
    )
    try:
        c = runner.ensure(spec("sess_c", "env_c"), 1)
        assert process_uid(pid_of(c)) == uid_a
        wait_for(lambda: straggler.poll() is not None, 10, "the straggler of the freed uid to be killed")
        assert straggler.returncode == -signal.SIGKILL
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()


@requires_root
def test_an_executor_uid_range_is_checked_at_start(shared_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range that holds an account of this machine (executors would run as that user), a
    worker that is not root, or a range given together with another way of naming the executor
    user is refused at start, naming the setting."""
    for key in [k for k in os.environ if k.startswith("CONTROLLER_")]:
        monkeypatch.delenv(key)
    nobody = pwd.getpwnam("nobody")
    overlapping = Settings.from_env({"CONTROLLER_LOCAL_EXECUTOR_UIDS": f"{nobody.pw_uid}-{nobody.pw_uid + 10}"})
    with pytest.raises(ConfigError, match=r"uid \d+ \(user 'nobody'\)"):
        wiring.executor_identity(overlapping)
    fine = free_uid_range(100)
    settings = Settings.from_env({"CONTROLLER_LOCAL_EXECUTOR_UIDS": f"{fine.first}-{fine.last}"})
    assert wiring.executor_identity(settings) == fine
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(ConfigError, match="needs the worker to run as root"):
        wiring.executor_identity(settings)
