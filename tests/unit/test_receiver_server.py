"""The receiver's uvicorn options (controller/server.py); what the guarded protocol does on the
wire is tests/contract/test_receiver_server.py, the floods they hold off are in
tests/system/test_receiver_limits.py."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from controller.config import ReceiverSettings
from controller.server import options


def test_options_carry_the_settings_into_uvicorn() -> None:
    """L3: the limits reach the server uvicorn builds: httptools with the header cap and deadline
    (the guarded protocol), the connection cap, and no WebSocket upgrades."""
    limits = ReceiverSettings(max_connections=7, max_header_bytes=4096, header_timeout_seconds=1.5)
    config = uvicorn.Config(Starlette(), host="127.0.0.1", port=0, lifespan="off", **options(limits))
    config.load()
    assert config.limit_concurrency == 7
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)
    assert config.http_protocol_class.__name__ == "GuardedHttpToolsProtocol"
    assert config.ws_protocol_class is None


class RecordingTransport(asyncio.Transport):
    """What the protocol writes, one entry per ``write`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def answers_written(requests: bytes) -> list[bytes]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", **options(ReceiverSettings()))
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    protocol.data_received(requests)
    for _ in range(20):  # the answers' tasks run on the next turns of the loop
        await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport.writes


def test_an_answer_leaves_in_one_write() -> None:
    """L3: the response's head is written with its body, one write (one system call, one TCP
    segment) per answer, where uvicorn writes them apart."""
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    writes = asyncio.run(answers_written(request * 2))
    assert len(writes) == 2
    for written in writes:
        assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b"\r\n\r\nok")
