"""Suspend and restore: the local runner's checkpoints (``CONTROLLER_IDLE_SUSPEND=checkpoint``).

Each sandbox then runs in a pid namespace of its own (``processes.py``), and CRIU
(``checkpoint.py``) restores a tree inside the session's cgroup (it runs there and leaves
cgroups alone). ``dump`` checkpoints the namespace into ``checkpoint/`` (``suspended.json``
beside it: when, how big, for which environment, and when its lineage's first sandbox started);
``resume`` restores it as the new generation's sandbox, carrying that first start
(``Handle.lineage_started_at``: the maximum lifetime counts from it), or gives up when it cannot,
or when the lineage is past its maximum lifetime (the runner then starts afresh). A dump is made
only when its image fits the room checkpoints have on the state volume (``checkpoint.refusal``;
one dump at a time, under ``checkpoints.lock``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from controller import logs
from controller.model import Handle, SandboxSpec
from controller.runners.local import cgroups, checkpoint
from controller.runners.local.processes import KILL_WAIT_SECONDS, Processes
from controller.runners.local.procfs import proc_stat
from controller.runners.local.state import CHECKPOINT, SUSPENDED, StateDirectory, leader, write_private

log = logs.get(__name__)

EXECUTOR_EXECUTABLE = "codex"
"""The executor's own binary (codex's native one): its link is shut down before a dump."""
LINK_NOTICE_SECONDS = 0.1
"""How long the executor is given to see its link shut down before the dump (codex's first
reconnect comes 0.5 s or more after a drop, so the dump finds it asleep in its backoff)."""
CLOCK_CATCH_UP_SECONDS = 60
"""A restored sandbox's clocks are moved on by at least this much (more when it was suspended
longer: as long as it was), so a reconnect backoff it slept in (codex's: 30 s at most) is over."""


class Checkpoints:
    """The checkpoints of the sandboxes on one state directory, made with the CRIU binary ``criu``
    (None: checkpointing is off, and nothing is restored). ``on_resume`` is called with
    ``restored`` or ``fresh_start`` for each start of a session that had a checkpoint;
    ``max_lifetime_seconds``: a checkpoint whose lineage started longer ago than this is not
    restored. ``max_percent`` and ``reserve_percent``: the room checkpoints may take on the state
    volume (``checkpoint.refusal``); ``on_refused`` is called with the reason (``cap`` or
    ``reserve``) for each suspension whose image did not fit."""

    def __init__(
        self,
        state: StateDirectory,
        processes: Processes,
        criu: str | None,
        on_resume: Callable[[str], None],
        max_lifetime_seconds: float | None,
        max_percent: float,
        reserve_percent: float,
        on_refused: Callable[[str], None],
    ) -> None:
        self._state = state
        self._processes = processes
        self.criu = criu
        self._on_resume = on_resume
        self._max_lifetime = max_lifetime_seconds
        self._checkpoint_percent = (max_percent, reserve_percent)
        self._on_checkpoint_refused = on_refused

    def suspend(self, directory: Path, current: Handle) -> bool:
        """Checkpoint the sandbox ``current`` (its session's lock held) when it runs in a pid
        namespace and its leader lives; whether a checkpoint was kept (the dump leaves nothing of
        the sandbox running; without one, the caller stops what runs)."""
        if not (self._state.in_pid_namespace(directory) and self._processes.leader_alive(current)):
            return False
        pid, _ = leader(current)
        with self._state.checkpoints_locked():  # one dump at a time on the volume: each sees the others' images
            return self._dump(directory, current, pid)

    def _dump(self, directory: Path, current: Handle, pid: int) -> bool:
        """Checkpoint the tree led by ``pid`` when its image fits (``checkpoint.refusal``, before
        the dump on its estimate, after it on its size); whether it was kept."""
        images = directory / CHECKPOINT
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
            dumped = checkpoint.dump(self.criu or "criu", pid, images)
        except checkpoint.CheckpointFailed as exc:
            self._state.drop_checkpoint(directory)
            log.warning("checkpoint failed, executor stopped instead", extra={**where, "reason": str(exc)})
            return False
        room = self._room(directory)
        room = checkpoint.Room(room.size_bytes, room.free_bytes + dumped.size_bytes, room.images_bytes)
        refused = checkpoint.refusal(room, dumped.size_bytes, *self._checkpoint_percent)
        if refused is not None:  # larger than its estimate: removed (its tree is gone already)
            self._state.drop_checkpoint(directory)
            self._refused(refused, dumped.size_bytes, True, where)
            return False
        write_private(
            directory / SUSPENDED,
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
        size_bytes, free_bytes = checkpoint.volume(self._state.root)
        log.warning(
            "checkpoint refused, executor stopped instead",
            extra={
                **where,
                "reason": reason,
                "image_bytes": size,
                "written": written,  # True: the dump was made, larger than estimated, and removed
                "images_bytes": self.images_bytes(),
                "volume_bytes": size_bytes,
                "free_bytes": free_bytes,
                "max_percent": self._checkpoint_percent[0],
                "reserve_percent": self._checkpoint_percent[1],
            },
        )
        self._on_checkpoint_refused(reason)

    def _room(self, directory: Path) -> checkpoint.Room:
        """The state volume's size and free space, and the images of every session but ``directory``'s."""
        size_bytes, free_bytes = checkpoint.volume(self._state.root)
        others = self.images_bytes(but=directory)
        return checkpoint.Room(size_bytes, free_bytes, others)

    def images_bytes(self, but: Path | None = None) -> int:
        """Bytes of every session's checkpoint images on the state volume (``but``'s left out)."""
        return sum(checkpoint.image_size(d / CHECKPOINT) for d in self._state.root.glob("*") if d != but)

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint: ``size_bytes`` and ``suspended_at``; None when it has none."""
        directory = self._state.session(session_id)
        try:
            data = json.loads((directory / SUSPENDED).read_text())
        except (OSError, ValueError):
            return None
        if not (directory / CHECKPOINT).is_dir():
            return None
        return {"size_bytes": float(data["size_bytes"]), "suspended_at": float(data["suspended_at"])}

    def resume(self, directory: Path, spec: SandboxSpec, generation: int) -> Handle | None:
        """Restore the session's checkpoint, if it has one, as this generation's sandbox; None
        (logged, counted, the checkpoint removed) when there is none or it cannot be restored:
        the caller starts afresh on the same workspace."""
        images = directory / CHECKPOINT
        if not images.is_dir():
            return None
        try:
            saved = json.loads((directory / SUSPENDED).read_text())
        except (OSError, ValueError):
            saved = {}
        started = time.monotonic()
        cgroup = None
        try:
            if self.criu is None:
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
            cgroup = self._processes.fresh_cgroup(directory, spec.session_id)
            pid = checkpoint.restore(self.criu, images, cgroup)
            found = proc_stat(pid)
            if found is None or not found.running:
                raise checkpoint.CheckpointFailed(f"the restored process {pid} is gone")
        except checkpoint.CheckpointFailed as exc:
            if cgroup is not None:
                cgroups.end(cgroup, KILL_WAIT_SECONDS)  # whatever CRIU left of the tree
            self._state.drop_checkpoint(directory)
            log.warning(
                "restore impossible, starting a fresh executor",
                extra={"session_id": spec.session_id, "generation": generation, "reason": str(exc)},
            )
            self._on_resume("fresh_start")
            return None
        self._state.drop_checkpoint(directory)
        handle = self._state.record(
            directory, spec, generation, pid, found.start_ticks, time.time(), lineage, cgroup, pid_namespace=True
        )
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
