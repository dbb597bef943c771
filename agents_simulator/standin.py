"""A clearly labelled stand-in for ``codex exec-server``, for machines without codex.

It does only what the controller and the simulator can observe: registers with the
environment key (exit 1 on any failure, like the real executor), opens the returned
WebSocket and holds it, reconnecting with backoff, and exits 0 on SIGTERM/SIGINT. It runs
no commands. Install the real executor with ``npm install -g @openai/codex@0.171.0``.

Usage (same flags as the real one): ``python -m agents_simulator.standin exec-server
--remote URL --environment-id ID`` with ``CODEX_API_KEY`` set.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import sys
import time

import httpx
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

BANNER = "stand-in executor (NOT codex): registers and holds the link, runs no commands"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="standin-executor", description=BANNER)
    parser.add_argument("command", choices=["exec-server"])
    parser.add_argument("--remote", required=True)
    parser.add_argument("--environment-id", required=True)
    args = parser.parse_args(argv)
    key = os.environ.get("CODEX_API_KEY")
    if not key:
        print("CODEX_API_KEY is not set", file=sys.stderr)
        return 1
    print(BANNER, flush=True)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        response = httpx.post(
            f"{args.remote.rstrip('/')}/cloud/environment/{args.environment_id}/register",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "security_profile": "noise_hybrid_ik_v1",
                "executor_public_key": {
                    "suite": "standin",
                    "x25519_public_key": base64.b64encode(os.urandom(32)).decode(),
                    "mlkem768_public_key": base64.b64encode(os.urandom(32)).decode(),
                },
            },
            timeout=10,
        )
        body = response.json() if response.status_code < 300 else {}
    except (httpx.HTTPError, ValueError) as exc:
        print(f"registration failed: {type(exc).__name__}", file=sys.stderr)
        return 1
    if response.status_code >= 300 or body.get("environment_id") != args.environment_id or not body.get("url"):
        print(f"registration failed: HTTP {response.status_code}", file=sys.stderr)
        return 1
    print(f"registered environment {args.environment_id}", flush=True)
    delay = 1.0
    while not stopping:
        try:
            with connect(body["url"], open_timeout=10) as ws:
                delay = 1.0
                for _ in ws:  # the API side speaks first; a stand-in only listens
                    pass
        except (OSError, WebSocketException):
            pass
        time.sleep(delay)
        delay = min(delay * 2, 30.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
