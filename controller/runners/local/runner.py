"""The local-process runner: one executor child process per session, on this machine.

Layout under the state directory (created by this runner, owned by its uid, never group- or
world-writable; a directory that is not is refused with ``ConfigError``, and so is one any
directory on the way to which another user could replace: see ``state_directory_problems``)::

    sessions/<key>/lock           flock'ed around every change of this session's process
    sessions/<key>/sandbox.json   {"session_id", "generation", "pid", "pgid", "start_ticks", "name", …}
    sessions/<key>/workspace/     the executor's working directory (the session's workspace)
    sessions/<key>/home/          the executor's $HOME
    sessions/<key>/executor.log   its stdout and stderr (opened by the runner; the executor only
                                  holds the descriptor)
    sessions/<key>/checkpoint/    a suspended sandbox's CRIU images (0700, root's; see below)
    uids/                         with a uid per session: who holds which uid (``runners/local/uids.py``)

**A sandbox is a cgroup** (``runners/local/cgroups.py``; workers as root). The executor is the
leader of a new session and process group (``start_new_session``) and joins the session's
cgroup before it execs (``cgroups.join_argv``; the runner moves it too before ``ensure``
returns), so everything it starts (the npm launcher's native ``codex``, the commands that one
runs, whatever they ``setsid``, double-fork or daemonize) is born in that cgroup and cannot
leave it without root. ``sandbox.json`` records the cgroup; ``find``, ``live``, ``processes``
and ``release`` act on every process in it (``cgroup.procs``).

**Without cgroups** (``contained`` False: a worker that is not root, a read-only cgroup
hierarchy; ``containment`` says why, and the worker logs it at start) a sandbox is its leader's
session: processes whose session id (field 6 of ``/proc/<pid>/stat``) is the recorded leader's
pid and that started no earlier than it. A process that leaves the session (``setsid``, and
codex runs every command in a session of its own) is then *not* part of the sandbox and is
not stopped with it, unless the session has a uid of its own (below).

Health follows the leader: RUNNING while the recorded leader lives (a pid cannot be reused
while it names a live process group or session, and a process that *is* at that pid but
started at another time means the recorded leader is long gone, so a recycled pid is never
mistaken for the sandbox); FAILED once it has died, *even if other processes of the sandbox
still run* (the npm launcher killed while its native ``codex`` lives on, the executor killed
while a command's daemon lives on). Such a sandbox is not serving as the controller started
it, so it is replaced: ``release`` (and ``ensure`` before it starts anew) sends SIGTERM to
every process of the sandbox, then after a grace period writes ``cgroup.kill`` (the kernel
kills whatever is left, also what forks meanwhile) and removes the empty cgroup; without one,
SIGKILL to every process group of the session until no member is left. ``find`` and ``live``
count a sandbox while *any* of its processes lives, so a half-dead one is adopted and then
replaced, never left behind.

Under the lock, ``ensure`` starts a process only when no healthy one exists for the session, so
two workers (or a worker and its redelivered job) can never start a second one (L1).

**The sandbox runs apart from the controller** (L2). Given ``run_as`` (the worker runs as root),
the executor runs as an unprivileged uid with no supplementary groups and umask 077; its
workspace and home are 0700 and owned by that uid, while the state directory and each session
directory are 0711 (enter, not list) and everything else in them is 0600 and owned by the
runner. It therefore cannot read the worker's ``/proc/<pid>/environ``, the runner's files or
other users' files. ``run_as`` is either one user for every executor (``RunAs``:
``CONTROLLER_LOCAL_EXECUTOR_USER``, default ``nobody``: executors are apart from the
controller, not from each other), or a range of uids (``UidRange``:
``CONTROLLER_LOCAL_EXECUTOR_UIDS``) from which each session gets its own for as long as it has
a sandbox or a kept workspace (``runners/local/uids.py``): then one session's code can neither read
another's workspace nor signal its processes, and stopping a sandbox also stops whatever runs
as its uid (even a process that left its session with ``setsid``). Without ``run_as`` the
executor runs as the runner's own uid (an explicit opt-in in the settings).

**Checkpointing** (``criu``: ``CONTROLLER_IDLE_SUSPEND=checkpoint``, ``runners/local/checkpoint.py``):
each sandbox then runs in a pid namespace of its own, and its recorded leader is the
namespace's pid 1 (a root ``unshare --fork`` that waits for the executor, pid 2, and exits with
it), session leader of the sandbox as above; ``sandbox.json`` says ``"pid_namespace": true``.
The ``unshare`` that made the namespace is in the sandbox's cgroup too, and CRIU restores a
tree inside the session's cgroup (it runs there and leaves cgroups alone).
``suspend`` dumps the namespace into ``checkpoint/`` (``suspended.json`` beside it: when, how
big, for which environment, and when its lineage's first sandbox started) and removes
``sandbox.json``; the next ``ensure`` restores it as the new generation's sandbox, carrying that
first start (``Handle.lineage_started_at``: the maximum lifetime counts from it), or starts afresh
when it cannot, or when the lineage is past its maximum lifetime. A dump is made only when its
image fits the room checkpoints have on the state volume (``checkpoint.refusal``; one dump at a
time, under ``checkpoints.lock``); one that does not is a plain stop. ``discard`` removes the
checkpoint with the workspace.

Its environment is built from scratch: PATH, HOME, CODEX_API_KEY (the environment key, L2)
and SANDBOX_WORKSPACE; the controller's own variables (its API key among them) never reach it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from controller import logs
from controller.errors import ConfigError, RunnerRejected
from controller.model import Handle, Health, SandboxSpec
from controller.runners.base import checked
from controller.runners.local import cgroups, checkpoint
from controller.runners.local.procfs import ProcStat, proc_stat
from controller.runners.local.uids import UidClaims, UidRange, signal_uid, uid_processes

__all__ = ["LocalRunner", "RunAs", "UidRange", "prepare_state_directory", "session_key", "state_directory_problems"]

log = logs.get(__name__)

_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_STOP_WAIT_SECONDS = 5.0
_KILL_WAIT_SECONDS = 5.0
EXECUTOR_EXECUTABLE = "codex"
"""The executor's own binary (codex's native one): its link is shut down before a dump."""
LINK_NOTICE_SECONDS = 0.1
"""How long the executor is given to see its link shut down before the dump (codex's first
reconnect comes 0.5 s or more after a drop, so the dump finds it asleep in its backoff)."""
CLOCK_CATCH_UP_SECONDS = 60
"""A restored sandbox's clocks are moved on by at least this much (more when it was suspended
longer: as long as it was), so a reconnect backoff it slept in (codex's: 30 s at most) is over."""


def session_key(session_id: str) -> str:
    """A directory name for a session: readable prefix plus a hash (ids are not path-safe)."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:10]
    return f"{_SAFE.sub('_', session_id)[:40]}-{digest}"


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user executors run as (the runner must be root to switch to it)."""

    uid: int
    gid: int
    name: str


def _wait_for_uid(pid: int, uid: int, seconds: float = 5.0) -> None:
    """Return once ``pid`` runs as ``uid`` (its launcher has dropped to it) or is gone, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        if any(line.startswith("Uid:") and int(line.split()[2]) == uid for line in status.splitlines()):
            return  # (the effective uid)
        time.sleep(0.002)


def _processes() -> list[ProcStat]:
    """Every process on the machine, running or not (one scan of /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat_ = proc_stat(int(entry.name))
            if stat_ is not None:
                found.append(stat_)
    return found


def members(leader: int, start_ticks: int, processes: list[ProcStat] | None = None) -> list[ProcStat]:
    """The running processes of the session whose recorded leader is ``leader``.

    Empty when the leader's pid now belongs to a process started at another time (a recycled
    pid: the recorded session cannot still exist)."""
    processes = _processes() if processes is None else processes
    at_pid = next((p for p in processes if p.pid == leader), None)
    if at_pid is not None and at_pid.start_ticks != start_ticks:
        return []
    return [p for p in processes if p.sid == leader and p.start_ticks >= start_ticks and p.running]


def _prefixes(path: Path) -> list[Path]:
    """``/``, ``/a``, ``/a/b`` … ``path`` (absolute)."""
    return [*reversed(path.parents), path]


def _way_problems(path: Path) -> list[str]:
    """Problems with the directories on the way to ``path`` (as written, and as its symlinks
    resolve): each one that exists must be owned by root or this uid, and others may write to
    it only with the sticky bit set.

    Whoever may write to a directory may rename what is in it and put their own in its place:
    the state directory, or a directory above it, swapped for one they control, with a forged
    ``sandbox.json`` naming a root-owned process the controller would then signal. The sticky
    bit (``/tmp``, mode 1777) takes that right away for entries owned by someone else, and the
    next component is then checked to be owned by root or this uid: so ``/tmp/sandbox-controller``
    is safe, ``/home/alice/state`` (alice could move it) or a group-writable ``/srv`` is not."""
    me = os.geteuid()
    absolute = Path(os.path.abspath(path))
    problems: list[str] = []
    seen: set[Path] = set()
    for chain in (_prefixes(absolute), _prefixes(absolute.resolve())):
        for component in chain[:-1]:  # the state directory itself: stricter rules, in the caller
            if component in seen:
                continue
            seen.add(component)
            try:
                info = os.lstat(component)
            except FileNotFoundError:
                break  # the rest is created by this runner
            except OSError as exc:
                problems.append(f"{component} (on the way to the local state directory {path}): {exc.strerror}")
                break
            where = f"{component} (on the way to the local state directory {path})"
            if info.st_uid not in (0, me):
                problems.append(
                    f"{where} is owned by uid {info.st_uid}, neither root nor this controller (uid {me}): "
                    "its owner could swap the state directory for one of their own; choose another directory"
                )
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
                problems.append(
                    f"{where} is group- or world-writable (mode {stat.S_IMODE(info.st_mode):04o}) without the "
                    "sticky bit: others could swap the state directory for one of their own; choose another directory"
                )
    return problems


def state_directory_problems(path: Path, traversable: bool) -> list[str]:
    """Everything that makes ``path`` unsafe as the state directory, as far as it exists (read
    only: ``check-config`` and every process start run this; ``prepare_state_directory`` again
    after creating it). ``traversable``: executors of another uid must reach their workspace in it."""
    problems = _way_problems(path)
    try:
        info: os.stat_result | None = path.lstat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return [*problems, f"local state directory {path}: {exc.strerror}"]
    if info is not None:
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            problems.append(f"local state directory {path} is not a directory (symlinks are refused)")
        elif info.st_uid != os.geteuid():
            problems.append(
                f"local state directory {path} is owned by uid {info.st_uid}, not by this controller "
                f"(uid {os.geteuid()}); another user may have created it: choose another directory"
            )
        elif info.st_mode & 0o022:
            problems.append(
                f"local state directory {path} is group- or world-writable "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); make it 0700 or choose another directory"
            )
    if traversable:
        existing = [p for p in Path(os.path.abspath(path)).resolve().parents if p.exists()]
        blocked = [p for p in existing if not os.stat(p).st_mode & stat.S_IXOTH]
        if blocked:
            problems.append(
                f"local state directory {path}: the executor user cannot reach it, because "
                f"{blocked[-1]} is not searchable by others (needs o+x); choose another directory"
            )
    return problems


def prepare_state_directory(path: Path, traversable: bool) -> None:
    """Create the state directory 0700 (0711 when another uid must reach its workspace in it;
    missing parents 0755, whatever the umask), or refuse an unsafe one (``ConfigError``)."""
    problems = state_directory_problems(path, traversable)
    if problems:
        raise ConfigError(problems)
    try:
        missing = [p for p in _prefixes(Path(os.path.abspath(path)))[:-1] if not p.exists()]
        for parent in missing:
            with suppress(FileExistsError):
                parent.mkdir(mode=0o755)
                os.chmod(parent, 0o755)
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError as exc:
        raise ConfigError([f"local state directory {path}: {exc.strerror}"]) from exc
    problems = state_directory_problems(path, traversable)  # what was just created, checked too
    if problems:
        raise ConfigError(problems)
    # Readable by nobody else; searchable by others when executors of another uid need it (a
    # runner built without run_as, e.g. for clean-up, does not take that away).
    os.chmod(path, 0o711 if traversable or info.st_mode & 0o011 else 0o700)


def _hand_over(path: Path, uid: int, gid: int) -> None:
    """Make ``path`` and everything below it owned by ``uid``:``gid``, never following a symlink
    (``os.fwalk`` works through directory descriptors, so a directory swapped for a symlink
    while it walks leads nowhere outside)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for _, directories, files, descriptor in os.fwalk(path, follow_symlinks=False):
        for name in (*directories, *files):
            with suppress(FileNotFoundError):
                os.chown(name, uid, gid, dir_fd=descriptor, follow_symlinks=False)


STARTING = "starting.json"
"""In a session's directory while a start (or a restore) is under way: the cgroup it runs in,
until ``sandbox.json`` names the sandbox (``LocalRunner.end_unrecorded``)."""


def _write_private(path: Path, text: str) -> None:
    """Write a file only the runner's uid can read (0600), replacing it atomically."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.replace(partial, path)


class LocalRunner:
    def __init__(
        self,
        state_directory: str | Path,
        executor_command: Sequence[str],
        executor_key: str,
        extra_env: dict[str, str] | None = None,
        run_as: RunAs | UidRange | None = None,
        criu: str | None = None,
        on_resume: Callable[[str], None] = lambda outcome: None,
        max_lifetime_seconds: float | None = None,
        checkpoint_max_percent: float = 25.0,
        checkpoint_reserve_percent: float = 20.0,
        on_checkpoint_refused: Callable[[str], None] = lambda reason: None,
        contain: bool = True,
    ) -> None:
        """``run_as``: the user every executor runs as, or the range each session's executor gets
        its own uid from; None runs them as this process's own uid (the settings allow that
        only on an explicit opt-in). ``criu``: the CRIU binary when an idle sandbox is to be
        checkpointed rather than stopped (``CONTROLLER_IDLE_SUSPEND=checkpoint``; executors then
        run in a pid namespace each, ``runners/local/checkpoint.py``); ``on_resume`` is called with
        ``restored`` or ``fresh_start`` for each start of a session that had a checkpoint.
        ``max_lifetime_seconds``: a checkpoint whose lineage started longer ago than this is not
        restored (a fresh start instead). ``checkpoint_max_percent`` and
        ``checkpoint_reserve_percent``: the room checkpoints may take on the state volume
        (``checkpoint.refusal``); ``on_checkpoint_refused`` is called with the reason (``cap`` or
        ``reserve``) for each suspension whose image did not fit, so the sandbox was stopped.
        ``contain``: give each sandbox a cgroup of its own where the host allows it
        (``runners/local/cgroups.py``; ``containment`` says which, or why not); False: never (tests of
        the fallback)."""
        state = Path(state_directory)
        prepare_state_directory(state, traversable=run_as is not None)
        self._dir_mode = stat.S_IMODE(state.stat().st_mode)  # 0700, or 0711 when executors must reach in
        self._root = state / "sessions"
        self._root.mkdir(mode=self._dir_mode, exist_ok=True)
        os.chmod(self._root, self._dir_mode)
        self._command = list(executor_command)
        self._key = executor_key
        self._extra_env = dict(extra_env or {})
        self._run_as = run_as
        self._claims = UidClaims(state / "uids", run_as) if isinstance(run_as, UidRange) else None
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._criu = criu
        self._on_resume = on_resume
        self._max_lifetime = max_lifetime_seconds
        self._checkpoint_percent = (checkpoint_max_percent, checkpoint_reserve_percent)
        self._on_checkpoint_refused = on_checkpoint_refused
        self._cgroups, self.containment = cgroups.parent() if contain else (None, "turned off by the caller")
        self._state = state

    @property
    def contained(self) -> bool:
        """Whether this runner's sandboxes each get a cgroup (``containment`` says where, or why not)."""
        return self._cgroups is not None

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        directory = self._root / session_key(spec.session_id)
        with self._locked(directory):
            current = self._read(directory)
            if current is not None:
                if self._leader_alive(current):
                    return current
                self._stop(current)  # what is left of a sandbox whose leader died goes first (L1)
            restored = self._resume(directory, spec, generation)
            return restored if restored is not None else self._spawn(directory, spec, generation)

    def status(self, handle: Handle) -> Health:
        self._reap()
        directory = self._root / session_key(handle.session_id)
        current = self._read(directory)
        if current is None or current.uid != handle.uid:
            return Health.GONE
        return Health.RUNNING if self._leader_alive(current) else Health.FAILED

    def release(self, handle: Handle) -> None:
        directory = self._root / session_key(handle.session_id)
        with self._locked(directory):
            current = self._read(directory)
            if current is None or current.uid != handle.uid:
                return  # already gone, or a newer sandbox: not ours to stop
            self._stop(current)
            (directory / "sandbox.json").unlink(missing_ok=True)
        log.info("executor stopped", extra={"session_id": handle.session_id, "sandbox": handle.name})

    def suspend(self, handle: Handle) -> None:
        """Checkpoint the sandbox's whole process tree into ``checkpoint/`` beside its
        workspace, which leaves nothing of it running (issue 29); without checkpointing, or
        when the dump fails (logged), this is ``release``. The next ``ensure`` restores it."""
        if self._criu is None:
            self.release(handle)  # CONTROLLER_IDLE_SUSPEND=stop: the plain stop it always was
            return
        directory = self._root / session_key(handle.session_id)
        suspended = False
        with self._locked(directory):
            current = self._read(directory)
            if current is None or current.uid != handle.uid:
                return  # already gone, or a newer sandbox: not ours
            if self._in_pid_namespace(directory) and self._leader_alive(current):
                pid, _ = self._leader(current)
                with self._room_locked():  # one dump at a time on the volume: each sees the others' images
                    suspended = self._dump(directory, current, pid)
            self._stop(current)  # whatever the dump left (nothing, once it succeeded)
            (directory / "sandbox.json").unlink(missing_ok=True)
            self._reap()
        if not suspended:
            log.info("executor stopped", extra={"session_id": handle.session_id, "sandbox": handle.name})

    def _dump(self, directory: Path, current: Handle, pid: int) -> bool:
        """Checkpoint the tree led by ``pid`` when its image fits (``checkpoint.refusal``, before
        the dump on its estimate, after it on its size); whether it was kept."""
        images = directory / "checkpoint"
        where = {"session_id": current.session_id, "sandbox": current.name}
        estimate = checkpoint.tree_memory(checkpoint.namespace_processes(pid))
        refused = checkpoint.refusal(self._room(directory), estimate, *self._checkpoint_percent)
        if refused is not None:
            self._refused(refused, estimate, False, where)
            return False
        tree = checkpoint.namespace_processes(pid)
        if checkpoint.close_links(tree, EXECUTOR_EXECUTABLE):  # dumped asleep in its backoff, not linked
            time.sleep(LINK_NOTICE_SECONDS)
        try:
            dumped = checkpoint.dump(self._criu or "criu", pid, images)
        except checkpoint.CheckpointFailed as exc:
            self._drop_checkpoint(directory)
            log.warning("checkpoint failed, executor stopped instead", extra={**where, "reason": str(exc)})
            return False
        room = self._room(directory)
        room = checkpoint.Room(room.size_bytes, room.free_bytes + dumped.size_bytes, room.images_bytes)
        refused = checkpoint.refusal(room, dumped.size_bytes, *self._checkpoint_percent)
        if refused is not None:  # larger than its estimate: removed (its tree is gone already)
            self._drop_checkpoint(directory)
            self._refused(refused, dumped.size_bytes, True, where)
            return False
        _write_private(
            directory / "suspended.json",
            json.dumps(
                {
                    "suspended_at": time.time(),
                    "size_bytes": dumped.size_bytes,
                    "environment_id": current.environment_id,
                    "lineage_started_at": current.lineage_started_at or current.created_at,
                }
            ),
        )
        log.info(
            "executor suspended",
            extra={**where, "dump_seconds": round(dumped.seconds, 3), "size_bytes": dumped.size_bytes},
        )
        return True

    def _refused(self, reason: str, size: int, written: bool, where: dict[str, str]) -> None:
        """One line and one count for an image that did not fit (``checkpoint.refusal``)."""
        size_bytes, free_bytes = checkpoint.volume(self._root)
        log.warning(
            "checkpoint refused, executor stopped instead",
            extra={
                **where,
                "reason": reason,
                "image_bytes": size,
                "written": written,  # True: the dump was made, larger than estimated, and removed
                "images_bytes": self.checkpoint_bytes(),
                "volume_bytes": size_bytes,
                "free_bytes": free_bytes,
                "max_percent": self._checkpoint_percent[0],
                "reserve_percent": self._checkpoint_percent[1],
            },
        )
        self._on_checkpoint_refused(reason)

    def _room(self, directory: Path) -> checkpoint.Room:
        """The state volume's size and free space, and the images of every session but ``directory``'s."""
        size_bytes, free_bytes = checkpoint.volume(self._root)
        others = self.checkpoint_bytes(but=directory)
        return checkpoint.Room(size_bytes, free_bytes, others)

    def checkpoint_bytes(self, but: Path | None = None) -> int:
        """Bytes of every session's checkpoint images on the state volume (``but``'s left out)."""
        return sum(checkpoint.image_size(d / "checkpoint") for d in self._root.glob("*") if d != but)

    @contextmanager
    def _room_locked(self) -> Iterator[None]:
        """Held around a dump (after the session's own lock, never the other way round), so two
        workers' dumps never both count on the same free room."""
        descriptor = os.open(self._root.parent / "checkpoints.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint: ``size_bytes`` and ``suspended_at``; None when it has none."""
        directory = self._root / session_key(session_id)
        try:
            data = json.loads((directory / "suspended.json").read_text())
        except (OSError, ValueError):
            return None
        if not (directory / "checkpoint").is_dir():
            return None
        return {"size_bytes": float(data["size_bytes"]), "suspended_at": float(data["suspended_at"])}

    def find(self, session_id: str) -> Handle | None:
        self._reap()
        current = self._read(self._root / session_key(session_id))
        return current if current is not None and self._members(current) else None

    def discard(self, session_id: str) -> None:
        """Remove the session's workspace once it is released for good (L16); its uid, if it
        holds one of a range, is free again."""
        directory = self._root / session_key(session_id)
        with self._locked(directory):
            if self._read(directory) is None:
                shutil.rmtree(directory / "workspace", ignore_errors=True)
                shutil.rmtree(directory / "home", ignore_errors=True)
                self._drop_checkpoint(directory)
                if self._claims is not None:
                    self._claims.release(session_key(session_id))

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

    def end_unrecorded(self) -> list[str]:
        """Stop every sandbox whose start never recorded it: its executor spawned (or restored)
        in the session's cgroup, then the worker starting it killed before ``sandbox.json``.
        Nothing names such a sandbox, so no worker would ever stop it, idle or not. A start
        writes ``starting.json`` (the cgroup) before it spawns and removes it once recorded: a
        session directory that still has one and no ``sandbox.json``, whose lock no start holds
        now, has that cgroup ended (one warning line each). Any runner on the state directory
        can do it (the cgroup's path is on disk, not worked out from its own cgroup). Without
        cgroups a start writes none, and such a sandbox is left (README: containment)."""
        ended = []
        for directory in sorted(self._root.glob("*")):
            if not (directory / STARTING).exists() or (directory / "sandbox.json").exists():
                continue
            with self._locked(directory, wait=False) as held:
                if not held or (directory / "sandbox.json").exists():
                    continue  # being started now, or recorded meanwhile
                try:
                    marker = json.loads((directory / STARTING).read_text())
                    session_id, cgroup = str(marker["session_id"]), Path(marker["cgroup"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                if not cgroup.is_absolute() or not cgroup.name.endswith(f".{directory.name}"):
                    continue  # not a sandbox cgroup of this session: never touched
                pids = cgroups.members(cgroup)
                if not cgroups.end(cgroup, _KILL_WAIT_SECONDS):
                    where = {"session_id": session_id, "cgroup": str(cgroup)}
                    log.warning("unrecorded sandbox not stopped", extra=where)
                    continue
                (directory / STARTING).unlink(missing_ok=True)
            if pids:
                log.warning(
                    "unrecorded sandbox stopped",
                    extra={
                        "session_id": session_id,
                        "cgroup": str(cgroup),
                        "pids": pids,
                        "reason": "its start never recorded it (the worker starting it died first)",
                    },
                )
                ended.append(session_id)
        return ended

    # -- helpers --------------------------------------------------------------------------

    def live(self) -> list[Handle]:
        """Sandboxes with any process left (in their cgroup, or session) (tests and the dev view count these)."""
        self._reap()
        processes = _processes()
        return [h for h in self.list_managed() if self._members(h, processes)]

    def processes(self, handle: Handle) -> list[int]:
        """The pids of the sandbox's running processes (its whole cgroup, or without one its session)."""
        self._reap()
        return [p.pid for p in self._members(handle)]

    def stop_all(self) -> None:
        """Stop every executor (dev mode's Ctrl-C; test clean-up)."""
        for handle in self.list_managed():
            self.release(handle)
        for child in list(self._children.values()):  # an unshare still exiting after its namespace went
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=_KILL_WAIT_SECONDS)
        self._reap()

    @contextmanager
    def _locked(self, directory: Path, wait: bool = True) -> Iterator[bool]:
        """The session directory's lock for the block (every start, stop and suspend holds it);
        with ``wait=False``, the block learns whether it got it (False: another holds it now)."""
        directory.mkdir(mode=self._dir_mode, exist_ok=True)
        descriptor = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(descriptor)  # closing releases the lock

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
            lineage_started_at=float(data.get("lineage_started_at", 0.0)),
        )

    @staticmethod
    def _leader(handle: Handle) -> tuple[int, int]:
        pid, _, ticks = handle.uid.partition(":")
        return int(pid), int(ticks)

    def _leader_alive(self, handle: Handle) -> bool:
        pid, ticks = self._leader(handle)
        found = proc_stat(pid)
        return found is not None and found.running and found.start_ticks == ticks

    def _members(self, handle: Handle, processes: list[ProcStat] | None = None) -> list[ProcStat]:
        """The sandbox's running processes: every one in its cgroup when it has one (whatever
        session it is in), else its leader's session."""
        cgroup = self._cgroup_of(handle)
        if cgroup is not None:
            found = [proc_stat(pid) for pid in cgroups.members(cgroup)]
            return [p for p in found if p is not None and p.running]
        pid, ticks = self._leader(handle)
        return members(pid, ticks, processes)

    def _cgroup_of(self, handle: Handle) -> Path | None:
        """The cgroup ``sandbox.json`` records for ``handle``'s sandbox (None: it has none, or
        the record is of another sandbox of the session now)."""
        try:
            data = json.loads((self._root / session_key(handle.session_id) / "sandbox.json").read_text())
        except (OSError, ValueError):
            return None
        if f"{data.get('pid')}:{data.get('start_ticks')}" != handle.uid or not data.get("cgroup"):
            return None
        return Path(data["cgroup"])

    def _fresh_cgroup(self, directory: Path, session_id: str) -> Path | None:
        """The session's cgroup, made empty for a sandbox about to start in it (anything left
        in it belongs to an older sandbox of the session: killed); None without containment.
        Until ``_record`` names the sandbox, ``starting.json`` names the cgroup, so that a start
        cut short leaves a sandbox the sweep can find and stop (``end_unrecorded``)."""
        if self._cgroups is None:
            return None
        cgroup = cgroups.sandbox_cgroup(self._cgroups, self._state, directory.name)
        if not cgroups.end(cgroup, _KILL_WAIT_SECONDS):
            raise RunnerRejected(f"the cgroup {cgroup} of an older sandbox of the session cannot be emptied")
        try:
            cgroup.mkdir()
        except OSError as exc:
            raise RunnerRejected(f"cannot create the sandbox's cgroup {cgroup}: {exc.strerror}") from exc
        _write_private(directory / STARTING, json.dumps({"session_id": session_id, "cgroup": str(cgroup)}))
        return cgroup

    def _identity(self, directory: Path) -> tuple[int, int] | None:
        """The (uid, gid) the session's executor runs as; None: this process's own."""
        if isinstance(self._run_as, RunAs):
            return self._run_as.uid, self._run_as.gid
        if self._claims is not None:
            uid = self._claims.claim(directory.name)  # the session's uid, or a fresh one
            return uid, uid
        return None

    def _executor_uid(self, session_id: str) -> int | None:
        """The uid of a session's own (a range's uid), whose every process is the sandbox's."""
        return self._claims.uid_of(session_key(session_id)) if self._claims is not None else None

    @staticmethod
    def _private_directory(path: Path, identity: tuple[int, int] | None) -> None:
        """A directory only the executor's uid may enter (0700, owned by it). A kept one owned
        by another uid (a workspace from before executors got a uid each) is handed over whole."""
        path.mkdir(mode=0o700, exist_ok=True)
        if identity is not None:
            uid, gid = identity
            info = path.lstat()
            if (info.st_uid, info.st_gid) != (uid, gid):
                _hand_over(path, uid, gid)
        os.chmod(path, 0o700)

    def _in_pid_namespace(self, directory: Path) -> bool:
        try:
            return bool(json.loads((directory / "sandbox.json").read_text()).get("pid_namespace"))
        except (OSError, ValueError):
            return False

    def _drop_checkpoint(self, directory: Path) -> None:
        (directory / "suspended.json").unlink(missing_ok=True)
        shutil.rmtree(directory / "checkpoint", ignore_errors=True)

    def _resume(self, directory: Path, spec: SandboxSpec, generation: int) -> Handle | None:
        """Restore the session's checkpoint, if it has one, as this generation's sandbox; None
        (logged, counted, the checkpoint removed) when there is none or it cannot be restored:
        the caller starts afresh on the same workspace."""
        images = directory / "checkpoint"
        if not images.is_dir():
            return None
        try:
            saved = json.loads((directory / "suspended.json").read_text())
        except (OSError, ValueError):
            saved = {}
        started = time.monotonic()
        cgroup = None
        try:
            if self._criu is None:
                raise checkpoint.CheckpointFailed("checkpointing is off (CONTROLLER_IDLE_SUSPEND=stop)")
            if saved.get("environment_id") != spec.environment_id:
                raise checkpoint.CheckpointFailed("the checkpoint is of another environment (or its record is lost)")
            lineage = float(saved.get("lineage_started_at") or saved["suspended_at"])
            if self._max_lifetime and time.time() - lineage >= self._max_lifetime:
                raise checkpoint.CheckpointFailed(
                    f"its lineage started {time.time() - lineage:.0f}s ago, past the maximum lifetime "
                    f"({self._max_lifetime:g}s): a fresh sandbox starts its own"
                )
            suspended_for = time.time() - float(saved.get("suspended_at", time.time()))
            checkpoint.advance_clocks(images, max(CLOCK_CATCH_UP_SECONDS, round(suspended_for)))
            # CRIU runs in the cgroup: all it restores is born there
            cgroup = self._fresh_cgroup(directory, spec.session_id)
            pid = checkpoint.restore(self._criu, images, cgroup)
            found = proc_stat(pid)
            if found is None or not found.running:
                raise checkpoint.CheckpointFailed(f"the restored process {pid} is gone")
        except checkpoint.CheckpointFailed as exc:
            if cgroup is not None:
                cgroups.end(cgroup, _KILL_WAIT_SECONDS)  # whatever CRIU left of the tree
            self._drop_checkpoint(directory)
            log.warning(
                "restore impossible, starting a fresh executor",
                extra={"session_id": spec.session_id, "generation": generation, "reason": str(exc)},
            )
            self._on_resume("fresh_start")
            return None
        self._drop_checkpoint(directory)
        handle = self._record(directory, spec, generation, pid, found.start_ticks, time.time(), lineage, cgroup)
        log.info(
            "executor restored",
            extra={
                "session_id": spec.session_id,
                "pid": pid,
                "generation": generation,
                "restore_seconds": round(time.monotonic() - started, 3),
                "suspended_seconds": round(time.time() - float(saved.get("suspended_at", time.time())), 1),
            },
        )
        self._on_resume("restored")
        return handle

    def _record(
        self,
        directory: Path,
        spec: SandboxSpec,
        generation: int,
        pid: int,
        ticks: int,
        created_at: float,
        lineage_started_at: float = 0.0,
        cgroup: Path | None = None,
    ) -> Handle:
        """Write ``sandbox.json`` for the sandbox led by ``pid`` and return its handle;
        ``lineage_started_at``: a restored sandbox's first start (its maximum lifetime counts
        from there), carried from its checkpoint; 0 for a sandbox that starts its lineage."""
        _write_private(directory / "session", spec.session_id)
        name = f"executor-{session_key(spec.session_id)}-g{generation}"
        _write_private(
            directory / "sandbox.json",
            json.dumps(
                {
                    "session_id": spec.session_id,
                    "generation": generation,
                    "pid": pid,
                    "pgid": pid,
                    "start_ticks": ticks,
                    "name": name,
                    "environment_id": spec.environment_id,
                    "created_at": created_at,
                    "lineage_started_at": lineage_started_at,
                    "pid_namespace": self._criu is not None,
                    "cgroup": str(cgroup) if cgroup is not None else None,
                }
            ),
        )
        (directory / STARTING).unlink(missing_ok=True)  # recorded: no longer a start under way
        return Handle(
            session_id=spec.session_id,
            name=name,
            generation=generation,
            uid=f"{pid}:{ticks}",
            environment_id=spec.environment_id,
            created_at=created_at,
            lineage_started_at=lineage_started_at,
        )

    def _namespace_leader(self, launcher: int) -> int | None:
        """The pid (as seen here) of pid 1 of the namespace ``unshare`` (pid ``launcher``) forked."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
            except OSError:  # (the file exists on kernels CRIU runs on: CONFIG_CHECKPOINT_RESTORE)
                return None
            if children:
                return int(children[0])
            time.sleep(0.01)
        return None

    def _spawn(self, directory: Path, spec: SandboxSpec, generation: int) -> Handle:
        workspace = directory / "workspace"
        home = directory / "home"
        identity = self._identity(directory)
        self._private_directory(workspace, identity)
        self._private_directory(home, identity)
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
        namespaced = self._criu is not None  # checkpointable: a pid namespace of its own
        cgroup = self._fresh_cgroup(directory, spec.session_id)
        # In a cgroup the executor is started by root (who joins it) and drops to its uid
        # itself, as in a pid namespace; otherwise Popen drops to it before the exec.
        drops_itself = namespaced or cgroup is not None
        if drops_itself and shutil.which(self._command[0], path=env["PATH"]) is None:
            if cgroup is not None:  # (behind sh, setpriv or unshare it would fail unseen)
                cgroups.end(cgroup, _KILL_WAIT_SECONDS)
            there = "/" in self._command[0] and Path(self._command[0]).exists()  # but not executable
            words = os.strerror(errno.EACCES if there else errno.ENOENT)
            raise RunnerRejected(f"cannot start the executor {self._command[0]!r}: {words}")  # the system's words
        if namespaced:
            argv = checkpoint.pid_namespace_argv(argv, identity)
        elif cgroup is not None and identity is not None:
            argv = [*checkpoint.drop_argv(identity), *argv]
        if cgroup is not None:
            argv = cgroups.join_argv(cgroup, argv)
        log_descriptor = os.open(directory / "executor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with os.fdopen(log_descriptor, "ab") as output:
                child = subprocess.Popen(
                    argv,
                    cwd=workspace,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    # unshare's own complaints stay out of the log (a restore checks its size)
                    stderr=subprocess.DEVNULL if namespaced else subprocess.STDOUT,
                    start_new_session=True,  # leader of its own session and process group
                    # unshare and the cgroup's join need root: setpriv drops to the executor's uid
                    user=identity[0] if identity and not drops_itself else None,
                    group=identity[1] if identity and not drops_itself else None,
                    extra_groups=[] if identity and not drops_itself else None,
                    umask=0o077 if identity else -1,
                )
        except OSError as exc:
            if cgroup is not None:
                cgroups.end(cgroup, _KILL_WAIT_SECONDS)
            raise RunnerRejected(f"cannot start the executor {self._command[0]!r}: {exc.strerror}") from exc
        self._children[child.pid] = child
        if cgroup is not None:
            cgroups.move(cgroup, child.pid)  # joined when Popen returns (the shell joins too, before it execs)
            if identity is not None and not namespaced:
                _wait_for_uid(child.pid, identity[0])  # as Popen(user=) would: returned as the executor's uid
        created_at = time.time()
        leader = self._namespace_leader(child.pid) if namespaced else child.pid
        if leader is None:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            if cgroup is not None:
                cgroups.end(cgroup, _KILL_WAIT_SECONDS)
            raise RunnerRejected(f"cannot start the executor {self._command[0]!r} in a pid namespace (unshare)")
        started = proc_stat(leader)
        ticks = started.start_ticks if started is not None else 0
        handle = self._record(directory, spec, generation, leader, ticks, created_at, cgroup=cgroup)
        log.info(
            "executor process started",
            extra={
                "session_id": spec.session_id,
                "pid": leader,
                "generation": generation,
                "uid": identity[0] if identity else os.geteuid(),
            },
        )
        return handle

    def _stop(self, handle: Handle) -> None:
        """SIGTERM to every process of the sandbox: each one in its cgroup (or, without one, each
        process group of its session) and, when the session has a uid of its own, every process
        of that uid; SIGKILL to what is left after the grace period (``cgroup.kill``: the kernel
        kills the whole cgroup, also what forks meanwhile; the empty cgroup is removed); return
        once nothing of it runs (or warn after a bounded wait)."""
        uid = self._executor_uid(handle.session_id)
        cgroup = self._cgroup_of(handle)
        for sig, wait in ((signal.SIGTERM, _STOP_WAIT_SECONDS), (signal.SIGKILL, _KILL_WAIT_SECONDS)):
            signalled = self._signal_members(handle, sig)
            if uid is not None:
                signalled = signal_uid(uid, sig) or signalled
            if cgroup is not None and sig == signal.SIGKILL:
                cgroups.end(cgroup, wait)  # kills, waits until it is empty, removes it
            if not signalled or self._gone_within(handle, uid, wait):
                break
        if cgroup is not None and not cgroups.end(cgroup, _KILL_WAIT_SECONDS):  # the cgroup goes with it
            log.warning(
                "sandbox cgroup not removed",
                extra={"session_id": handle.session_id, "sandbox": handle.name, "cgroup": str(cgroup)},
            )
        left = [p.pid for p in self._members(handle)] + (uid_processes(uid) if uid is not None else [])
        if left:
            log.warning(
                "executor processes survived SIGKILL",
                extra={"session_id": handle.session_id, "sandbox": handle.name, "pids": left},
            )

    def _gone_within(self, handle: Handle, uid: int | None, seconds: float) -> bool:
        """Whether every process of the sandbox (and of the session's own uid) ends within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            self._reap()
            if not self._members(handle) and (uid is None or not uid_processes(uid)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _signal_members(self, handle: Handle, sig: int) -> bool:
        """Signal each process of the sandbox's cgroup, or without one each process group of its
        session (a group id cannot be reused while it has members, unlike a bare pid). False
        when nothing of the sandbox runs."""
        cgroup = self._cgroup_of(handle)
        if cgroup is not None:
            return cgroups.signal_members(cgroup, sig)
        found = self._members(handle)
        for pgid in sorted({p.pgid for p in found}):
            with suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        return bool(found)

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]
