"""The local runner's state directory: its layout, its safety, and the records in it.

Created by the runner, owned by its uid, never group- or world-writable; a directory that is not
is refused with ``ConfigError``, and so is one any directory on the way to which another user
could replace (``state_directory_problems``)::

    sessions/<key>/lock            flock'ed around every change of this session's process
    sessions/<key>/session         the session's id (a key is not reversible)
    sessions/<key>/sandbox.json    {"session_id", "generation", "pid", "pgid", "start_ticks", "name", …}
    sessions/<key>/starting.json   while a start (or a restore) is under way: its cgroup
    sessions/<key>/workspace/      the executor's working directory (the session's workspace)
    sessions/<key>/home/           the executor's $HOME
    sessions/<key>/executor.log    its stdout and stderr (opened by the runner; the executor only
                                   holds the descriptor)
    sessions/<key>/checkpoint/     a suspended sandbox's CRIU images (0700, root's; ``suspend.py``)
    sessions/<key>/suspended.json  beside them: when, how big, for which environment, and when
                                   its lineage's first sandbox started
    checkpoints.lock               flock'ed around every dump (one at a time on the volume)
    uids/                          with a uid per session: who holds which uid (``uids.py``)

The state directory and each session directory are 0711 (enter, not list) when executors run as
another uid, else 0700; the workspace and home are 0700 and owned by the executor's uid, and
everything else is 0600 and owned by the runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from controller.errors import ConfigError
from controller.files import locked as locked_file
from controller.model import Handle, SandboxSpec

_SAFE = re.compile(r"[^a-zA-Z0-9_.-]")

SANDBOX = "sandbox.json"
"""In a session's directory while it has a sandbox: the record that names it."""
STARTING = "starting.json"
"""In a session's directory while a start (or a restore) is under way: the cgroup it runs in,
until ``sandbox.json`` names the sandbox (``Processes.end_unrecorded``)."""
CHECKPOINT = "checkpoint"
"""A session's directory of checkpoint images (``suspend.py``)."""
SUSPENDED = "suspended.json"
"""Beside a session's checkpoint: what ``suspend.py`` needs to restore it."""


def session_key(session_id: str) -> str:
    """A directory name for a session: readable prefix plus a hash (ids are not path-safe)."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:10]
    return f"{_SAFE.sub('_', session_id)[:40]}-{digest}"


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


def private_directory(path: Path, identity: tuple[int, int] | None) -> None:
    """A directory only the executor's uid may enter (0700, owned by it). A kept one owned
    by another uid (a workspace from before executors got a uid each) is handed over whole."""
    path.mkdir(mode=0o700, exist_ok=True)
    if identity is not None:
        uid, gid = identity
        info = path.lstat()
        if (info.st_uid, info.st_gid) != (uid, gid):
            _hand_over(path, uid, gid)
    os.chmod(path, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write a file only the runner's uid can read (0600), replacing it atomically."""
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    os.replace(partial, path)


def leader(handle: Handle) -> tuple[int, int]:
    """The (pid, start ticks) of the sandbox's recorded leader (its handle's uid)."""
    pid, _, ticks = handle.uid.partition(":")
    return int(pid), int(ticks)


class StateDirectory:
    """The state directory of one runner (``path``), its sessions' directories below ``root``."""

    def __init__(self, path: Path, traversable: bool) -> None:
        prepare_state_directory(path, traversable)
        self.path = path
        self._dir_mode = stat.S_IMODE(path.stat().st_mode)  # 0700, or 0711 when executors must reach in
        self.root = path / "sessions"
        self.root.mkdir(mode=self._dir_mode, exist_ok=True)
        os.chmod(self.root, self._dir_mode)

    def session(self, session_id: str) -> Path:
        """The session's directory (which may not exist yet)."""
        return self.root / session_key(session_id)

    def sessions(self) -> list[Path]:
        """Every session's directory, in order."""
        return sorted(self.root.glob("*"))

    @contextmanager
    def locked(self, directory: Path, wait: bool = True) -> Iterator[bool]:
        """The session directory's lock for the block (every start, stop and suspend holds it);
        with ``wait=False``, the block learns whether it got it (False: another holds it now)."""
        directory.mkdir(mode=self._dir_mode, exist_ok=True)
        with locked_file(directory / "lock", wait) as got:
            yield got

    @contextmanager
    def checkpoints_locked(self) -> Iterator[None]:
        """Held around a dump (after the session's own lock, never the other way round), so two
        workers' dumps never both count on the same free room."""
        with locked_file(self.path / "checkpoints.lock"):
            yield

    @staticmethod
    def read(directory: Path) -> Handle | None:
        """The handle ``sandbox.json`` records in the session's directory; None: it has none."""
        try:
            data = json.loads((directory / SANDBOX).read_text())
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

    def handles(self) -> list[Handle]:
        """Every sandbox recorded, in the order of their sessions' directories."""
        return [h for h in map(self.read, self.sessions()) if h is not None]

    @staticmethod
    def record(
        directory: Path,
        spec: SandboxSpec,
        generation: int,
        pid: int,
        ticks: int,
        created_at: float,
        lineage_started_at: float = 0.0,
        cgroup: Path | None = None,
        pid_namespace: bool = False,
    ) -> Handle:
        """Write ``sandbox.json`` for the sandbox led by ``pid`` and return its handle;
        ``lineage_started_at``: a restored sandbox's first start (its maximum lifetime counts
        from there), carried from its checkpoint; 0 for a sandbox that starts its lineage."""
        write_private(directory / "session", spec.session_id)
        name = f"executor-{session_key(spec.session_id)}-g{generation}"
        write_private(
            directory / SANDBOX,
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
                    "pid_namespace": pid_namespace,
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

    @staticmethod
    def starting(directory: Path, session_id: str, cgroup: Path) -> None:
        """Note a start under way in ``cgroup``, until ``record`` names its sandbox."""
        write_private(directory / STARTING, json.dumps({"session_id": session_id, "cgroup": str(cgroup)}))

    def cgroup_of(self, handle: Handle) -> Path | None:
        """The cgroup ``sandbox.json`` records for ``handle``'s sandbox (None: it has none, or
        the record is of another sandbox of the session now)."""
        try:
            data = json.loads((self.session(handle.session_id) / SANDBOX).read_text())
        except (OSError, ValueError):
            return None
        if f"{data.get('pid')}:{data.get('start_ticks')}" != handle.uid or not data.get("cgroup"):
            return None
        return Path(data["cgroup"])

    @staticmethod
    def in_pid_namespace(directory: Path) -> bool:
        try:
            return bool(json.loads((directory / SANDBOX).read_text()).get("pid_namespace"))
        except (OSError, ValueError):
            return False

    @staticmethod
    def drop_checkpoint(directory: Path) -> None:
        (directory / SUSPENDED).unlink(missing_ok=True)
        shutil.rmtree(directory / CHECKPOINT, ignore_errors=True)

    def keeps_workspace(self, session_id: str) -> bool:
        return (self.session(session_id) / "workspace").is_dir()

    def workspaces(self) -> list[str]:
        """Sessions whose workspace directory is still here (removed by ``discard``)."""
        found = []
        for directory in self.sessions():
            try:
                if (directory / "workspace").is_dir():
                    found.append((directory / "session").read_text())
            except OSError:
                continue
        return found
