"""The local-process runner: one executor child process per session, on this machine.

Layout under the state directory::

    sessions/<key>/lock           flock'ed around every change of this session's process
    sessions/<key>/sandbox.json   {"session_id", "generation", "pid", "start_ticks", "name"}
    sessions/<key>/workspace/     the executor's working directory (the session's workspace)
    sessions/<key>/executor.log   its stdout and stderr

The executor runs in its own process group (``start_new_session``) so it outlives a worker
that dies, and is found again through ``sandbox.json``: a pid counts as the sandbox only if
``/proc/<pid>/stat`` shows the same start time and the process is not a zombie. Under the
lock, ``ensure`` starts a process only when no live one exists for the session, so two
workers (or a worker and its redelivered job) can never start a second one (L1).

Its environment is built from scratch: PATH, HOME and CODEX_API_KEY (the environment key,
L2); the controller's own variables (its API key among them) never reach it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from controller import logs
from controller.errors import RunnerRejected
from controller.model import Handle, Health, SandboxSpec
from controller.runners.base import checked

log = logs.get(__name__)

_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_STOP_WAIT_SECONDS = 5.0


def session_key(session_id: str) -> str:
    """A directory name for a session: readable prefix plus a hash (ids are not path-safe)."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:10]
    return f"{_SAFE.sub('_', session_id)[:40]}-{digest}"


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks, or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


class LocalRunner:
    def __init__(
        self,
        state_directory: str | Path,
        executor_command: Sequence[str],
        executor_key: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self._root = Path(state_directory) / "sessions"
        self._root.mkdir(parents=True, exist_ok=True)
        self._command = list(executor_command)
        self._key = executor_key
        self._extra_env = dict(extra_env or {})
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        directory = self._root / session_key(spec.session_id)
        with self._locked(directory):
            current = self._read(directory)
            if current is not None and self._alive(current):
                return current
            return self._spawn(directory, spec, generation)

    def status(self, handle: Handle) -> Health:
        self._reap()
        directory = self._root / session_key(handle.session_id)
        current = self._read(directory)
        if current is None or current.uid != handle.uid:
            return Health.GONE
        return Health.RUNNING if self._alive(current) else Health.FAILED

    def release(self, handle: Handle) -> None:
        directory = self._root / session_key(handle.session_id)
        with self._locked(directory):
            current = self._read(directory)
            if current is None or current.uid != handle.uid:
                return  # already gone, or a newer sandbox: not ours to stop
            self._stop(current)
            (directory / "sandbox.json").unlink(missing_ok=True)
        log.info("executor stopped", extra={"session_id": handle.session_id, "sandbox": handle.name})

    def find(self, session_id: str) -> Handle | None:
        self._reap()
        current = self._read(self._root / session_key(session_id))
        return current if current is not None and self._alive(current) else None

    def discard(self, session_id: str) -> None:
        """Remove the session's workspace once it is released for good (L16)."""
        directory = self._root / session_key(session_id)
        with self._locked(directory):
            if self._read(directory) is None:
                shutil.rmtree(directory / "workspace", ignore_errors=True)
                shutil.rmtree(directory / "home", ignore_errors=True)

    def keeps_workspace(self, session_id: str) -> bool:
        return (self._root / session_key(session_id) / "workspace").is_dir()

    def workspaces(self) -> list[str]:
        """Sessions whose workspace directory is still here (removed by ``discard``)."""
        found = []
        for directory in sorted(self._root.glob("*")):
            try:
                if (directory / "workspace").is_dir():
                    found.append((directory / "session").read_text())
            except OSError:
                continue
        return found

    def list_managed(self) -> list[Handle]:
        handles = []
        for directory in sorted(self._root.glob("*")):
            handle = self._read(directory)
            if handle is not None:
                handles.append(handle)
        return handles

    # -- helpers --------------------------------------------------------------------------

    def live(self) -> list[Handle]:
        """Sandboxes whose process is alive (tests and the dev view count these)."""
        self._reap()
        return [h for h in self.list_managed() if self._alive(h)]

    def stop_all(self) -> None:
        """Stop every executor (dev mode's Ctrl-C; test clean-up)."""
        for handle in self.list_managed():
            self.release(handle)

    @contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self, directory: Path) -> Handle | None:
        try:
            data = json.loads((directory / "sandbox.json").read_text())
        except (OSError, ValueError):
            return None
        return Handle(
            session_id=data["session_id"],
            name=data["name"],
            generation=int(data["generation"]),
            uid=f"{data['pid']}:{data['start_ticks']}",
            environment_id=data.get("environment_id", ""),
            created_at=float(data.get("created_at", 0.0)),
        )

    def _alive(self, handle: Handle) -> bool:
        pid, _, ticks = handle.uid.partition(":")
        return _start_ticks(int(pid)) == int(ticks)

    def _spawn(self, directory: Path, spec: SandboxSpec, generation: int) -> Handle:
        workspace = directory / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        home = directory / "home"
        home.mkdir(exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(home),
            "CODEX_API_KEY": self._key,
            "SANDBOX_WORKSPACE": spec.workspace_directory,
            **self._extra_env,
        }
        argv = [
            *self._command,
            "exec-server",
            "--remote",
            spec.remote_url,
            "--environment-id",
            spec.environment_id,
        ]
        try:
            with open(directory / "executor.log", "ab") as output:
                child = subprocess.Popen(
                    argv,
                    cwd=workspace,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            raise RunnerRejected(f"cannot start the executor {self._command[0]!r}: {exc.strerror}") from exc
        self._children[child.pid] = child
        created_at = time.time()
        ticks = _start_ticks(child.pid) or 0
        (directory / "session").write_text(spec.session_id)
        name = f"executor-{session_key(spec.session_id)}-g{generation}"
        (directory / "sandbox.json").write_text(
            json.dumps(
                {
                    "session_id": spec.session_id,
                    "generation": generation,
                    "pid": child.pid,
                    "start_ticks": ticks,
                    "name": name,
                    "environment_id": spec.environment_id,
                    "created_at": created_at,
                }
            )
        )
        log.info(
            "executor process started",
            extra={"session_id": spec.session_id, "pid": child.pid, "generation": generation},
        )
        return Handle(
            session_id=spec.session_id,
            name=name,
            generation=generation,
            uid=f"{child.pid}:{ticks}",
            environment_id=spec.environment_id,
            created_at=created_at,
        )

    def _stop(self, handle: Handle) -> None:
        pid = int(handle.uid.partition(":")[0])
        if not self._alive(handle):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + _STOP_WAIT_SECONDS
        while time.monotonic() < deadline:
            self._reap()
            if not self._alive(handle):
                return
            time.sleep(0.05)
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]
