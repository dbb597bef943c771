"""What waiting for a replica costs per delivery: the receiver against a Redis with a replica
(each 2xx only once a replica has the delivery: ``WAIT``) and, in the same run, against a lone
Redis (nothing to wait for).

Two redis-servers with their append-only file (fsync every second, as the chart's Redis), one
of them with a replica attached (a third redis-server), and one ``sandbox-controller serve``
(uvicorn, one process) on each, all on loopback. The Go load generator of
``bench/receiver_fastpath.py`` signs every request afresh (every delivery a new job):

0. The inbox alone, in this process (no HTTP): ``RedisInbox.submit`` one delivery after another,
   then 64 at once, on each Redis in turn: the time each call takes (p50, p99) and this
   process's CPU per call. What waiting for the replica adds to one delivery, with least noise.
1. Throughput, closed loop, 16 and 64 clients, interleaved rounds: requests/second and each
   receiver's CPU time per request, and the ratio of the two receivers. Every answer must be 2xx
   and each receiver must have queued exactly one job per 2xx; on the replica, too.
2. Latency, open loop, both receivers at the same rate (a quarter of the lone receiver's
   saturation, so a busier machine does not push it past what the receiver gets of the CPU):
   p50 and p99 from when each request was due.

    .venv/bin/python bench/replica_ack.py [--rounds 3] [--clients 16,64] [--seconds 5] [--load 0.25] [--calls 2000]

Figures from different runs or machines are not comparable; the ratios of one run are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile
from bench.plots import markdown_table
from bench.receiver_fastpath import SECRET, build_loadgen, cpu_seconds, load, loadavg
from controller import queue
from controller.inbox import Job, Outcome
from controller.redis_client import Endpoint
from controller.store.redis import RedisInbox
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer

CASES = ("alone", "replicated")


def inbox_calls(url: str, calls: int, concurrency: int) -> tuple[list[float], float]:
    """``calls`` submits of new deliveries through the receiver's inbox, ``concurrency`` at a
    time: each call's seconds, and this process's CPU seconds per call."""

    async def run() -> list[float]:
        inbox = RedisInbox(Endpoint(url).pipelined(), queue.QUEUE, dedup_ttl_seconds=3600)
        took: list[float] = []

        async def one(n: int) -> None:
            started = time.perf_counter()
            outcome = await inbox.submit(
                Job(f"sess_bench_{n % 500}", uuid.uuid4().hex, "agent.session.action_required")
            )
            took.append(time.perf_counter() - started)
            assert outcome is Outcome.ENQUEUED

        try:
            await one(-1)  # connect
            took.clear()
            for start in range(0, calls, concurrency):
                await asyncio.gather(*(one(n) for n in range(start, min(calls, start + concurrency))))
        finally:
            await inbox.close()
        return took

    cpu = time.process_time()
    took = asyncio.run(run())
    return took, (time.process_time() - cpu) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="16,64", help="client connection counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (after 1 s warm-up)")
    parser.add_argument("--load", type=float, default=0.25, help="latency runs' rate, as a share of saturation")
    parser.add_argument("--calls", type=int, default=2000, help="deliveries per inbox run")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    binary = build_loadgen()
    directory = Path(tempfile.mkdtemp(prefix="bench-replica-ack-"))
    lone = RedisServer(directory / "alone").start()
    primary = RedisServer(directory / "primary").start()
    replica = RedisServer(directory / "replica", replica_of=primary).start()
    wait_for(replica.in_sync, 30, "the replica to sync")
    redis = {"alone": lone, "replicated": primary}
    clients = {case: server.client() for case, server in redis.items()}
    for server in (lone, primary, replica):
        with server.client() as admin:
            admin.config_set("appendfsync", "everysec")  # as the Helm chart's Redis
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    ports = {case: free_port() for case in CASES}
    servers = {
        case: Managed(
            case,
            python_module("controller", "serve", "--host", "127.0.0.1", "--port", str(ports[case])),
            {**base, "CONTROLLER_REDIS_URL": redis[case].url, "CONTROLLER_WEBHOOK_SECRETS": SECRET},
            directory / f"{case}.log",
        )
        for case in CASES
    }
    inbox: dict[tuple[str, int], list[tuple[float, float, float]]] = {(c, n): [] for c in CASES for n in (1, 64)}
    rps: dict[tuple[str, int], list[float]] = {(case, c): [] for case in CASES for c in levels}
    cpu: dict[tuple[str, int], list[float]] = {(case, c): [] for case in CASES for c in levels}
    latency: dict[tuple[str, int], list[tuple[float, float, float]]] = {(case, c): [] for case in CASES for c in levels}
    before = loadavg()
    try:
        for process in servers.values():
            process.start()
        wait_for(lambda: all(port_open(p) for p in ports.values()), 60, "the receivers")
        for round_ in range(1, args.rounds + 1):
            for at_once in (1, 64):
                for case in CASES:
                    took, cpu_per_call = inbox_calls(redis[case].url, args.calls, at_once)
                    inbox[case, at_once].append((percentile(took, 0.5), percentile(took, 0.99), cpu_per_call))
                    clients[case].delete(queue.QUEUE)
                line = "  ".join(f"{c} p50 {inbox[c, at_once][-1][0] * 1e3:.2f} ms" for c in CASES)
                print(f"round {round_}, inbox, {at_once:>2} at once: {line}", flush=True)
        for round_ in range(1, args.rounds + 1):
            for count in levels:
                for case in CASES:
                    used = cpu_seconds(servers[case].pid)
                    result = load(binary, ports[case], count, args.seconds, 1.0)
                    used = cpu_seconds(servers[case].pid) - used
                    rps[case, count].append(result["rps"])
                    cpu[case, count].append(used / result["all_2xx"] * 1e6)
                    queued = clients[case].llen(queue.QUEUE)
                    if queued != result["all_2xx"]:
                        raise SystemExit(f"{case}: {result['all_2xx']} answered 2xx but {queued} jobs queued")
                    if case == "replicated":
                        with replica.client() as on_replica:
                            there = on_replica.llen(queue.QUEUE)
                        if there < queued:
                            raise SystemExit(f"{queued} jobs acknowledged, {there} of them on the replica")
                    clients[case].delete(queue.QUEUE)
                    time.sleep(0.5)
                line = "  ".join(f"{c} {rps[c, count][-1]:5.0f}/s {cpu[c, count][-1]:3.0f}µs" for c in CASES)
                print(f"round {round_}, {count:>3} clients: {line}", flush=True)
        for round_ in range(1, args.rounds + 1):
            for count in levels:
                rate = statistics.median(rps["alone", count]) * args.load
                for case in CASES:
                    result = load(binary, ports[case], count, args.seconds, 1.0, rate=rate)
                    clients[case].delete(queue.QUEUE)
                    latency[case, count].append((rate, result["p50_ms"], result["p99_ms"]))
                    time.sleep(0.5)
                line = "  ".join(
                    f"{c} p50 {latency[c, count][-1][1]:.1f} ms p99 {latency[c, count][-1][2]:.1f} ms" for c in CASES
                )
                print(f"round {round_}, {count:>3} clients at {rate:.0f} req/s: {line}", flush=True)
    finally:
        for process in servers.values():
            process.stop()
        for client in clients.values():
            client.close()
        for server in (replica, primary, lone):
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    after = loadavg()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    inbox_header = ["calls at once", "alone p50 (ms)", "p99", "µs CPU", "replicated p50 (ms)", "p99", "µs CPU"]
    inbox_rows = [
        [
            str(n),
            *(
                f"{med([r[i] for r in inbox[case, n]]) * (1e3 if i < 2 else 1e6):.{2 if i < 2 else 0}f}"
                for case in CASES
                for i in range(3)
            ),
        ]
        for n in (1, 64)
    ]
    header = ["clients", "alone (req/s)", "replicated (req/s)", "replicated/alone", "alone (µs CPU)", "replicated (µs)"]
    rows = [
        [
            str(c),
            f"{med(rps['alone', c]):.0f}",
            f"{med(rps['replicated', c]):.0f}",
            f"{med(rps['replicated', c]) / med(rps['alone', c]):.2f}",
            f"{med(cpu['alone', c]):.0f}",
            f"{med(cpu['replicated', c]):.0f}",
        ]
        for c in levels
    ]
    lat_header = ["clients", "rate (req/s)", "alone p50 (ms)", "alone p99", "replicated p50", "replicated p99"]
    lat_rows = [
        [
            str(c),
            f"{med([r[0] for r in latency['alone', c]]):.0f}",
            *(f"{med([r[i] for r in latency[case, c]]):.1f}" for case in CASES for i in (1, 2)),
        ]
        for c in levels
    ]
    print(f"\nmedians of {args.rounds} interleaved rounds, {args.seconds:g} s each; one uvicorn process per receiver")
    print(f"load average (1, 5, 15 min): before {before}, after {after}; {os.cpu_count()} cores\n")
    print(f"the receiver's inbox alone, {args.calls} deliveries per run, medians\n")
    print(markdown_table(inbox_header, inbox_rows))
    print("\nthe receiver over HTTP, closed loop, medians\n")
    print(markdown_table(header, rows))
    print(f"\nboth receivers at the same rate ({args.load:g} of the lone one's saturation, open loop), medians\n")
    print(markdown_table(lat_header, lat_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
