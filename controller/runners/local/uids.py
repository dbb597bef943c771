"""Who the local runner's executors run as: one user for all (``RunAs``:
``CONTROLLER_LOCAL_EXECUTOR_USER``), or one uid per session (``UidRange``, ``UidClaims``:
``CONTROLLER_LOCAL_EXECUTOR_UIDS``).

Executors of different sessions run as different uids, so one session's code can neither
read another's workspace (0700, owned by its uid) nor signal its processes. A session keeps
its uid from its first sandbox until its workspace is discarded: an idle stop keeps the
workspace, whose files the uid owns, so the next sandbox of that session runs as the same
uid and finds them usable.

The claims live in the runner's state directory, so every worker on the machine (several
processes, L1) shares them::

    uids/lock         flock'ed around every claim and release (one allocation at a time)
    uids/next         where the next search for a free uid starts
    uids/<uid>        a claim: the session key holding that uid
    uids/s-<key>      the same claim, found by session key

A search starts after the uid handed out last and wraps around the range, so a released uid
is handed out again only once every other free uid has been; before it is, any process
still running as it (something the old sandbox detached with ``setsid``) is killed. Files
such a process left outside its workspace and home (in ``/tmp``, say) are not removed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from controller import files, logs
from controller.errors import RunnerRejected

log = logs.get(__name__)

_KILL_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user executors run as (the runner must be root to switch to it)."""

    uid: int
    gid: int
    name: str


@dataclass(frozen=True)
class UidRange:
    """The uids executors may run as, ``first`` to ``last`` inclusive (each with gid = uid and
    no supplementary groups)."""

    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last


def uid_processes(uid: int) -> list[int]:
    """Pids of the running processes (zombies aside: they hold nothing and their parent reaps
    them) whose real, effective, saved or filesystem uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _has_uid(int(entry.name), uid):
            found.append(int(entry.name))
    return found


def _has_uid(pid: int, uid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process with ``uid`` among its uids."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (OSError, ValueError):
        return False
    if status.get("State", "").split()[:1] in (["Z"], ["X"]):
        return False
    return str(uid) in status.get("Uid", "").split()


def signal_uid(uid: int, sig: int) -> bool:
    """Send ``sig`` to every process running as ``uid``; False when there is none. Each is
    signalled through a pidfd opened *before* its uid is checked again, so a pid recycled
    meanwhile by another user's process is never signalled."""
    found = False
    for pid in uid_processes(uid):
        try:
            descriptor = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:
            if _has_uid(pid, uid):  # the process the pidfd pins is still one of uid's
                found = True
                with suppress(ProcessLookupError):
                    signal.pidfd_send_signal(descriptor, sig)
        finally:
            os.close(descriptor)
    return found


def kill_uid(uid: int) -> list[int]:
    """SIGKILL every process of ``uid`` until none is left (bounded); the pids still there."""
    deadline = time.monotonic() + _KILL_WAIT_SECONDS
    while signal_uid(uid, signal.SIGKILL) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = uid_processes(uid)
    if left:
        log.warning("processes of a released executor uid survived SIGKILL", extra={"uid": uid, "pids": left})
    return left


class UidClaims:
    """The claims of ``uids`` kept under ``directory`` (created 0700 by the runner, which owns it)."""

    def __init__(self, directory: Path, uids: UidRange) -> None:
        self._dir = directory
        self.uids = uids
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)

    def uid_of(self, key: str) -> int | None:
        """The uid ``key`` holds, if any."""
        uid = self._read_int(self._dir / f"s-{key}")
        if uid is None or uid not in self.uids or self._read(self._dir / str(uid)) != key:
            return None
        return uid

    def claim(self, key: str) -> int:
        """The uid ``key`` holds, or a free one claimed for it now (a freshly claimed uid has no
        process left running as it). Raises RunnerRejected when every uid is held."""
        with self._locked():
            held = self.uid_of(key)
            if held is not None:
                return held
            cursor = self._read_int(self._dir / "next")
            start = cursor if cursor is not None and cursor in self.uids else self.uids.first
            for offset in range(self.uids.size):
                uid = self.uids.first + (start - self.uids.first + offset) % self.uids.size
                if (self._dir / str(uid)).exists():
                    continue
                kill_uid(uid)  # a process the last holder detached must not meet the next one
                # The session's record first: a crash between the two leaves no claim behind
                # (the uid stays free), never a claim no session knows about.
                self._write(self._dir / f"s-{key}", str(uid))
                self._write(self._dir / str(uid), key)
                following = uid + 1 if uid < self.uids.last else self.uids.first
                self._write(self._dir / "next", str(following))
                log.info("executor uid claimed", extra={"uid": uid})
                return uid
        raise RunnerRejected(
            f"every uid of CONTROLLER_LOCAL_EXECUTOR_UIDS ({self.uids.first}-{self.uids.last}) is held by a "
            "session with a sandbox or a kept workspace: widen the range (or shorten the workspace retention)"
        )

    def release(self, key: str) -> int | None:
        """Give back the uid ``key`` holds (its workspace is gone); kill whatever still runs as it."""
        with self._locked():
            uid = self.uid_of(key)
            (self._dir / f"s-{key}").unlink(missing_ok=True)
            if uid is None:
                return None
            kill_uid(uid)
            (self._dir / str(uid)).unlink(missing_ok=True)
        log.info("executor uid released", extra={"uid": uid})
        return uid

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with files.locked(self._dir / "lock"):
            yield

    @staticmethod
    def _read(path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except OSError:
            return None

    def _read_int(self, path: Path) -> int | None:
        text = self._read(path)
        return int(text) if text is not None and text.isdigit() else None

    @staticmethod
    def _write(path: Path, text: str) -> None:
        partial = path.with_name(path.name + ".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.replace(partial, path)
