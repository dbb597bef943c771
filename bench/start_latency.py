"""Delivery → sandbox start → executor registered: the latency distribution (L15).

Runs the whole loop on loopback (redis-server, the simulator, one receiver, two Celery workers
with two pool processes each, the scheduler, the local runner) and creates sessions one after
another at a steady pace; the simulator sends each its signed action-required webhook. Per
session it takes three timestamps, all on this machine's clock:

  delivered   the simulator's delivery attempt the receiver answered 200
  started     the worker's "sandbox started" log line
  registered  the executor's registration call to the simulator (it then connects)

and prints percentiles of delivered → started and delivered → registered, then writes
bench/results/start_latency.png (their distributions). The executor is the real codex when
it is installed (scripts/test puts it in the cache), else the labelled stand-in.

    .venv/bin/python bench/start_latency.py [--sessions 30] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import executor, percentile
from bench.plots import markdown_table, save_png
from tests.support.processes import wait_for
from tests.system.loop import Loop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between session creations")
    args = parser.parse_args()
    command, codex = executor()
    directory = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    loop = Loop(directory, command, receivers=1, workers=2)
    try:
        loop.start()
        sessions: list[dict[str, Any]] = []
        with loop.api() as client:
            for _ in range(args.sessions):
                sessions.append(loop.create_session(client))
                time.sleep(args.interval)
        environments = {s["environment"]["id"]: s["id"] for s in sessions}

        def registered() -> dict[str, float] | None:
            first: dict[str, float] = {}
            for r in loop.registrations():
                if r["status_code"] == 200 and r["environment_id"] in environments:
                    sid = environments[r["environment_id"]]
                    first[sid] = min(first.get(sid, r["received_at"]), r["received_at"])
            return first if len(first) == len(sessions) else None

        registered_at = wait_for(registered, 300, "every executor to register", interval=1.0)
        assert isinstance(registered_at, dict)
        deliveries = httpx.get(f"{loop.simulator_url}/admin/deliveries", timeout=10).json()["data"]
        delivered_at: dict[str, float] = {}
        events = {e["id"]: e for e in httpx.get(f"{loop.simulator_url}/admin/events", timeout=10).json()["data"]}
        for d in deliveries:
            if d["event_type"] != "agent.session.action_required":
                continue
            sid = events[d["event_id"]]["data"]["id"]
            ok = [a for a in d["attempts"] if a["status_code"] == 200]
            if sid in registered_at and ok:
                delivered_at[sid] = min(delivered_at.get(sid, ok[0]["started_at"]), ok[0]["started_at"])
        started_at: dict[str, float] = {}
        for worker in loop.workers:
            for line in worker.log_lines():
                if line.get("event") == "sandbox started" and line.get("session_id") in delivered_at:
                    sid = str(line["session_id"])
                    started_at.setdefault(sid, float(line["time"]))  # type: ignore[arg-type]
    finally:
        loop.stop()
        shutil.rmtree(directory, ignore_errors=True)

    ids = [sid for sid in delivered_at if sid in started_at]
    to_start = [started_at[s] - delivered_at[s] for s in ids]
    to_registered = [registered_at[s] - delivered_at[s] for s in ids]
    header = ["", "p50 (ms)", "p90 (ms)", "p99 (ms)", "max (ms)", "mean (ms)"]
    rows = [
        [
            label,
            *(f"{percentile(v, q) * 1000:.0f}" for q in (0.5, 0.9, 0.99)),
            f"{max(v) * 1000:.0f}",
            f"{statistics.mean(v) * 1000:.0f}",
        ]
        for label, v in (("delivered → sandbox started", to_start), ("delivered → executor registered", to_registered))
    ]
    kind = "real codex" if codex else "stand-in executor"
    print(f"\n{len(ids)} sessions, one every {args.interval}s; {kind}; 2 workers × 2 processes\n")
    print(markdown_table(header, rows))

    def draw(axes: Any) -> None:
        for values, label in (
            (to_start, "delivered → sandbox started"),
            (to_registered, "delivered → executor registered"),
        ):
            ordered = sorted(v * 1000 for v in values)
            axes.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=label)
        axes.set_xlim(left=0)
        axes.set_xlabel("milliseconds after the delivery")
        axes.set_ylabel("fraction of sessions")
        axes.set_ylim(0, 1.02)
        axes.legend(loc="lower right")

    save_png("start_latency", draw, f"Delivery → start → registration ({len(ids)} sessions, {kind})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
