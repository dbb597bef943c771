"""The receiver's HTTP/1.1 server: made for one public ASGI app and for the clients that attack it.

``run(app, host, port, limits, on_refused)`` is what ``sandbox-controller serve`` runs (uvloop
when installed). It is a small asyncio server over ``controller/endpoint/framing.py``'s framing, so that
every byte a connection sends is counted against a limit and every phase has a clock:

- **head** (request line and headers, through the blank line): at most ``max_header_bytes``,
  counted byte for byte whatever the segmentation (431), complete within
  ``header_timeout_seconds`` of the connection opening or of the previous answer (closed);
  at most ``MAX_BLANK_BYTES`` line ends before the request line (400);
- **body**: read only while the app reads it. Up to ``BODY_BUFFER_BYTES`` wait for the app
  before reading pauses; a body the app did not read when it answered is not read at all (the
  connection closes after the answer). Complete, with its trailers, within
  ``body_timeout_seconds`` of the head (408; the app's own deadline on ``/webhooks`` is a
  second shorter, so it answers first);
- **trailers**: at most ``max_header_bytes`` (431), then dropped; chunk lines at most
  ``framing.MAX_CHUNK_LINE_BYTES`` (400);
- **answers**: the next request, when it came before the previous answer was written
  (pipelined), is not read or parsed while part of that answer is unsent — in the transport,
  or in the kernel's send queue because the client's window is full — looked at again every
  ``SWEEP_SECONDS``; such a connection waits for its client (it may be shed) and is reset at
  the header deadline (``answers_unread``), its queued answer dropped;
- **reads** of at most ``READ_BYTES``, so one connection holds at most
  ``max_header_bytes + BODY_BUFFER_BYTES + READ_BYTES`` of the server's memory (the app's
  ``max_in_flight`` bodies are the app's).

**Capacity** is ``max_connections`` open connections. When a connection arrives with all of
them open, the one that has waited longest for its client (between requests, or with its head
or body incomplete) is closed to make room ("shed") — but one receiving a body at a reasonable
rate only when no other is waiting (``shed_order``); only when every open connection is
being answered does the newcomer get ``503`` with ``Retry-After`` (after its head, within a
short deadline) — so clients that do not finish never hold capacity a genuine delivery needs.

Every refusal — 400, 408, 431, 503, 500 for an app that failed before answering, a deadline that
closed a connection, a connection shed — calls ``on_refused(reason)``
(``controller_receiver_refused_total{reason}``), and is logged at most once per
``LOG_EVERY_SECONDS`` per reason with the count since. A refusal answered while the client may
still be sending is followed by a lingering close (our side half-closed, input read and dropped
for at most ``LINGER_SECONDS``), so the client reads the answer rather than a reset. The server
sends no 413: a body over the cap is the app's to refuse (``controller/endpoint/app.py``, counted
in ``controller_webhooks_total``), since only the app knows a route's cap.

Answers: one write per ASGI message (the head waits for the first body bytes), a ``date``
header, ``Content-Length`` or else chunked, nothing after the head for ``HEAD``, keep-alive as
HTTP/1.1 says. No upgrades, no HTTP/2, no TLS (terminated in front, as the chart's Ingress does).
SIGTERM or SIGINT stop accepting, close idle connections, and give requests in progress up to
``shutdown_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from controller import logs
from controller.config import ReceiverSettings
from controller.endpoint import framing

log = logs.get("controller.server")  # the name its log lines have always carried

READ_BYTES = 64 * 1024
"""The most one read takes from a socket."""
BODY_BUFFER_BYTES = 64 * 1024
"""Body bytes that may wait for the app before reading from the connection pauses."""
LINGER_SECONDS = 2.0
LINGER_MAX_BYTES = 256 * 1024
OVER_CAPACITY_HEAD_SECONDS = 2.0
"""How long a connection beyond capacity has to send its head before it is closed (a 503 once it has)."""
RETRY_AFTER_SECONDS = 1
MAX_BLANK_BYTES = 8
"""Line ends (``\\r`` or ``\\n``) ignored before a request line, four CRLFs: more get 400 and
close, so a flood of them costs one read."""
LOG_EVERY_SECONDS = 10.0
SWEEP_SECONDS = 0.1
"""How often deadlines are looked at: each fires at most this late."""
REFUSAL_REASONS = (
    "bad_request",
    "header_too_large",
    "header_timeout",
    "trailers_too_large",
    "body_timeout",
    "over_capacity",
    "shed",
    "answers_unread",
    "app_error",
)
"""The reasons ``on_refused`` is called with (``controller_receiver_refused_total``'s label values)."""


@dataclass(frozen=True)
class Limits:
    max_connections: int = 400
    max_header_bytes: int = 16 * 1024
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 11.0
    shutdown_timeout_seconds: float = 20.0

    @classmethod
    def from_settings(cls, receiver: ReceiverSettings, app_body_timeout_seconds: float) -> Limits:
        """The server's limits; its body deadline a second after the app's own (``/webhooks``
        answers 408 itself, counted with the deliveries)."""
        return cls(
            receiver.max_connections,
            receiver.max_header_bytes,
            receiver.header_timeout_seconds,
            app_body_timeout_seconds + 1.0,
        )


_READ_BUFFER = bytearray(READ_BYTES)
"""One buffer every connection reads into (the loop runs one read at a time); copied out at once."""
_READ_VIEW = memoryview(_READ_BUFFER)
_SIOCOUTQNSD = 0x894B
_RESET = struct.pack("ii", 1, 0)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})
_FRAMING_HEADERS = {
    b"content-length": "content-length",
    b"transfer-encoding": "transfer-encoding",
    b"connection": "connection",
}
"""Answer headers the server reads or replaces: it frames the body and says ``connection: close``."""


def unsent_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes in the socket's send queue not yet sent (Linux ``SIOCOUTQNSD``: held back because
    the peer's receive window is full); 0 where that cannot be asked."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        (unsent,) = struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQNSD, b"\0\0\0\0"))
    except (OSError, ValueError):
        return 0
    return int(unsent)


class Phase:
    IDLE = "idle"  # waiting for the first byte of the next head
    HEAD = "head"  # part of a head received
    BODY = "body"  # head complete, body (or trailers) still arriving
    DONE = "done"  # the request is read whole; its answer is pending
    LINGER = "linger"  # answered and half-closed; input dropped until the client closes


WAITING_FOR_CLIENT = frozenset({Phase.IDLE, Phase.HEAD, Phase.BODY, Phase.LINGER})
"""Phases in which a connection waits for its client: the ones shed to make room."""
BODY_GRACE_SECONDS = 1.0
"""A body that began this recently is being received, whatever it has sent yet."""
MIN_BODY_BYTES_PER_SECOND = 16 * 1024
"""A body arriving at least this fast on average since its head is being received: a genuine
sender's arrives in milliseconds; a 256 KiB body at this rate would take 16 s."""


def shed_order(phase: str, since: float, body_bytes: int, now: float) -> tuple[int, float]:
    """Which connection waiting for its client is shed first to make room (the least): one
    answered and lingering, then the idle, those with a head incomplete and those trickling a
    body — the longest waiting first —, and only then one receiving a body at a reasonable
    rate (within ``BODY_GRACE_SECONDS`` of its head, or at ``MIN_BODY_BYTES_PER_SECOND``)."""
    if phase is Phase.LINGER:
        return (0, since)
    if phase is Phase.BODY:
        elapsed = now - since
        if elapsed < BODY_GRACE_SECONDS or body_bytes >= MIN_BODY_BYTES_PER_SECOND * elapsed:
            return (2, since)
    return (1, since)


class RefusalLog:
    """One log line per reason at most every ``LOG_EVERY_SECONDS`` (the first at once), with the
    count since the last, so a flood of refusals is visible without flooding the log."""

    def __init__(self, on_refused: Callable[[str], None]) -> None:
        self._on_refused = on_refused
        self._throttle = logs.Throttle(LOG_EVERY_SECONDS)

    def __call__(self, reason: str) -> None:
        try:
            self._on_refused(reason)
        except Exception:
            log.exception("receiver.count_error")
        count = self._throttle.count(reason)
        if count:
            log.warning("receiver.refused", extra={"reason": reason, "count": count})


class Server:
    """The connections of one listening socket, and the limits they share."""

    def __init__(self, app: Any, limits: Limits, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.limits = limits
        self.refused = RefusalLog(on_refused or (lambda reason: None))
        self.open: dict[Connection, None] = {}  # insertion-ordered: oldest first
        self.surplus: dict[Connection, None] = {}
        self.held: dict[Connection, None] = {}
        """Connections whose next request waits for their answers to leave (``Connection._hold``)."""
        self.stopping = False
        self.date = b""
        self._date_second = -1
        self.tasks: set[asyncio.Task[None]] = set()

    def now_date(self) -> bytes:
        second = int(time.time())
        if second != self._date_second:
            self._date_second = second
            self.date = formatdate(second, usegmt=True).encode("ascii")
        return self.date

    def admit(self, connection: Connection) -> bool:
        """Take a slot for ``connection``, shedding the longest-waiting connection if all are
        taken; False when every open connection is being answered (it is surplus)."""
        if len(self.open) >= self.limits.max_connections:
            now = asyncio.get_running_loop().time()
            oldest = min(
                (each for each in self.open if each.phase in WAITING_FOR_CLIENT),
                key=lambda each: shed_order(each.phase, each.phase_since, each.received - each.body_from, now),
                default=None,
            )
            if oldest is None:
                return False
            self.refused("shed")
            oldest.abort()
        self.open[connection] = None
        return True

    def leave(self, connection: Connection) -> None:
        """``connection`` is closed: its slot is free."""
        self.open.pop(connection, None)
        self.surplus.pop(connection, None)
        self.held.pop(connection, None)

    def sweep(self) -> None:
        """Run the deadlines that have passed. Every ``SWEEP_SECONDS``: one timer for all
        connections, so a request arms and disarms its deadlines with an attribute each."""
        now = asyncio.get_running_loop().time()
        for connections in (self.open, self.surplus):
            due = [each for each in connections if each.deadline is not None and each.deadline <= now]
            for each in due:
                each.deadline = None
                each.on_deadline()
        for each in list(self.held):
            each.release()

    def protocol(self) -> Connection:
        return Connection(self)

    async def shutdown(self) -> None:
        self.stopping = True
        for each in [*self.open, *self.surplus]:
            if each.cycle is None:
                each.abort()
        deadline = time.monotonic() + self.limits.shutdown_timeout_seconds
        while self.open and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for each in [*self.open, *self.surplus]:
            each.abort()
        for task in list(self.tasks):
            task.cancel()


class Connection(asyncio.BufferedProtocol):
    """One client connection: framing, deadlines and flow control, one request at a time
    (pipelined requests wait in the buffer, bounded, for the previous answer)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.searched = 0
        self.phase = Phase.IDLE
        self.phase_since = self.loop.time()
        self.served = 0
        self.cycle: Cycle | None = None
        self.body: framing.FixedBody | framing.ChunkedBody | None = None
        self.deadline: float | None = None
        """When ``on_deadline`` runs (the loop's clock), unless disarmed first: ``Server.sweep``."""
        self.on_deadline: Callable[[], None] = self.abort
        self.surplus = False
        self.reading = True
        self.lingered = 0
        self.blank = 0
        """Line ends dropped before this request's line (``MAX_BLANK_BYTES``)."""
        self.pipelined = False
        """The next request's bytes were here when the last answer was written: before reading
        it, look whether that answer has left (a syscall only a pipelining client costs)."""
        self.received = 0
        self.body_from = 0
        """``received`` when the body began: the body's bytes so far are the difference."""
        self.writable: asyncio.Future[None] | None = None

    # asyncio callbacks

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport: asyncio.Transport = base  # type: ignore[assignment]  # uvloop's is no subclass of it
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self.server
        if server.stopping:
            transport.abort()
            return
        if not server.admit(self):
            if len(server.surplus) >= self.limits.max_connections:
                server.refused("over_capacity")
                transport.abort()
                return
            server.surplus[self] = None
            self.surplus = True
            self._arm(min(OVER_CAPACITY_HEAD_SECONDS, self.limits.header_timeout_seconds), self._head_expired)
            return
        self._arm(self.limits.header_timeout_seconds, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.server.leave(self)
        self.phase = Phase.LINGER
        if self.cycle is not None:
            self.cycle.lost()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ_VIEW

    def buffer_updated(self, nbytes: int) -> None:
        if self.phase is Phase.LINGER:
            self.lingered += nbytes
            if self.lingered > LINGER_MAX_BYTES:
                self.abort()
            return
        self.buffer += _READ_VIEW[:nbytes]
        self.received += nbytes
        self._advance()

    def eof_received(self) -> bool | None:
        if self.phase is Phase.DONE and self.cycle is not None:
            self.cycle.keep_alive = False  # the client half-closed after its request: answer, then close
            return True
        if self.cycle is not None:
            self.cycle.lost()  # the body can never be complete
        return None  # close

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        if self.buffer and self.cycle is None:
            self._advance()  # a pipelined request waited for the answers before it to be written out

    @property
    def write_blocked(self) -> bool:
        """The client is not reading our answers: the transport's buffer is over its high mark."""
        return self.writable is not None and not self.writable.done()

    # the request's way through

    def _advance(self) -> None:
        limits = self.limits
        while self.transport is not None and not self.transport.is_closing():
            phase = self.phase
            if phase is Phase.LINGER:
                return
            if phase is Phase.BODY:
                if not self._read_body():
                    return
            elif phase is Phase.DONE or self.cycle is not None or self.write_blocked:
                # The answer is pending (or not yet written out): the next request waits, bounded.
                if len(self.buffer) >= limits.max_header_bytes:
                    self._pause_reading()
                return
            else:
                if phase is Phase.IDLE:
                    if not self._strip_blank_lines() or not self.buffer:
                        return
                    if self.pipelined and self._answer_unsent():
                        self._hold()
                        return
                    self._enter(Phase.HEAD)
                try:
                    end = framing.head_end(self.buffer, self.searched, limits.max_header_bytes)
                    if end < 0:
                        self.searched = len(self.buffer)
                        return
                    head = framing.parse_head(bytes(self.buffer[:end]), limits.max_header_bytes)
                except framing.FramingError as exc:
                    self.refuse(exc.status, exc.reason, str(exc))
                    return
                del self.buffer[:end]
                self.searched = 0
                self._begin(head)

    def _answer_unsent(self) -> bool:
        """Part of an answer is still here, in the transport or in the kernel's send queue
        unsent: the client is not reading what it asked for."""
        transport = self.transport
        return transport is not None and (transport.get_write_buffer_size() > 0 or unsent_bytes(transport) > 0)

    def _hold(self) -> None:
        """Read nothing and render nothing more until the answers written have left (``Server.sweep``
        looks again): a client that pipelines requests and reads no answer costs one answer."""
        self._pause_reading()
        self.server.held[self] = None

    def release(self) -> None:
        """``Server.sweep``: the answers held for have left, or the connection ended."""
        if self.transport is None or self.transport.is_closing() or self.phase is not Phase.IDLE:
            self.server.held.pop(self, None)
        elif not self._answer_unsent():
            self.server.held.pop(self, None)
            self._resume_reading()
            self._advance()

    def _strip_blank_lines(self) -> bool:
        """Drop line ends before a request line (RFC 9112 asks servers to ignore at least one),
        at most ``MAX_BLANK_BYTES`` of them per request: past that, 400 and close (a client
        sending nothing else is cut off at its first read, not at the header deadline).
        Whether the connection goes on."""
        blank = len(self.buffer) - len(self.buffer.lstrip(b"\r\n"))
        if blank:
            del self.buffer[:blank]
            self.blank += blank
            if self.blank > MAX_BLANK_BYTES:
                self.refuse(400, "bad_request", "Too many empty lines before the request line.")
                return False
        return True

    def _begin(self, head: framing.Head) -> None:
        self._disarm()
        self.pipelined = False
        if self.surplus:
            self.refuse(503, "over_capacity", "The receiver is at capacity; retry later.")
            return
        keep_alive = head.keep_alive and not self.server.stopping
        cycle = self.cycle = Cycle(self, head, keep_alive)
        self.body = head.body
        if head.body is not None:
            self.body_from = self.received - len(self.buffer)  # what followed the head in its read counts
            self._enter(Phase.BODY)
            self._arm(self.limits.body_timeout_seconds, self._body_expired)
        else:
            self._enter(Phase.DONE)
            cycle.body_complete()
        task = self.loop.create_task(cycle.run(self.server.app))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def _read_body(self) -> bool:
        """Move body bytes from the buffer to the app; whether the request is read whole."""
        body, cycle = self.body, self.cycle
        assert body is not None and cycle is not None
        if cycle.queued >= BODY_BUFFER_BYTES:
            self._pause_reading()
            return False
        if not self.buffer:
            return False
        try:
            pieces, used = body.feed(self.buffer)
        except framing.FramingError as exc:
            self.refuse(exc.status, exc.reason, str(exc))
            return False
        del self.buffer[:used]
        cycle.add_body(pieces)
        if not body.done:
            if cycle.queued >= BODY_BUFFER_BYTES:
                self._pause_reading()
            return False
        self._disarm()
        self._enter(Phase.DONE)
        cycle.body_complete()
        return True

    def answered(self, cycle: Cycle) -> None:
        """The app's answer is written whole."""
        self.cycle = None
        self.served += 1
        if not cycle.keep_alive or self.phase is Phase.BODY or self.server.stopping:
            # A body the app did not read is not read: close (lingering, the client may be sending).
            self.linger()
            return
        self.body = None
        self.blank = 0
        self.pipelined = bool(self.buffer)  # the next request came before this answer left
        self._enter(Phase.IDLE)
        self._arm(self.limits.header_timeout_seconds, self._head_expired)
        self._resume_reading()
        if self.buffer:
            self._advance()

    def app_wants_body(self) -> None:
        """The app waits for body bytes: read from the client again."""
        self._resume_reading()

    # refusals, deadlines, closing

    def refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` (unless an answer has begun) and close; counted as ``reason``."""
        self.server.refused(reason)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or not cycle.started:
            extra = ((b"retry-after", b"%d" % RETRY_AFTER_SECONDS),) if status == 503 else ()
            transport.write(framing.answer(status, message, extra))
            if cycle is not None:
                cycle.started = cycle.complete = True
        if cycle is not None:
            cycle.lost()
            self.cycle = None
        self.linger()

    def linger(self) -> None:
        """Half-close our side and drop input until the client closes, at most ``LINGER_SECONDS``."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._enter(Phase.LINGER)
        self.buffer.clear()
        if not transport.can_write_eof():
            transport.close()
            return
        self._resume_reading()
        transport.write_eof()
        self._arm(LINGER_SECONDS, self.abort)

    def abort(self) -> None:
        """Close now: gracefully when everything written has left, else with a reset (a client
        that does not read its answers must not keep a socket and its buffer until it does)."""
        self._disarm()
        transport = self.transport
        if transport is None:
            return
        if self._answer_unsent():
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a reset: the kernel drops what is queued rather than keep sending it
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            transport.abort()
        elif not transport.is_closing():
            transport.close()
        self.server.leave(self)
        self.phase = Phase.LINGER

    def _head_expired(self) -> None:
        if self in self.server.held:
            self.server.refused("answers_unread")
        elif self.phase is Phase.HEAD or (self.phase is Phase.IDLE and not self.served):
            self.server.refused("header_timeout")  # keep-alive idle after an answer is no refusal
        self.abort()

    def _body_expired(self) -> None:
        self.refuse(408, "body_timeout", "The request body did not arrive in time.")

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.phase_since = self.loop.time()

    def _arm(self, seconds: float, callback: Callable[[], None]) -> None:
        self.deadline = self.loop.time() + seconds
        self.on_deadline = callback

    def _disarm(self) -> None:
        self.deadline = None

    def _pause_reading(self) -> None:
        if self.reading and self.transport is not None and not self.transport.is_closing():
            self.reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self.reading and self.transport is not None and not self.transport.is_closing():
            self.reading = True
            self.transport.resume_reading()
            if self.buffer and self.phase is Phase.BODY:
                self._advance()


class Cycle:
    """One request and its answer, as the app sees them (ASGI ``receive``/``send``)."""

    def __init__(self, connection: Connection, head: framing.Head, keep_alive: bool) -> None:
        self.connection = connection
        self.head = head
        self.keep_alive = keep_alive
        self.pieces: deque[bytes] = deque()
        self.queued = 0
        self.read_whole = False
        self.body_given = False
        self.disconnected = False
        self.waiter: asyncio.Future[None] | None = None
        self.started = False
        self.complete = False
        self.continued = not head.expects_continue
        self.held = b""
        self.chunked = False

    def scope(self) -> dict[str, Any]:
        head, transport = self.head, self.connection.transport
        assert transport is not None
        client = transport.get_extra_info("peername")
        server = transport.get_extra_info("sockname")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": head.http_version,
            "server": tuple(server[:2]) if isinstance(server, tuple) else None,
            "client": tuple(client[:2]) if isinstance(client, tuple) else None,
            "scheme": "http",
            "method": head.method,
            "root_path": "",
            "path": head.path,
            "raw_path": head.raw_path,
            "query_string": head.query,
            "headers": head.headers,
            "state": {},
        }

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope(), self.receive, self.send)
        except Exception:
            log.exception("receiver.app_error")
            if not self.started:
                self.connection.refuse(500, "app_error", "Internal Server Error")
                return
        if not self.complete:
            if not self.started and not self.disconnected:
                log.error("receiver.no_answer")
            self.connection.abort()

    # inbound (called by the connection)

    def add_body(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            if piece:
                self.pieces.append(piece)
                self.queued += len(piece)
        self._wake()

    def body_complete(self) -> None:
        self.read_whole = True
        self._wake()

    def lost(self) -> None:
        self.disconnected = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # ASGI

    async def receive(self) -> dict[str, Any]:
        while True:
            if self.disconnected or self.complete:
                return {"type": "http.disconnect"}
            if self.pieces:
                body = self.pieces.popleft() if len(self.pieces) == 1 else b"".join(self.pieces)
                self.pieces.clear()
                self.queued = 0
                more = not self.read_whole
                self.body_given = not more
                if more:
                    self.connection.app_wants_body()
                return {"type": "http.request", "body": body, "more_body": more}
            if self.read_whole and not self.body_given:
                self.body_given = True
                return {"type": "http.request", "body": b"", "more_body": False}
            if not self.read_whole and not self.continued and not self.started:
                self.continued = True
                transport = self.connection.transport
                if transport is not None and not transport.is_closing():
                    transport.write(_CONTINUE)
            self.connection.app_wants_body()
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected:
            return  # the client is gone, or the server answered (a refusal) and closes
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("the answer has already started")
            self.started = True
            self.held = self._answer_head(message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if not self.started or self.complete:
            raise RuntimeError("body sent before the answer started, or after it ended")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        out = [self.held] if self.held else []
        self.held = b""
        if self.head.method != "HEAD":
            if self.chunked:
                if body:
                    out.append(b"%x\r\n%s\r\n" % (len(body), body))
                if not more:
                    out.append(b"0\r\n\r\n")
            elif body:
                out.append(body)
        connection = self.connection
        transport = connection.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        if not more:
            self.complete = True
            self._wake()
            connection.answered(self)
        elif connection.writable is not None and not connection.writable.done():
            await connection.writable

    def _answer_head(self, status: int, headers: Any) -> bytes:
        framed = status in _NO_BODY_STATUSES or self.head.method == "HEAD"
        lines = []
        for name, value in headers:
            special = _FRAMING_HEADERS.get(name.lower())
            if special is not None:
                if special == "content-length":
                    framed = True
                elif special == "transfer-encoding":
                    continue  # the server frames the body
                elif value.lower() == b"close":
                    self.keep_alive = False
                    continue
            lines.append(name + b": " + value + b"\r\n")
        block = b"".join(lines)
        if block.count(b"\n") != len(lines) or block.count(b"\r") != len(lines):
            raise RuntimeError("a header of the app's answer holds a line break")
        if self.connection.phase is Phase.BODY:
            self.keep_alive = False  # the rest of the body is not read: the connection ends here
        ending = b"\r\n" if self.keep_alive else b"connection: close\r\n\r\n"
        if not framed:
            self.chunked = True
            ending = b"transfer-encoding: chunked\r\n" + ending
        date = self.connection.server.now_date()
        return b"".join((framing.status_line(status), block, b"date: ", date, b"\r\n", ending))


async def serve(
    app: Any,
    host: str,
    port: int,
    limits: Limits,
    on_refused: Callable[[str], None] | None = None,
    ready: Callable[[Server], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``app`` until ``stop`` is set (or, without one, until SIGTERM or SIGINT)."""
    server = Server(app, limits, on_refused)
    loop = asyncio.get_running_loop()
    listening = await loop.create_server(server.protocol, host, port, backlog=2048, reuse_address=True)
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    sweeping = loop.create_task(_sweep(server))
    addresses = [sock.getsockname()[:2] for sock in listening.sockets]
    log.info("receiver.listening", extra={"addresses": [f"{a}:{p}" for a, p in addresses]})
    if ready is not None:
        ready(server)
    try:
        await stop.wait()
    finally:
        log.info("receiver.stopping", extra={"open_connections": len(server.open)})
        listening.close()
        await server.shutdown()
        sweeping.cancel()
        await listening.wait_closed()
        log.info("receiver.stopped")


async def _sweep(server: Server) -> None:
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            server.sweep()
        except Exception:
            log.exception("receiver.sweep_error")


def run(app: Any, host: str, port: int, limits: Limits, on_refused: Callable[[str], None] | None = None) -> None:
    """``serve`` on a new event loop (uvloop's when installed)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        asyncio.run(serve(app, host, port, limits, on_refused))
    else:
        uvloop.run(serve(app, host, port, limits, on_refused))
