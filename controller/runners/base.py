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

A runner may also keep warm pools (``Pools``): sandboxes started ahead of any session, one of
which ``ensure`` claims for a session instead of starting one; ``tend_pools`` keeps them at
their size (the scheduler's leader calls it every few seconds) and tells how it found each.

``ensure`` refuses (``SpecRefused``, a ``RunnerRejected``) a spec whose ids or ``remote_url`` are unsafe to put
in an argument list, a path or a manifest (``checked``, L2): the decision already refused such
a session; this is the last line of defence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from controller import trust
from controller.errors import SpecRefused
from controller.model import Handle, Health, PoolState, SandboxSpec


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


@runtime_checkable
class Pools(Protocol):
    def tend_pools(self) -> Sequence[PoolState]: ...
