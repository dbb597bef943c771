"""First input → turn started, with pre-start and without, side by side in one run.

Runs the whole loop on loopback (redis-server, the simulator, one receiver, one Celery worker,
the scheduler, the local runner with the real codex when installed) with
CONTROLLER_PRESTART_AGENT_IDS naming one agent. It creates sessions of that agent and of
another one, alternately, none with input, waits until every pre-started executor has
registered, then sends each session its first input and times, on this machine's clock, how
long until the session's turn is running (its status reads ``in_progress``, polled every
10 ms). Without pre-start that includes the connection request: its webhook, the worker, the
sandbox start and the executor's registration; with it, none of that.

    .venv/bin/python bench/prestart.py [--sessions 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import executor, percentile
from tests.support.processes import wait_for
from tests.system.loop import Loop

PRESTART, ON_REQUEST = "agent_prestart", "agent_on_request"


def first_turn_seconds(loop: Loop, client: httpx.Client, session_id: str) -> float:
    """Seconds from sending the first input to the session's turn running."""
    started = time.monotonic()
    loop.submit(session_id, "hello")
    while True:
        status = client.get(f"/v1/agents/sessions/{session_id}").json()["status"]
        if status == "in_progress":
            return time.monotonic() - started
        if status == "failed" or time.monotonic() - started > 120:
            raise RuntimeError(f"session {session_id} never started its turn (status {status})")
        time.sleep(0.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10, help="sessions per arm")
    args = parser.parse_args()
    command, codex = executor()
    loop = Loop(
        Path(tempfile.mkdtemp(prefix="bench-prestart-")),
        command,
        receivers=1,
        workers=1,
        extra_env={"CONTROLLER_PRESTART_AGENT_IDS": PRESTART},
    )
    try:
        loop.start()
        sessions: list[tuple[str, dict[str, Any]]] = []
        with loop.api() as client:
            for _ in range(args.sessions):
                for agent in (PRESTART, ON_REQUEST):
                    sessions.append((agent, loop.create_session(client, input_text=None, agent=None, agent_id=agent)))
        warm = {s["environment"]["id"] for agent, s in sessions if agent == PRESTART}

        def all_registered() -> bool:
            return warm <= {r["environment_id"] for r in loop.registrations() if r["status_code"] == 200}

        wait_for(all_registered, 300, "every pre-started executor to register", interval=0.5)
        seconds: dict[str, list[float]] = {PRESTART: [], ON_REQUEST: []}
        with loop.api() as client:
            for agent, session in sessions:  # alternating arms: drift in the machine hits both
                seconds[agent].append(first_turn_seconds(loop, client, session["id"]))
    finally:
        loop.stop()

    print(f"executor: {'codex' if codex else 'stand-in'}; {args.sessions} sessions per arm")
    print("| arm | p50 | p90 | max |")
    print("| --- | --- | --- | --- |")
    for agent, label in ((ON_REQUEST, "on request (no pre-start)"), (PRESTART, "pre-started")):
        values = seconds[agent]
        print(f"| {label} | {percentile(values, 0.5):.3f} s | {percentile(values, 0.9):.3f} s | {max(values):.3f} s |")
    ratio = statistics.median(seconds[ON_REQUEST]) / statistics.median(seconds[PRESTART])
    print(f"median first input → turn running: on request / pre-started = {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
