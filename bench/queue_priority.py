"""Connection requests while a 10,000-session sweep's jobs are queued: one queue vs two.

Runs the whole loop on loopback (redis-server, the simulator, one receiver, two Celery workers
with two pool processes each, the scheduler, the local runner with the stand-in executor) and
measures two phases in the same run, one after the other on the same processes:

  one queue    the sweep's jobs go on the webhook queue, as every job did before the
               maintenance queue existed: a connection request queues behind them
  two queues   the sweep's jobs go on the maintenance queue (what the scheduler does now):
               workers take the webhook job first

In each phase the real sweep (``controller.reconcile.sweep``) asks for work on N sessions and
publishes one job each (a runner reporting N kept workspaces whose sessions the simulator does
not know: each job costs a worker one Agents API GET, a 404, and the store calls, as a swept
session does), then sessions are created at a steady pace; the simulator sends each its signed
action-required webhook. Per session: delivered (the attempt the receiver answered 200) →
started (the worker's "sandbox started" line). A phase ends when its sessions started and both
queues are empty.

    .venv/bin/python bench/queue_priority.py [--sweep 10000] [--sessions 20] [--interval 0.25]
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

from bench.plots import markdown_table, save_png
from bench.start_latency import percentile
from controller import logs, queue, reconcile
from controller.inbox import Job
from controller.model import Handle, Health
from controller.store.redis import RedisSessionStore
from tests.support.processes import wait_for
from tests.support.redis_clients import connect
from tests.system.loop import Loop


class Workspaces:
    """A runner whose only sandboxes are N kept workspaces: the sweep asks for work on each."""

    def __init__(self, session_ids: list[str]) -> None:
        self._ids = session_ids

    def list_managed(self) -> list[Handle]:
        return []

    def workspaces(self) -> list[str]:
        return list(self._ids)

    def status(self, handle: Handle) -> Health:
        return Health.RUNNING


def phase(loop: Loop, name: str, target: str, sweep_size: int, sessions: int, interval: float) -> dict[str, Any]:
    client = connect(loop.redis.url)
    store = RedisSessionStore(client, lease_ttl_seconds=30)
    publish = queue.batch_publisher(client, target)
    swept = [f"sess_sweep_{name}_{n:06d}" for n in range(sweep_size)]
    began = time.perf_counter()
    runner: Any = Workspaces(swept)
    reconcile.sweep(store, runner, lambda sids: publish([Job(sid, "", "reconcile") for sid in sids]))
    sweep_seconds = time.perf_counter() - began
    depth_at_first = int(client.llen(queue.QUEUE)) + int(client.llen(queue.MAINTENANCE_QUEUE))
    created: list[str] = []
    with loop.api() as api:
        for _ in range(sessions):
            created.append(str(loop.create_session(api)["id"]))
            time.sleep(interval)

    def started() -> dict[str, float] | None:
        found: dict[str, float] = {}
        for worker in loop.workers:
            for line in worker.log_lines():
                if line.get("event") == "sandbox started" and line.get("session_id") in created:
                    found.setdefault(str(line["session_id"]), float(line["time"]))  # type: ignore[arg-type]
        return found if len(found) == len(created) else None

    started_at = wait_for(started, 900, f"{name}: every session to start", interval=1.0)
    assert isinstance(started_at, dict)
    wait_for(
        lambda: client.llen(queue.QUEUE) == 0 and client.llen(queue.MAINTENANCE_QUEUE) == 0,
        900,
        f"{name}: the sweep's jobs to drain",
        interval=1.0,
    )
    drained = time.perf_counter() - began
    deliveries = httpx.get(f"{loop.simulator_url}/admin/deliveries", timeout=30).json()["data"]
    events = {e["id"]: e for e in httpx.get(f"{loop.simulator_url}/admin/events", timeout=30).json()["data"]}
    delivered_at: dict[str, float] = {}
    for d in deliveries:
        if d["event_type"] != "agent.session.action_required":
            continue
        sid = events[d["event_id"]]["data"]["id"]
        ok = [a for a in d["attempts"] if a["status_code"] == 200]
        if sid in started_at and ok:
            delivered_at[sid] = min(delivered_at.get(sid, ok[0]["started_at"]), ok[0]["started_at"])
    client.close()
    latencies = [started_at[s] - delivered_at[s] for s in delivered_at]
    return {
        "name": name,
        "latencies": latencies,
        "sweep_seconds": sweep_seconds,
        "depth": depth_at_first,
        "drained": drained,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=10_000, help="sessions the sweep enqueues")
    parser.add_argument("--sessions", type=int, default=20, help="connection requests per phase")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between session creations")
    args = parser.parse_args()
    logs.setup("WARNING")
    directory = Path(tempfile.mkdtemp(prefix="bench-queues-"))
    # Jobs wait in the queue for tens of seconds in the first phase: keep the recovery pass from
    # re-enqueuing them meanwhile (it would only add coalesced duplicates).
    quiet_recovery = {"CONTROLLER_RECOVERY_AFTER_SECONDS": "900"}
    executor = f"{sys.executable} -m agents_simulator.standin"
    loop = Loop(directory, executor, receivers=1, workers=2, extra_env=quiet_recovery)
    results = []
    try:
        loop.start()
        for name, target in (("one queue", queue.QUEUE), ("two queues", queue.MAINTENANCE_QUEUE)):
            results.append(phase(loop, name, target, args.sweep, args.sessions, args.interval))
            r = results[-1]
            print(
                f"{name}: {len(r['latencies'])} sessions, p50 {percentile(r['latencies'], 0.5) * 1000:.0f} ms, "
                f"p99 {percentile(r['latencies'], 0.99) * 1000:.0f} ms",
                flush=True,
            )
    finally:
        loop.stop()
        shutil.rmtree(directory, ignore_errors=True)
    header = [
        "sweep jobs on",
        "sessions",
        "delivered → started p50 (ms)",
        "p99 (ms)",
        "max (ms)",
        "mean (ms)",
        "jobs queued when the sweep ended",
        "sweep + drain (s)",
    ]
    rows = [
        [
            "the webhook queue (before)" if r["name"] == "one queue" else "the maintenance queue (after)",
            str(len(r["latencies"])),
            f"{percentile(r['latencies'], 0.5) * 1000:.0f}",
            f"{percentile(r['latencies'], 0.99) * 1000:.0f}",
            f"{max(r['latencies']) * 1000:.0f}",
            f"{statistics.mean(r['latencies']) * 1000:.0f}",
            str(r["depth"]),
            f"{r['drained']:.1f}",
        ]
        for r in results
    ]
    print(
        f"\n{args.sweep} swept sessions, {args.sessions} connection requests one every {args.interval}s "
        "per phase; 1 receiver, 2 workers × 2 processes, stand-in executor\n"
    )
    print(markdown_table(header, rows))

    def draw(axes: Any) -> None:
        for r in results:
            ordered = sorted(v * 1000 for v in r["latencies"])
            axes.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=r["name"])
        axes.set_xscale("log")
        axes.set_xlabel("delivered → sandbox started (ms, log scale)")
        axes.set_ylabel("fraction of sessions")
        axes.set_ylim(0, 1.02)
        axes.legend(loc="lower right")

    save_png("queue_priority", draw, f"Connection requests during a {args.sweep}-session sweep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
