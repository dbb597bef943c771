"""Instructions per request of a server process, counted by valgrind's callgrind: a figure that
does not move with what else the machine runs (CPU time per request does, by tens of percent
on a shared 2-core machine), for comparing servers and changes on a busy machine.

The server runs under ``valgrind --tool=callgrind`` (about fifty times slower); once it
answers, its counters are zeroed (``callgrind_control --zero``), a fixed load is sent, and
the counters are dumped: user-space instructions of every thread of the process (the
interpreter, uvloop, httptools, OpenSSL's HMAC, …) divided by the requests answered. The
kernel's side (socket reads and writes, ``epoll``) is not counted: CPU time per request
includes it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.processes import Managed, port_open, wait_for


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def per_request(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    port: int,
    directory: Path,
    run_load: Callable[[], dict[str, Any]],
) -> float:
    """Instructions per request of ``argv`` (a server listening on ``port``) under ``run_load``."""
    out = directory / f"{name}.callgrind"
    wrapped = [
        "valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}.%p", "--", *argv,
    ]  # fmt: skip
    # The system allocator, not pymalloc's arenas: the same instructions either way to within a
    # few percent, and valgrind follows it without warnings.
    log = directory / f"{name}.callgrind.log"
    server = Managed(name, wrapped, {**env, "PYTHONMALLOC": "malloc"}, log, cwd=directory).start()
    try:
        wait_for(lambda: port_open(port), 300, f"{name} under valgrind")
        run_load()  # warm: connections, caches, the first script load
        control(server.pid, "--zero")
        result = run_load()
        control(server.pid, "--dump")
    finally:
        server.stop(timeout=60)
    dumps = [path.read_text(errors="replace") for path in directory.glob(f"{out.name}.{server.pid}.1")]
    match = re.search(r"^summary: (\d+)", dumps[0], re.MULTILINE) if dumps else None
    if match is None:
        raise SystemExit(f"{name}: callgrind wrote no dump ({server.output()[-500:]})")
    return int(match.group(1)) / result["all_2xx"]


def control(pid: int, action: str) -> None:
    subprocess.run(["callgrind_control", action, str(pid)], check=True, capture_output=True, timeout=120)
