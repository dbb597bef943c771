"""The receiver's HTTP framing (``controller/endpoint/framing.py``) and server connection
(``controller/endpoint/server.py``) without sockets; on the wire: tests/contract/test_receiver_server.py,
under floods: tests/system/test_receiver_limits.py."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from controller.config import ReceiverSettings
from controller.endpoint import framing, server

CAP = 4096


def test_limits_take_the_settings_and_keep_the_apps_body_deadline_first() -> None:
    """L3: the server's limits are the receiver's settings; its body deadline is a second after the
    app's own, so ``/webhooks`` answers 408 itself."""
    limits = server.Limits.from_settings(
        ReceiverSettings(max_connections=7, max_header_bytes=4096, header_timeout_seconds=1.5), 10.0
    )
    assert (limits.max_connections, limits.max_header_bytes, limits.header_timeout_seconds) == (7, 4096, 1.5)
    assert limits.body_timeout_seconds == 11.0


def head_length_in_pieces(data: bytes, cuts: list[int]) -> int | str:
    """``head_end`` fed ``data`` as the server is, piece by piece: the head's length or ``431``."""
    buffer, searched, at = bytearray(), 0, 0
    for cut in [*sorted(cuts), len(data)]:
        buffer += data[at:cut]
        at = cut
        try:
            end = framing.head_end(buffer, searched, CAP)
        except framing.HeadTooLarge:
            return "431"
        if end >= 0:
            return end
        searched = len(buffer)
    return -1


@pytest.mark.parametrize("size", [CAP - 1, CAP, CAP + 1, CAP + 3, 2 * CAP])
def test_the_head_cap_is_the_same_for_every_segmentation(size: int) -> None:
    """L3: whatever the pieces a head arrives in, it is framed at its blank line when it is at
    most the cap, and refused (431) when it is over, to the byte."""
    data = b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * (size - 27) + b"\r\n\r\n" + b"GET / HTTP/1.1\r\n"
    assert data.index(b"\r\n\r\n") + 4 == size
    expected: int | str = size if size <= CAP else "431"
    rng = random.Random(size)
    for _ in range(300):
        cuts = rng.sample(range(1, len(data)), rng.randint(0, 12))
        assert head_length_in_pieces(data, cuts) == expected, cuts
    for cut in range(size - 5, size + 1):  # every split near the blank line
        assert head_length_in_pieces(data, [cut]) == expected, cut


def decode_chunked(data: bytes, cuts: list[int], max_trailer_bytes: int = 64) -> tuple[bytes, int]:
    body = framing.ChunkedBody(max_trailer_bytes)
    decoded, at, used_total = b"", 0, 0
    for cut in [*sorted(cuts), len(data)]:
        piece = data[at:cut]
        at = cut
        pieces, used = body.feed(piece)
        decoded += b"".join(pieces)
        used_total += used
        if body.done:
            break
    assert body.done
    return decoded, used_total


def test_a_chunked_body_decodes_the_same_in_any_pieces_and_stops_at_its_end() -> None:
    """L3: chunks (with an extension) and trailers are decoded whatever the segmentation; the
    bytes after the body (a pipelined request) are not the body's."""
    wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n"
    after = b"GET / HTTP/1.1\r\n"
    rng = random.Random(7)
    for _ in range(300):
        cuts = rng.sample(range(1, len(wire + after)), rng.randint(0, 10))
        assert decode_chunked(wire + after, cuts) == (b"hello world", len(wire))


@pytest.mark.parametrize(
    "wire",
    [
        b"zz\r\nhello\r\n0\r\n\r\n",  # not hex
        b"5\nhello\r\n0\r\n\r\n",  # bare LF
        b"5\r\nhelloX\r\n0\r\n\r\n",  # longer than its size
        b"\r\n",  # no size
        b"1" * 17 + b"\r\n",  # a size no body has
        b"1;" + b"e" * framing.MAX_CHUNK_LINE_BYTES + b"\r\n",  # an endless extension
    ],
)
def test_malformed_chunks_are_bad_requests(wire: bytes) -> None:
    """L3: chunk framing that could be read two ways is refused (400)."""
    with pytest.raises(framing.BadRequest):
        framing.ChunkedBody(64).feed(wire)


def test_trailers_over_their_cap_are_refused_in_any_pieces() -> None:
    """L3: trailers count against their cap as they arrive, one endless line or many short ones."""
    for trailers in (b"X-A: " + b"a" * 100, b"X-A: 1\r\n" * 20):
        wire = b"0\r\n" + trailers
        body = framing.ChunkedBody(64)
        with pytest.raises(framing.TrailersTooLarge):
            for at in range(0, len(wire), 7):
                body.feed(wire[at : at + 7])


class RecordingTransport:
    """What the connection writes, one entry per ``write`` call."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def write_eof(self) -> None:
        self.eof = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def feed(connection: server.Connection, data: bytes) -> None:
    view = connection.get_buffer(len(data))
    view[: len(data)] = data
    connection.buffer_updated(len(data))


async def answers_written(requests: bytes) -> tuple[list[bytes], list[str]]:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    refused: list[str] = []
    running = server.Server(app, server.Limits(), refused.append)
    connection = running.protocol()
    transport = RecordingTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    feed(connection, requests)
    for _ in range(20):  # the answers' tasks run on the next turns of the loop
        await asyncio.sleep(0)
    connection.connection_lost(None)
    return transport.writes, refused


def test_an_answer_leaves_in_one_write() -> None:
    """L3: the answer's head is written with its body: one write (one system call, one TCP
    segment) per answer, pipelined requests answered in order."""
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    writes, refused = asyncio.run(answers_written(request * 2))
    assert len(writes) == 2 and refused == []
    for written in writes:
        assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b"\r\n\r\nok")


def test_a_malformed_head_is_answered_400_and_counted() -> None:
    """L3: a head llhttp refuses gets 400 and the connection half-closes; the refusal is counted."""
    writes, refused = asyncio.run(answers_written(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"))
    assert writes[0].startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert refused == ["bad_request"]


def test_every_refusal_reason_is_declared_and_documented() -> None:
    """The reasons the server counts are exactly ``REFUSAL_REASONS``, and README's metrics table
    names each one (a new reason cannot be counted unseen)."""
    import inspect
    import re
    from pathlib import Path

    source = inspect.getsource(server)
    counted = set(re.findall(r'refused\("(\w+)"\)', source)) | set(re.findall(r'refuse\(\d+, "(\w+)"', source))
    counted |= {kind.reason for kind in (framing.BadRequest, framing.HeadTooLarge, framing.TrailersTooLarge)}
    assert counted == set(server.REFUSAL_REASONS)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.lstrip().startswith("| `controller_receiver_refused_total")]
    assert {reason for reason in server.REFUSAL_REASONS if f"`{reason}`" not in row} == set()


def test_a_body_of_tiny_chunks_is_refused_once_its_chunks_are_not_paid_for() -> None:
    """L3: each chunk costs a turn of the decoder's loop, so chunks are paid for with data: a
    body of one-byte chunks is refused at chunk ``FREE_CHUNKS + 1`` (not after 4096: 8.6 ms of
    CPU for 24 KB), and one of 1 KiB chunks is decoded whole, whatever its length."""
    body = framing.ChunkedBody(64)
    pieces, _ = body.feed(b"1\r\na\r\n" * framing.FREE_CHUNKS)
    assert b"".join(pieces) == b"a" * framing.FREE_CHUNKS
    with pytest.raises(framing.BadRequest, match="chunks too small"):
        body.feed(b"1\r\na\r\n")
    body = framing.ChunkedBody(64)
    chunk = b"400\r\n" + b"k" * 1024 + b"\r\n"
    pieces, _ = body.feed(chunk * 1000 + b"0\r\n\r\n")
    assert body.done and len(b"".join(pieces)) == 1024 * 1000


def test_the_idle_are_shed_before_a_body_being_received() -> None:
    """L5: the shedding order: lingering first, then idle, head-waiting and trickled bodies by
    how long they waited, and a body arriving at a reasonable rate (or within its grace) last."""
    now = 100.0
    order = {
        "lingering, newest": server.shed_order(server.Phase.LINGER, 99.9, 0, now),
        "idle": server.shed_order(server.Phase.IDLE, 99.0, 0, now),
        "head": server.shed_order(server.Phase.HEAD, 99.5, 0, now),
        "body trickled for 5 s": server.shed_order(server.Phase.BODY, 95.0, 100, now),
        "body just begun, nothing yet": server.shed_order(server.Phase.BODY, 90.0 + 9.7, 0, now),
        "body at 64 KiB/s for 5 s": server.shed_order(server.Phase.BODY, 95.0, 5 * 64 * 1024, now),
    }
    assert sorted(order, key=order.__getitem__) == [
        "lingering, newest",
        "body trickled for 5 s",
        "idle",
        "head",
        "body at 64 KiB/s for 5 s",
        "body just begun, nothing yet",
    ]
