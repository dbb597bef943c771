"""The local-process runner: one executor child process per session, on this machine.

Its state lives in a directory of its own (``state.py``: the layout, and the refusal of an
unsafe one); each sandbox's processes are started, watched and stopped by ``processes.py``, in a
cgroup of their own where the host allows it; with checkpointing, ``suspend.py`` dumps an idle
sandbox and restores it at its next start.

Health follows the leader: RUNNING while the recorded leader lives; FAILED once it has died,
*even if other processes of the sandbox still run* (the npm launcher killed while its native
``codex`` lives on, the executor killed while a command's daemon lives on). Such a sandbox is
not serving as the controller started it, so it is replaced: ``release`` (and ``ensure`` before
it starts anew) stops every process of the sandbox. ``find`` counts a sandbox while *any* of its
processes lives, so a half-dead one is adopted and then replaced, never left behind.

Under the session directory's lock, ``ensure`` starts a process only when no healthy one exists
for the session, so two workers (or a worker and its redelivered job) can never start a second
one (L1).

**The sandbox runs apart from the controller** (L2). Given ``run_as`` (the worker runs as root),
the executor runs as an unprivileged uid with no supplementary groups and umask 077; its
workspace and home are 0700 and owned by that uid, while the state directory and each session
directory are 0711 (enter, not list) and everything else in them is 0600 and owned by the
runner. It therefore cannot read the worker's ``/proc/<pid>/environ``, the runner's files or
other users' files. ``run_as`` is either one user for every executor (``RunAs``:
``CONTROLLER_LOCAL_EXECUTOR_USER``, default ``nobody``: executors are apart from the
controller, not from each other), or a range of uids (``UidRange``:
``CONTROLLER_LOCAL_EXECUTOR_UIDS``) from which each session gets its own for as long as it has
a sandbox or a kept workspace (``uids.py``): then one session's code can neither read
another's workspace nor signal its processes, and stopping a sandbox also stops whatever runs
as its uid (even a process that left its session with ``setsid``). Without ``run_as`` the
executor runs as the runner's own uid (an explicit opt-in in the settings).

**Checkpointing** (``criu``: ``CONTROLLER_IDLE_SUSPEND=checkpoint``, ``suspend.py``):
``suspend`` dumps the sandbox and removes ``sandbox.json``; the next ``ensure`` restores it as
the new generation's sandbox, or starts afresh when it cannot. A dump that is refused (its image
does not fit the room checkpoints have) or fails is a plain stop. ``discard`` removes the
checkpoint with the workspace.

Its environment is built from scratch: PATH, HOME, CODEX_API_KEY (the environment key, L2)
and SANDBOX_WORKSPACE; the controller's own variables (its API key among them) never reach it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from controller import logs
from controller.model import Handle, Health, SandboxSpec
from controller.runners.base import checked
from controller.runners.local.processes import Processes
from controller.runners.local.state import StateDirectory, private_directory, session_key
from controller.runners.local.suspend import Checkpoints
from controller.runners.local.uids import RunAs, UidClaims, UidRange

__all__ = ["LocalRunner"]

log = logs.get(__name__)


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
        run in a pid namespace each, ``checkpoint.py``); ``on_resume`` is called with
        ``restored`` or ``fresh_start`` for each start of a session that had a checkpoint.
        ``max_lifetime_seconds``: a checkpoint whose lineage started longer ago than this is not
        restored (a fresh start instead). ``checkpoint_max_percent`` and
        ``checkpoint_reserve_percent``: the room checkpoints may take on the state volume
        (``checkpoint.refusal``); ``on_checkpoint_refused`` is called with the reason (``cap`` or
        ``reserve``) for each suspension whose image did not fit, so the sandbox was stopped.
        ``contain``: give each sandbox a cgroup of its own where the host allows it
        (``cgroups.py``; ``containment`` says which, or why not); False: never (tests of
        the fallback)."""
        state = Path(state_directory)
        self._state = StateDirectory(state, traversable=run_as is not None)
        self._command = list(executor_command)
        self._key = executor_key
        self._extra_env = dict(extra_env or {})
        self._run_as = run_as
        self._claims = UidClaims(state / "uids", run_as) if isinstance(run_as, UidRange) else None
        self._processes = Processes(self._state, contain)
        self._checkpoints = Checkpoints(
            self._state,
            self._processes,
            criu,
            on_resume,
            max_lifetime_seconds,
            checkpoint_max_percent,
            checkpoint_reserve_percent,
            on_checkpoint_refused,
        )
        self.containment = self._processes.containment

    @property
    def contained(self) -> bool:
        """Whether this runner's sandboxes each get a cgroup (``containment`` says where, or why not)."""
        return self._processes.contained

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        directory = self._state.session(spec.session_id)
        with self._state.locked(directory):
            current = self._state.read(directory)
            if current is not None:
                if self._processes.leader_alive(current):
                    return current
                self._stop(current)  # what is left of a sandbox whose leader died goes first (L1)
            restored = self._checkpoints.resume(directory, spec, generation)
            return restored if restored is not None else self._spawn(directory, spec, generation)

    def status(self, handle: Handle) -> Health:
        self._processes.reap()
        current = self._state.read(self._state.session(handle.session_id))
        if current is None or current.uid != handle.uid:
            return Health.GONE
        return Health.RUNNING if self._processes.leader_alive(current) else Health.FAILED

    def release(self, handle: Handle) -> None:
        directory = self._state.session(handle.session_id)
        with self._state.locked(directory):
            current = self._state.read(directory)
            if current is None or current.uid != handle.uid:
                return  # already gone, or a newer sandbox: not ours to stop
            self._stop(current)
            (directory / "sandbox.json").unlink(missing_ok=True)
        log.info("executor stopped", extra={"session_id": handle.session_id, "sandbox": handle.name})

    @property
    def checkpointing(self) -> bool:
        """Whether idle sandboxes are checkpointed (``criu`` given: ``CONTROLLER_IDLE_SUSPEND=checkpoint``);
        without it ``lifecycle.suspends`` releases them."""
        return self._checkpoints.criu is not None

    def suspend(self, handle: Handle) -> None:
        """Checkpoint the sandbox's whole process tree into ``checkpoint/`` beside its
        workspace, which leaves nothing of it running (issue 29); when its image does not fit or
        the dump fails (logged, counted), or it runs in no pid namespace of its own, the sandbox
        is stopped instead. The next ``ensure`` restores it. Asked only of a runner that is
        ``checkpointing`` (``lifecycle.suspends`` chooses): of another, ``RuntimeError``."""
        if not self.checkpointing:
            raise RuntimeError("suspend asked of a local runner that does not checkpoint (lifecycle.suspends)")
        directory = self._state.session(handle.session_id)
        with self._state.locked(directory):
            current = self._state.read(directory)
            if current is None or current.uid != handle.uid:
                return  # already gone, or a newer sandbox: not ours
            suspended = self._checkpoints.suspend(directory, current)
            self._stop(current)  # whatever the dump left (nothing, once it succeeded)
            (directory / "sandbox.json").unlink(missing_ok=True)
            self._processes.reap()
        if not suspended:
            log.info("executor stopped", extra={"session_id": handle.session_id, "sandbox": handle.name})

    def checkpoint_bytes(self) -> int:
        """Bytes of every session's checkpoint images on the state volume."""
        return self._checkpoints.images_bytes()

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint: ``size_bytes`` and ``suspended_at``; None when it has none."""
        return self._checkpoints.suspended(session_id)

    def find(self, session_id: str) -> Handle | None:
        self._processes.reap()
        current = self._state.read(self._state.session(session_id))
        return current if current is not None and self._processes.members_of(current) else None

    def discard(self, session_id: str) -> None:
        """Remove the session's workspace once it is released for good (L16); its uid, if it
        holds one of a range, is free again."""
        directory = self._state.session(session_id)
        with self._state.locked(directory):
            if self._state.read(directory) is None:
                shutil.rmtree(directory / "workspace", ignore_errors=True)
                shutil.rmtree(directory / "home", ignore_errors=True)
                self._state.drop_checkpoint(directory)
                if self._claims is not None:
                    self._claims.release(session_key(session_id))

    def keeps_workspace(self, session_id: str) -> bool:
        return self._state.keeps_workspace(session_id)

    def workspaces(self) -> list[str]:
        """Sessions whose workspace directory is still here (removed by ``discard``)."""
        return self._state.workspaces()

    def list_managed(self) -> list[Handle]:
        return self._state.handles()

    def end_unrecorded(self) -> list[str]:
        """Stop every sandbox whose start never recorded it (``Processes.end_unrecorded``)."""
        return self._processes.end_unrecorded()

    # -- helpers --------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Stop every executor (dev mode's Ctrl-C; test clean-up)."""
        for handle in self.list_managed():
            self.release(handle)
        self._processes.wait_children()

    def _identity(self, directory: Path) -> tuple[int, int] | None:
        """The (uid, gid) the session's executor runs as; None: this process's own."""
        if isinstance(self._run_as, RunAs):
            return self._run_as.uid, self._run_as.gid
        if self._claims is not None:
            uid = self._claims.claim(directory.name)  # the session's uid, or a fresh one
            return uid, uid
        return None

    def _stop(self, handle: Handle) -> None:
        """Stop every process of the sandbox, and of the session's own uid when it has one."""
        uid = self._claims.uid_of(session_key(handle.session_id)) if self._claims is not None else None
        self._processes.stop(handle, uid)

    def _spawn(self, directory: Path, spec: SandboxSpec, generation: int) -> Handle:
        home = directory / "home"
        identity = self._identity(directory)
        private_directory(directory / "workspace", identity)
        private_directory(home, identity)
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
        namespaced = self._checkpoints.criu is not None  # checkpointable: a pid namespace of its own
        return self._processes.start(directory, spec, generation, argv, env, identity, namespaced)
