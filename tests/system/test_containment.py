"""A sandbox's processes end with it (issue 37, defect 4), with real parts on loopback: the
receivers, Celery workers, the scheduler, redis-server, the simulator and the real codex.

codex 0.171.0 runs every command in a session of its own, so a command's background process is
never in the executor's session or process group. Whatever it starts — ``setsid nohup``, a
double-forked daemon — must end with the sandbox, also when the executor itself died without a
word (SIGKILL: an OOM kill, a crash) and the controller only finds a dead sandbox to replace.
The workers run as root here, so each sandbox is a cgroup of its own (``runners/local/cgroups.py``).
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

import pytest

from tests.support.processes import wait_for
from tests.support.simulator import run_turn
from tests.system.loop import connected_session, started, workspace_of

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

# A daemon as the textbook makes one: fork, setsid, fork again, leave the workspace.
DAEMON = (
    "import os, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    'os.chdir("/")\n'
    "time.sleep(1000)\n"
)


def marked(mark: str) -> list[int]:
    """Running processes (zombies aside) whose environment carries ``MARK=<mark>``."""
    needle = f"MARK={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def executor_processes(workspace: Path) -> list[int]:
    """The codex processes (the npm launcher and the native binary) serving from ``workspace``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
        except OSError:
            continue
        if b"exec-server" in argv and os.path.basename(argv[0]) not in (b"unshare", b"sh") and cwd == str(workspace):
            found.append(int(entry.name))
    return found


def test_a_commands_detached_processes_end_with_an_executor_that_was_sigkilled(tmp_path: Path) -> None:
    """Issue 37 (4), L17: a command starts ``setsid nohup sleep 1000 &`` and a double-forked
    daemon, then the executor is SIGKILLed (no stop of its own, nothing forwarded). The controller
    finds the sandbox dead and replaces it, killing its cgroup; within a bounded wait no process
    the old sandbox started is left, and the session's new executor serves."""
    with started(tmp_path) as loop:
        sid, environment_id = connected_session(loop)
        workspace = workspace_of(loop, sid)
        mark = secrets.token_hex(6)
        script = (
            f"MARK={mark} setsid nohup sleep 1000 >/dev/null 2>&1 < /dev/null &\n"
            f"MARK={mark} python3 -c '{DAEMON}' >/dev/null 2>&1 < /dev/null &\n"
        )
        turn = run_turn(loop.simulator_url, sid, [["sh", "-c", script]])
        [command] = turn["commands"]
        assert (command["status"], command["exit_code"]) == ("completed", 0), command
        wait_for(lambda: len(marked(mark)) >= 2, 30, "the detached sleep and the daemon to run")

        executor = executor_processes(workspace)
        assert executor, "no codex process found in the workspace"
        for pid in executor:
            os.kill(pid, signal.SIGKILL)  # as the OOM killer does: no signal handler, nothing forwarded

        wait_for(lambda: loop.worker_lines("executor stopped", sid), 90, "the controller to stop the dead sandbox")
        wait_for(lambda: not marked(mark), 15, "every process of the old sandbox to end", interval=0.1)
        wait_for(lambda: loop.environment_status(environment_id) == "connected", 90, "the new executor to connect")
        turn = run_turn(loop.simulator_url, sid, [["true"]])
        assert [(c["status"], c["exit_code"]) for c in turn["commands"]] == [("completed", 0)]
