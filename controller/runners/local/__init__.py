"""The local runner: one executor process tree per session, on this machine.

``runner`` is the runner protocol (``LocalRunner``). ``checkpoint`` suspends a sandbox with CRIU
and restores it; ``cgroups`` gives each sandbox a cgroup of its own; ``uids`` gives each session
a uid of its own; ``procfs`` reads ``/proc``; ``host_sandbox`` says whether this host lets
Codex build its own sandbox. What the rest of the product, the tests and bench/ use is here.
"""

from controller.runners.local.cgroups import parent as cgroup_parent
from controller.runners.local.checkpoint import host_can_checkpoint
from controller.runners.local.host_sandbox import codex_sandbox_problem
from controller.runners.local.runner import (
    CLOCK_CATCH_UP_SECONDS,
    LocalRunner,
    RunAs,
    members,
    prepare_state_directory,
    session_key,
    state_directory_problems,
)
from controller.runners.local.uids import UidRange

__all__ = [
    "CLOCK_CATCH_UP_SECONDS",
    "LocalRunner",
    "RunAs",
    "UidRange",
    "cgroup_parent",
    "codex_sandbox_problem",
    "host_can_checkpoint",
    "members",
    "prepare_state_directory",
    "session_key",
    "state_directory_problems",
]
