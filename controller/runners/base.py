"""The runner protocol: one sandbox per session, idempotent by construction.

A runner never decides *whether* to start or stop; ``lifecycle.py`` does. A runner only
makes it so, safely under repetition:

- ``ensure(spec, generation)`` returns the handle of a live sandbox of that generation for
  the session, starting one only when none of that generation is alive. Calling it twice,
  or from two processes at once, yields one sandbox.
- ``status(handle)`` reports ``Health`` without changing anything.
- ``release(handle)`` stops and removes that sandbox (and only that one: the handle's uid
  guards against deleting a newer sandbox of the same name). Releasing what is gone is fine.
- ``find(session_id)`` returns the session's live sandbox, if any, so that a sandbox whose
  start was never recorded (a worker died in between) is adopted, not duplicated.
- ``discard(session_id)`` deletes what outlives a sandbox (a workspace volume) once the
  session is released for good (L16).
- ``list_managed()`` lists every sandbox this runner manages (for reconciliation and clean-up).
- ``workspaces()`` lists the sessions that still have a kept workspace, with or without a
  sandbox, so that the sweep can discard one whose session is gone (L16, L17);
  ``keeps_workspace(session_id)`` asks the same of one session.

A runner may also say why a sandbox that is starting cannot start (``Diagnoses``: a pod whose
node lacks its seccomp profile), so that it is reported and kept rather than replaced by one
that could not start either.

A runner may also keep warm pools (``Pools``): sandboxes started ahead of any session, one of
which ``ensure`` claims for a session instead of starting one; ``tend_pools`` keeps them at
their size (the scheduler's leader calls it every few seconds) and tells how it found each. A
pool sized by demand reads its size from a ``DemandLog`` the workers note placements in.

``ensure`` refuses (``SpecRefused``, a ``RunnerRejected``) a spec whose ids or ``remote_url`` are unsafe to put
in an argument list, a path or a manifest (``checked``, L2): the decision already refused such
a session; this is the last line of defence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from controller import trust
from controller.errors import SpecRefused
from controller.model import CannotStart, Handle, Health, PoolState, SandboxSpec


def checked(spec: SandboxSpec) -> SandboxSpec:
    """The spec itself, or ``SpecRefused`` when an id or the URL's shape is unsafe (L2)."""
    problem = trust.spec_problem(spec)
    if problem is not None:
        raise SpecRefused(f"refused to start a sandbox: {problem}")
    return spec


class Runner(Protocol):
    def ensure(self, spec: SandboxSpec, generation: int) -> Handle: ...

    def status(self, handle: Handle) -> Health: ...

    def release(self, handle: Handle) -> None: ...

    def find(self, session_id: str) -> Handle | None: ...

    def discard(self, session_id: str) -> None: ...

    def list_managed(self) -> list[Handle]: ...

    def workspaces(self) -> list[str]: ...

    def keeps_workspace(self, session_id: str) -> bool: ...


class DemandLog(Protocol):
    """When sessions of a template were placed (claims and cold starts), shared by every
    process: the workers note each placement, the scheduler's leader sizes the pool from them."""

    def note(self, template: str, keep_seconds: float) -> None:
        """Note one placement now; notes older than ``keep_seconds`` may be dropped."""
        ...

    def recent(self, template: str) -> tuple[float, list[float]]:
        """The clock's time now and the stamps of the placements noted (on that clock)."""
        ...


@runtime_checkable
class Starts(Protocol):
    """A runner that tells how it placed a session's sandbox, and when the sandbox's own start
    stages happened (``controller.start_stages``)."""

    def placement(self, session_id: str) -> tuple[str, str] | None:
        """(template, source) of the sandbox this process's last ``ensure`` for the session
        returned (source: ``warm`` or ``cold``); None when it placed none lately."""
        ...

    def start_stamps(self, handle: Handle) -> dict[str, float]:
        """The sandbox's own stamps (``start_stages.STAMPS``: pod_created, scheduled,
        container_started) that are known; empty when there are none."""
        ...


@runtime_checkable
class Connects(Protocol):
    """A runner that opens its connections ahead of its first placement (each worker pool
    process, at its start): else a process's first placement pays for them inside its job."""

    def connect(self) -> None:
        """Open them now; best effort (a failure is logged: the first placement connects)."""
        ...


@runtime_checkable
class EndsUnrecorded(Protocol):
    """A runner whose start can be cut short between its sandbox's first process and the record
    of it (the worker that started it killed in between): such a sandbox runs with nothing that
    would ever stop it. ``end_unrecorded`` stops every one found, the sweep's safety net."""

    def end_unrecorded(self) -> list[str]:
        """Stop every sandbox no record names (none being started now); the sessions whose
        sandbox it stopped."""
        ...


@runtime_checkable
class Suspends(Protocol):
    """A runner that can stop an idle sandbox with its memory kept (issue 29). Whether a stop
    suspends is chosen in one place, ``lifecycle.suspends``: an idle stop on a runner whose
    ``checkpointing`` is on. ``suspend`` then checkpoints the sandbox and frees it; a checkpoint
    it cannot make (no room for the image, a failed dump) leaves a plain stop all the same,
    logged and counted by the runner. The next ``ensure`` for the session restores it, or starts
    afresh when it cannot."""

    @property
    def checkpointing(self) -> bool:
        """Whether this runner checkpoints idle sandboxes (False: they are released)."""
        ...

    def suspend(self, handle: Handle) -> None:
        """Checkpoint the sandbox and free it; asked only of a runner that is ``checkpointing``."""
        ...

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint (``size_bytes``, ``suspended_at``), or None."""
        ...


@runtime_checkable
class Diagnoses(Protocol):
    """A runner that can tell why a sandbox that is starting cannot start."""

    def diagnose(self, handle: Handle) -> tuple[Health, CannotStart | None]:
        """The sandbox's health (as ``status``, from the same read) and, while it is starting,
        why it cannot start, or None."""
        ...

    def tell_cannot_start(self, handle: Handle, found: CannotStart) -> None:
        """Say it on the sandbox itself (a Kubernetes Event on the pod); best effort."""
        ...


@runtime_checkable
class Pools(Protocol):
    def tend_pools(self) -> Sequence[PoolState]: ...
