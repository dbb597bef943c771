"""Real processes for system tests: started on loopback, logged to files, always stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agents_simulator.waiting import free_port, port_open, wait_for

__all__ = ["Managed", "end_group", "free_port", "port_open", "python_module", "wait_for"]


class Managed:
    """One child process in its own process group, output to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None):
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Managed:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0, repeat_seconds: float | None = None) -> None:
        """SIGTERM to the group; SIGKILL if the process has not exited ``timeout`` seconds later.
        ``repeat_seconds``: send the SIGTERM again at that interval meanwhile, for a process that
        drops a SIGTERM it cannot act on yet rather than acting on it later (redis-server)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        deadline = time.monotonic() + timeout
        try:
            while True:
                os.killpg(self.proc.pid, signal.SIGTERM)
                left = deadline - time.monotonic()
                try:
                    self.proc.wait(timeout=max(0.0, min(left, repeat_seconds or left)))
                    return
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass

    def log_lines(self) -> list[dict[str, object]]:
        """The JSON lines this process wrote (other lines skipped)."""
        lines = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(raw))
        return lines

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def end_group(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """End a process started in its own group: SIGTERM to the group, wait for the leader, then
    SIGKILL to the group for anything left in it (children that outlived their leader)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def processes_under(directory: Path) -> list[str]:
    """Running processes whose working directory, command line or environment lies under
    ``directory`` (executors run in their workspace with HOME beside it), as "pid: command"."""
    needle = str(directory).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat[stat.rindex(")") + 2] in "ZX":
                continue
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            cwd = os.readlink(proc / "cwd").encode()
        except OSError:
            continue
        if needle in cmdline or needle in environ or cwd.startswith(needle):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
            found.append(f"{proc.name}: {command}")
    return found


def assert_no_process_left(directory: Path, timeout: float = 15.0) -> None:
    """Fail (after killing them) if processes of ``directory`` remain after a bounded wait."""
    deadline = time.monotonic() + timeout
    while (left := processes_under(directory)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for entry in left:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)
    assert not left, f"processes left running under {directory}: {left}"
