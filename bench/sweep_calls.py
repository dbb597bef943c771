"""Agents API calls per hour that sweeps cost at N idle sessions: every pass full (before)
against full passes only every ``reconcile.FULL_EVERY`` (after), counted from real sweeps.

N idle sessions as workers leave them once the idle timeout stopped their sandboxes: a
mapping each, the workspace kept, the timer armed at the end of its retention (7 days by
default); the runner reports the N workspaces. A fresh real redis-server holds the store; one
hour of passes at the reconcile interval (300 s: 12 passes) runs against it, each with the
scheduler's choice of full or partial, publishing to the real queue. Each job a sweep enqueues
costs a worker one Agents API GET (the session; a stopped sandbox asks nothing else), so the
jobs counted are the calls. Timers add N / retention-hours calls per hour either way.

    .venv/bin/python bench/sweep_calls.py [--sessions 10000] [--interval 300] [--retention-days 7]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plots import markdown_table
from controller import logs, queue, reconcile
from controller.config import PREFIX, Settings
from controller.inbox import Job
from controller.model import Handle, Health, Record
from controller.store.base import Lease
from controller.store.redis import RedisSessionStore, connect
from tests.support.redis_server import RedisServer


class KeptWorkspaces:
    """No sandbox running; N workspaces kept (the sessions went idle and were stopped)."""

    def __init__(self, session_ids: list[str]) -> None:
        self._ids = session_ids

    def list_managed(self) -> list[Handle]:
        return []

    def workspaces(self) -> list[str]:
        return list(self._ids)

    def status(self, handle: Handle) -> Health:
        return Health.GONE


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=300.0, help="CONTROLLER_RECONCILE_INTERVAL_SECONDS")
    parser.add_argument("--retention-days", type=float, default=7.0, help="CONTROLLER_WORKSPACE_RETENTION_SECONDS")
    args = parser.parse_args()
    logs.setup("WARNING")
    directory = Path(tempfile.mkdtemp(prefix="bench-sweep-calls-"))
    server = RedisServer(directory / "redis").start()
    passes = round(3600 / args.interval)
    try:
        client = connect(server.url)
        store = RedisSessionStore(client, lease_ttl_seconds=30)
        ids = [f"sess_idle_{n:06d}" for n in range(args.sessions)]
        retention_end = time.time() + args.retention_days * 86400
        for n, sid in enumerate(ids):
            store.want(sid)
            lease = store.acquire(sid)
            assert isinstance(lease, Lease)
            handle = Handle(sid, f"sandbox-{n}", 1, uid=str(n), environment_id=f"env_{n}")
            store.save(lease, Record(sid, f"env_{n}", handle, time.time() - 3600, stopped_at=time.time()))
            store.arm(lease, retention_end)
            store.complete(lease)
        publish_many = queue.batch_publisher(
            queue.make_app(Settings.from_env({PREFIX + "REDIS_URL": server.url})), queue.MAINTENANCE_QUEUE
        )
        runner: Any = KeptWorkspaces(ids)

        def hour(full_every: int) -> tuple[int, float]:
            jobs, seconds = 0, 0.0
            for n in range(passes):
                started = time.perf_counter()
                result = reconcile.sweep(
                    store,
                    runner,
                    lambda sids: publish_many([Job(sid, "", "reconcile") for sid in sids]),
                    full=n % full_every == 0,
                )
                seconds += time.perf_counter() - started
                jobs += result.enqueued
            return jobs, seconds

        before, before_s = hour(1)
        after, after_s = hour(reconcile.FULL_EVERY)
        queued = int(client.llen(queue.MAINTENANCE_QUEUE))
        assert queued == before + after, (queued, before, after)
        client.close()
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    timer_calls = args.sessions / (args.retention_days * 24)
    rows = [
        [
            "every pass full (before)",
            str(passes),
            str(before),
            f"{timer_calls:.0f}",
            f"{before + timer_calls:,.0f}",
            f"{before_s:.1f}",
        ],
        [
            f"full every {reconcile.FULL_EVERY}th pass (after)",
            str(passes),
            str(after),
            f"{timer_calls:.0f}",
            f"{after + timer_calls:,.0f}",
            f"{after_s:.1f}",
        ],
    ]
    print(
        f"\n{args.sessions} idle sessions (stopped, workspace kept, retention timer armed), "
        f"one pass every {args.interval:g} s = {passes} passes per hour; real redis-server and queue\n"
    )
    header = [
        "sweeps",
        "passes / h",
        "jobs enqueued / h",
        "timer firings / h",
        "Agents API GETs / h",
        "sweep time / h (s)",
    ]
    print(markdown_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
