"""Find a CRIU that can checkpoint on this host, for tests that suspend sandboxes (issue 29)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controller.runners.local import host_can_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def criu_binary() -> str:
    """The CRIU binary ``scripts/criu.sh`` built (or ``CONTROLLER_CRIU``), when ``criu check``
    passes with it; otherwise the test is skipped with the reason (failed under ``CI=true``,
    where scripts/test built it)."""
    override = os.environ.get("CONTROLLER_CRIU")
    if override:
        binary = override
    else:
        printed = subprocess.run([str(ROOT / "scripts" / "criu.sh"), "--print"], capture_output=True, text=True)
        binary = printed.stdout.strip()
    ok, reason = host_can_checkpoint(binary)
    if ok:
        return binary
    message = f"this host cannot checkpoint: {reason}; run scripts/criu.sh (as root)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def proc_limits_criu() -> str:
    """The CRIU ``scripts/criu.sh --variant proc-limits`` built (scripts/criu-proc-limits.patch:
    a non-root task's rlimits read from /proc when prlimit(2) is refused, as it is to a root
    without CAP_SYS_RESOURCE), or "" when it was not built. The real node tier's."""
    printed = subprocess.run(
        [str(ROOT / "scripts" / "criu.sh"), "--variant", "proc-limits", "--print"], capture_output=True, text=True
    )
    binary = printed.stdout.strip()
    return binary if binary and os.access(binary, os.X_OK) else ""
