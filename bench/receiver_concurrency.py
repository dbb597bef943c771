"""Receiver throughput against client concurrency, beside a bare Starlette app.

Starts a real redis-server, one `sandbox-controller serve` (one uvicorn process) and, as the
baseline, a bare Starlette app (bench/bare_app.py: POST /webhooks reads the body, answers 200)
on the same uvicorn HTTP implementation (h11), all on loopback. For each number of client
threads it sends the same number of requests to:

  bare       POST /webhooks on the bare app           (uvicorn + Starlette, no work)
  accept     POST /webhooks, signed, unique ids       (verify, parse, classify, dedup, enqueue)
  duplicate  POST /webhooks, signed, one id           (verify, parse, classify, dedup lookup)

and prints a table of requests/second (and each case's ratio to bare), then writes
bench/results/receiver_concurrency.png. No worker runs: jobs stay queued. Figures from
different runs or machines are not comparable; the ratios are the result.

    .venv/bin/python bench/receiver_concurrency.py [--requests 600] [--clients 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import start_receiver
from bench.plots import markdown_table, save_png
from controller.signing import sign_headers
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer

SECRET = "whsec_" + "YmVuY2htYXJrLXNlY3JldC1ub3QtYS1yZWFsLW9uZQ=="
Call = Callable[[httpx.Client, int], int]


def body(session_id: str) -> bytes:
    event = {
        "id": f"evt_{uuid.uuid4().hex}",
        "object": "event",
        "created_at": int(time.time()),
        "type": "agent.session.action_required",
        "data": {"id": session_id, "required_action": {"type": "environment_connection"}},
    }
    return json.dumps(event).encode()


def rate(requests: int, clients: int, call: Call) -> float:
    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=clients)) as client:
        for n in range(clients):
            call(client, -1 - n)  # warm the connections
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            statuses = list(pool.map(lambda n: call(client, n), range(requests)))
        elapsed = time.perf_counter() - started
    bad = [s for s in statuses if s != 200]
    if bad:
        raise SystemExit(f"{len(bad)} non-200 answers, e.g. {bad[:3]}")
    return requests / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600, help="requests per case and concurrency")
    parser.add_argument("--clients", default="1,2,4,8,16,32", help="client thread counts, comma-separated")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    redis = RedisServer(directory / "redis").start()
    port, bare_port = free_port(), free_port()
    receiver, env = start_receiver(directory, redis.url, SECRET, port)
    bare_argv = python_module(
        "uvicorn", "--app-dir", str(Path(__file__).parent), "bare_app:app", "--host", "127.0.0.1",
        "--port", str(bare_port), "--http", "h11", "--no-access-log", "--log-level", "warning",
    )  # fmt: skip
    bare = Managed("bare", bare_argv, env, directory / "bare.log").start()
    url, bare_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
    rows: dict[str, list[float]] = {"bare": [], "accept": [], "duplicate": []}
    try:
        wait_for(lambda: port_open(port) and port_open(bare_port), 30, "the receiver and the bare app")
        duplicate_body = body("sess_bench_duplicate")
        duplicate_headers = sign_headers(SECRET, "wh_bench_duplicate", int(time.time()), duplicate_body)

        def bare_call(client: httpx.Client, n: int) -> int:
            return client.post(f"{bare_url}/webhooks", content=body(f"sess_bench_{n}")).status_code

        def accept(client: httpx.Client, n: int) -> int:
            payload = body(f"sess_bench_{n % 500}")
            headers = sign_headers(SECRET, f"wh_{uuid.uuid4().hex}", int(time.time()), payload)
            return client.post(f"{url}/webhooks", content=payload, headers=headers).status_code

        def duplicate(client: httpx.Client, n: int) -> int:
            return client.post(f"{url}/webhooks", content=duplicate_body, headers=duplicate_headers).status_code

        calls: dict[str, Call] = {"bare": bare_call, "accept": accept, "duplicate": duplicate}
        for clients in levels:
            for case, call in calls.items():
                rows[case].append(rate(args.requests, clients, call))
            print(f"clients {clients:>3}: " + "  ".join(f"{c} {rows[c][-1]:7.0f} req/s" for c in calls), flush=True)
    finally:
        receiver.stop()
        bare.stop()
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)

    header = ["client threads", "bare Starlette (req/s)", "accept (req/s, ratio)", "duplicate (req/s, ratio)"]
    table = [
        [
            str(c),
            f"{rows['bare'][i]:.0f}",
            f"{rows['accept'][i]:.0f} ({rows['accept'][i] / rows['bare'][i]:.2f})",
            f"{rows['duplicate'][i]:.0f} ({rows['duplicate'][i] / rows['bare'][i]:.2f})",
        ]
        for i, c in enumerate(levels)
    ]
    print(f"\n{args.requests} requests per point; one uvicorn process each; 2 cores shared with the client\n")
    print(markdown_table(header, table))

    def draw(axes: Any) -> None:
        for case, label in (
            ("bare", "bare Starlette app"),
            ("accept", "receiver: accept (unique ids)"),
            ("duplicate", "receiver: duplicate"),
        ):
            axes.plot(levels, rows[case], marker="o", label=label)
        axes.set_xscale("log", base=2)
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.set_xlabel("client threads")
        axes.set_ylabel("requests / second")
        axes.set_ylim(bottom=0)
        axes.legend()

    save_png("receiver_concurrency", draw, "Receiver throughput vs concurrency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
