"""Agents API calls per hour that sweeps cost at N idle sessions, counted from real sweeps:
every pass full (before), partial passes that leave timed sessions to their timers (timers
only), and partial passes that also leave sessions whose pod is watched to the pod watch
(timers + watch), each with a full pass every ``CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS``.

Two populations of N idle sessions, as workers leave them:

- stopped: the idle timeout stopped their sandboxes; a mapping each, the workspace kept, the
  timer armed at the end of its retention (7 days by default); the runner reports N workspaces.
- warm: kept warm (``CONTROLLER_IDLE_TIMEOUT_SECONDS=0``, no maximum lifetime): a mapping and a
  running pod each and no timer (nothing about them is due); the runner reports N pods.

A fresh real redis-server holds the store; one hour of passes at the reconcile interval (300
s: 12 passes) runs against it, each full or partial as the scheduler chooses, publishing to
the real queue. Each job a sweep enqueues costs a worker one Agents API GET (the session; an
idle session asks nothing else), so the jobs counted are the calls. Timers add N /
retention-hours calls per hour to the stopped population either way; the pod watch adds a call
only when a pod changes (none do at idle).

    .venv/bin/python bench/sweep_calls.py [--sessions 10000] [--interval 300] [--retention-days 7]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Listing
from bench.plots import markdown_table
from controller import logs, queue, reconcile
from controller.inbox import Job
from controller.model import Handle, Record
from controller.store.base import Lease
from controller.store.redis import RedisSessionStore
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer


def populate(store: RedisSessionStore, ids: list[str], warm: bool, retention_days: float) -> Any:
    """Leave each session as a worker does, and return the runner that reports their sandboxes."""
    retention_end = time.time() + retention_days * 86400
    handles = []
    for n, sid in enumerate(ids):
        store.want(sid)
        lease = store.acquire(sid)
        assert isinstance(lease, Lease)
        handle = Handle(sid, f"sandbox-{n}", 1, uid=str(n), environment_id=f"env_{n}")
        handles.append(handle)
        stopped_at = None if warm else time.time()
        store.save(lease, Record(sid, f"env_{n}", handle, time.time() - 3600, stopped_at=stopped_at))
        store.arm(lease, None if warm else retention_end)
        store.complete(lease)
    return Listing(handles=handles) if warm else Listing(workspaces=ids)


def hour(
    store: RedisSessionStore,
    runner: Any,
    publish_many: Callable[[Sequence[Job]], None],
    passes: int,
    interval: float,
    full_every: float,
    watched: bool,
) -> tuple[int, int, float]:
    """One hour of passes, each full as the scheduler chooses: (jobs, full passes, seconds)."""
    jobs, fulls, seconds, next_full = 0, 0, 0.0, 0.0
    for n in range(passes):
        now = n * interval
        full = now >= next_full
        if full:
            next_full, fulls = now + full_every, fulls + 1
        started = time.perf_counter()
        result = reconcile.sweep(
            store,
            runner,
            lambda sids: publish_many([Job(sid, "", "reconcile") for sid in sids]),
            full=full,
            watched=watched,
        )
        seconds += time.perf_counter() - started
        jobs += result.enqueued
    return jobs, fulls, seconds


MODES = [
    # (label, full sweep every N seconds (0: every pass), pod watch live)
    ("every pass full (before)", 0.0, False),
    ("timers only, full hourly", 3600.0, False),
    ("timers + pod watch, full hourly (default)", 3600.0, True),
    ("timers + pod watch, full every 600 s", 600.0, True),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=300.0, help="CONTROLLER_RECONCILE_INTERVAL_SECONDS")
    parser.add_argument("--retention-days", type=float, default=7.0, help="CONTROLLER_WORKSPACE_RETENTION_SECONDS")
    args = parser.parse_args()
    logs.setup("WARNING")
    passes = round(3600 / args.interval)
    rows = []
    for population, warm in (("stopped", False), ("warm", True)):
        directory = Path(tempfile.mkdtemp(prefix="bench-sweep-calls-"))
        server = RedisServer(directory / "redis").start()
        try:
            client = connect(server.url)
            store = RedisSessionStore(client, lease_ttl_seconds=30)
            ids = [f"sess_idle_{n:06d}" for n in range(args.sessions)]
            runner = populate(store, ids, warm, args.retention_days)
            publish_many = queue.batch_publisher(client, queue.MAINTENANCE_QUEUE)

            timer_calls = 0.0 if warm else args.sessions / (args.retention_days * 24)
            total = 0
            for label, full_every, watched in MODES:
                jobs, fulls, seconds = hour(store, runner, publish_many, passes, args.interval, full_every, watched)
                total += jobs
                rows.append(
                    [
                        population,
                        label,
                        f"{fulls} / {passes}",
                        f"{jobs:,}",
                        f"{timer_calls:.0f}",
                        f"{jobs + timer_calls:,.0f}",
                        f"{seconds:.1f}",
                    ]
                )
            queued = int(client.llen(queue.MAINTENANCE_QUEUE))
            assert queued == total, (queued, total)
            client.close()
        finally:
            server.stop()
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"\n{args.sessions} idle sessions, one pass every {args.interval:g} s = {passes} passes per hour; "
        "real redis-server and queue\n"
    )
    header = [
        "population",
        "sweeps",
        "full passes / h",
        "jobs enqueued / h",
        "timer firings / h",
        "Agents API GETs / h",
        "sweep time / h (s)",
    ]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
