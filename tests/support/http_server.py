"""The receiver's HTTP server (``controller/endpoint/server.py``) serving an app from a thread of the test
process, on uvloop as ``serve`` runs it, with every refusal it counts recorded."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import uvloop

from controller import endpoint
from tests.support.processes import free_port, port_open, wait_for


class ServerThread:
    """``with ServerThread(app, limits) as running:`` ``running.port``; ``running.refused`` counts
    ``on_refused`` calls by reason."""

    def __init__(self, app: Any, limits: endpoint.Limits) -> None:
        self.app, self.limits = app, limits
        self.port = free_port()
        self.refused: Counter[str] = Counter()
        self.server: endpoint.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="receiver-server", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await endpoint.serve(self.app, "127.0.0.1", self.port, self.limits, self._count, self._ready, self._stop)

        uvloop.run(main())

    def _count(self, reason: str) -> None:
        self.refused[reason] += 1

    def _ready(self, running: endpoint.Server) -> None:
        self.server = running

    def open_connections(self) -> int:
        assert self.server is not None
        return len(self.server.open)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        wait_for(lambda: self.server is not None and port_open(self.port), 30, "the server")
        return self

    def stop(self) -> None:
        """Ask the server to stop, as SIGTERM does (``__exit__`` waits for it)."""
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the server did not stop"
