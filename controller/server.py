"""The receiver's HTTP server: uvicorn options that keep slow or hostile clients cheap.

``options(limits)`` is what ``sandbox-controller serve`` passes to ``uvicorn.run``:

- uvicorn's httptools protocol (the C parser ``llhttp``, about a third of the pure-Python h11
  parser's CPU per request: ``bench/receiver_fastpath.py``), with two guards it lacks
  (``guarded_protocol``):

  - a header cap: a request whose request line and headers exceed ``max_header_bytes`` gets
    431 and the connection is closed. httptools itself buffers a header of any size (each
    piece is appended until the line ends), so the bytes of a request head still incomplete
    are counted as they arrive, and the request is refused once they pass the cap: what a
    connection can make the receiver hold is the cap plus one read (the event loop reads up
    to 256 KiB at a time);
  - a header deadline: a connection whose request head is not complete
    ``header_timeout_seconds`` after it opened, or after its previous response, is closed, so
    a client trickling headers cannot keep a connection slot for ever;

- ``limit_concurrency``: once ``max_connections`` connections are open (or requests in
  progress), a new request gets 503 and the sender retries: a backstop on sockets (the body
  budget is the app's ``max_in_flight``, which leaves health probes alone);
- no WebSocket upgrades (``ws="none"``): the receiver serves none, and an upgraded connection
  would leave these guards behind.

In the app (``receiver``), the signature headers are checked before a body byte is read
(``signing.Verifier.precheck``), at most ``max_in_flight`` deliveries are read at once (503
beyond), and the body has a deadline (408).
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import httptools
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from controller.config import ReceiverSettings

_HEADER_LINE_EXTRA = 4
"""Bytes of a header line besides its name and value (``": "`` and CRLF), as counted for the cap."""


def options(limits: ReceiverSettings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config`` that enforce ``limits``."""
    return {
        "http": guarded_protocol(limits.max_header_bytes, limits.header_timeout_seconds),
        "ws": "none",
        "limit_concurrency": limits.max_connections,
        # The receiver reads no client address (it logs none), so uvicorn's proxy-headers
        # middleware, a layer on every request, has nothing to do.
        "proxy_headers": False,
    }


class _Phase(enum.Enum):
    IDLE = "idle"  # between requests: nothing of the next one has been parsed
    HEAD = "head"  # the request line and headers are arriving
    BODY = "body"  # the head is complete; the body (if any) is arriving


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head over the cap."""


def guarded_protocol(max_header_bytes: int, header_timeout_seconds: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the header cap and the header deadline (see the module
    docstring)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _phase = _Phase.IDLE
        _head_received = 0
        """Bytes received for the current head in the chunks before the one being parsed (or,
        once a chunk is parsed and the head is still incomplete, including it)."""
        _chunk = 0
        """Bytes in the chunk being parsed."""
        _began = 0
        """Requests begun in the chunk being parsed."""
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._unset_keepalive_if_required()
            phase = self._phase
            self._chunk = len(data)
            self._began = 0
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserCallbackError as exc:
                if isinstance(exc.__context__, _HeadTooLarge):
                    self._refuse_head()
                else:
                    self._bad_request()
                return
            except httptools.HttpParserError:
                self._bad_request()
                return
            except httptools.HttpParserUpgrade:
                pass  # ws="none": the request is served as plain HTTP, its Upgrade header ignored
            if self._phase is not _Phase.HEAD:
                return
            # The head is still incomplete: count what it holds so far.
            if phase is _Phase.HEAD and not self._began:
                self._head_received += len(data)  # every byte of this chunk belongs to it
            elif phase is _Phase.IDLE and self._began == 1:
                self._head_received = len(data)  # it began this chunk (after stray CRLFs at most)
            else:
                # It began after the end of another request in this chunk, where is not known: what
                # the parser handed over counts now (its current header is not in it), and the next
                # chunk counts whole.
                self._head_received = self._head_size()
            if self._head_received > max_header_bytes:
                self._refuse_head()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = _Phase.HEAD
            self._head_received = 0
            self._began += 1

        def on_headers_complete(self) -> None:
            # The head has at most the bytes received for it: counted exactly only when that is
            # more than the cap (a large head in one chunk).
            if self._head_received + self._chunk > max_header_bytes and self._head_size() > max_header_bytes:
                raise _HeadTooLarge  # stops the parser: data_received answers 431
            self._phase = _Phase.BODY
            self._disarm()  # the request line and headers are in
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._phase = _Phase.IDLE
            super().on_message_complete()

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            cycle.__class__ = OneWriteCycle  # before the app runs: it is handed this class's send
            super()._start_asgi_task(cycle, app)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Keep-alive: the next request's head gets the same deadline (unless a pipelined one
            # is already complete).
            if not self.transport.is_closing() and self._phase is not _Phase.BODY:
                self._arm()

        def _head_size(self) -> int:
            """The bytes of the URL and the complete headers the parser has handed over."""
            return len(self.url) + sum(len(name) + len(value) + _HEADER_LINE_EXTRA for name, value in self.headers)

        def _refuse_head(self) -> None:
            self.logger.warning("Request headers over the cap (%d bytes).", max_header_bytes)
            self._close_with(431, "Request headers are too large.")

        def _bad_request(self) -> None:
            self.logger.warning("Invalid HTTP request received.")
            self._close_with(400, "Invalid HTTP request received.")

        def _close_with(self, status: int, message: str) -> None:
            self._disarm()
            if self.transport.is_closing():
                return
            body = message.encode("ascii")
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._header_deadline = self.loop.call_later(header_timeout_seconds, self._expire)

        def _disarm(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _expire(self) -> None:
            self._header_deadline = None
            if self._phase is not _Phase.BODY and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpToolsProtocol


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's response cycle, writing a response's head together with its first body bytes.

    uvicorn writes the head (status line and headers) as soon as the app starts its response,
    and the body when the app sends it: two writes, two system calls and two TCP segments for an
    answer the receiver has whole at once (on loopback each write also runs the peer's receive
    path: it was a tenth of the receiver's CPU time, ``bench/receiver_fastpath.py --profile``).
    Here the head waits for the first body message and leaves in the same write. A response
    whose app fails between the two is not sent at all (uvicorn closes the connection), where
    uvicorn would have sent its head alone.
    """

    _held: bytes | None = None

    async def send(self, message: ASGISendEvent) -> None:
        held = self._held
        if held is None and (self.response_started or message["type"] != "http.response.start"):
            await super().send(message)  # a later body message, or a protocol error for uvicorn to raise
            return
        transport = self.transport
        collected = _Collecting(transport, held)
        self._held, self.transport = None, collected  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
            if held is None and message["type"] == "http.response.start":
                self._held = collected.take()  # the head: written with the first body message
            else:
                collected.release()


class _Collecting:
    """Stands for a transport while one ASGI message is written: the writes are joined into one,
    and a close waits for it (``release``)."""

    def __init__(self, transport: asyncio.Transport, held: bytes | None) -> None:
        self._transport = transport
        self._parts = [held] if held else []
        self._close = False

    def write(self, data: bytes) -> None:
        self._parts.append(data)

    def close(self) -> None:
        self._close = True

    def is_closing(self) -> bool:
        return self._close or self._transport.is_closing()

    def take(self) -> bytes | None:
        data = b"".join(self._parts)
        if self._close:  # never happens with the head alone; kept safe all the same
            self.release()
            return None
        return data

    def release(self) -> None:
        if self._parts and not self._transport.is_closing():
            self._transport.write(b"".join(self._parts))
        self._parts = []
        if self._close:
            self._transport.close()
