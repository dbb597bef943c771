"""Where a server process's CPU goes per request: py-spy samples of it under load, each sample
attributed to one stage of the request path, scaled by the CPU time per request measured from
``/proc`` over the same seconds.

py-spy (``pip install py-spy``) samples the process from outside (ptrace: root, or
``kernel.yama.ptrace_scope`` 0) without changing its code; it counts a sample only while a
thread is running (not while the event loop waits in ``epoll``), so each stage's share of the
samples is its share of the process's CPU time. A sample goes to the stage of its innermost
frame that names one (``STAGES``): time in the standard library or in C (a socket write, the
JSON encoder) counts for the stage that called it, and the HTTP server's work that the
receiver's code awaits (reading the body, sending the answer) counts as HTTP.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bench.plots import markdown_table

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the log line (logging, controller/logs.py)", ("logging/__init__.py", "controller/logs.py")),
    ("the metric (prometheus_client)", ("prometheus_client/",)),
    ("signature: headers and HMAC (controller/signing.py)", ("controller/signing.py",)),
    ("the task message (controller/task_message.py)", ("controller/task_message.py",)),
    ("the Redis call (controller/store/)", ("controller/store/",)),
    ("parse and classify (controller/events.py)", ("controller/events.py",)),
    ("the receiver's own steps (controller/endpoint/app.py)", ("controller/endpoint/app.py",)),
    ("HTTP parsing and answering (uvicorn, h11, httptools)", ("uvicorn/protocols/", "h11/", "httptools/")),
    ("ASGI dispatch (uvicorn middleware, Starlette)", ("uvicorn/middleware/", "starlette/")),
    ("the header deadline and server options (controller/endpoint/server.py)", ("controller/endpoint/server.py",)),
)
OTHER = "the event loop and the rest (asyncio, uvloop, the interpreter)"


def stage_of(frames: Iterable[str]) -> str:
    """The stage of one sample, from its frames (``function (path:line)`` each, outermost first)."""
    for frame in reversed(list(frames)):
        for stage, needles in STAGES:
            if any(needle in frame for needle in needles):
                return stage
    return OTHER


def read_raw(path: Path) -> Counter[str]:
    """Samples per stage from py-spy's ``--format raw`` output (collapsed stacks: ``a;b;c COUNT``)."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack.split(";"))] += int(count)
    return counts


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    return found


def profile(pid: int, run_load: Callable[[], dict[str, Any]], output: Path, rate: int = 499) -> str:
    """Run ``run_load`` (closed loop against the process ``pid``) while py-spy samples ``pid``;
    return a table of CPU µs per request by stage."""
    recorder = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        used = cpu_seconds(pid)
        result = run_load()
        used = cpu_seconds(pid) - used
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        try:
            _, errors = recorder.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            _, errors = recorder.communicate()
    if not output.exists():
        raise SystemExit(f"py-spy wrote no profile: {errors.strip()[-500:]}")
    counts = read_raw(output)
    return table(counts, used / result["all_2xx"] * 1e6, result)


def table(counts: Counter[str], per_request_us: float, result: dict[str, Any]) -> str:
    total = sum(counts.values()) or 1
    order = [stage for stage, _ in STAGES] + [OTHER]
    rows = [
        [stage, f"{counts[stage] / total * 100:.1f}", f"{counts[stage] / total * per_request_us:.0f}"]
        for stage in order
        if counts[stage]
    ]
    rows.append(["all (CPU per request from /proc)", "100", f"{per_request_us:.0f}"])
    head = f"{result['all_2xx']} requests at {result['rps']:.0f} req/s; {total} samples\n\n"
    return head + markdown_table(["stage", "share of samples (%)", "µs per request"], rows)
