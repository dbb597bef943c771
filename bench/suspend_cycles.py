"""Successive short suspensions of one codex executor (issue 37): how long after each restore
the restored executor is connected again. ``LocalRunner`` with checkpointing on, the Agents
API simulator, the real codex 0.171.0.

Each cycle: the executor connected, ``--up`` seconds later ``suspend`` (the CRIU dump), then
``--suspended`` seconds later ``ensure`` (the restore), then the time until the simulator
reports the environment connected, measured from the restore's start.

    .venv/bin/python bench/suspend_cycles.py [--cycles 8] [--up 2] [--suspended 3]

Root only; needs the cached codex and the CRIU scripts/criu.sh builds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.suspend import checkpointing
from controller.model import SandboxSpec
from tests.support.processes import wait_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--up", type=float, default=2.0, help="seconds connected before each suspension")
    parser.add_argument("--suspended", type=float, default=3.0, help="seconds suspended before each restore")
    args = parser.parse_args()
    directory, simulator, runner, outcomes = checkpointing("bench-suspend-cycles-")
    figures = []
    try:
        with simulator.openai() as api:
            session = api.beta.agents.sessions.create(
                environment={"type": "self_hosted", "workspace_directory": "/workspace"}, input=None
            )
        spec = SandboxSpec(session.id, session.environment.id, session.environment.remote_url)
        connected = lambda: simulator.environment_status(spec.environment_id) == "connected"  # noqa: E731
        handle = runner.ensure(spec, 1)
        wait_for(connected, 60, "codex to connect", interval=0.01)
        for cycle in range(2, args.cycles + 2):
            time.sleep(args.up)
            runner.suspend(handle)
            wait_for(lambda: not connected(), 30, "the link to drop", interval=0.01)
            time.sleep(args.suspended)
            started = time.monotonic()
            handle = runner.ensure(spec, cycle)
            wait_for(connected, 120, "the restored codex to reconnect", interval=0.01)
            figures.append(time.monotonic() - started)
            print(f"restore {cycle - 1}: connected {figures[-1]:.2f} s after the restore began", flush=True)
    finally:
        runner.stop_all()
        simulator.stop()
        shutil.rmtree(directory, ignore_errors=True)
    if outcomes.count("restored") != len(outcomes):
        raise SystemExit(f"not every resume restored: {outcomes}")
    print("reconnects (s): " + ", ".join(f"{f:.2f}" for f in figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
