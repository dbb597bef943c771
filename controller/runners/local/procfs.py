"""What ``/proc/<pid>/stat`` says about a process: the local runner's view of its sandboxes'
processes and CRIU's restored tree, read one way. A pid names a process only together with its
start time (``start_ticks``): a pid is reused once its process is gone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcStat:
    """What ``/proc/<pid>/stat`` says about one process."""

    pid: int
    state: str
    pgid: int
    sid: int
    start_ticks: int

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X")


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat fields, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid=pid, state=fields[0], pgid=int(fields[2]), sid=int(fields[3]), start_ticks=int(fields[19]))


def start_ticks(pid: int) -> int | None:
    """The start time (clock ticks after boot) of ``pid`` if it runs (not a zombie), else None."""
    found = proc_stat(pid)
    return found.start_ticks if found is not None and found.running else None
