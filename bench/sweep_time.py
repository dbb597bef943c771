"""How long the scheduler's reconcile sweep takes as the number of sessions grows: the sweep
as it was (one Redis call after another) against the batched sweep, side by side.

For each size N: a fresh real redis-server holds N session → sandbox mappings (written as a
worker writes them: want, lease, fenced save, complete), a runner reports N healthy managed
sandboxes, and each sweep asks for work on every session and publishes one job each to the
real Celery queue on that Redis:

  one by one   the sweep before batching, kept here verbatim as the baseline: ``want`` then
               ``send_task`` per session, each its own round trip
  batched      ``controller.reconcile.sweep`` as the scheduler runs it: ``want_many`` (one
               pipeline of scripts) and ``queue.fenced_publisher`` (one push of task messages
               written by ``task_message``, made under the leader's term) per 1,000

Each is timed three times per size, alternating (the median is reported), and the queue holds
exactly N jobs per sweep.

    .venv/bin/python bench/sweep_time.py [--sizes 100,300,1000,3000,10000]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collections.abc import Callable

from bench.common import Listing
from bench.plots import markdown_table, save_png
from controller import logs, queue, reconcile
from controller.config import PREFIX, Settings
from controller.inbox import Job
from controller.model import Handle, Record
from controller.scheduler import LEADER_KEY
from controller.store.base import Lease
from controller.store.redis import RedisSessionStore
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer

RUNS = 3
TERM = "bench-term"


def one_by_one(store: RedisSessionStore, runner: Any, enqueue: Callable[[str], None]) -> int:
    """The sweep before batching (its loop, verbatim): one ``want`` and one publish per session."""
    mapped = set(store.session_ids())
    handles = runner.list_managed()
    managed = {handle.session_id for handle in handles} | set(runner.workspaces())
    for session_id in sorted(mapped | managed):
        store.want(session_id)
        enqueue(session_id)
    return len(mapped | managed)


def measure(size: int, directory: Path) -> tuple[float, float]:
    server = RedisServer(directory / f"redis-{size}").start()
    try:
        client = connect(server.url)
        store = RedisSessionStore(client, lease_ttl_seconds=30)
        handles = []
        for n in range(size):
            sid = f"sess_bench_{n:06d}"
            store.want(sid)
            lease = store.acquire(sid)
            assert isinstance(lease, Lease)
            handle = Handle(sid, f"sandbox-{n}", 1, uid=str(n), environment_id=f"env_{n}")
            store.save(lease, Record(sid, f"env_{n}", handle, time.time()))
            store.complete(lease)
            handles.append(handle)
        settings = Settings.from_env({PREFIX + "REDIS_URL": server.url})
        app = queue.make_app(settings)
        publish = queue.publisher(app, queue.MAINTENANCE_QUEUE)
        client.set(LEADER_KEY, TERM)  # as a leading scheduler holds it
        fenced = queue.fenced_publisher(client, queue.MAINTENANCE_QUEUE, LEADER_KEY)
        runner: Any = Listing(handles=handles)
        before, after = [], []
        for _ in range(RUNS):
            started = time.perf_counter()
            assert one_by_one(store, runner, lambda sid: publish(Job(sid, "", "reconcile"))) == size
            before.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = reconcile.sweep(
                store, runner, lambda sids: fenced([Job(sid, "", "reconcile") for sid in sids], TERM)
            )
            after.append(time.perf_counter() - started)
            assert result.enqueued == size
        queued = int(client.llen(queue.MAINTENANCE_QUEUE))
        assert queued == 2 * RUNS * size, (queued, size)
        return statistics.median(before), statistics.median(after)
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,1000,3000,10000", help="session counts, comma-separated")
    args = parser.parse_args()
    logs.setup("WARNING")
    sizes = [int(s) for s in args.sizes.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    before: list[float] = []
    after: list[float] = []
    try:
        for size in sizes:
            old, new = measure(size, directory)
            before.append(old)
            after.append(new)
            print(
                f"{size:>6} sessions: one by one {old:7.3f} s ({old / size * 1000:.3f} ms each), "
                f"batched {new:7.3f} s ({new / size * 1000:.3f} ms each)",
                flush=True,
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rows = [
        [str(n), f"{b:.3f}", f"{a:.3f}", f"{a / n * 1000:.3f}", f"{n / a:.0f}", f"{b / a:.1f}×"]
        for n, b, a in zip(sizes, before, after, strict=True)
    ]
    print(f"\nmedian of {RUNS} sweeps per size and path, alternating; real redis-server, Celery publish, loopback\n")
    header = ["sessions", "one by one (s)", "batched (s)", "batched per session (ms)", "batched per s", "speed-up"]
    print(markdown_table(header, rows))

    def draw(axes: Any) -> None:
        axes.plot(sizes, before, marker="o", label="one by one (before)")
        axes.plot(sizes, after, marker="o", label="batched (reconcile.sweep)")
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("mapped sessions (log scale)")
        axes.set_ylabel("seconds (log scale)")
        axes.legend()

    save_png("sweep_time", draw, "Reconcile sweep time vs sessions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
