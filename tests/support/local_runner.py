"""The local runner's sandboxes as tests see them: which still have a process, and which pids
they have. The runner keeps no such view for tests; these read what it records (``list_managed``,
``find`` and ``sandbox.json`` in its state directory) and ``/proc``."""

from __future__ import annotations

import json
from pathlib import Path

from controller.model import Handle
from controller.runners.local import LocalRunner, members, session_key
from controller.runners.local.cgroups import members as cgroup_members
from controller.runners.local.procfs import proc_stat

__all__ = ["live", "sandbox_pids"]


def live(runner: LocalRunner) -> list[Handle]:
    """The runner's sandboxes with any process left (in their cgroup, or session): each one
    ``find`` finds (which reaps the runner's exited children too)."""
    return [h for h in runner.list_managed() if runner.find(h.session_id) == h]


def sandbox_pids(state: Path, handle: Handle) -> list[int]:
    """The pids of the running processes of ``handle``'s sandbox, for the runner on the state
    directory ``state``: its whole cgroup when ``sandbox.json`` records one for that sandbox
    (whatever session a process is in), else its leader's session."""
    try:
        record = json.loads((state / "sessions" / session_key(handle.session_id) / "sandbox.json").read_text())
    except (OSError, ValueError):
        record = {}
    if record.get("cgroup") and f"{record.get('pid')}:{record.get('start_ticks')}" == handle.uid:
        found = [proc_stat(pid) for pid in cgroup_members(Path(record["cgroup"]))]
        return [p.pid for p in found if p is not None and p.running]
    pid, _, ticks = handle.uid.partition(":")
    return [p.pid for p in members(int(pid), int(ticks))]
