"""A sandbox's processes: started, watched and stopped, each sandbox contained where the host allows.

**A sandbox is a cgroup** (``cgroups.py``; workers as root). The executor is the leader of a
new session and process group (``start_new_session``) and joins the session's cgroup before it
execs (``cgroups.join_argv``; ``start`` moves it too before it returns), so everything it starts
(the npm launcher's native ``codex``, the commands that one runs, whatever they ``setsid``,
double-fork or daemonize) is born in that cgroup and cannot leave it without root.
``sandbox.json`` records the cgroup; ``members_of`` and ``stop`` act on every process in it
(``cgroup.procs``).

**Without cgroups** (``contained`` False: a worker that is not root, a read-only cgroup
hierarchy; ``containment`` says why, and the worker logs it at start) a sandbox is its leader's
session: processes whose session id (field 6 of ``/proc/<pid>/stat``) is the recorded leader's
pid and that started no earlier than it. A process that leaves the session (``setsid``, and
codex runs every command in a session of its own) is then *not* part of the sandbox and is
not stopped with it, unless the session has a uid of its own (``uids.py``).

Health follows the leader (``leader_alive``): a pid cannot be reused while it names a live
process group or session, and a process that *is* at that pid but started at another time
means the recorded leader is long gone, so a recycled pid is never mistaken for the sandbox.
``stop`` sends SIGTERM to every process of the sandbox, then after a grace period writes
``cgroup.kill`` (the kernel kills whatever is left, also what forks meanwhile) and removes the
empty cgroup; without one, SIGKILL to every process group of the session until no member is
left.

With checkpointing (``namespaced``) each sandbox runs in a pid namespace of its own
(``checkpoint.pid_namespace_argv``), and its recorded leader is the namespace's pid 1 (a root
``unshare --fork`` that waits for the executor, pid 2, and exits with it), session leader of
the sandbox as above. The ``unshare`` that made the namespace is in the sandbox's cgroup too.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from controller import logs
from controller.errors import RunnerRejected
from controller.model import Handle, SandboxSpec
from controller.runners.local import cgroups, checkpoint
from controller.runners.local.procfs import ProcStat, proc_stat
from controller.runners.local.state import STARTING, StateDirectory, leader
from controller.runners.local.uids import signal_uid, uid_processes

log = logs.get(__name__)

_STOP_WAIT_SECONDS = 5.0
KILL_WAIT_SECONDS = 5.0


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


def _all_processes() -> list[ProcStat]:
    """Every process on the machine, running or not (one scan of /proc)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat_ = proc_stat(int(entry.name))
            if stat_ is not None:
                found.append(stat_)
    return found


def members(leader: int, start_ticks: int) -> list[ProcStat]:
    """The running processes of the session whose recorded leader is ``leader``.

    Empty when the leader's pid now belongs to a process started at another time (a recycled
    pid: the recorded session cannot still exist)."""
    processes = _all_processes()
    at_pid = next((p for p in processes if p.pid == leader), None)
    if at_pid is not None and at_pid.start_ticks != start_ticks:
        return []
    return [p for p in processes if p.sid == leader and p.start_ticks >= start_ticks and p.running]


def _namespace_leader(launcher: int) -> int | None:
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


class Processes:
    """The processes of the sandboxes on one state directory; ``contain``: give each sandbox a
    cgroup of its own where the host allows it (``containment`` says which, or why not)."""

    def __init__(self, state: StateDirectory, contain: bool) -> None:
        self._state = state
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._cgroups, self.containment = cgroups.parent() if contain else (None, "turned off by the caller")

    @property
    def contained(self) -> bool:
        """Whether each sandbox gets a cgroup (``containment`` says where, or why not)."""
        return self._cgroups is not None

    def leader_alive(self, handle: Handle) -> bool:
        pid, ticks = leader(handle)
        found = proc_stat(pid)
        return found is not None and found.running and found.start_ticks == ticks

    def members_of(self, handle: Handle) -> list[ProcStat]:
        """The sandbox's running processes: every one in its cgroup when it has one (whatever
        session it is in), else its leader's session."""
        cgroup = self._state.cgroup_of(handle)
        if cgroup is not None:
            found = [proc_stat(pid) for pid in cgroups.members(cgroup)]
            return [p for p in found if p is not None and p.running]
        pid, ticks = leader(handle)
        return members(pid, ticks)

    def fresh_cgroup(self, directory: Path, session_id: str) -> Path | None:
        """The session's cgroup, made empty for a sandbox about to start in it (anything left
        in it belongs to an older sandbox of the session: killed); None without containment.
        Until ``StateDirectory.record`` names the sandbox, ``starting.json`` names the cgroup, so
        that a start cut short leaves a sandbox the sweep can find and stop (``end_unrecorded``)."""
        if self._cgroups is None:
            return None
        cgroup = cgroups.sandbox_cgroup(self._cgroups, self._state.path, directory.name)
        if not cgroups.end(cgroup, KILL_WAIT_SECONDS):
            raise RunnerRejected(f"the cgroup {cgroup} of an older sandbox of the session cannot be emptied")
        try:
            cgroup.mkdir()
        except OSError as exc:
            raise RunnerRejected(f"cannot create the sandbox's cgroup {cgroup}: {exc.strerror}") from exc
        self._state.starting(directory, session_id, cgroup)
        return cgroup

    def start(
        self,
        directory: Path,
        spec: SandboxSpec,
        generation: int,
        argv: list[str],
        env: dict[str, str],
        identity: tuple[int, int] | None,
        namespaced: bool,
    ) -> Handle:
        """Start the executor (``argv``, in the session's workspace, with ``env``) as this
        generation's sandbox, as ``identity`` (uid, gid; None: this process's own), in a pid
        namespace of its own when ``namespaced`` (checkpointable), and record it."""
        command = argv[0]
        cgroup = self.fresh_cgroup(directory, spec.session_id)
        # In a cgroup the executor is started by root (who joins it) and drops to its uid
        # itself, as in a pid namespace; otherwise Popen drops to it before the exec.
        drops_itself = namespaced or cgroup is not None
        if drops_itself and shutil.which(command, path=env["PATH"]) is None:
            if cgroup is not None:  # (behind sh, setpriv or unshare it would fail unseen)
                cgroups.end(cgroup, KILL_WAIT_SECONDS)
            there = "/" in command and Path(command).exists()  # but not executable
            words = os.strerror(errno.EACCES if there else errno.ENOENT)
            raise RunnerRejected(f"cannot start the executor {command!r}: {words}")  # the system's words
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
                    cwd=directory / "workspace",
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
                cgroups.end(cgroup, KILL_WAIT_SECONDS)
            raise RunnerRejected(f"cannot start the executor {command!r}: {exc.strerror}") from exc
        self._children[child.pid] = child
        if cgroup is not None:
            cgroups.move(cgroup, child.pid)  # joined when Popen returns (the shell joins too, before it execs)
            if identity is not None and not namespaced:
                _wait_for_uid(child.pid, identity[0])  # as Popen(user=) would: returned as the executor's uid
        created_at = time.time()
        pid = _namespace_leader(child.pid) if namespaced else child.pid
        if pid is None:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            if cgroup is not None:
                cgroups.end(cgroup, KILL_WAIT_SECONDS)
            raise RunnerRejected(f"cannot start the executor {command!r} in a pid namespace (unshare)")
        started = proc_stat(pid)
        ticks = started.start_ticks if started is not None else 0
        handle = self._state.record(
            directory, spec, generation, pid, ticks, created_at, cgroup=cgroup, pid_namespace=namespaced
        )
        log.info(
            "executor process started",
            extra={
                "session_id": spec.session_id,
                "pid": pid,
                "generation": generation,
                "uid": identity[0] if identity else os.geteuid(),
            },
        )
        return handle

    def stop(self, handle: Handle, uid: int | None) -> None:
        """SIGTERM to every process of the sandbox: each one in its cgroup (or, without one, each
        process group of its session) and, when the session has a uid of its own (``uid``), every
        process of that uid; SIGKILL to what is left after the grace period (``cgroup.kill``: the
        kernel kills the whole cgroup, also what forks meanwhile; the empty cgroup is removed);
        return once nothing of it runs (or warn after a bounded wait)."""
        cgroup = self._state.cgroup_of(handle)
        for sig, wait in ((signal.SIGTERM, _STOP_WAIT_SECONDS), (signal.SIGKILL, KILL_WAIT_SECONDS)):
            signalled = self._signal_members(handle, sig)
            if uid is not None:
                signalled = signal_uid(uid, sig) or signalled
            if cgroup is not None and sig == signal.SIGKILL:
                cgroups.end(cgroup, wait)  # kills, waits until it is empty, removes it
            if not signalled or self._gone_within(handle, uid, wait):
                break
        if cgroup is not None and not cgroups.end(cgroup, KILL_WAIT_SECONDS):  # the cgroup goes with it
            log.warning(
                "sandbox cgroup not removed",
                extra={"session_id": handle.session_id, "sandbox": handle.name, "cgroup": str(cgroup)},
            )
        left = [p.pid for p in self.members_of(handle)] + (uid_processes(uid) if uid is not None else [])
        if left:
            log.warning(
                "executor processes survived SIGKILL",
                extra={"session_id": handle.session_id, "sandbox": handle.name, "pids": left},
            )

    def _gone_within(self, handle: Handle, uid: int | None, seconds: float) -> bool:
        """Whether every process of the sandbox (and of the session's own uid) ends within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            self.reap()
            if not self.members_of(handle) and (uid is None or not uid_processes(uid)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _signal_members(self, handle: Handle, sig: int) -> bool:
        """Signal each process of the sandbox's cgroup, or without one each process group of its
        session (a group id cannot be reused while it has members, unlike a bare pid). False
        when nothing of the sandbox runs."""
        cgroup = self._state.cgroup_of(handle)
        if cgroup is not None:
            return cgroups.signal_members(cgroup, sig)
        found = self.members_of(handle)
        for pgid in sorted({p.pgid for p in found}):
            with suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        return bool(found)

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
        for directory in self._state.sessions():
            if not (directory / STARTING).exists() or (directory / "sandbox.json").exists():
                continue
            with self._state.locked(directory, wait=False) as held:
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
                if not cgroups.end(cgroup, KILL_WAIT_SECONDS):
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

    def reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]

    def wait_children(self) -> None:
        """Wait (bounded) for every child started here to exit, then reap them."""
        for child in list(self._children.values()):  # an unshare still exiting after its namespace went
            with suppress(subprocess.TimeoutExpired):
                child.wait(timeout=KILL_WAIT_SECONDS)
        self.reap()
