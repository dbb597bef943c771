"""The receiver's HTTP server: uvicorn options that keep slow or hostile clients cheap.

``options(limits)`` is what ``sandbox-controller serve`` passes to ``uvicorn.run``:

- the pure-Python h11 parser rather than httptools, because h11 refuses request headers
  above ``max_header_bytes`` (431, connection closed) instead of buffering them without bound;
- ``limit_concurrency``: once ``max_connections`` connections are open (or requests in
  progress), a new request gets 503 and the sender retries: a backstop on sockets (the body
  budget is the app's ``max_in_flight``, which leaves health probes alone);
- a header deadline, which uvicorn lacks: a connection whose request headers are not complete
  ``header_timeout_seconds`` after it opened, or after its previous response, is closed, so a
  client trickling headers cannot keep a connection slot for ever.

In the app (``receiver``), the signature headers are checked before a body byte is read
(``signing.Verifier.precheck``), at most ``max_in_flight`` deliveries are read at once (503
beyond), and the body has a deadline (408).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from controller.config import ReceiverSettings


def options(limits: ReceiverSettings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that enforce ``limits``."""
    return {
        "http": protocol_with_header_deadline(limits.header_timeout_seconds),
        "h11_max_incomplete_event_size": limits.max_header_bytes,
        "limit_concurrency": limits.max_connections,
    }


def protocol_with_header_deadline(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers take longer than ``seconds``."""

    class HeaderDeadlineProtocol(H11Protocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:
                self._disarm()  # the request line and headers are in (or the connection is ending)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Keep-alive: the next request's headers get the same deadline (a pipelined request
            # already parsed by the call above has left IDLE and needs none).
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _expire(self) -> None:
            self._header_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.conn.send(h11.ConnectionClosed())
                self.transport.close()

    return HeaderDeadlineProtocol
