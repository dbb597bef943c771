"""HTTP/1.1 framing for the receiver's server (``controller/endpoint/server.py``): where a request's
head, body and trailers end, each counted against its limit. No I/O, no clock: bytes in, decisions
out. httptools (llhttp) reads the head and decodes chunked bodies; what is built here is what
llhttp leaves to its caller: the limits, and where a body ends.

- ``head_end``: the end of the head (request line and headers, through the blank line), or
  ``HeadTooLarge`` as soon as the bytes received prove it longer than the cap. The cap counts
  every byte of the head, so the verdict is the same however TCP splits it.
- ``parse_head``: the head, through httptools (llhttp, strict: one Content-Length, no
  Content-Length beside Transfer-Encoding, ``chunked`` last; a head it does not finish, such as
  the start of an HTTP/2 preface, is refused): method, target, version, headers, keep-alive,
  and how the body is framed.
- ``FixedBody`` / ``ChunkedBody``: the body by Content-Length (counted here) or by chunks
  (decoded by llhttp, strict: sizes, extensions, CRLFs and trailer fields checked); the chunk
  lines are bounded, the chunks are paid for with data (``FREE_CHUNKS``, ``MIN_CHUNK_BYTES``),
  and the trailers are counted against the head's cap, then dropped (no app here reads
  trailers). Where a chunked body ends is placed here, from llhttp's events: httptools gives
  no position, and a pipelined request after the body must be found (``ChunkedBody``).
- ``answer``: a whole short answer (the server's own refusals).

Errors carry the status and the refusal reason the server counts
(``controller_receiver_refused_total{reason}``).
"""

from __future__ import annotations

import http
import urllib.parse

import httptools

_END = b"\r\n\r\n"
MAX_CHUNK_LINE_BYTES = 1024
"""A chunk-size line (hex digits and any extensions) longer than this is refused (400)."""
FREE_CHUNKS = 64
MIN_CHUNK_BYTES = 1024
"""Chunks are paid for with data: a body may have ``FREE_CHUNKS`` chunks, and one more for every
``MIN_CHUNK_BYTES`` of data decoded before it; past that, 400, as llhttp reads the chunk line
over the budget. Each chunk costs three calls from llhttp into Python and a turn placing them
(4096 one-byte chunks: 7.6 ms on a loaded 2-core machine, a third of the hand-built decoder's
22 ms beside it), so a body of tiny chunks is refused after 64, and a chunked body costs the
server about as much CPU per byte as one framed by Content-Length (at most a chunk per KiB)."""


class FramingError(Exception):
    """A request the server answers itself and then closes."""

    status = 400
    reason = "bad_request"


class BadRequest(FramingError):
    pass


class HeadTooLarge(FramingError):
    status = 431
    reason = "header_too_large"


class TrailersTooLarge(FramingError):
    status = 431
    reason = "trailers_too_large"


def head_end(buffer: bytes | bytearray, searched: int, cap: int) -> int:
    """The length of the head at the start of ``buffer`` (through its blank line), or -1 while it
    is incomplete. ``searched``: how much of ``buffer`` an earlier call already searched.
    HeadTooLarge once the head is known to be over ``cap`` bytes."""
    end = buffer.find(_END, max(0, searched - 3))
    if end < 0:
        if len(buffer) >= cap:  # the blank line, when it comes, ends at least one byte later
            raise HeadTooLarge(f"request head over {cap} bytes")
        return -1
    if end + 4 > cap:
        raise HeadTooLarge(f"request head over {cap} bytes")
    return end + 4


class Head:
    """A request's head, as ``parse_head`` read it."""

    __slots__ = (
        "body",
        "expects_continue",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "path",
        "query",
        "raw_path",
    )

    def __init__(self, collected: _Collector, raw_path: bytes, path: str, query: bytes) -> None:
        self.method: str = collected.method.decode("ascii")
        self.raw_path = raw_path
        self.path = path
        self.query = query
        self.http_version: str = collected.http_version
        self.headers: list[tuple[bytes, bytes]] = collected.headers
        self.keep_alive: bool = collected.keep_alive
        self.body: FixedBody | ChunkedBody | None = None
        self.expects_continue = False


class _Collector:
    """httptools callbacks for one head. What the parser knows of the request is read when the
    headers are complete: once the message is complete (a request without a body), it has
    already reset for the next one."""

    __slots__ = (
        "chunked",
        "content_length",
        "expect",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "parser",
        "url",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parser: httptools.HttpRequestParser | None = None
        self.method = b""
        self.http_version = ""
        self.keep_alive = False
        self.content_length: bytes | None = None
        self.chunked: list[bytes] = []
        self.expect = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"content-length":
            self.content_length = value
        elif name == b"transfer-encoding":
            self.chunked.append(value)
        elif name == b"expect":
            self.expect = value.strip().lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        self.method = parser.get_method()
        self.http_version = parser.get_http_version()
        self.keep_alive = parser.should_keep_alive()


def parse_head(head: bytes, max_trailer_bytes: int) -> Head:
    """The head (as ``head_end`` framed it), or BadRequest."""
    collected = _Collector()
    parser = collected.parser = httptools.HttpRequestParser(collected)
    try:
        parser.feed_data(head)
    except httptools.HttpParserUpgrade:
        pass  # an Upgrade (or CONNECT) is served as a plain request: this server upgrades nothing
    except httptools.HttpParserError as exc:
        raise BadRequest(f"invalid request head: {exc}") from None
    if not collected.method:  # llhttp finished no head here: it waits for more (a ``PRI`` preface's)
        raise BadRequest("request head not complete")
    try:
        url = httptools.parse_url(collected.url)
    except httptools.HttpParserInvalidURLError:
        raise BadRequest("invalid request target") from None
    raw_path = url.path or b"/"
    try:
        path = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("request target is not ASCII") from None
    if "%" in path:
        path = urllib.parse.unquote(path)
    parsed = Head(collected, raw_path, path, url.query or b"")
    if collected.chunked:
        if b",".join(collected.chunked).strip().lower() != b"chunked":
            raise BadRequest("Transfer-Encoding other than chunked")
        parsed.body = ChunkedBody(max_trailer_bytes)
    elif collected.content_length is not None:
        length = int(collected.content_length)  # llhttp checked: digits, one value
        parsed.body = FixedBody(length) if length else None
    parsed.expects_continue = collected.expect and parsed.body is not None
    return parsed


class FixedBody:
    """A body of ``Content-Length`` bytes."""

    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes | bytearray) -> tuple[list[bytes], int]:
        """The body bytes at the start of ``data`` and how many bytes of it were the body's."""
        taken = min(self.remaining, len(data))
        self.remaining -= taken
        self.done = self.remaining == 0
        return ([bytes(data[:taken])] if taken else []), taken


_CHUNKED_HEAD = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
"""What a chunk decoder's parser reads first: the request's own head was read by ``parse_head``."""
_HEADER, _COMPLETE = -1, -2
"""``ChunkedBody``'s events besides the data's (its length): a chunk line read, a chunk's end."""


class _End(Exception):
    """The body's last byte is read: llhttp stops there (what follows is the next request's)."""


class _Ignore:
    """httptools callbacks that keep nothing (``ChunkedBody``'s probe of trailers)."""


class ChunkedBody:
    """A chunked body, decoded by llhttp (httptools' parser, strict: CRLF line ends, chunk sizes,
    extensions and trailer fields checked; trailers dropped), fed from after the head. Around it,
    what llhttp leaves to its caller:

    - the limits: chunk lines at most ``MAX_CHUNK_LINE_BYTES`` (400), trailers at most
      ``max_trailer_bytes`` (431; checked before any byte past the cap is parsed, so a verdict
      is the same however the bytes arrive), chunks paid for with data (400, counted as llhttp
      reads each chunk line, so a flood of tiny chunks stops at the one over);
    - where the body ends: llhttp says when (its events), not where, so each event of a read is
      placed by the bytes that end it — a chunk line at its LF, the data by its length, the
      CRLF after it at its LF, the trailers at their blank line. This is the hand-built part
      kept: llhttp has no other way to give the position (httptools reports none but an
      upgrade's), and without it a pipelined request after the body could not be found."""

    _LINE, _HEADED, _DATA, _TRAILERS = range(4)

    def __init__(self, max_trailer_bytes: int) -> None:
        self.done = False
        self._max_trailer_bytes = max_trailer_bytes
        self._state = self._LINE
        self._open = 0
        """Bytes of the chunk line, or of the trailers, in earlier reads."""
        self._carry = b"\r\n"
        """The trailers' last three bytes so far (a blank line may begin in them; before the first
        trailer byte, the last chunk line's CRLF)."""
        self._chunks = 0
        self._data_bytes = 0
        self._pieces: list[bytes] = []
        self._events: list[int] = []
        self._refusal: FramingError | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._parser.feed_data(_CHUNKED_HEAD)

    # llhttp's callbacks

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > FREE_CHUNKS + self._data_bytes // MIN_CHUNK_BYTES:
            self._refusal = BadRequest(f"chunks too small: more than {FREE_CHUNKS} and one per {MIN_CHUNK_BYTES} bytes")
            raise self._refusal
        self._events.append(_HEADER)

    def on_body(self, piece: bytes) -> None:
        self._data_bytes += len(piece)
        self._pieces.append(piece)
        self._events.append(len(piece))

    def on_chunk_complete(self) -> None:
        self._events.append(_COMPLETE)

    def on_message_complete(self) -> None:
        self.done = True
        raise _End

    # reads

    def feed(self, data: bytes | bytearray) -> tuple[list[bytes], int]:
        """The body bytes decoded from the start of ``data`` and how many bytes of it were the
        body's (all of them, unless the body ended inside ``data``). BadRequest for malformed
        framing, TrailersTooLarge past the trailer cap."""
        pieces: list[bytes] = []
        self._pieces = pieces
        used, size = 0, len(data)
        with memoryview(data) as view:
            while used < size and not self.done:
                stop = size
                if self._state in (self._HEADED, self._TRAILERS):  # trailers may be next: no byte past the cap
                    allowed = self._max_trailer_bytes - self._open
                    if allowed <= 0:
                        raise TrailersTooLarge(f"trailers over {self._max_trailer_bytes} bytes")
                    stop = min(size, used + allowed)
                used = self._read(data, view, used, stop)
        return pieces, used

    def _read(self, data: bytes | bytearray, view: memoryview, start: int, stop: int) -> int:
        """Feed ``data[start:stop]`` to llhttp and place its events: where this read of the body
        ended (``stop`` unless the body ended before)."""
        self._events = []
        error: FramingError | None = None
        try:
            self._parser.feed_data(view[start:stop])
        except httptools.HttpParserError as exc:
            if self._refusal is not None:
                raise self._refusal from None
            if not self.done:
                error = BadRequest(f"invalid chunked body: {exc}")
        at = start
        for event in self._events:
            if event > 0:  # data
                at += event
                self._state = self._DATA
            elif event == _HEADER:  # the chunk line ends at its LF (it holds none before)
                end = data.find(b"\n", at) + 1
                self._check_line(self._open + end - at)
                at, self._open, self._carry = end, 0, b"\r\n"
                self._state = self._HEADED
            elif self._state == self._DATA:  # the CRLF after a chunk's data
                at = data.find(b"\n", at) + 1
                self._state, self._open = self._LINE, 0
            else:  # after the last chunk (no data): the trailers end at their blank line
                seen = self._carry + bytes(data[at:stop])
                end = at + seen.find(b"\r\n\r\n") + 4 - len(self._carry)
                self._check_trailers(data, at, self._open + end - at, error)
                return end
        if error is not None:
            if self._state in (self._HEADED, self._TRAILERS) and at < stop:
                self._check_trailers(data, at, self._open + stop - at, error)
            raise error
        if self._state == self._LINE:
            self._open += stop - at
            self._check_line(self._open)
        elif self._state != self._DATA and at < stop:  # after a chunk line, bytes but no data: trailers
            self._state = self._TRAILERS
            self._check_trailers(data, at, self._open + stop - at, None)
            self._open += stop - at
            self._carry = (self._carry + bytes(data[max(at, stop - 3) : stop]))[-3:]
        return stop

    @staticmethod
    def _check_line(length: int) -> None:
        if length > MAX_CHUNK_LINE_BYTES:
            raise BadRequest("chunk line too long")

    def _check_trailers(self, data: bytes | bytearray, at: int, length: int, error: FramingError | None) -> None:
        """TrailersTooLarge if the trailers so far (``length``, from ``at`` in this read) are over
        the cap — unless llhttp refused them within the cap: trailers that began in this read
        (``_open`` is 0) are read again by a fresh parser, up to the cap, to say which came first."""
        if length <= self._max_trailer_bytes:
            return
        if error is not None and not self._open:
            probe = httptools.HttpRequestParser(_Ignore())
            try:
                probe.feed_data(_CHUNKED_HEAD + b"0\r\n" + bytes(data[at : at + self._max_trailer_bytes]))
            except httptools.HttpParserError:
                raise error from None
        raise TrailersTooLarge(f"trailers over {self._max_trailer_bytes} bytes")


_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode()) for status in http.HTTPStatus
}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def answer(status: int, message: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """A whole plain-text answer that closes the connection."""
    body = message.encode("ascii")
    headers = b"".join(name + b": " + value + b"\r\n" for name, value in extra)
    return (
        status_line(status)
        + headers
        + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        + body
    )
