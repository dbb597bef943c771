"""HTTP/1.1 framing for the receiver's server (``controller/endpoint/server.py``): where a request's head,
body and trailers end, each counted against its limit. No I/O, no clock: bytes in, decisions out.

- ``head_end``: the end of the head (request line and headers, through the blank line), or
  ``HeadTooLarge`` as soon as the bytes received prove it longer than the cap. The cap counts
  every byte of the head, so the verdict is the same however TCP splits it.
- ``parse_head``: the head, through httptools (llhttp, strict: one Content-Length, no
  Content-Length beside Transfer-Encoding, ``chunked`` last): method, target, version,
  headers, keep-alive, and how the body is framed.
- ``FixedBody`` / ``ChunkedBody``: the body by Content-Length or by chunks; the chunk lines are
  bounded, the chunks are paid for with data (``FREE_CHUNKS``, ``MIN_CHUNK_BYTES``), and the
  trailers are counted against the head's cap, then dropped (no app here reads trailers).
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
``MIN_CHUNK_BYTES`` of data decoded before it; past that, 400. Each chunk costs a turn of a
Python loop (about 2 µs), so a body of tiny chunks (4096 one-byte chunks cost 8.6 ms) is
refused after 64, and a chunked body costs the server about as much CPU per byte as one
framed by Content-Length (at most a turn per KiB)."""


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


class ChunkedBody:
    """A chunked body: chunk lines at most ``MAX_CHUNK_LINE_BYTES``, trailers at most
    ``max_trailer_bytes`` together (then dropped); strict CRLF line ends."""

    _SIZE, _DATA, _DATA_END, _TRAILERS = range(4)

    def __init__(self, max_trailer_bytes: int) -> None:
        self.done = False
        self._state = self._SIZE
        self._remaining = 0
        self._line = bytearray()
        self._max_trailer_bytes = max_trailer_bytes
        self._trailer_bytes = 0
        self._chunks = 0
        self._data_bytes = 0

    def feed(self, data: bytes | bytearray) -> tuple[list[bytes], int]:
        """The body bytes decoded from the start of ``data`` and how many bytes of it were the
        body's (all of them, unless the body ended inside ``data``). BadRequest for malformed
        framing, TrailersTooLarge past the trailer cap."""
        pieces: list[bytes] = []
        at, size = 0, len(data)
        while at < size and not self.done:
            if self._state == self._DATA:
                taken = min(self._remaining, size - at)
                pieces.append(bytes(data[at : at + taken]))
                at += taken
                self._remaining -= taken
                self._data_bytes += taken
                if not self._remaining:
                    self._state = self._DATA_END
                continue
            newline = data.find(b"\n", at)
            piece_end = size if newline < 0 else newline + 1
            self._line += data[at:piece_end]
            if self._state == self._TRAILERS:
                self._trailer_bytes += piece_end - at
                if self._trailer_bytes > self._max_trailer_bytes:
                    raise TrailersTooLarge(f"trailers over {self._max_trailer_bytes} bytes")
            elif len(self._line) > MAX_CHUNK_LINE_BYTES:
                raise BadRequest("chunk line too long")
            at = piece_end
            if newline < 0:
                break
            line, self._line = bytes(self._line), bytearray()
            if not line.endswith(b"\r\n"):
                raise BadRequest("chunk line not ended by CRLF")
            self._line_ended(line[:-2])
        return pieces, at

    def _line_ended(self, line: bytes) -> None:
        if self._state == self._DATA_END:
            if line:
                raise BadRequest("chunk data longer than its size")
            self._state = self._SIZE
        elif self._state == self._SIZE:
            digits = line.split(b";", 1)[0].rstrip(b" \t")
            if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
                raise BadRequest("invalid chunk size")
            self._remaining = int(digits, 16)
            self._state = self._DATA if self._remaining else self._TRAILERS
            self._chunks += 1
            if self._chunks > FREE_CHUNKS + self._data_bytes // MIN_CHUNK_BYTES:
                raise BadRequest(f"chunks too small: more than {FREE_CHUNKS} and one per {MIN_CHUNK_BYTES} bytes")
        elif not line:  # _TRAILERS: the blank line ends the body
            self.done = True


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
