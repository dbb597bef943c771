"""How fast the receiver accepts signed deliveries, against a baseline in the same run.

Starts a real redis-server and one `sandbox-controller serve` (uvicorn, one process) on
loopback, then sends, from a pool of client threads:

  baseline   GET /healthz                 (uvicorn + Starlette, no work)
  accept     POST /webhooks, unique ids   (verify, parse, classify, dedup claim, enqueue, mark)
  duplicate  POST /webhooks, one id       (verify, parse, classify, dedup lookup)

and prints requests/second and the ratio of each to the baseline. No worker runs: jobs stay
queued in Redis. Usage: .venv/bin/python bench/receiver_throughput.py [--requests N] [--clients C]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import start_receiver
from controller.signing import sign_headers
from tests.support.processes import free_port, port_open, wait_for
from tests.support.redis_server import RedisServer

SECRET = "whsec_" + "YmVuY2htYXJrLXNlY3JldC1ub3QtYS1yZWFsLW9uZQ=="


def body(session_id: str) -> bytes:
    return json.dumps(
        {
            "id": f"evt_{uuid.uuid4().hex}",
            "object": "event",
            "created_at": int(time.time()),
            "type": "agent.session.action_required",
            "data": {"id": session_id, "required_action": {"type": "environment_connection"}},
        }
    ).encode()


def run(label: str, requests: int, clients: int, call) -> float:  # type: ignore[no-untyped-def]
    with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=clients)) as client:
        call(client, 0)  # warm the connection pool
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            statuses = list(pool.map(lambda n: call(client, n), range(requests)))
        elapsed = time.perf_counter() - started
    bad = [s for s in statuses if s != 200]
    assert not bad, f"{label}: {len(bad)} non-200 answers, e.g. {bad[:3]}"
    return requests / elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    redis = RedisServer(directory / "redis").start()
    port = free_port()
    receiver, _ = start_receiver(directory, redis.url, SECRET, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: port_open(port), 30, "the receiver")
        duplicate_body = body("sess_bench_duplicate")
        duplicate_headers = sign_headers(SECRET, "wh_bench_duplicate", int(time.time()), duplicate_body)

        def healthz(client: httpx.Client, n: int) -> int:
            return client.get(f"{url}/healthz").status_code

        def accept(client: httpx.Client, n: int) -> int:
            payload = body(f"sess_bench_{n % 500}")
            headers = sign_headers(SECRET, f"wh_{uuid.uuid4().hex}", int(time.time()), payload)
            return client.post(f"{url}/webhooks", content=payload, headers=headers).status_code

        def duplicate(client: httpx.Client, n: int) -> int:
            return client.post(f"{url}/webhooks", content=duplicate_body, headers=duplicate_headers).status_code

        baseline = run("baseline", args.requests, args.clients, healthz)
        accepted = run("accept", args.requests, args.clients, accept)
        duplicated = run("duplicate", args.requests, args.clients, duplicate)
        queued = redis.client().llen("sandbox-controller")
        print(f"requests per case: {args.requests}, client threads: {args.clients}, receiver: 1 uvicorn process")
        print(f"baseline  GET /healthz            {baseline:8.0f} req/s  ratio 1.00")
        print(f"accept    POST /webhooks (unique) {accepted:8.0f} req/s  ratio {accepted / baseline:.2f}")
        print(f"duplicate POST /webhooks (one id) {duplicated:8.0f} req/s  ratio {duplicated / baseline:.2f}")
        # Every unique delivery once (the accept run's warm-up included) plus the one duplicate id.
        expected = args.requests + 1 + 1
        print(f"jobs queued: {queued} (expected {expected}: every unique delivery once, the duplicate id once)")
        return 0 if queued == expected else 1
    finally:
        receiver.stop()
        redis.stop()


if __name__ == "__main__":
    sys.exit(main())
