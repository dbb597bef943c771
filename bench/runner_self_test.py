"""The runner's startup self-test of Codex's sandbox: what it costs the executor's start.

Runs the sandbox image's entrypoint (``runner_image/entrypoint.sh``) directly with the native
codex binary (as the image runs it) against the simulator on loopback, as an unprivileged uid
(65534) in a directory of its own, alternating rounds with the self-test on
(``SANDBOX_SELF_TEST_SECONDS`` default) and off (``0``). Per round: seconds from the
entrypoint's start until the simulator reports the environment connected, and the self-test's
own ``seconds`` from its log line. Prints medians (and the 90th percentile) as a markdown table.

    .venv/bin/python bench/runner_self_test.py [--rounds 10]      # root (switches to uid 65534)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile
from bench.idle_memory import codex_commands
from bench.plots import markdown_table
from tests.support.processes import wait_for
from tests.support.simulator import SimulatorProcess

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = ROOT / "runner_image" / "entrypoint.sh"
UID = 65534
SELF_TEST = "codex sandbox self-test"


def one_round(sim: SimulatorProcess, native: str, base: Path, on: bool) -> tuple[float, float | None, str]:
    """Seconds to connected, the self-test's own seconds (None when off) and its verdict."""
    session = sim.openai().beta.agents.sessions.create(
        environment={"type": "self_hosted", "workspace_directory": "/workspace"}, input="hi"
    )
    env_id, remote_url = session.environment.id, session.environment.remote_url
    home = Path(tempfile.mkdtemp(dir=base))
    (home / ".codex").mkdir()
    (home / "tmp").mkdir()
    for path in (home, home / ".codex", home / "tmp"):
        os.chown(path, UID, UID)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TMPDIR": str(home / "tmp"),
        "CODEX_BIN": native,
        "REMOTE_URL": remote_url,
        "ENVIRONMENT_ID": env_id,
        "CODEX_API_KEY": sim.environment_key,
        **({} if on else {"SANDBOX_SELF_TEST_SECONDS": "0"}),
    }
    log = home / "entrypoint.log"
    with open(log, "wb") as out:
        started = time.monotonic()
        process = subprocess.Popen(
            ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "bash", str(ENTRYPOINT)],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: sim.environment_status(env_id) == "connected", 30, "the environment to be connected", 0.01)
        connected = time.monotonic() - started
        seconds, verdict = None, "off"
        if on:

            def line() -> dict[str, Any] | None:
                found = [json.loads(x) for x in log.read_text().splitlines() if SELF_TEST in x]
                return found[0] if found else None

            found: dict[str, Any] = wait_for(line, 30, "the self-test's line")
            seconds, verdict = float(found["seconds"]), str(found["sandbox"])
        return connected, seconds, verdict
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the entrypoint runs as uid 65534, as an unprivileged pod's would")
    _, native = codex_commands()
    base = Path(tempfile.mkdtemp(prefix="bench-self-test-"))
    base.chmod(0o755)
    # The native binary where uid 65534 can run it (the cache is under root's home).
    shared = base / "codex"
    shutil.copytree(Path(native).parents[1], shared)
    for path in (shared, *shared.rglob("*")):
        path.chmod(0o755)
    binary = str(shared / "bin" / "codex")
    on: list[tuple[float, float | None, str]] = []
    off: list[tuple[float, float | None, str]] = []
    try:
        with SimulatorProcess(base / "logs") as sim:
            one_round(sim, binary, base, True)  # warm-up: page cache
            for _ in range(args.rounds):
                on.append(one_round(sim, binary, base, True))
                off.append(one_round(sim, binary, base, False))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    verdicts = sorted({v for _, _, v in on})
    rows = []
    for label, runs in (("off", off), ("on", on)):
        connected = [c for c, _, _ in runs]
        own = [s for _, s, _ in runs if s is not None]
        rows.append(
            [
                label,
                f"{statistics.median(connected):.3f}",
                f"{percentile(connected, 0.9):.3f}",
                f"{statistics.median(own):.3f}" if own else "-",
                ", ".join(verdicts) if own else "-",
            ]
        )
    print(f"{args.rounds} rounds each, load average {os.getloadavg()[0]:.1f}")
    header = ["self-test", "start → connected, median (s)", "p90 (s)", "self-test's own (s)", "verdict"]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
