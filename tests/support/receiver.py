"""``sandbox-controller serve`` as a real process on loopback, reading its webhook secrets
from a file (as the chart mounts them), with a real redis-server behind it."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import httpx

from controller.signing import sign, sign_headers
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer


class Receiver:
    """``sandbox-controller serve`` reading its secrets from ``secrets_file``."""

    def __init__(self, directory: Path, redis: RedisServer, secrets_file: Path) -> None:
        self.directory, self.redis, self.secrets_file = directory, redis, secrets_file
        self.port = free_port()
        self.metrics_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base_url}/webhooks"
        self.process: Managed | None = None

    def start(self) -> Receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
        env.update(
            CONTROLLER_REDIS_URL=self.redis.url,
            CONTROLLER_WEBHOOK_SECRETS_FILE=str(self.secrets_file),
            CONTROLLER_METRICS_PORT=str(self.metrics_port),
        )
        argv = python_module(
            "controller", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--metrics-host", "127.0.0.1"
        )
        self.process = Managed("receiver", argv, env, self.directory / "receiver.log").start()
        wait_for(lambda: port_open(self.port), 30, "the receiver to listen")
        return self

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log(self) -> str:
        return (self.directory / "receiver.log").read_text(errors="replace")

    def post_signed(self, secret: str | bytes) -> int:
        """A delivery signed with ``secret`` alone (text as the receiver takes it, or raw key
        bytes, as a forger holding a guessed key would sign); the receiver's status."""
        body = json.dumps(
            {
                "id": f"evt_{uuid.uuid4().hex}",
                "object": "event",
                "created_at": int(time.time()),
                "type": "agent.session.action_required",
                "data": {"id": f"sess_{uuid.uuid4().hex}", "required_action": {"type": "function_call"}},
            }
        ).encode()
        webhook_id, timestamp = f"wh_{uuid.uuid4().hex}", int(time.time())
        if isinstance(secret, bytes):
            signature = {"webhook-signature": sign(secret, webhook_id, timestamp, body)}
            signed = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), **signature}
        else:
            signed = sign_headers(secret, webhook_id, timestamp, body)
        headers = {"content-type": "application/json", **signed}
        return httpx.post(self.url, content=body, headers=headers, timeout=10).status_code

    def healthz(self, timeout: float = 2.0) -> int:
        return httpx.get(f"{self.base_url}/healthz", timeout=timeout).status_code

    def metric(self, sample: str) -> float:
        """The value of one sample line of ``GET /metrics`` on the metrics port (0 when absent)."""
        for line in httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text.splitlines():
            name, _, value = line.rpartition(" ")
            if name == sample:
                return float(value)
        return 0.0
