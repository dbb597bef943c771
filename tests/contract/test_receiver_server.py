"""The receiver's HTTP server on the wire (``controller/server.py``): uvicorn with httptools and
the guards it lacks, a header cap and a header deadline, served on 127.0.0.1 from a thread of
this process with ``server.options`` exactly as ``serve`` passes them. The floods these guards
hold off, on a real receiver process, are tests/system/test_receiver_limits.py.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from controller import server
from controller.config import ReceiverSettings
from tests.support.processes import free_port, port_open, wait_for

CAP = 4096
DEADLINE = 1.0
LIMITS = ReceiverSettings(max_connections=20, max_header_bytes=CAP, header_timeout_seconds=DEADLINE)


async def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"body {len(await request.body())}")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    app = Starlette(routes=[Route("/", echo, methods=["GET", "POST"])])
    chosen = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=chosen, log_config=None, access_log=False, lifespan="off", **server.options(LIMITS)
    )
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(target=uvicorn_server.run, name="receiver-server", daemon=True)
    thread.start()
    try:
        wait_for(lambda: port_open(chosen), 30, "the server")
        yield chosen
    finally:
        uvicorn_server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


def exchange(port: int, pieces: Sequence[bytes], pause: float = 0.0, within: float = 10.0) -> tuple[list[str], str]:
    """Send ``pieces`` (``pause`` seconds apart, stopping if the server closed), then read until
    the server closes: the status lines received, and how the connection ended (``closed``,
    ``reset`` or ``open`` when the server kept it past ``within`` seconds)."""
    received, ended = b"", "open"
    with socket.create_connection(("127.0.0.1", port), timeout=within) as client:
        for piece in pieces:
            try:
                client.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(pause)
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
    return [line.decode() for line in re.findall(rb"HTTP/1\.1 \d{3}[^\r]*", received)], ended


def head(*lines: str, method: str = "GET", target: str = "/") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + "".join(f"{x}\r\n" for x in lines).encode()


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
    """L3: a header that never ends is refused once the bytes received for the head pass the cap
    (httptools itself would buffer it without bound)."""
    pieces = [head() + b"X-Endless: "] + [b"a" * 512] * 64  # 32 KiB, never a line end
    statuses, ended = exchange(port, pieces, pause=0.01)
    assert statuses == ["HTTP/1.1 431 Request Header Fields Too Large"]
    assert ended in {"closed", "reset"}


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


def test_headers_not_complete_within_the_deadline_close_the_connection(port: int) -> None:
    """L3: a client that sends a header line every 0.2 s, never ending its headers, is closed at
    the header deadline (1 s here), without an answer."""
    started = time.monotonic()
    statuses, ended = exchange(port, [head()] + [b"X-Trickle: a\r\n"] * 40, pause=0.2)
    assert statuses == []
    assert ended in {"closed", "reset"}
    assert time.monotonic() - started < 40 * 0.2  # closed before the client was done


def test_a_kept_alive_connection_gets_the_deadline_again_after_each_answer(port: int) -> None:
    """L3: two requests on one connection are served; a third that trickles its headers is closed."""
    pieces = [head() + b"\r\n", head() + b"\r\n", head()] + [b"X-Trickle: a\r\n"] * 40
    started = time.monotonic()
    statuses, ended = exchange(port, pieces, pause=0.2)
    assert statuses == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]
    assert ended in {"closed", "reset"}
    assert time.monotonic() - started < 42 * 0.2


def test_an_upgrade_header_is_ignored(port: int) -> None:
    """L3: no WebSocket or other upgrade leaves the guarded protocol: the request is plain HTTP."""
    statuses, _ = exchange(port, [head("Connection: Upgrade, close", "Upgrade: websocket") + b"\r\n"])
    assert statuses == ["HTTP/1.1 200 OK"]


def test_an_answer_with_its_body_arrives_whole(port: int) -> None:
    """L3: the head written with the body (``OneWriteCycle``) still makes a whole HTTP answer,
    with keep-alive, ``Connection: close`` and HEAD alike."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(head() + b"\r\n" + head(method="HEAD") + b"\r\n" + head("Connection: close") + b"\r\n")
        received = b""
        while data := client.recv(65536):
            received += data
    answers = received.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"200 OK"] * 3
    assert answers[0].endswith(b"\r\n\r\nbody 0") and answers[2].endswith(b"\r\n\r\nbody 0")
    assert answers[1].endswith(b"\r\n\r\n")  # HEAD: the head alone
