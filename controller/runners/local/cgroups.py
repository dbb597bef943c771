"""A cgroup (v2) per local sandbox: the kernel's containment of everything a sandbox starts.

codex runs every command in a session of its own, and a command may ``setsid``, double-fork or
daemonize: no process group or session holds what a sandbox started. A cgroup does. Each
sandbox's executor joins its own cgroup before it execs (``join_argv``: a root ``sh`` writes
itself into ``cgroup.procs``, then execs the rest), so every process it or its commands start
is born there, and an unprivileged process cannot move itself out (``cgroup.procs`` of every
cgroup is root's). Stopping a sandbox writes ``1`` to its ``cgroup.kill`` (Linux 5.14): the
kernel SIGKILLs every process in it, also one forked while the kill runs, and ``cgroup.events``
says ``populated 0`` once none is left; the empty cgroup is then removed (``end``).

Where: ``sandbox-controller`` below this process's own cgroup v2 (``0::`` of
``/proc/self/cgroup``) on the cgroup2 mount (``/sys/fs/cgroup`` on a pure v2 host, often
``/sys/fs/cgroup/unified`` on a hybrid one), one cgroup per session named by a hash of the
state directory and the session's key (two workers of one state directory share them; two
state directories on one host never meet). ``parent`` makes it, or says why it cannot: no
cgroup2 mount, not root, a read-only cgroupfs (an unprivileged container), or a kernel
without ``cgroup.kill``; the local runner then falls back to signalling the executor's session
(``processes.py``) and the worker says so at start.

Only the unified hierarchy is used and no controller is enabled (no limits: containment only),
so a parent with processes of its own (the worker's cgroup) may have these children.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

__all__ = [
    "NAME",
    "end",
    "join_argv",
    "members",
    "mount_point",
    "move",
    "own_cgroup",
    "parent",
    "populated",
    "sandbox_cgroup",
    "signal_members",
]

NAME = "sandbox-controller"
"""The directory below this process's own cgroup that holds the sandboxes' cgroups."""
_JOIN = 'echo 0 > "$1" || exit 126; shift; exec env -u PWD "$@"'
"""Run as root: move this shell into the cgroup whose ``cgroup.procs`` is ``$1``, then exec the
rest (sh exports PWD; env takes it out, so the executor's environment is what the runner gave)."""


def mount_point(mounts: str) -> Path | None:
    """The cgroup2 mount in ``/proc/self/mounts``'s text, or None (a host with v1 only)."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def _read_only(mounts: str, where: Path) -> bool:
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and Path(fields[1]) == where:
            return "ro" in fields[3].split(",")
    return False


def own_cgroup(cgroups: str) -> str | None:
    """This process's cgroup v2 path (``0::/a/b`` in ``/proc/self/cgroup``'s text), or None."""
    for line in cgroups.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def parent(make: bool = True) -> tuple[Path | None, str]:
    """Make (if needed) the cgroup that holds the sandboxes' cgroups; (its path, a line saying
    where), or (None, why containment is unavailable here: the runner then falls back).
    ``make=False`` (``check-config``) creates nothing: it says whether the cgroup could be made."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
        mine = own_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return None, f"cannot read this process's cgroups: {exc.strerror}"
    mount = mount_point(mounts)
    if mount is None or mine is None:
        return None, "no cgroup v2 hierarchy is mounted here (cgroup v1 only)"
    if os.geteuid() != 0:
        return None, f"moving executors into cgroups needs the worker to run as root (it runs as uid {os.geteuid()})"
    if _read_only(mounts, mount):
        return None, f"the cgroup v2 hierarchy at {mount} is mounted read-only (an unprivileged container)"
    where = mount / mine.lstrip("/") / NAME
    if not make and not where.exists():
        if not os.access(where.parent, os.W_OK):
            return None, f"cannot create the cgroup {where}: permission denied"
        return where, f"a cgroup per sandbox below {where} (created at the worker's start)"
    try:
        where.mkdir(exist_ok=True)
    except OSError as exc:
        return None, f"cannot create the cgroup {where}: {exc.strerror}"
    if not (where / "cgroup.kill").exists():
        return None, f"this kernel has no cgroup.kill (Linux 5.14 or later needed; {where})"
    return where, f"a cgroup per sandbox below {where}"


def sandbox_cgroup(under: Path, state_directory: Path, key: str) -> Path:
    """The cgroup of the session whose directory in ``state_directory`` is ``key``."""
    state = hashlib.sha256(os.path.realpath(state_directory).encode()).hexdigest()[:8]
    return under / f"{state}.{key}"


def join_argv(cgroup: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` started inside ``cgroup`` (run as root: the join comes before any drop of
    privileges in ``argv``); it exits 126 without starting ``argv`` when the join fails."""
    return ["sh", "-c", _JOIN, "sh", str(cgroup / "cgroup.procs"), *argv]


def move(cgroup: Path, pid: int) -> None:
    """Put ``pid`` into ``cgroup`` now (a process already gone is left alone)."""
    try:
        (cgroup / "cgroup.procs").write_text(str(pid))
    except ProcessLookupError:
        pass


def _tree(cgroup: Path) -> list[Path]:
    """``cgroup`` and every cgroup below it (a sandbox cannot make any; counted all the same)."""
    found = [cgroup]
    with suppress(OSError):
        for entry in os.scandir(cgroup):
            if entry.is_dir(follow_symlinks=False):
                found += _tree(Path(entry.path))
    return found


def members(cgroup: Path) -> list[int]:
    """Pids (as this process sees them) of every process in ``cgroup`` and below; [] when it is
    gone."""
    found: list[int] = []
    for each in _tree(cgroup):
        with suppress(OSError, ValueError):
            found += [int(pid) for pid in (each / "cgroup.procs").read_text().split()]
    return found


def populated(cgroup: Path) -> bool:
    """Whether any process is left in ``cgroup`` or below (``cgroup.events``); False when it is gone."""
    try:
        return "populated 1" in (cgroup / "cgroup.events").read_text()
    except OSError:
        return False


def signal_members(cgroup: Path, sig: int) -> bool:
    """Send ``sig`` to every process in ``cgroup``; False when none was there."""
    pids = members(cgroup)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)
    return bool(pids)


def end(cgroup: Path, wait_seconds: float) -> bool:
    """Kill every process in ``cgroup`` (``cgroup.kill``), wait (at most ``wait_seconds``) until
    none is left, and remove it; True when it is gone (or never was)."""
    if not cgroup.is_dir():
        return True
    with suppress(FileNotFoundError):
        (cgroup / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            for each in reversed(_tree(cgroup)):
                each.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.02)
