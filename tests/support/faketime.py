"""A process whose own wall clock is off by a given number of seconds.

``skewed(seconds)`` is the environment that preloads ``skew/skewclock.c`` (built here once with
the system's C compiler, into the cache): every read of the wall clock in that process
(``time.time()``, ``datetime.now()``, ``gettimeofday``) is shifted, while its monotonic clock —
its sleeps, timeouts and waits — stays true. Tests use it to show that decisions use Redis's
clock, not the process's own. (libfaketime shifts the monotonic clock's sleeps too and breaks
Python's ``time.sleep``: EINVAL or a hang, as seen with 0.9.10.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("skew") / "skewclock.c"


def library() -> Path:
    """The built shim (cached by the source's hash); skips the test (fails it under ``CI=true``)
    when no C compiler is there to build it."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("SANDBOX_CONTROLLER_CACHE", Path.home() / ".cache" / "sandbox-controller"))
    built = cache / "skewclock" / f"skewclock-{digest}.so"
    if built.is_file():
        return built
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        message = "no C compiler (cc or gcc) to build the clock-skew shim tests/support/skew/skewclock.c"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    built.parent.mkdir(parents=True, exist_ok=True)
    partial = built.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SOURCE), "-ldl"], check=True)
    partial.replace(built)
    return built


def skewed(seconds: float) -> dict[str, str]:
    """Environment variables that put a process's wall clock ``seconds`` ahead (or behind)."""
    return {"LD_PRELOAD": str(library()), "SKEW_CLOCK_SECONDS": f"{seconds:g}"}
