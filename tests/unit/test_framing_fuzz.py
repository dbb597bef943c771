"""Hypothesis against the endpoint's framing (controller/endpoint/framing.py), with llhttp itself as
the oracle: random and hostile chunked bodies and request heads, fed in many segmentations,
decode to what a plain httptools parse of the same bytes decodes, or are refused where it
refuses or where one of the framing's own limits is passed (chunk lines, chunks paid for with
data, the trailers' cap) — with the same status however the bytes arrive."""

from __future__ import annotations

import itertools
import random
from typing import Any

import httptools
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from controller.endpoint import framing

pytestmark = pytest.mark.timeout(300)

HEAD = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
NEXT = b"GET /next HTTP/1.1\r\n\r\n"
"""A pipelined request after the body: not the body's."""
LINE = framing.MAX_CHUNK_LINE_BYTES
Outcome = tuple[Any, ...]
"""``("body", decoded, bytes of the wire that were the body's)``, ``("incomplete", decoded)``, or
``(status,)`` for a refusal."""


class Recorder:
    """httptools callbacks: what one parse of a chunked body saw."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.whole: bytes | None = None
        self.header = self.data = self.complete = False

    def on_body(self, piece: bytes) -> None:
        if self.whole is None:
            self.body += piece
            self.data = True

    def on_chunk_header(self) -> None:
        self.header = True

    def on_chunk_complete(self) -> None:
        self.complete = True

    def on_message_complete(self) -> None:
        if self.whole is None:
            self.whole = bytes(self.body)


def plain(wire: bytes) -> Outcome:
    """One plain httptools parse of the whole request, no limits: the body, or a refusal (a
    refusal after the body is whole is the next request's)."""
    seen = Recorder()
    parser = httptools.HttpRequestParser(seen)
    try:
        parser.feed_data(HEAD + wire)
    except httptools.HttpParserError:
        if seen.whole is None:
            return (400,)
    return ("body", seen.whole) if seen.whole is not None else ("incomplete", bytes(seen.body))


def by_llhttp(wire: bytes, cap: int, limits: bool = True) -> Outcome:
    """The plainest reading there is: httptools fed one byte at a time, so each of its events is
    placed at its byte, and the framing's limits counted byte by byte as the bytes come (a
    trailer byte past the cap is refused before it is parsed)."""
    seen = Recorder()
    parser = httptools.HttpRequestParser(seen)
    parser.feed_data(HEAD)
    state, line, trailers, chunks = "line", 0, 0, 0
    for at in range(len(wire)):
        if state == "trailers":
            trailers += 1
            if limits and trailers > cap:
                return (431,)
        elif state == "line":
            line += 1
        seen.header = seen.data = seen.complete = False
        decoded_before = len(seen.body)
        try:
            parser.feed_data(wire[at : at + 1])
        except httptools.HttpParserError:
            return (400,)
        if limits and state == "line" and line > LINE:
            return (400,)
        if seen.header:
            chunks += 1
            if limits and chunks > framing.FREE_CHUNKS + decoded_before // framing.MIN_CHUNK_BYTES:
                return (400,)
            state, line = "headed", 0
        elif seen.data:
            state = "data"
        elif seen.complete and state == "data":
            state = "line"
        elif state == "headed":  # a byte after a chunk line that is no data: the trailers began
            state, trailers = "trailers", 1
        if seen.whole is not None:
            return ("body", seen.whole, at + 1)
    return ("incomplete", bytes(seen.body))


def by_framing(wire: bytes, cap: int, cuts: list[int], as_buffer: bool) -> Outcome:
    """``framing.ChunkedBody`` fed ``wire`` in the pieces ``cuts`` make, as the server feeds it
    (its buffer is a bytearray)."""
    body = framing.ChunkedBody(cap)
    decoded, used_in_all, at = bytearray(), 0, 0
    try:
        for cut in [*sorted(set(cuts)), len(wire)]:
            if cut <= at:
                continue
            piece = wire[at:cut]
            pieces, used = body.feed(bytearray(piece) if as_buffer else piece)
            decoded += b"".join(pieces)
            used_in_all += used
            at = cut
            if body.done:
                return ("body", bytes(decoded), used_in_all)
            assert used == len(piece), "a body not yet whole takes every byte it is given"
    except framing.FramingError as exc:
        return (exc.status,)
    return ("incomplete", bytes(decoded))


def segmentations(wire: bytes, rng: random.Random) -> list[list[int]]:
    """Whole, byte by byte, and ten random ways TCP could split ``wire``."""
    inner = range(1, len(wire)) if len(wire) > 1 else range(0)
    found = [[], list(inner)]
    for _ in range(10):
        found.append(rng.sample(inner, min(len(inner), rng.randint(1, 12))) if inner else [])
    return found


# Bodies: well formed, malformed at every joint, and mutated at random.

HOSTILE = b'0123456789abcdefABCDEFgx;=" \t\r\n:-\\\x00\x01\x7f\x80\xff'
"""Bytes that matter to chunked framing, and some that must never pass."""
WELL_FORMED = {
    "extension": [b"", b"", b"", b";a", b";a=b", b';a="q v"', b';a="q\\"v"', b";a=b;c=d", b";" + b"e" * (LINE - 10)],
    "line end": [b"\r\n"],
    "size": ["%x", "%X", "%04x"],
    "trailer": [b"X-T: 1", b"x-checksum: abc", b"X-Long: " + b"v" * 40, b"X-Empty:", b"X-Fold: a"],
}
MALFORMED = {
    "extension": [b" ;a", b";a= b", b"; a", b";a=", b";=b", b';a="\x01"', b';a="open', b";a\x00", b";" + b"e" * LINE],
    "line end": [b"\n", b"\r", b"\r\r\n", b" \r\n"],
    "size": ["%017x", "%020x", "+%x", "-%x", " %x", "0x%x"],
    "trailer": [b"bad line", b":", b" folded", b"X T: 1", b"X-T : 1", b"X-T: \x00", b"X-T: \x7f", b"X-T: 1\r"],
}


def part(draw: st.DrawFn, kind: str, hostile: bool) -> Any:
    """One of the well-formed forms of ``kind``; in a hostile body, now and then a malformed one."""
    if hostile and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(MALFORMED[kind]))
    return draw(st.sampled_from(WELL_FORMED[kind]))


@st.composite
def chunk(draw: st.DrawFn, hostile: bool) -> bytes:
    size = draw(st.integers(1, 48) | st.sampled_from([1024, 1500]))
    data = draw(st.binary(min_size=size, max_size=size)) if size < 64 else random.Random(size).randbytes(size)
    if hostile and draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, size))] + draw(st.binary(max_size=3))  # not its size
    line = (part(draw, "size", hostile) % size).encode() + part(draw, "extension", hostile)
    return line + part(draw, "line end", hostile) + data + part(draw, "line end", hostile)


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    """A chunked body (chunks, the last chunk, trailers), then what may follow it: well formed,
    or hostile (malformed joints now and then, and random edits anywhere)."""
    hostile = draw(st.integers(0, 2)) == 0
    if draw(st.integers(0, 5)) == 0:  # tiny chunks: the budget
        count = draw(st.integers(50, 80))
        big = b"%x\r\n%s\r\n" % (1100, b"b" * 1100) if draw(st.booleans()) else b""
        chunks = [big, *(b"1\r\nx\r\n" for _ in range(count))]
    else:
        chunks = draw(st.lists(chunk(hostile), max_size=6))
    last = b"0" + part(draw, "extension", hostile) + part(draw, "line end", hostile)
    trailers = b"".join(
        part(draw, "trailer", hostile) + part(draw, "line end", hostile) for _ in range(draw(st.integers(0, 4)))
    )
    wire = b"".join(chunks) + last + trailers + part(draw, "line end", hostile)
    wire += draw(st.sampled_from([b"", NEXT, NEXT + NEXT, b"\r\n" + NEXT, b"garbage\r\n\r\n"]))
    for _ in range(draw(st.sampled_from([0, 1, 2, 5])) if hostile else 0):  # random edits anywhere
        at = draw(st.integers(0, len(wire)))
        byte = bytes([draw(st.sampled_from(HOSTILE))])
        wire = wire[:at] + draw(st.sampled_from([byte, b"", byte + wire[at : at + 1]])) + wire[at + 1 :]
    return wire


random_wires = st.lists(st.sampled_from(HOSTILE), max_size=120).map(bytes)
caps = st.sampled_from([2, 16, 64, 4096, 4096])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    wire=st.one_of(chunked_bodies(), chunked_bodies(), chunked_bodies(), random_wires),
    cap=caps,
    rng=st.randoms(use_true_random=False),
)
def test_a_chunked_body_decodes_as_llhttp_reads_it_in_any_pieces(wire: bytes, cap: int, rng: random.Random) -> None:
    """L3: the framing decodes a chunked body to the bytes llhttp decodes, ends it where llhttp
    ends it (a pipelined request after it is not the body's), and refuses what llhttp refuses or
    what passes a limit of its own first — with the same status whatever the segmentation."""
    assert by_llhttp(wire, cap, limits=False)[:2] == plain(wire), "the byte-by-byte reading is llhttp's"
    expected = by_llhttp(wire, cap)
    event(str(expected[0]))
    for number, cuts in enumerate(segmentations(wire, rng)):
        assert by_framing(wire, cap, cuts, as_buffer=number % 2 == 1) == expected, cuts


TRICKY = [
    b"0\r\n\r\n" + NEXT,
    b"0\r\nX-T: 1\r\nY: 2\r\n\r\n" + NEXT,
    b"5;a=b\r\nhello\r\n0;z\r\nX-T: 1\r\n\r\n" + NEXT,
    b"4\r\n\r\n\r\n\r\n0\r\n\r\n" + NEXT,  # data that looks like the end
    b"1\r\n\n\r\n0\r\nX-T: \r\n\r\n\r\n" + NEXT,
    b"0\r\nX-T: 1\r\nbad\r\n\r\n",
]


@pytest.mark.parametrize("wire", TRICKY)
@pytest.mark.parametrize("cap", [4, 12, 64])
def test_every_split_of_a_tricky_body_in_two_or_three_reads(wire: bytes, cap: int) -> None:
    """L3: a body whose end (the trailers' blank line, data that looks like one) falls anywhere
    in a read decodes and ends as llhttp reads it, split at every place and every pair of places."""
    expected = by_llhttp(wire, cap)
    for count in (1, 2):
        for cuts in itertools.combinations(range(1, len(wire)), count):
            assert by_framing(wire, cap, list(cuts), as_buffer=False) == expected, cuts


# Heads: what parse_head makes of a head, against what llhttp makes of it.

WELL_FORMED_HEADS = {
    "method": [b"GET", b"POST", b"POST", b"HEAD", b"PUT", b"OPTIONS", b"DELETE"],
    "target": [b"/", b"/webhooks", b"/webhooks", b"/webhooks?x=1&y", b"/a%20b", b"/%7e", b"http://h/x?q", b"//"],
    "version": [b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"],
    "line end": [b"\r\n"],
    "field": [
        b"Host: h",
        b"Content-Length: 5",
        b"Content-Length: 0",
        b"Transfer-Encoding: chunked",
        b"X-A: 1",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Connection: upgrade",
        b"Upgrade: websocket",
        b"Expect: 100-continue",
        b"Webhook-Id: msg_1",
        b"Content-Length: 05",
        b"Transfer-Encoding: Chunked",
    ],
}
MALFORMED_HEADS = {
    "method": [b"CONNECT", b"PRI", b"G T", b"get", b""],
    "target": [b"*", b"/\xc3\xa9", b"/a b", b""],
    "version": [b"HTTP/2.0", b"HTTP/1.1x", b"http/1.1", b"HTTP/1"],
    "line end": MALFORMED["line end"],
    "field": [
        b"Content-Length: 5, 5",
        b"Content-Length: -1",
        b"Content-Length: 99999999999999999999999",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: chunked, gzip",
        b"Transfer-Encoding: identity",
        b"X-A : 1",
        b" folded",
        b"X-B:\x00",
        b"no colon",
        b"X-C: \xff",
    ],
}


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """A request head: well formed, or hostile (malformed parts now and then, a byte changed)."""
    hostile = draw(st.integers(0, 2)) == 0

    def part(kind: str) -> bytes:
        forms = MALFORMED_HEADS if hostile and draw(st.integers(0, 4)) == 0 else WELL_FORMED_HEADS
        return draw(st.sampled_from(forms[kind]))

    request_line = part("method") + b" " + part("target") + b" " + part("version") + part("line end")
    fields = b"".join(part("field") + part("line end") for _ in range(draw(st.integers(0, 5))))
    head = request_line + fields + b"\r\n"
    if hostile and draw(st.booleans()):
        at = draw(st.integers(0, len(head) - 4))
        head = head[:at] + bytes([draw(st.sampled_from(HOSTILE))]) + head[at + 1 :]
    return head


class HeadRecorder:
    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parser: httptools.HttpRequestParser | None = None
        self.seen: tuple[Any, ...] | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        parser = self.parser
        self.seen = (parser.get_method().decode(), parser.get_http_version(), parser.should_keep_alive())


def target_refused(url: bytes) -> bool:
    """The framing's own rule for targets: a URL llhttp's parser reads, with an ASCII path."""
    try:
        path = httptools.parse_url(url).path or b"/"
    except httptools.HttpParserInvalidURLError:
        return True
    return not path.isascii()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=heads(), rng=st.randoms(use_true_random=False))
@example(head=b"PRI / HTTP/1.1\r\n\r\n", rng=random.Random(0))  # llhttp waits for the rest of a preface
@example(head=b"PRI * HTTP/2.0\r\n\r\n", rng=random.Random(0))
def test_a_head_reads_as_llhttp_reads_it(head: bytes, rng: random.Random) -> None:
    """L3: a head the framing accepts is one llhttp accepts, with llhttp's method, version,
    headers and keep-alive, and a body framed as its headers say; it refuses what llhttp refuses,
    and of what llhttp accepts only what it documents (a Transfer-Encoding other than chunked, a
    target that is not ASCII); where the head ends does not depend on the segmentation."""
    end = framing.head_end(head, 0, 4096)
    for cuts in segmentations(head, rng):
        buffer, searched, found = bytearray(), 0, -1
        for piece in [head[a:b] for a, b in zip([0, *sorted(set(cuts))], [*sorted(set(cuts)), len(head)], strict=True)]:
            buffer += piece
            found = framing.head_end(buffer, searched, 4096)
            if found >= 0:
                break
            searched = len(buffer)
        assert found == end, cuts
    if end < 0:
        event("no blank line: never parsed")
        return
    head = head[:end]
    seen = HeadRecorder()
    parser = seen.parser = httptools.HttpRequestParser(seen)
    try:
        parser.feed_data(head)
        refused_by_llhttp = seen.seen is None
    except httptools.HttpParserUpgrade:
        refused_by_llhttp = False
    except httptools.HttpParserError:
        refused_by_llhttp = True
    try:
        parsed = framing.parse_head(head, 4096)
    except framing.BadRequest:
        event("refused")
        encodings = b",".join(value for name, value in seen.headers if name == b"transfer-encoding")
        assert refused_by_llhttp or (encodings and encodings.strip().lower() != b"chunked") or target_refused(seen.url)
        return
    event("accepted")
    assert not refused_by_llhttp and seen.seen is not None
    assert (parsed.method, parsed.http_version, parsed.keep_alive) == seen.seen
    assert parsed.headers == seen.headers
    lengths = [int(value) for name, value in seen.headers if name == b"content-length"]
    if any(name == b"transfer-encoding" for name, _ in seen.headers):
        assert isinstance(parsed.body, framing.ChunkedBody)
    elif lengths and lengths[0]:
        assert isinstance(parsed.body, framing.FixedBody) and parsed.body.remaining == lengths[0]
    else:
        assert parsed.body is None
