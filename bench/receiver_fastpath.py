"""The receiver's fast path against a bare Starlette app and a 20-line handler, side by side.

One run starts a real redis-server (append-only, fsync every second: the Helm chart's Redis)
and one single-process uvicorn server per case on loopback, all on the receiver's uvicorn
settings (``controller.server.options``, via ``bench/serve_app.py``):

  bare         bench/bare_app.py: POST /webhooks reads the body, answers 200 (the ceiling)
  handler      bench/webhook_handler.py: verify with ``standardwebhooks``, LPUSH with redis-py's
               blocking client on the event loop (the fastest way to write that handler here)
  handler-thr  the same handler, the push in Starlette's thread pool
  handler-aio  the same handler, with redis-py's asyncio client
  receiver     ``sandbox-controller serve`` as deployed (INFO: one JSON log line per delivery)

and drives them with the Go load generator (bench/loadgen, stdlib only, built here with
``go build`` into ~/.cache/sandbox-controller/bench): keep-alive connections, every request
freshly signed with a fresh webhook-id (so every receiver request is a new job).

1. Throughput: for each round (default 3) and client count (16, 64), each server in turn,
   closed loop; medians per server and client count, and the receiver's ratio to each. Every
   answer must be 2xx, and the receiver must have queued exactly one Celery message per 2xx
   (checked on the Redis list after each run). Also each server process's CPU time per request
   (user + system, from /proc), which depends less on what else the machine runs.
2. Latency: the receiver in open loop at half of its own median saturation throughput, per
   client count, 3 rounds: p50/p99 measured from when each request was due; and the bare app
   at the same rate as a control (what the machine, the load generator and uvicorn add alone).

    .venv/bin/python bench/receiver_fastpath.py [--rounds 3] [--clients 16,64] [--seconds 5]

``pip install '.[bench]'`` provides ``standardwebhooks``. The machine's load average is printed
before and after; figures from different runs or machines are not comparable, the ratios of
one run are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.plots import markdown_table
from controller import queue
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer

SECRET = "whsec_" + "YmVuY2htYXJrLXNlY3JldC1ub3QtYS1yZWFsLW9uZQ=="
HANDLERS = {"handler": "app", "handler-thr": "app_thread", "handler-aio": "app_asyncio"}
CASES = ("bare", *HANDLERS, "receiver")
HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "sandbox-controller" / "bench"


def build_loadgen() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    binary = CACHE / "loadgen"
    env = {**os.environ, "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "loadgen", env=env, check=True)
    return binary


def load(binary: Path, port: int, clients: int, seconds: float, warmup: float, rate: float = 0) -> dict[str, Any]:
    argv = [
        str(binary), "-url", f"http://127.0.0.1:{port}/webhooks", "-clients", str(clients),
        "-duration", f"{seconds}s", "-warmup", f"{warmup}s", "-rate", str(rate),
    ]  # fmt: skip
    env = {**os.environ, "LOADGEN_SECRET": SECRET}
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=seconds + warmup + 60)
    result: dict[str, Any] = json.loads(done.stdout)
    if result["non_2xx"] or result["errors"] or not result["requests"]:
        raise SystemExit(f"port {port}, {clients} clients: not every answer was 2xx: {result}")
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="16,64", help="client connection counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (after 1 s warm-up)")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    binary = build_loadgen()
    directory = Path(tempfile.mkdtemp(prefix="bench-fastpath-"))
    redis = RedisServer(directory / "redis").start()
    client = redis.client()
    client.config_set("appendfsync", "everysec")  # as the Helm chart's Redis (appendonly, default fsync)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLLER_", "BENCH_"))}
    ports = {case: free_port() for case in CASES}

    def app(name: str, target: str, env: dict[str, str]) -> Managed:
        argv = [sys.executable, str(HERE / "serve_app.py"), target, str(ports[name])]
        return Managed(name, argv, env, directory / f"{name}.log")

    handler_env = {**base, "BENCH_SECRET": SECRET, "BENCH_REDIS_URL": redis.url}
    receiver_env = {**base, "CONTROLLER_REDIS_URL": redis.url, "CONTROLLER_WEBHOOK_SECRETS": SECRET}
    serve = python_module("controller", "serve", "--host", "127.0.0.1", "--port", str(ports["receiver"]))
    servers = {
        "bare": app("bare", "bare_app:app", base),
        **{name: app(name, f"webhook_handler:{attribute}", handler_env) for name, attribute in HANDLERS.items()},
        "receiver": Managed("receiver", serve, receiver_env, directory / "receiver.log"),
    }
    rps: dict[tuple[str, int], list[float]] = {(case, c): [] for case in CASES for c in levels}
    cpu: dict[tuple[str, int], list[float]] = {(case, c): [] for case in CASES for c in levels}
    latency: dict[int, list[tuple[float, float, float, float, float]]] = {c: [] for c in levels}
    before = loadavg()
    try:
        for each in servers.values():
            each.start()
        wait_for(lambda: all(port_open(p) for p in ports.values()), 60, "the servers")
        for round_ in range(1, args.rounds + 1):
            for clients in levels:
                for case in CASES:
                    used = cpu_seconds(servers[case].pid)
                    result = load(binary, ports[case], clients, args.seconds, 1.0)
                    used = cpu_seconds(servers[case].pid) - used
                    rps[case, clients].append(result["rps"])
                    cpu[case, clients].append(used / result["all_2xx"] * 1e6)  # µs per request, warm-up included
                    if case == "receiver":
                        queued = client.llen(queue.QUEUE)
                        if queued != result["all_2xx"]:
                            raise SystemExit(f"receiver answered {result['all_2xx']} 2xx but queued {queued} jobs")
                    client.delete(queue.QUEUE, "bench:jobs")
                    time.sleep(0.5)  # let the machine settle between runs
                line = "  ".join(f"{c} {rps[c, clients][-1]:5.0f}/s {cpu[c, clients][-1]:3.0f}µs" for c in CASES)
                print(f"round {round_}, {clients:>3} clients: {line}", flush=True)
        for round_ in range(1, args.rounds + 1):
            for clients in levels:
                rate = statistics.median(rps["receiver", clients]) / 2
                result = load(binary, ports["receiver"], clients, args.seconds, 1.0, rate=rate)
                client.delete(queue.QUEUE)
                time.sleep(0.5)
                control = load(binary, ports["bare"], clients, args.seconds, 1.0, rate=rate)
                time.sleep(0.5)
                latency[clients].append(
                    (rate, result["p50_ms"], result["p99_ms"], control["p50_ms"], control["p99_ms"])
                )
                print(
                    f"round {round_}, {clients:>3} clients at {rate:.0f} req/s: "
                    f"receiver p50 {result['p50_ms']:.1f} ms  p99 {result['p99_ms']:.1f} ms; "
                    f"bare p50 {control['p50_ms']:.1f} ms  p99 {control['p99_ms']:.1f} ms",
                    flush=True,
                )
    finally:
        for each in servers.values():
            each.stop()
        client.close()
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    after = loadavg()

    def med(case: str, clients: int) -> float:
        return statistics.median(rps[case, clients])

    others = [case for case in CASES if case != "receiver"]
    header = ["clients", *(f"{case} (req/s)" for case in CASES), *(f"receiver/{case}" for case in others)]
    rows = [
        [str(c), *(f"{med(case, c):.0f}" for case in CASES)]
        + [f"{med('receiver', c) / med(case, c):.2f}" for case in others]
        for c in levels
    ]
    cpu_header = ["clients", *(f"{case} (µs)" for case in CASES)]
    cpu_rows = [[str(c), *(f"{statistics.median(cpu[case, c]):.0f}" for case in CASES)] for c in levels]
    lat_header = ["clients", "rate (req/s, half of saturation)", "p50 (ms)", "p99 (ms)"]
    lat_header += ["bare p50 (ms)", "bare p99 (ms)"]
    lat_rows = [
        [str(c), f"{statistics.median(row[0] for row in latency[c]):.0f}"]
        + [f"{statistics.median(row[i] for row in latency[c]):.1f}" for i in range(1, 5)]
        for c in levels
    ]
    print(f"\nmedians of {args.rounds} interleaved rounds, {args.seconds:g} s each; one uvicorn process per server")
    print(f"load average (1, 5, 15 min): before {before}, after {after}; {os.cpu_count()} cores\n")
    print(markdown_table(header, rows))
    print("\nserver CPU time per request (user + system), medians\n")
    print(markdown_table(cpu_header, cpu_rows))
    print("\nthe receiver at half of its saturation throughput (open loop), and the bare app at that rate, medians\n")
    print(markdown_table(lat_header, lat_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
