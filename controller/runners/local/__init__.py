"""The local runner: one executor process tree per session, on this machine.

``runner`` is the runner protocol (``LocalRunner``), the face of the rest: ``state`` is the
state directory (its layout, its safety, the records in it), ``processes`` starts, watches and
stops a sandbox's processes, and ``suspend`` checkpoints an idle sandbox and restores it. Below
them are the host's means: ``checkpoint`` (CRIU), ``cgroups`` (a cgroup per sandbox), ``uids``
(who executors run as: one user, or a uid per session), ``host_sandbox`` (whether this host
lets Codex build its own sandbox) and ``procfs`` (reading ``/proc``). What the rest of the
product, the tests and bench/ use is exported here.
"""

from controller.runners.local.cgroups import parent as cgroup_parent
from controller.runners.local.checkpoint import host_can_checkpoint
from controller.runners.local.host_sandbox import codex_sandbox_problem
from controller.runners.local.processes import members
from controller.runners.local.runner import LocalRunner
from controller.runners.local.state import prepare_state_directory, session_key, state_directory_problems
from controller.runners.local.suspend import CLOCK_CATCH_UP_SECONDS
from controller.runners.local.uids import RunAs, UidRange

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
