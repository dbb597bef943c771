"""How long the scheduler's reconcile sweep takes as the number of sessions grows.

For each size N: a fresh real redis-server holds N session → sandbox mappings (written as a
worker writes them: want, lease, fenced save, complete), a runner reports N healthy managed
sandboxes, and the sweep (``controller.reconcile.sweep``) asks for work on every session and
publishes one job each to the real Celery queue on that Redis. The sweep is timed three
times per size (the median is reported) and the queue holds exactly N jobs per sweep.

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

from bench.plots import markdown_table, save_png
from controller import logs, queue, reconcile
from controller.config import PREFIX, Settings
from controller.inbox import Job
from controller.model import Handle, Health, Record
from controller.store.base import Lease
from controller.store.redis import RedisSessionStore, connect
from tests.support.redis_server import RedisServer

RUNS = 3


class HealthyRunner:
    """Every sandbox alive: what the sweep sees on a healthy cluster (the runner's listing is
    one call; the sweep asks nothing per sandbox)."""

    def __init__(self, handles: list[Handle]) -> None:
        self._handles = handles

    def list_managed(self) -> list[Handle]:
        return list(self._handles)

    def workspaces(self) -> list[str]:
        return []

    def status(self, handle: Handle) -> Health:
        return Health.RUNNING


def measure(size: int, directory: Path) -> tuple[float, int]:
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
        publish = queue.publisher(queue.make_app(settings))
        runner: Any = HealthyRunner(handles)
        timings = []
        for _ in range(RUNS):
            started = time.perf_counter()
            result = reconcile.sweep(store, runner, lambda sid: publish(Job(sid, "", "reconcile")))
            timings.append(time.perf_counter() - started)
            assert result.enqueued == size
        queued = int(client.llen(queue.QUEUE))
        assert queued == RUNS * size, (queued, size)
        return statistics.median(timings), queued
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,300,1000,3000,10000", help="session counts, comma-separated")
    args = parser.parse_args()
    logs.setup("WARNING")
    sizes = [int(s) for s in args.sizes.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    seconds: list[float] = []
    try:
        for size in sizes:
            median, _ = measure(size, directory)
            seconds.append(median)
            print(f"{size:>6} sessions: sweep {median:7.3f} s  ({median / size * 1000:.3f} ms per session)", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rows = [[str(n), f"{s:.3f}", f"{s / n * 1000:.3f}", f"{n / s:.0f}"] for n, s in zip(sizes, seconds, strict=True)]
    print(f"\nmedian of {RUNS} sweeps per size; real redis-server and Celery publish on loopback\n")
    print(markdown_table(["sessions", "sweep (s)", "per session (ms)", "sessions / s"], rows))

    def draw(axes: Any) -> None:
        axes.plot(sizes, seconds, marker="o", label="reconcile sweep (median of 3)")
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("mapped sessions (log scale)")
        axes.set_ylabel("seconds (log scale)")
        axes.legend()

    save_png("sweep_time", draw, "Reconcile sweep time vs sessions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
