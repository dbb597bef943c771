"""Suspend with memory against a fresh start, local runner (issue 29): ``codex exec-server``
started by ``LocalRunner`` with checkpointing on (as a worker runs it with
``CONTROLLER_IDLE_SUSPEND=checkpoint``), connected to the Agents API simulator.

For each case, ``--rounds`` times (default 3; medians are printed):

  idle codex     the executor alone, connected and idle
  + 100 MiB      the executor, and a process a command of a turn started (``setsid -f``) that
                 holds 100 MiB of random bytes in memory

it measures the fresh start (``ensure`` → the simulator reports the environment connected),
the memory (USS: private pages) and CPU the sandbox's processes use while idle (over
``--settle`` seconds), the suspension (``LocalRunner.suspend``: the CRIU dump, after which no
process of the sandbox is left) and the size of its images, and the resume (``ensure`` → the
restored executor reconnected by itself; and the restore alone, ``ensure`` returning).

    .venv/bin/python bench/suspend.py [--rounds 3] [--settle 5]

Root only; needs the cached codex and the CRIU scripts/criu.sh builds (``scripts/test``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.idle_memory import codex_commands, smaps
from bench.plots import markdown_table
from controller.model import Handle, SandboxSpec
from controller.runners.local import LocalRunner, host_can_checkpoint
from controller.runners.local.checkpoint import namespace_processes
from tests.support.processes import wait_for
from tests.support.simulator import SimulatorProcess, run_turn

ROOT = Path(__file__).resolve().parents[1]
HOLDER = "import os, time; kept = bytearray(os.urandom(100 * 2**20)); time.sleep(10**9)"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def tree(runner: LocalRunner, handle: Handle) -> list[int]:
    """Every process of the sandbox: its pid namespace's (the holder left the executor's session)."""
    return namespace_processes(int(handle.uid.split(":")[0]))


def one_round(runner: LocalRunner, simulator: SimulatorProcess, hold: bool, settle: float) -> dict[str, float]:
    with simulator.openai() as api:
        session = api.beta.agents.sessions.create(
            environment={"type": "self_hosted", "workspace_directory": "/workspace"}, input=None
        )
    spec = SandboxSpec(session.id, session.environment.id, session.environment.remote_url)
    connected = lambda: simulator.environment_status(spec.environment_id) == "connected"  # noqa: E731
    started = time.monotonic()
    first = runner.ensure(spec, 1)
    wait_for(connected, 60, "codex to connect", interval=0.01)
    fresh = time.monotonic() - started
    if hold:
        turn = run_turn(
            simulator.base_url,
            spec.session_id,
            [["sh", "-c", f"setsid -f python3 -c '{HOLDER}' </dev/null >/dev/null 2>&1"]],
        )
        assert turn["commands"][0]["exit_code"] == 0, turn
        time.sleep(2)  # the holder fills its 100 MiB
    pids = tree(runner, first)
    cpu_before = cpu_seconds(pids)
    time.sleep(settle)
    cpu = cpu_seconds(pids) - cpu_before
    uss = sum((s["Private_Clean"] + s["Private_Dirty"]) for s in map(smaps, pids) if s) / 1024
    started = time.monotonic()
    runner.suspend(first)
    suspend = time.monotonic() - started
    left = [p for p in pids if Path(f"/proc/{p}").exists()]
    size = runner.suspended(spec.session_id)
    assert size is not None and not left, (size, left)
    wait_for(lambda: not connected(), 30, "the link to drop", interval=0.05)
    started = time.monotonic()
    second = runner.ensure(spec, 2)
    restore = time.monotonic() - started
    wait_for(connected, 60, "the restored codex to reconnect", interval=0.01)
    resume = time.monotonic() - started
    back = len(tree(runner, second))
    assert back == len(pids), f"{len(pids)} processes suspended, {back} restored"
    runner.release(second)
    return {
        "fresh": fresh,
        "uss": uss,
        "cpu_per_minute": cpu * 60 / settle,
        "processes": len(pids),
        "suspend": suspend,
        "size": size["size_bytes"] / 1e6,
        "restore": restore,
        "resume": resume,
    }


def checkpointing(prefix: str) -> tuple[Path, SimulatorProcess, LocalRunner, list[str]]:
    """A started simulator and a local runner that checkpoints the real codex with the CRIU
    scripts/criu.sh built, in a new temporary directory named by ``prefix``, and the list the
    runner reports its resume outcomes to. Exits when this host cannot checkpoint."""
    criu = subprocess.run([str(ROOT / "scripts" / "criu.sh"), "--print"], capture_output=True, text=True).stdout.strip()
    ok, reason = host_can_checkpoint(criu)
    if not ok:
        raise SystemExit(f"this host cannot checkpoint: {reason}")
    launcher, _ = codex_commands()
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    simulator = SimulatorProcess(directory / "logs").start()
    outcomes: list[str] = []
    runner = LocalRunner(
        directory / "state", [launcher], simulator.environment_key, criu=criu, on_resume=outcomes.append
    )
    return directory, simulator, runner, outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0, help="idle seconds measured before each suspension")
    args = parser.parse_args()
    directory, simulator, runner, outcomes = checkpointing("bench-suspend-")
    results: dict[str, list[dict[str, float]]] = {"idle codex": [], "+ 100 MiB": []}
    try:
        for _ in range(args.rounds):
            for case, hold in (("idle codex", False), ("+ 100 MiB", True)):
                results[case].append(one_round(runner, simulator, hold, args.settle))
    finally:
        runner.stop_all()
        simulator.stop()
        shutil.rmtree(directory, ignore_errors=True)
    if outcomes.count("restored") != len(outcomes):
        raise SystemExit(f"not every resume restored: {outcomes}")

    def median(case: str, key: str, digits: int = 2) -> str:
        return f"{statistics.median(r[key] for r in results[case]):.{digits}f}"

    print(f"{args.rounds} rounds per case (medians); the npm launcher and the native codex 0.171.0\n")
    header = [
        "case",
        "processes",
        "USS idle (MiB)",
        "CPU idle (s/min)",
        "fresh start → connected (s)",
        "suspend (s)",
        "image (MB)",
        "restore (s)",
        "resume → reconnected (s)",
    ]
    body = [
        [
            case,
            median(case, "processes", 0),
            median(case, "uss", 1),
            median(case, "cpu_per_minute", 3),
            median(case, "fresh"),
            median(case, "suspend"),
            median(case, "size", 1),
            median(case, "restore"),
            median(case, "resume"),
        ]
        for case in results
    ]
    print(markdown_table(header, body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
