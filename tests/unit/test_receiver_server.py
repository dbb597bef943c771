"""The receiver's uvicorn options (controller/server.py); the floods they hold off are in
tests/system/test_receiver_limits.py."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from controller.config import ReceiverSettings
from controller.server import options


def test_options_carry_the_settings_into_uvicorn() -> None:
    """L3: the limits reach the server uvicorn builds: h11 with the header cap, the
    connection cap, and the protocol that enforces the header deadline."""
    limits = ReceiverSettings(max_connections=7, max_header_bytes=4096, header_timeout_seconds=1.5)
    config = uvicorn.Config(Starlette(), host="127.0.0.1", port=0, lifespan="off", **options(limits))
    config.load()
    assert config.limit_concurrency == 7
    assert config.h11_max_incomplete_event_size == 4096
    assert issubclass(config.http_protocol_class, H11Protocol)
    assert config.http_protocol_class.__name__ == "HeaderDeadlineProtocol"
