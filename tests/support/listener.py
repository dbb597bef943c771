"""A TCP listener on loopback that counts the connections it accepted: what a sandboxed command
must not reach, while an unsandboxed one does (tests/contract/test_*codex_sandbox.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest


class Listener:
    """Accepts and closes connections on 127.0.0.1, counting them."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def connect_argv(self) -> list[str]:
        code = f"import socket; socket.create_connection(('127.0.0.1', {self.port}), 5).close(); print('connected')"
        return ["python3", "-c", code]


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    yield found
    found.socket.close()
