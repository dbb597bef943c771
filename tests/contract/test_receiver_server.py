"""The receiver's HTTP server on the wire (``controller/endpoint/server.py``): every byte counted, every
phase on a clock, capacity never held by clients that do not finish, every refusal counted.
Served on 127.0.0.1 from a thread of this process (``tests/support/http_server.py``, uvloop as
``serve`` runs it). The same attacks on a real receiver process, with its memory watched, are in
tests/system/test_receiver_limits.py.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator, Sequence

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from controller.endpoint import server
from tests.support.http_server import ServerThread
from tests.support.processes import port_open, wait_for

CAP = 4096
DEADLINE = 1.0
BODY_DEADLINE = 2.0
LIMITS = server.Limits(
    max_connections=20,
    max_header_bytes=CAP,
    header_timeout_seconds=DEADLINE,
    body_timeout_seconds=BODY_DEADLINE,
    shutdown_timeout_seconds=2.0,
)


async def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"body {len(await request.body())}")


async def healthz(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")  # reads no body


class Gate:
    """``/hold`` answers once the test opens the gate (requests being answered, holding capacity)."""

    def __init__(self) -> None:
        self.opened = False
        self.waiting = 0
        self.big = 0
        self.medium = 0

    async def hold(self, request: Request) -> PlainTextResponse:
        self.waiting += 1
        while not self.opened:
            await asyncio.sleep(0.01)
        return PlainTextResponse("held")


BIG = b"b" * 2**20
MEDIUM = b"m" * 10_000  # about the size of the receiver's /metrics


def make_app(gate: Gate | None = None) -> Starlette:
    gate = gate or Gate()

    async def big(request: Request) -> Response:
        gate.big += 1
        return Response(BIG)

    async def medium(request: Request) -> Response:
        gate.medium += 1
        return Response(MEDIUM)

    return Starlette(
        routes=[
            Route("/", echo, methods=["GET", "POST"]),
            Route("/healthz", healthz, methods=["GET", "POST"]),
            Route("/hold", gate.hold, methods=["GET"]),
            Route("/big", big, methods=["GET"]),
            Route("/medium", medium, methods=["GET"]),
        ]
    )


@pytest.fixture(scope="module")
def running() -> Iterator[ServerThread]:
    with ServerThread(make_app(), LIMITS) as started:
        yield started


@pytest.fixture
def port(running: ServerThread) -> int:
    return running.port


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


def read_until_closed(client: socket.socket, within: float) -> tuple[bytes, str]:
    received, ended = b"", "open"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            data = client.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            ended = "reset"
            break
        if not data:
            ended = "closed"
            break
        received += data
    return received, ended


def statuses_in(received: bytes) -> list[str]:
    return [line.decode() for line in re.findall(rb"HTTP/1\.1 \d{3}[^\r]*", received)]


def exchange(port: int, pieces: Sequence[bytes], pause: float = 0.0, within: float = 10.0) -> tuple[list[str], str]:
    """Send ``pieces`` (``pause`` seconds apart, stopping if the server closed), then read until
    the server closes: the status lines received, and how the connection ended (``closed``,
    ``reset`` or ``open`` when the server kept it past ``within`` seconds)."""
    with connect(port, within) as client:
        for piece in pieces:
            try:
                client.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(pause)
        received, ended = read_until_closed(client, within)
    return statuses_in(received), ended


def head(*lines: str, method: str = "GET", target: str = "/") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + "".join(f"{x}\r\n" for x in lines).encode()


def head_of_exactly(size: int, pad_with: str = "a") -> bytes:
    """A whole head (``Connection: close``, blank line included) of exactly ``size`` bytes."""
    bare = head("Connection: close", "X-Pad: ") + b"\r\n"
    padded = head("Connection: close", "X-Pad: " + pad_with * (size - len(bare))) + b"\r\n"
    assert len(padded) == size
    return padded


# -- the head ---------------------------------------------------------------------------------------


def test_a_head_over_the_cap_in_one_read_gets_431_and_the_connection_closes(port: int) -> None:
    """L3: headers above the cap that arrive whole in one read are refused with 431."""
    statuses, ended = exchange(port, [head(f"X-Big: {'a' * CAP}", "Connection: close") + b"\r\n"])
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]
    assert ended in {"closed", "reset"}


def test_many_small_headers_over_the_cap_are_refused_too(port: int) -> None:
    """L3: the cap counts the whole head, not one header."""
    lines = [f"X-H{i}: v" for i in range(CAP // 8)]
    statuses, _ = exchange(port, [head(*lines) + b"\r\n"])
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]


def test_a_url_over_the_cap_is_refused(port: int) -> None:
    """L3: the request line counts toward the cap."""
    statuses, _ = exchange(port, [head(target="/" + "u" * CAP) + b"\r\n"])
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]


def test_a_header_trickled_past_the_cap_is_refused_before_it_ends(port: int) -> None:
    """L3: a header that never ends is refused once the bytes received for the head pass the cap."""
    pieces = [head() + b"X-Endless: "] + [b"a" * 512] * 64  # 32 KiB, never a line end
    statuses, ended = exchange(port, pieces, pause=0.01)
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]
    assert ended in {"closed", "reset"}


SEGMENTATIONS = {
    "one write": lambda size: [size],
    "the first byte alone": lambda size: [1, size - 1],
    "the last byte alone": lambda size: [size - 1, 1],
    "split inside the blank line": lambda size: [size - 3, 3],
    "the blank line's last two bytes alone": lambda size: [size - 2, 2],
    "1000-byte pieces": lambda size: [1000] * (size // 1000) + [size % 1000],
    "at the cap": lambda size: [min(size, CAP - 1), size - min(size, CAP - 1)],
}


def pieces_of(data: bytes, sizes: list[int]) -> list[bytes]:
    pieces, at = [], 0
    for size in sizes:
        if size:
            pieces.append(data[at : at + size])
            at += size
    assert b"".join(pieces) == data
    return pieces


@pytest.mark.parametrize("segmentation", sorted(SEGMENTATIONS))
def test_the_cap_is_exact_to_the_byte_whatever_the_segmentation(port: int, segmentation: str) -> None:
    """L3: a head of exactly the cap is served and one of the cap plus one byte gets 431, however
    TCP splits it (each piece its own segment, 50 ms apart)."""
    for size, expected in ((CAP, "HTTP/1.1 200 OK"), (CAP + 1, "HTTP/1.1 431 Request Header Fields Too Large")):
        data = head_of_exactly(size)
        statuses, _ = exchange(port, pieces_of(data, SEGMENTATIONS[segmentation](size)), pause=0.05)
        assert statuses == [expected], (segmentation, size, statuses)


def test_whitespace_in_header_values_counts_toward_the_cap(port: int) -> None:
    """L3: leading whitespace of a header value is bytes of the head like any other: a head made
    six times the cap by spaces is refused even in one write."""
    statuses, _ = exchange(port, [head_of_exactly(6 * CAP, pad_with=" ")[:-2] + b"\r\n"])
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]
    data = head("Connection: close", "X-Pad:" + " " * (CAP - 100) + "v") + b"\r\n"
    statuses, _ = exchange(port, [data])
    assert statuses == (["HTTP/1.1 200 OK"] if len(data) <= CAP else ["HTTP/1.1 431 Request Header Fields Too Large"])


def test_a_head_under_the_cap_passes_with_a_large_body_in_the_same_read(port: int) -> None:
    """L3: only the head counts: a request of 3 KiB of headers and a 20 KiB body in one write is served."""
    body = b"b" * 20_000
    request = head(f"X-Some: {'h' * 3000}", f"Content-Length: {len(body)}", "Connection: close", method="POST")
    statuses, _ = exchange(port, [request + b"\r\n" + body])
    assert statuses == ["HTTP/1.1 200 OK"]


def test_a_pipelined_request_after_a_body_is_served(port: int) -> None:
    """L3: a read holding the end of one request's body and the start of the next request's head
    does not count the body toward the next head."""
    body = b"b" * 20_000
    first = head(f"Content-Length: {len(body)}", method="POST") + b"\r\n"
    second = head(f"X-Next: {'n' * 2000}", "Connection: close") + b"\r\n"
    pieces = [first + body[:100], body[100:] + second[:1000], second[1000:]]
    statuses, _ = exchange(port, pieces, pause=0.2)
    assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]


def test_headers_not_complete_within_the_deadline_close_the_connection(running: ServerThread) -> None:
    """L3: a client that sends a header line every 0.2 s, never ending its headers, is closed at
    the header deadline (1 s here), without an answer, and the refusal is counted."""
    before = running.refused["header_timeout"]
    started = time.monotonic()
    statuses, ended = exchange(running.port, [head()] + [b"X-Trickle: a\r\n"] * 40, pause=0.2)
    assert statuses == []
    assert ended in {"closed", "reset"}
    assert time.monotonic() - started < 40 * 0.2  # closed before the client was done
    wait_for(lambda: running.refused["header_timeout"] > before, 10, "the header timeout to be counted")


def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(running: ServerThread) -> None:
    """L3: an opened connection that never sends a byte is closed at the header deadline and counted."""
    before = running.refused["header_timeout"]
    with connect(running.port) as client:
        _, ended = read_until_closed(client, DEADLINE + 5)
    assert ended in {"closed", "reset"}
    wait_for(lambda: running.refused["header_timeout"] > before, 10, "the header timeout to be counted")


def test_a_kept_alive_connection_gets_the_deadline_again_after_each_answer(port: int) -> None:
    """L3: two requests on one connection are served; a third that trickles its headers is closed."""
    pieces = [head() + b"\r\n", head() + b"\r\n", head()] + [b"X-Trickle: a\r\n"] * 40
    started = time.monotonic()
    statuses, ended = exchange(port, pieces, pause=0.2)
    assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]
    assert ended in {"closed", "reset"}
    assert time.monotonic() - started < 42 * 0.2


def test_an_upgrade_header_is_ignored(port: int) -> None:
    """L3: no WebSocket or other upgrade leaves the server's limits: the request is plain HTTP."""
    statuses, _ = exchange(port, [head("Connection: Upgrade, close", "Upgrade: websocket") + b"\r\n"])
    assert statuses == ["HTTP/1.1 200 OK"]


@pytest.mark.parametrize(
    "framing",
    [
        ("Content-Length: 5", "Transfer-Encoding: chunked"),
        ("Content-Length: 5", "Content-Length: 6"),
        ("Transfer-Encoding: gzip",),
        ("Transfer-Encoding: chunked, gzip",),
        ("Content-Length: -1",),
    ],
)
def test_ambiguous_body_framing_is_refused(running: ServerThread, framing: tuple[str, ...]) -> None:
    """L3: a head whose body length could be read two ways (request smuggling) gets 400."""
    statuses, ended = exchange(running.port, [head(*framing, method="POST") + b"\r\n" + b"hello"])
    assert statuses == ["HTTP/1.1 400 Bad Request"]
    assert ended in {"closed", "reset"}


# -- body and trailers ----------------------------------------------------------------------------


TOO_LARGE = "HTTP/1.1 431 Request Header Fields Too Large"


def endless_trailers(port: int, target: str, method: str, seconds: float) -> tuple[list[str], str, float]:
    """A chunked request that ends its chunks, then sends 1 KiB trailer lines as fast as it can,
    for at most ``seconds``: what the server answered, how the connection ended, and how long
    the client could go on sending."""
    line = b"X-Trailer: " + b"t" * 1010 + b"\r\n"
    started = time.monotonic()
    with connect(port, 5.0) as client:
        client.sendall(head("Transfer-Encoding: chunked", method=method, target=target) + b"\r\n5\r\nhello\r\n0\r\n")
        sending = 0.0
        while time.monotonic() - started < seconds:
            try:
                client.sendall(line * 64)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            sending = time.monotonic() - started
        received, ended = read_until_closed(client, 5.0)
    return statuses_in(received), ended, sending


@pytest.mark.parametrize(
    ("method", "target", "answer"),
    [
        ("POST", "/", TOO_LARGE),  # reads its body: the trailers are refused
        ("GET", "/", TOO_LARGE),
        ("POST", "/healthz", "HTTP/1.1 200 OK"),  # reads no body: answered, the rest is never read
        ("GET", "/healthz", "HTTP/1.1 200 OK"),
        ("POST", "/missing", "HTTP/1.1 404 Not Found"),
    ],
)
def test_endless_trailers_are_cut_off_on_every_route(
    running: ServerThread, method: str, target: str, answer: str
) -> None:
    """L3: trailers after the last chunk count against the head's cap whatever the route: a client
    sending trailers without end is answered and its connection closed within a few seconds
    (the server reads and drops at most ``LINGER_MAX_BYTES`` after answering); on a route that
    reads its body the trailers over the cap get 431, counted. (On a route that reads none, the
    app's answer or the 431, whichever comes first.)"""
    before = running.refused["trailers_too_large"]
    statuses, ended, sending = endless_trailers(running.port, target, method, seconds=20.0)
    assert statuses in ([answer], [TOO_LARGE])
    assert ended in {"closed", "reset"}
    assert sending < 15.0, f"the client could send trailers for {sending:.1f} s"
    if answer.startswith("HTTP/1.1 431"):
        wait_for(lambda: running.refused["trailers_too_large"] > before, 10, "the refusal to be counted")


def test_a_body_not_complete_within_its_deadline_gets_408(running: ServerThread) -> None:
    """L3: a body trickled to a route that reads it gets 408 at the body deadline, counted."""
    before = running.refused["body_timeout"]
    started = time.monotonic()
    statuses, ended = exchange(
        running.port, [head("Content-Length: 100", method="POST") + b"\r\n"] + [b"x"] * 30, pause=0.2
    )
    assert statuses == ["HTTP/1.1 408 Request Timeout"]
    assert ended in {"closed", "reset"}
    assert time.monotonic() - started < 30 * 0.2 + 5
    wait_for(lambda: running.refused["body_timeout"] > before, 10, "the refusal to be counted")


def test_a_body_of_tiny_chunks_gets_400_and_one_of_kib_chunks_is_served(running: ServerThread) -> None:
    """L3: 4000 one-byte chunks (24 KB on the wire, milliseconds of the server's CPU) get 400 once
    their chunks are not paid for with data, counted; 64 KiB in 1 KiB chunks is served."""
    before = running.refused["bad_request"]
    tiny = head("Transfer-Encoding: chunked", "Connection: close", method="POST") + b"\r\n"
    statuses, ended = exchange(running.port, [tiny + b"1\r\na\r\n" * 4000 + b"0\r\n\r\n"])
    assert statuses == ["HTTP/1.1 400 Bad Request"]
    assert ended in {"closed", "reset"}
    wait_for(lambda: running.refused["bad_request"] > before, 10, "the refusal to be counted")
    chunk = b"400\r\n" + b"k" * 1024 + b"\r\n"
    statuses, _ = exchange(running.port, [tiny + chunk * 64 + b"0\r\n\r\n"])
    assert statuses == ["HTTP/1.1 200 OK"]


def test_a_body_on_a_route_that_reads_none_is_not_read(running: ServerThread) -> None:
    """L3: ``GET /healthz`` declaring a 1 GB body is answered at once and its connection closed:
    the body is never read, whatever the client trickles after."""
    with connect(running.port) as client:
        client.sendall(head("Content-Length: 1000000000", target="/healthz") + b"\r\n")
        for _ in range(5):
            try:
                client.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.5)
        received, ended = read_until_closed(client, 5.0)
    assert statuses_in(received) == ["HTTP/1.1 200 OK"]
    assert ended in {"closed", "reset"}


def test_expect_100_continue_is_answered_when_the_app_reads(port: int) -> None:
    """A client that waits for ``100 Continue`` before its body gets it, then its answer."""
    with connect(port) as client:
        client.sendall(head("Expect: 100-continue", "Content-Length: 5", "Connection: close", method="POST") + b"\r\n")
        first = client.recv(65536)
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
        client.sendall(b"hello")
        received, _ = read_until_closed(client, 5.0)
    assert statuses_in(received) == ["HTTP/1.1 200 OK"]
    assert received.endswith(b"body 5")


def test_an_answer_with_its_body_arrives_whole(port: int) -> None:
    """L3: keep-alive, ``HEAD`` and ``Connection: close`` answers are whole HTTP answers."""
    with connect(port) as client:
        client.sendall(head() + b"\r\n" + head(method="HEAD") + b"\r\n" + head("Connection: close") + b"\r\n")
        received, _ = read_until_closed(client, 5.0)
    answers = received.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"200 OK"] * 3
    assert answers[0].endswith(b"\r\n\r\nbody 0") and answers[2].endswith(b"\r\n\r\nbody 0")
    assert answers[1].endswith(b"\r\n\r\n")  # HEAD: the head alone
    assert b"connection: close" in answers[2] and b"date: " in answers[0]


# -- capacity ---------------------------------------------------------------------------------------


def genuine_status(port: int) -> str:
    statuses, _ = exchange(port, [head("Connection: close", target="/healthz") + b"\r\n"], within=5.0)
    return statuses[0] if statuses else "none"


def test_connections_trickling_a_body_hold_no_slot() -> None:
    """L3, L5: more connections than the cap each send ``GET /healthz`` with a 1 GB
    ``Content-Length``, read the answer and then send a byte every half second: none keeps its
    slot (the body is never read), and a fresh request is answered 200 while they go on."""
    limits = server.Limits(max_connections=20, max_header_bytes=CAP, header_timeout_seconds=30, body_timeout_seconds=30)
    with ServerThread(make_app(), limits) as running:
        holders = [connect(running.port) for _ in range(25)]
        try:
            for each in holders:
                each.sendall(head("Content-Length: 1000000000", target="/healthz") + b"\r\n")
            for _ in range(4):
                for each in holders:
                    try:
                        each.sendall(b"x")
                    except OSError:
                        pass
                time.sleep(0.5)
            assert genuine_status(running.port) == "HTTP/1.1 200 OK"
            wait_for(lambda: running.open_connections() == 0, 10, "the holders' connections to be closed")
        finally:
            for each in holders:
                each.close()


def test_clients_that_never_finish_their_heads_are_shed_for_a_new_one() -> None:
    """L3, L5: with every slot taken by connections trickling their heads (a long header
    deadline here), a new connection sheds the one that waited longest: a genuine request is
    answered 200 at once, and each shed is counted."""
    limits = server.Limits(max_connections=10, max_header_bytes=CAP, header_timeout_seconds=60, body_timeout_seconds=30)
    with ServerThread(make_app(), limits) as running:
        holders = [connect(running.port) for _ in range(10)]
        try:
            for each in holders:
                each.sendall(head())  # never the blank line
            wait_for(lambda: running.open_connections() == 10, 10, "every slot to be taken")
            started = time.monotonic()
            assert genuine_status(running.port) == "HTTP/1.1 200 OK"
            assert time.monotonic() - started < 5.0
            assert running.refused["shed"] >= 1
            holders[0].settimeout(5)
            _, ended = read_until_closed(holders[0], 5.0)
            assert ended in {"closed", "reset"}  # the oldest was the one shed
        finally:
            for each in holders:
                each.close()


def test_a_body_being_received_is_shed_after_the_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """L3, L5: a delivery whose head is in and whose body is on its way outlasts a churn of
    connections that send nothing: with every slot taken, 40 new connections each shed an idle
    one, never the delivery, which is answered 200 once its body comes. (The grace a body has
    before it must show a rate is made long here, so the test's pace does not matter.)"""
    monkeypatch.setattr(server, "BODY_GRACE_SECONDS", 60.0, raising=False)
    limits = server.Limits(max_connections=10, max_header_bytes=CAP, header_timeout_seconds=60, body_timeout_seconds=60)
    with ServerThread(make_app(), limits) as running, connect(running.port) as delivery:
        delivery.sendall(head("Content-Length: 100", "Connection: close", method="POST") + b"\r\n")
        idle: list[socket.socket] = []
        try:
            for _ in range(9):
                idle.append(connect(running.port))
            wait_for(lambda: running.open_connections() == 10, 10, "every slot to be taken")
            for _ in range(40):
                idle.append(connect(running.port))
                idle[-1].sendall(b"G")  # a head begun, never finished
            wait_for(lambda: running.refused["shed"] == 40, 10, "40 connections to be shed")
            delivery.sendall(b"x" * 100)
            received, _ = read_until_closed(delivery, 5.0)
            assert statuses_in(received) == ["HTTP/1.1 200 OK"]
            assert received.endswith(b"body 100")
        finally:
            for each in idle:
                each.close()


def test_beyond_capacity_of_answers_in_progress_a_request_gets_503_with_retry_after() -> None:
    """L5: when every slot holds a request being answered, a new request gets 503 with
    ``Retry-After`` (counted ``over_capacity``), and is served once a slot frees."""
    gate = Gate()
    limits = server.Limits(max_connections=3, max_header_bytes=CAP, header_timeout_seconds=30, body_timeout_seconds=30)
    with ServerThread(make_app(gate), limits) as running:
        busy = [connect(running.port) for _ in range(3)]
        try:
            for each in busy:
                each.sendall(head("Connection: close", target="/hold") + b"\r\n")
            wait_for(lambda: gate.waiting == 3, 10, "three requests being answered")
            with connect(running.port) as client:
                client.sendall(head("Connection: close", target="/healthz") + b"\r\n")
                received, _ = read_until_closed(client, 5.0)
            assert statuses_in(received) == ["HTTP/1.1 503 Service Unavailable"]
            assert b"\r\nretry-after: 1\r\n" in received
            assert running.refused["over_capacity"] == 1
            gate.opened = True
            for each in busy:
                received, _ = read_until_closed(each, 5.0)
                assert statuses_in(received) == ["HTTP/1.1 200 OK"]
            wait_for(lambda: genuine_status(running.port) == "HTTP/1.1 200 OK", 10, "a slot to free")
        finally:
            for each in busy:
                each.close()


def test_a_stop_lets_the_answer_in_progress_finish_and_takes_no_new_connection() -> None:
    """L5: on SIGTERM (here: the stop event) the server stops listening, closes idle connections,
    and a request being answered still gets its answer."""
    gate = Gate()
    limits = server.Limits(max_connections=5, max_header_bytes=CAP, header_timeout_seconds=30)
    with ServerThread(make_app(gate), limits) as running, connect(running.port) as busy, connect(running.port) as idle:
        try:
            busy.sendall(head("Connection: close", target="/hold") + b"\r\n")
            wait_for(lambda: gate.waiting == 1, 10, "the request to be answered")
            running.stop()
            _, ended = read_until_closed(idle, 5.0)
            assert ended in {"closed", "reset"}  # idle: closed at once
            wait_for(lambda: not port_open(running.port), 10, "the listening socket to close")
            gate.opened = True
            received, _ = read_until_closed(busy, 5.0)
            assert statuses_in(received) == ["HTTP/1.1 200 OK"]
        finally:
            gate.opened = True


def test_a_client_that_never_reads_its_answers_is_not_served_without_end() -> None:
    """L3: 100 pipelined requests for a 1 MiB answer each, never read: the server stops taking
    the next request once its answers are not leaving (far fewer than 100 are answered), and
    closes the connection at the header deadline, with what it had buffered."""
    gate = Gate()
    limits = server.Limits(max_connections=5, max_header_bytes=CAP, header_timeout_seconds=1.0)
    with ServerThread(make_app(gate), limits) as running, connect(running.port) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        client.sendall((head(target="/big") + b"\r\n") * 100)
        wait_for(lambda: gate.big > 0, 10, "the first answer")
        wait_for(lambda: running.open_connections() == 0, 15, "the connection to be closed")
        assert 0 < gate.big < 50, gate.big


def test_a_client_that_pipelines_and_never_reads_gets_few_answers_rendered() -> None:
    """L3: 500 pipelined requests for a 10 KB answer each, never read, by a client with a small
    receive window: once an answer cannot leave (the client's window is full), the next request
    is neither parsed nor answered, so only a handful are rendered (not the ~64 KiB the
    transport holds plus the kernel's send queue of them); at the header deadline the
    connection is reset and counted ``answers_unread``."""
    gate = Gate()
    limits = server.Limits(max_connections=5, max_header_bytes=CAP, header_timeout_seconds=1.0)
    with ServerThread(make_app(gate), limits) as running:
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
        with client:
            client.settimeout(10)
            client.connect(("127.0.0.1", running.port))
            client.sendall((head(target="/medium") + b"\r\n") * 500)
            wait_for(lambda: gate.medium > 0, 10, "the first answer")
            wait_for(lambda: running.open_connections() == 0, 10, "the connection to be closed")
            assert gate.medium <= 4, gate.medium
            wait_for(lambda: running.refused["answers_unread"] == 1, 10, "the cut-off to be counted")


def test_pipelined_requests_of_a_client_that_reads_are_all_answered(port: int) -> None:
    """Holding the next request until the answers have left costs a reading client nothing: 50
    pipelined requests for 10 KB answers, read as they come, are all answered."""
    with connect(port) as client:
        client.sendall((head(target="/medium") + b"\r\n") * 49 + head("Connection: close", target="/medium") + b"\r\n")
        received, ended = read_until_closed(client, 10.0)
    assert statuses_in(received) == ["HTTP/1.1 200 OK"] * 50
    assert ended == "closed"


def test_a_client_sending_only_blank_lines_gets_400_at_once(running: ServerThread) -> None:
    """L3: a handful of line ends before a request line are ignored; a flood of them gets 400
    and the connection closes long before the header deadline: of 32 MiB offered as fast as
    the server reads, it takes at most its lingering allowance, and the refusal is counted."""
    before = running.refused["bad_request"]
    with connect(running.port) as client:
        sent = 0
        while sent < 32 * 2**20:
            try:
                client.sendall(b"\r\n" * 32768)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 65536
        received, ended = read_until_closed(client, DEADLINE + 5)
    assert statuses_in(received) == ["HTTP/1.1 400 Bad Request"]
    assert ended in {"closed", "reset"}
    assert sent < 16 * 2**20, f"the server took {sent} bytes of line ends"
    wait_for(lambda: running.refused["bad_request"] > before, 10, "the refusal to be counted")


def test_a_few_line_ends_before_each_request_line_are_ignored(port: int) -> None:
    """RFC 9112 2.2: empty lines before a request line (up to ``MAX_BLANK_BYTES`` each time)
    are ignored, on a new connection and between kept-alive requests."""
    blank = b"\r\n" * (server.MAX_BLANK_BYTES // 2)
    statuses, _ = exchange(port, [blank + head() + b"\r\n", blank + head("Connection: close") + b"\r\n"], pause=0.1)
    assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]
    statuses, _ = exchange(port, [blank + b"\r\n" + head("Connection: close") + b"\r\n"])
    assert statuses == ["HTTP/1.1 400 Bad Request"]
