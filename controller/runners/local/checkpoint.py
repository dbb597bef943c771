"""Suspend with memory: a sandbox's whole process tree checkpointed to disk with CRIU, and
restored from there (issue 29; the local runner's ``CONTROLLER_IDLE_SUSPEND=checkpoint``).

**The sandbox runs in a pid namespace of its own** (``pid_namespace_argv``): ``unshare --pid
--fork`` (as root) forks the namespace's pid 1, which ``setsid`` makes a session leader (so
the whole tree, the session included, is inside what is dumped); pid 1 is a second, plain
``unshare --fork``, still root, that only forks the executor and waits for it, exiting with it.
The executor, pid 2, drops to its uid with ``setpriv``, and a one-line ``sh`` joins its stderr
to its stdout, the log. Pid 1 stays root because CRIU's parasite code, run inside the root task
of the dump, mounts a /proc for the namespace, which an unprivileged task may not do (dumping
a namespace whose pid 1 is the executor's uid fails: "Can't create a directory (-13)", "Can't
get proc fd"); being no executor, it also passes on no signal semantics of a pid 1 (the
executor gets SIGTERM as any process does). The ``unshare`` processes' own stderr goes
nowhere: they complain into it when a child dies (at every dump), and CRIU refuses to restore
a file whose size changed since. Orphans of the sandbox (a command that left with ``setsid
-f``) are re-parented to pid 1 and stay in the tree; pid 1 does not reap them, so one that ends
stays a zombie until the sandbox does. A restored tree gets a new pid namespace, so its pids
are always free there: no clash with whatever took the old numbers meanwhile.

**Dump** (``dump``): ``criu dump -t <pid 1 of the namespace>`` writes the images and kills the
tree (nothing of the sandbox runs after it; its memory is freed). Established TCP connections
are not kept (``--tcp-close``): the executor reconnects by itself, as after any lost link (L14).

**The reconnect after a restore** (issue 37): codex 0.171.0 waits a backoff before each
reconnect that grows with every drop (about 1, 2, 3–5, 6–8, 10–15, then 15–30 s) and is never
reset, not by a link up for 70 s nor by a new registration (measured: RELIABILITY.md). Dumped
with its link up, each restore made it see one more drop, and wait longer than the last time.
So the runner shuts the executor's link down just before the dump (``close_links``): the
executor is dumped asleep in its backoff, and the restore moves the sandbox's clocks on
(``advance_clocks``; the sandbox has a time namespace of its own) by as long as it was
suspended and at least ``CLOCK_CATCH_UP_SECONDS`` (``suspend.py``), more than codex's
longest backoff: the restored executor finds its backoff over and reconnects at once, however
many suspensions came before and however short they were. What every process of the sandbox
sees: its monotonic and boot-time clocks jump by that much at each restore (a ``sleep`` due
meanwhile ends at once); wall-clock time is the host's.

**Restore** (``restore``):
``criu restore --restore-detached`` brings the tree back and returns the new outer pid of its
first process; the images are then removed by the caller. Errors are ``CheckpointFailed`` with
the reason (the end of CRIU's log): the caller falls back to a fresh start. The dump records each
image's size (``manifest.json``; ``advance_clocks``, which rewrites the time namespace's image,
records its new size), and a restore refuses images of another size at once (a disk that
filled during the dump, a cut file: CRIU 4.2.1 given a cut pages image restores a task that
spins for good instead of failing). A restore is given up after ``restore_bound`` (a base plus
a share per MiB of images) or when CRIU fails: CRIU and every process it restored are killed,
nothing is left running. With the sandbox's cgroup (``cgroups.py``), CRIU runs in it,
so its ``cgroup.kill`` ends CRIU and the whole tree; without one, each task CRIU forked (pid 1
of the restored pid namespace, whose death ends the rest of it) and CRIU are SIGKILLed.

**Room** (``Room``, ``refusal``): images live on the state directory's volume, beside the live
sessions' workspaces. Before a dump the runner estimates the image from the tree's memory
(``tree_memory``: each process's anonymous and shared resident pages and its swap, an upper
bound of what CRIU writes) and makes no dump that would take the sum of images past
``max_percent`` of the volume's size (``cap``) or leave less than ``reserve_percent`` of it free
(``reserve``); the same check runs on the written images (``refusal`` with their real size), which
are removed when they pass it after all. An image that does not fit is not written: the sandbox
is stopped the ordinary way and keeps its workspace; images already there are never dropped for
it (docs/lifecycle.md: the rule and its cost).

``host_can_checkpoint`` runs ``criu check``: whether this host can checkpoint at all, with the
reason in one line (``check-config`` prints it).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from controller.runners.local import cgroups
from controller.runners.local.procfs import start_ticks

__all__ = [
    "CheckpointFailed",
    "Dumped",
    "Room",
    "advance_clocks",
    "close_links",
    "drop_argv",
    "dump",
    "has_sys_resource",
    "host_can_checkpoint",
    "image_size",
    "namespace_processes",
    "pid_namespace_argv",
    "refusal",
    "restore",
    "restore_bound",
    "tree_memory",
    "volume",
]

_CHECK_SECONDS = 30.0
_DUMP_SECONDS = 120.0
_RESTORE_BASE_SECONDS = 5.0
_RESTORE_SECONDS_PER_MIB = 0.05
_MIB = 1 << 20
_GONE_WAIT_SECONDS = 5.0
MANIFEST = "manifest.json"
"""Beside the images: each image file's size as the dump wrote it (``{name: bytes}``)."""


class CheckpointFailed(Exception):
    """CRIU could not dump or restore; the message says why (the end of its log)."""


@dataclass(frozen=True)
class Dumped:
    seconds: float
    size_bytes: int


def resolve(binary: str) -> str | None:
    """The CRIU binary's path (``CONTROLLER_CRIU``: a path, or a name looked up on PATH)."""
    if os.sep in binary:
        return binary if os.access(binary, os.X_OK) else None
    return shutil.which(binary)


def host_can_checkpoint(binary: str) -> tuple[bool, str]:
    """Whether CRIU runs here (``criu check``), and why in one line."""
    path = resolve(binary)
    if path is None:
        return False, f"{binary!r} not found (build it with scripts/criu.sh, then set CONTROLLER_CRIU)"
    if os.geteuid() != 0:
        return False, "checkpointing needs root (CRIU reads and rebuilds other processes)"
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=_CHECK_SECONDS)
        checked = subprocess.run([path, "check"], capture_output=True, text=True, timeout=_CHECK_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{path}: {exc}"
    first = (version.stdout.strip().splitlines() or ["unknown version"])[0]
    if checked.returncode != 0:
        errors = [line for line in (checked.stdout + checked.stderr).splitlines() if "Error" in line]
        return False, f"{path} ({first}): criu check failed: {(errors or ['exit ' + str(checked.returncode)])[-1]}"
    if not has_sys_resource():
        return True, (
            f"{path} ({first}): criu check passed, but without CAP_SYS_RESOURCE CRIU cannot read another uid's "
            "rlimits: only executors of this uid (CONTROLLER_LOCAL_EXECUTOR_SAME_USER=true) can be checkpointed; "
            "others fail to dump and are stopped instead"
        )
    return True, f"{path} ({first}): criu check passed"


_CAP_SYS_RESOURCE = 24


def has_sys_resource() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE: CRIU reads each process's rlimits with
    prlimit(2), which for another uid's process needs it (root lacks it in some containers)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError):
        pass
    return False


def drop_argv(identity: tuple[int, int]) -> list[str]:
    """The prefix that runs the rest of an argv as ``identity`` (uid, gid), with no supplementary groups."""
    return ["setpriv", f"--reuid={identity[0]}", f"--regid={identity[1]}", "--clear-groups", "--"]


def pid_namespace_argv(argv: Sequence[str], identity: tuple[int, int] | None) -> list[str]:
    """``argv`` run as pid 2 of a new pid namespace (pid 1: a root ``unshare --fork`` waiting
    for it, session leader there), and of a new time namespace where the kernel has them, as
    ``identity`` (uid, gid; None: this process's own), its stderr joined to its stdout."""
    drop = [] if identity is None else drop_argv(identity)
    redirect = ["sh", "-c", 'exec "$@" 2>&1', "sh"]
    time = ["--time"] if Path("/proc/self/ns/time").exists() else []  # its clocks, moved on at restore
    return ["unshare", "--pid", *time, "--fork", "--", "setsid", "unshare", "--fork", "--", *drop, *redirect, *argv]


def image_size(images: Path) -> int:
    """Bytes of the checkpoint's images (0: none)."""
    try:
        return sum(entry.stat().st_size for entry in images.iterdir() if entry.is_file())
    except OSError:
        return 0


@dataclass(frozen=True)
class Room:
    """What the state volume holds for checkpoints: its size and free bytes (``volume``), and
    the sum of every checkpoint's images on it now."""

    size_bytes: int
    free_bytes: int
    images_bytes: int


def volume(path: Path) -> tuple[int, int]:
    """(size, free bytes an unprivileged writer may use) of the filesystem holding ``path``."""
    found = os.statvfs(path)
    return found.f_blocks * found.f_frsize, found.f_bavail * found.f_frsize


def refusal(room: Room, image_bytes: int, max_percent: float, reserve_percent: float) -> str | None:
    """Why an image of ``image_bytes`` must not be (or stay) written, or None when it fits:
    ``cap`` (every image together would pass ``max_percent`` of the volume) or ``reserve`` (less
    than ``reserve_percent`` of the volume would be left free for live workspaces). ``room``
    counts neither the image nor its space as used yet."""
    if room.images_bytes + image_bytes > room.size_bytes * max_percent / 100:
        return "cap"
    if room.free_bytes - image_bytes < room.size_bytes * reserve_percent / 100:
        return "reserve"
    return None


def namespace_processes(leader: int) -> list[int]:
    """Every process in the pid namespace whose pid 1 is ``leader`` (as seen here): the tree a
    dump writes, processes that left the executor's session (``setsid``) included."""
    try:
        namespace = os.readlink(f"/proc/{leader}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == namespace:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


_MEMORY_FIELDS = ("RssAnon:", "RssShmem:", "VmSwap:")


def tree_memory(pids: Sequence[int]) -> int:
    """Bytes of memory of ``pids`` an image holds at most: anonymous and shared resident pages
    and swap, each process counted whole (pages shared after a fork counted in each: an upper
    bound), plus 1 MiB per process for what CRIU writes beside the pages."""
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        total += 2**20 + sum(int(line.split()[1]) * 1024 for line in lines if line.startswith(_MEMORY_FIELDS))
    return total


_ESTABLISHED = "01"
_PIDFD_GETFD = 438  # the syscall's number on x86-64 and arm64 alike (Linux 5.6)


def _established_sockets() -> set[int]:
    """Inodes of the TCP sockets established in this network namespace (the sandbox's)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _ESTABLISHED:
                found.add(int(fields[9]))
    return found


def close_links(pids: Sequence[int], executable: str) -> int:
    """Shut down every established TCP connection the processes of ``pids`` running
    ``executable`` (a file name: the executor's own processes, not the commands it runs) hold:
    the executor's link to the API, and its registration's keep-alive connection. Each is taken
    with ``pidfd_getfd`` and shut down both ways, so the executor sees its link lost now, as
    after any drop (L14), and sleeps its reconnect backoff; the number shut down."""
    established = _established_sockets()
    libc = ctypes.CDLL(None, use_errno=True)
    closed = 0
    for pid in pids:
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) != executable:
                continue
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in descriptors:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if not target.startswith("socket:[") or int(target[8:-1]) not in established:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                copy = libc.syscall(_PIDFD_GETFD, pidfd, int(name), 0)
                if copy < 0:
                    continue
                with socket.socket(fileno=copy) as taken:
                    taken.shutdown(socket.SHUT_RDWR)
                closed += 1
            except OSError:
                continue
            finally:
                os.close(pidfd)
    return closed


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _advanced_timespec(data: bytes, seconds: int) -> bytes:
    """A ``timespec`` message (1: tv_sec, 2: tv_nsec, varints) with ``seconds`` added to tv_sec."""
    out, at = bytearray(), 0
    while at < len(data):
        key, at = _varint(data, at)
        value, at = _varint(data, at)
        out += _encode_varint(key) + _encode_varint(value + seconds if key >> 3 == 1 else value)
    return bytes(out)


def advance_clocks(images: Path, seconds: int) -> bool:
    """Move the monotonic and boot-time clocks of the checkpoint's time namespace forward by
    ``seconds``: CRIU restores that namespace's clocks where they stood at the dump, so without
    this the tree sees no time pass while suspended. False when the checkpoint has no time
    namespace image (or an unreadable one): its clocks are then left as they are."""
    for image in images.glob("timens-*.img"):
        raw = image.read_bytes()
        if len(raw) < 12:
            return False
        size = int.from_bytes(raw[8:12], "little")
        entry, out, at = raw[12 : 12 + size], bytearray(), 0
        try:
            while at < len(entry):
                key, at = _varint(entry, at)
                length, at = _varint(entry, at)
                field = entry[at : at + length]
                at += length
                if key & 7 != 2:
                    return False
                field = _advanced_timespec(field, seconds)  # 1: monotonic, 2: boottime
                out += _encode_varint(key) + _encode_varint(len(field)) + field
        except IndexError:
            return False
        intact = _recorded(images).get(image.name) == len(raw)  # (else the restore refuses it)
        image.write_bytes(raw[:8] + len(out).to_bytes(4, "little") + bytes(out) + raw[12 + size :])
        if intact:
            _record_size(images, image.name)
        return True
    return False


def _log_tail(log: Path, lines: int = 3) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    errors = [line.strip() for line in text if "Error" in line and "RLIMIT_NOFILE" not in line]
    return "; ".join((errors or text)[-lines:])


def dump(binary: str, pid: int, images: Path) -> Dumped:
    """Checkpoint the tree rooted at ``pid`` (pid 1 of its namespace) into ``images`` (created
    0700, emptied first); the tree is gone afterwards."""
    path = resolve(binary)
    if path is None:
        raise CheckpointFailed(f"{binary!r} not found")
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(mode=0o700, parents=True)
    started = time.monotonic()
    # Run in the images directory, named "." (CRIU binds unix sockets to paths in its work
    # directory, and a long path overflows their 108 bytes: "Can't sent fd 0 to 2").
    argv = [path, "dump", "-t", str(pid), "-D", ".", "-W", ".", "--tcp-close", "--file-locks"]
    try:
        done = subprocess.run(
            [*argv, "-v2", "-o", "dump.log"], capture_output=True, text=True, timeout=_DUMP_SECONDS, cwd=images
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckpointFailed(f"criu dump: {exc}") from exc
    if done.returncode != 0:
        raise CheckpointFailed(f"criu dump exited {done.returncode}: {_log_tail(images / 'dump.log')}")
    (images / MANIFEST).write_text(json.dumps(_sizes(images)))
    return Dumped(seconds=time.monotonic() - started, size_bytes=image_size(images))


def _sizes(images: Path) -> dict[str, int]:
    """Each image file's size in bytes, by name."""
    return {entry.name: entry.stat().st_size for entry in images.iterdir() if entry.name.endswith(".img")}


def _recorded(images: Path) -> dict[str, int]:
    """The manifest's sizes ({} without a readable one)."""
    try:
        recorded = json.loads((images / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _record_size(images: Path, name: str) -> None:
    """Record ``name``'s size now in the manifest (an image the runner itself rewrote)."""
    recorded = _recorded(images)
    recorded[name] = (images / name).stat().st_size
    (images / MANIFEST).write_text(json.dumps(recorded))


def _check_manifest(images: Path) -> None:
    """``CheckpointFailed`` when an image is missing, added or not the size the dump wrote (a
    disk that filled, a cut file): CRIU given such images may never finish. A checkpoint from
    before the manifest (none there) is not checked."""
    if not (images / MANIFEST).exists():
        return
    recorded = _recorded(images)
    if not recorded:
        raise CheckpointFailed("the checkpoint's manifest is unreadable")
    found = _sizes(images)
    for name in sorted(set(recorded) | set(found)):
        if recorded.get(name) != found.get(name):
            raise CheckpointFailed(
                f"image {name} is {found.get(name, 'missing')} bytes on disk, {recorded.get(name, 'absent')} "
                "at the dump: cut or changed since"
            )


def restore_bound(size_bytes: int) -> float:
    """Seconds a restore of ``size_bytes`` of images is given before it is given up: a base plus
    a share per MiB (docs/lifecycle.md: the trade)."""
    return _RESTORE_BASE_SECONDS + _RESTORE_SECONDS_PER_MIB * size_bytes / _MIB


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _end_restore(criu: subprocess.Popen[bytes], roots: dict[int, int], cgroup: Path | None) -> None:
    """Kill a restore that is given up, and all it restored; return once they are gone (bounded).
    In the sandbox's cgroup: ``cgroup.kill`` (CRIU and every task it made). Otherwise each root
    task CRIU forked (``roots``: pid to start ticks) is pid 1 of the restored pid namespace, whose
    SIGKILL makes the kernel kill the rest of the namespace."""
    if cgroup is not None:
        with suppress(OSError):
            (cgroup / "cgroup.kill").write_text("1")
    for pid, ticks in roots.items():
        if start_ticks(pid) == ticks:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if criu.poll() is None:
        criu.kill()
    with suppress(subprocess.TimeoutExpired):
        criu.wait(timeout=_GONE_WAIT_SECONDS)
    deadline = time.monotonic() + _GONE_WAIT_SECONDS
    while time.monotonic() < deadline:
        if not any(start_ticks(pid) == ticks for pid, ticks in roots.items()) and not (
            cgroup is not None and cgroups.populated(cgroup)
        ):
            return
        time.sleep(0.01)


def restore(binary: str, images: Path, cgroup: Path | None = None) -> int:
    """Restore the tree checkpointed in ``images``, detached; its first process's pid (as this
    process sees it). With ``cgroup``, CRIU runs in it and leaves the cgroups alone
    (``--manage-cgroups=ignore``), so every process it restores is born in that cgroup. Images
    that are not as the dump wrote them are refused at once; a restore that has not finished
    within ``restore_bound`` of the images' size, or that fails, is given up: CRIU and every
    process it restored are killed before ``CheckpointFailed`` is raised."""
    path = resolve(binary)
    if path is None:
        raise CheckpointFailed(f"{binary!r} not found")
    if not (images / "inventory.img").is_file():
        raise CheckpointFailed(f"no checkpoint in {images}")
    _check_manifest(images)
    bound = restore_bound(image_size(images))
    pidfile = images / "restored.pid"
    pidfile.unlink(missing_ok=True)
    argv = [path, "restore", "-D", ".", "-W", ".", "--tcp-close", "--file-locks", "--restore-detached"]
    argv += ["--pidfile", pidfile.name, "-v2", "-o", "restore.log"]
    if cgroup is not None:
        argv = cgroups.join_argv(cgroup, [*argv, "--manage-cgroups=ignore"])
    try:
        criu = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=images
        )
    except OSError as exc:
        raise CheckpointFailed(f"criu restore: {exc}") from exc
    roots: dict[int, int] = {}  # the tasks CRIU forked (pid: start ticks): what to kill if it fails
    deadline = time.monotonic() + bound
    while criu.poll() is None and time.monotonic() < deadline:
        for child in _children(criu.pid):
            if child not in roots and (ticks := start_ticks(child)) is not None:
                roots[child] = ticks
        time.sleep(0.01)
    if criu.returncode is None:
        _end_restore(criu, roots, cgroup)
        raise CheckpointFailed(
            f"criu restore did not finish within {bound:.1f}s (given up, what it restored killed): "
            f"{_log_tail(images / 'restore.log')}"
        )
    if criu.returncode != 0:
        _end_restore(criu, roots, cgroup)
        raise CheckpointFailed(f"criu restore exited {criu.returncode}: {_log_tail(images / 'restore.log')}")
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError) as exc:
        _end_restore(criu, roots, cgroup)  # a tree nothing would know of
        raise CheckpointFailed(f"criu restore left no pid file: {exc}") from exc
