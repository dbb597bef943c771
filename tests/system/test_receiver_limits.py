"""The receiver under floods of slow and oversized connections: a real receiver process
(``sandbox-controller serve``, its own HTTP/1.1 server) on 127.0.0.1 with a real redis-server, configured
from the Helm chart's values, its resident memory sampled from ``/proc/<pid>/status`` while
900 connections hold on. The chart's memory limit of the receiver is the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controller.signing import sign_headers
from tests.support.deliveries import action_required
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

CHART_VALUES = Path(__file__).resolve().parents[2] / "helm" / "sandbox-controller" / "values.yaml"
SECRET = "whsec_" + "cmVjZWl2ZXItbGltaXRzLXRlc3Qtc2VjcmV0IQ=="
FLOOD = 900
FILES_NEEDED = 3 * FLOOD  # the test's client sockets; the receiver inherits the limit
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (``256Mi``, ``300M``, ``1Gi``) in bytes."""
    for suffix, factor in sorted(_UNITS.items(), key=lambda item: -len(item[0])):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


@dataclass(frozen=True)
class ChartReceiver:
    """The receiver's memory limit and settings, as the chart deploys them."""

    memory_limit_bytes: int
    env: dict[str, str]
    max_body_bytes: int
    header_timeout_seconds: float
    body_timeout_seconds: float

    @classmethod
    def from_values(cls, path: Path) -> ChartReceiver:
        values = yaml.safe_load(path.read_text())
        receiver, webhook = values["receiver"], values["webhook"]
        env = {
            "CONTROLLER_RECEIVER_MAX_CONNECTIONS": str(receiver["maxConnections"]),
            "CONTROLLER_RECEIVER_MAX_HEADER_BYTES": str(receiver["maxHeaderBytes"]),
            "CONTROLLER_RECEIVER_HEADER_TIMEOUT_SECONDS": str(receiver["headerTimeoutSeconds"]),
            "CONTROLLER_WEBHOOK_BODY_TIMEOUT_SECONDS": str(webhook["bodyTimeoutSeconds"]),
            "CONTROLLER_WEBHOOK_MAX_IN_FLIGHT": str(webhook["maxInFlight"]),
            "CONTROLLER_WEBHOOK_MAX_BODY_BYTES": str(webhook["maxBodyBytes"]),
            "CONTROLLER_WEBHOOK_TOLERANCE_SECONDS": str(webhook["toleranceSeconds"]),
        }
        return cls(
            memory_limit_bytes=quantity_bytes(receiver["resources"]["limits"]["memory"]),
            env=env,
            max_body_bytes=int(webhook["maxBodyBytes"]),
            header_timeout_seconds=float(receiver["headerTimeoutSeconds"]),
            body_timeout_seconds=float(webhook["bodyTimeoutSeconds"]),
        )


CHART = ChartReceiver.from_values(CHART_VALUES)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class RssSampler:
    """Samples a process's VmRSS every 20 ms on a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class Receiver:
    process: Managed
    redis: RedisServer
    port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhooks"


def process_group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    """A fresh receiver per flood, so each peak is that flood's own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FILES_NEEDED:
        if hard != resource.RLIM_INFINITY and hard < FILES_NEEDED:
            pytest.fail(f"open-file limit {hard} is below the {FILES_NEEDED} this flood needs (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILES_NEEDED, hard))
    directory = tmp_path
    redis_server = RedisServer(directory / "redis").start()
    port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(
        CHART.env,
        CONTROLLER_REDIS_URL=redis_server.url,
        CONTROLLER_WEBHOOK_SECRETS=SECRET,
        CONTROLLER_METRICS_PORT=str(metrics_port),
    )
    process = Managed(
        "receiver",
        python_module("controller", "serve", "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1"),
        env,
        directory / "receiver.log",
    ).start()
    world = Receiver(process, redis_server, port, metrics_port)
    try:
        wait_for(lambda: port_open(port), 30, "receiver to listen")
        yield world
    finally:
        process.stop()
        redis_server.stop()
        groups = [p.proc.pid for p in (process, redis_server.process) if p is not None and p.proc is not None]
        assert all(process_group_gone(pgid) for pgid in groups), "a process of this test was left running"


# -- the flood ----------------------------------------------------------------------------------


def request_head(extra: str = "") -> bytes:
    return f"POST /webhooks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}".encode()


def well_formed_headers(index: int) -> str:
    """Signature headers that pass the pre-check (fresh timestamp, a v1 entry) but match no body:
    what an attacker without the secret can send."""
    headers = sign_headers(SECRET, f"msg_flood_{index}", int(time.time()), b"not this body")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


async def answer(reader: asyncio.StreamReader, within: float) -> str:
    """The status line the receiver answered with, ``closed`` when it closed without one,
    ``reset`` when it reset the connection, ``hung`` when nothing came within ``within`` s."""
    try:
        data = await asyncio.wait_for(reader.read(4096), within)
    except TimeoutError:
        return "hung"
    except ConnectionError:
        return "reset"
    return data.split(b"\r\n", 1)[0].decode(errors="replace") if data else "closed"


async def slow_body(port: int, index: int, body_bytes: int, within: float) -> str:
    """Headers, then all but the last byte of a max-size body, then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_head(well_formed_headers(index) + f"Content-Length: {body_bytes}\r\n\r\n"))
        writer.write(b" " * (body_bytes - 1))
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return await answer(reader, within)
    finally:
        writer.close()


async def trickled_headers(port: int, within: float) -> str:
    """The request line, then one short header line a second, never the end of the headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_head())
        read = asyncio.ensure_future(answer(reader, within))
        line = 0
        while not read.done():
            with contextlib.suppress(ConnectionError):
                writer.write(f"X-Trickle-{line}: a\r\n".encode())
                await writer.drain()
            line += 1
            await asyncio.wait([read], timeout=1.0)
        return read.result()
    finally:
        writer.close()


async def huge_header(port: int, header_bytes: int, within: float) -> str:
    """One header of ``header_bytes`` bytes, written in 64 KiB pieces until the receiver stops it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_head() + b"X-Huge: ")
        piece = b"a" * 65536
        with contextlib.suppress(ConnectionError):
            for _ in range(header_bytes // len(piece)):
                writer.write(piece)
                await writer.drain()
        return await answer(reader, within)
    finally:
        writer.close()


async def genuine_delivery(url: str, session_id: str, deadline: float) -> list[int]:
    """A signed delivery sent as the Agents API would: retried on 503 until 200 (or the deadline)."""
    body = json.dumps(action_required("environment_connection", session_id)).encode()
    statuses: list[int] = []
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() < deadline:
            headers = sign_headers(SECRET, f"msg_genuine_{session_id}", int(time.time()), body)
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.TransportError:
                statuses.append(0)
            else:
                statuses.append(response.status_code)
                if response.status_code == 200:
                    assert response.json() == {"status": "enqueued"}
                    return statuses
            await asyncio.sleep(0.5)
    return statuses


async def flood_with_a_genuine_delivery(
    receiver: Receiver, attackers: list[Any], session_id: str, ramp_seconds: float
) -> tuple[Counter[str], list[int]]:
    """Open the flood (all at once, or ramped over ``ramp_seconds``), then send a genuine
    delivery while it holds."""
    tasks = []
    for attacker in attackers:
        tasks.append(asyncio.ensure_future(attacker))
        if ramp_seconds:
            await asyncio.sleep(ramp_seconds / len(attackers))
    deadline = time.monotonic() + CHART.header_timeout_seconds + CHART.body_timeout_seconds + 60
    statuses = await genuine_delivery(receiver.url, session_id, deadline)
    outcomes = Counter(await asyncio.gather(*tasks))
    return outcomes, statuses


def run_flood(
    receiver: Receiver, name: str, attackers: list[Any], session_id: str, ramp_seconds: float = 0.0
) -> tuple[Counter[str], list[int]]:
    assert receiver.process.alive()
    with RssSampler(receiver.process.pid) as sampler:
        baseline = sampler.peak
        outcomes, statuses = asyncio.run(flood_with_a_genuine_delivery(receiver, attackers, session_id, ramp_seconds))
    print(
        f"\nFIGURE receiver, {name}: peak RSS {sampler.peak / 2**20:.1f} MiB (idle {baseline / 2**20:.1f} MiB, "
        f"limit {CHART.memory_limit_bytes / 2**20:.0f} MiB); flood answers {dict(outcomes)}; "
        f"genuine delivery answers {statuses}"
    )
    assert receiver.process.alive(), receiver.process.output()[-2000:]
    assert sampler.peak < CHART.memory_limit_bytes, (
        f"{name}: peak RSS {sampler.peak / 2**20:.0f} MiB is above the chart's receiver limit "
        f"{CHART.memory_limit_bytes / 2**20:.0f} MiB"
    )
    assert statuses and statuses[-1] == 200, f"the genuine delivery was never accepted: {statuses}"
    assert set(statuses) <= {200, 503}, statuses  # only "retry later" while the flood holds
    assert outcomes["hung"] == 0, outcomes  # every flood connection was answered or closed
    return outcomes, statuses


# -- tests ----------------------------------------------------------------------------------------


SLOW_BODY_ANSWERS = {"HTTP/1.1 503 Service Unavailable", "HTTP/1.1 408 Request Timeout", "reset"}


def test_900_slow_bodies_stay_under_the_memory_limit(receiver: Receiver) -> None:
    """L3, L5: 900 connections, opened over two seconds, with well-formed signature headers each
    send all but one byte of a max-size body and stall. The receiver stays below the chart's
    memory limit: those read are cut off with 408 (at the body deadline, or sooner for a newer
    delivery once they have read for a second), the rest get 503 before their body is read; a
    genuine delivery sent during the flood is accepted within a few tries (the stalled readers
    it finds have held their slots for over a second: one is cut off for it)."""
    within = CHART.body_timeout_seconds + 30
    attackers = [slow_body(receiver.port, i, CHART.max_body_bytes, within) for i in range(FLOOD)]
    outcomes, statuses = run_flood(receiver, "900 slow bodies", attackers, "sess_during_slow_bodies", ramp_seconds=2.0)
    assert set(outcomes) <= SLOW_BODY_ANSWERS, outcomes
    assert outcomes["HTTP/1.1 408 Request Timeout"] > 0  # some reached the app and were cut off
    assert statuses.count(503) <= 4, statuses  # tries are 0.5 s apart: accepted within 2 s


def test_900_slow_bodies_at_once_stay_under_the_memory_limit(receiver: Receiver) -> None:
    """L3, L5: the same 900 slow bodies opened all at once, so every connection's first read
    (headers and up to 256 KiB of body) lands before any is answered: the connection cap keeps
    that below the chart's memory limit too, and a genuine delivery is accepted."""
    within = CHART.body_timeout_seconds + 30
    attackers = [slow_body(receiver.port, i, CHART.max_body_bytes, within) for i in range(FLOOD)]
    outcomes, _ = run_flood(receiver, "900 slow bodies at once", attackers, "sess_during_burst")
    assert set(outcomes) <= SLOW_BODY_ANSWERS, outcomes


def test_900_trickled_headers_are_closed_at_the_header_deadline(receiver: Receiver) -> None:
    """L3, L5: 900 connections that send a header line a second and never finish their headers
    are closed at the header deadline; memory stays below the limit and a genuine delivery is
    accepted (after 503s while they hold the connection cap)."""
    within = CHART.header_timeout_seconds + 30
    attackers = [trickled_headers(receiver.port, within) for _ in range(FLOOD)]
    outcomes, _ = run_flood(receiver, "900 trickled headers", attackers, "sess_during_trickled_headers")
    assert set(outcomes) <= {"closed", "reset"}, outcomes


def test_huge_headers_are_refused_without_buffering_them(receiver: Receiver) -> None:
    """L3: 900 connections each trying to send a 100 MB header are cut off at the header cap
    (431, connection closed) long before; memory stays below the limit and a genuine delivery
    sent during the flood is accepted."""
    within = 30.0
    attackers = [huge_header(receiver.port, 100 * 10**6, within) for _ in range(FLOOD)]
    outcomes, _ = run_flood(receiver, "900 x 100 MB headers", attackers, "sess_during_huge_headers")
    assert set(outcomes) <= {"HTTP/1.1 431 Request Header Fields Too Large", "closed", "reset"}, outcomes


def test_a_kept_alive_connection_gets_the_header_deadline_again(receiver: Receiver) -> None:
    """L3: after a response on a kept-alive connection, the next request's headers have the
    same deadline: two quick requests are both served, a third that trickles its headers is
    closed."""

    async def scenario() -> tuple[list[str], str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
        try:
            served = []
            for _ in range(2):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                await asyncio.wait_for(reader.readexactly(length), 30)
                served.append(head.split(b"\r\n", 1)[0].decode())
            writer.write(request_head())
            read = asyncio.ensure_future(answer(reader, CHART.header_timeout_seconds + 30))
            line = 0
            while not read.done():
                with contextlib.suppress(ConnectionError):
                    writer.write(f"X-Trickle-{line}: a\r\n".encode())
                    await writer.drain()
                line += 1
                await asyncio.wait([read], timeout=1.0)
            return served, read.result()
        finally:
            writer.close()

    served, third = asyncio.run(scenario())
    assert served == ["HTTP/1.1 200 OK", "HTTP/1.1 200 OK"]
    assert third in {"closed", "reset"}, third


# -- issue 24: trailers, slot holding, the cap to the byte --------------------------------------------


def metric_value(port: int, sample: str) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return 0.0


async def endless_trailers(port: int, method: str, target: str, extra: str, seconds: float) -> tuple[str, float]:
    """A chunked request whose chunks end, then 1 KiB trailer lines as fast as the receiver takes
    them for at most ``seconds``: its answer and how long the client could keep sending."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    line = b"X-Trailer: " + b"t" * 1010 + b"\r\n"
    started = time.monotonic()
    sending = 0.0
    try:
        writer.write(
            f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Transfer-Encoding: chunked\r\n\r\n".encode()
            + b"5\r\nhello\r\n0\r\n"
        )
        while time.monotonic() - started < seconds:
            try:
                writer.write(line * 64)
                await asyncio.wait_for(writer.drain(), seconds)
            except (ConnectionError, TimeoutError):
                break
            sending = time.monotonic() - started
        return await answer(reader, 10.0), sending
    finally:
        writer.close()


TRAILER_ROUTES = [
    ("POST", "/healthz", ""),
    ("GET", "/healthz", ""),
    ("GET", "/no-such-path", ""),
    ("POST", "/webhooks", "fake-signature"),
]


def test_endless_trailers_on_every_route_are_cut_off_with_memory_bounded(receiver: Receiver) -> None:
    """L3, L5: 25 connections on each route (``/healthz`` both ways, an unknown path, ``/webhooks``
    with well-formed but fake signature headers) send a last chunk and then trailers without end,
    as fast as the receiver reads: each is answered or closed within seconds, the receiver's
    memory grows by less than 64 MiB (trailers count against the head's cap; a body the route
    does not read is not read), ``/healthz`` answers throughout, and a genuine delivery is accepted."""
    idle = rss_bytes(receiver.process.pid)

    async def attack() -> tuple[Counter[str], list[float], list[int], list[float]]:
        attackers = []
        for method, target, extra in TRAILER_ROUTES:
            for index in range(25):
                headers = well_formed_headers(index) if extra else ""
                attackers.append(asyncio.ensure_future(endless_trailers(receiver.port, method, target, headers, 20.0)))
        await asyncio.sleep(1.0)
        health: list[float] = []
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(5):
                started = time.monotonic()
                assert (await client.get(f"http://127.0.0.1:{receiver.port}/healthz")).status_code == 200
                health.append(time.monotonic() - started)
                await asyncio.sleep(0.2)
        statuses = await genuine_delivery(receiver.url, "sess_during_trailers", time.monotonic() + 30)
        results = await asyncio.gather(*attackers)
        return Counter(status for status, _ in results), [sending for _, sending in results], statuses, health

    with RssSampler(receiver.process.pid) as sampler:
        outcomes, sending, statuses, health = asyncio.run(attack())
    growth = sampler.peak - idle
    print(
        f"\nFIGURE receiver, endless trailers on 4 routes x 25: RSS growth {growth / 2**20:.1f} MiB; "
        f"longest sending {max(sending):.1f} s; answers {dict(outcomes)}; /healthz {max(health):.3f} s at worst; "
        f"genuine delivery {statuses}"
    )
    assert growth < 64 * 2**20, f"the receiver grew by {growth / 2**20:.0f} MiB"
    assert max(sending) < 15.0, f"a client could send trailers for {max(sending):.1f} s"
    assert outcomes["hung"] == 0, outcomes
    assert statuses and statuses[-1] == 200, statuses
    assert metric_value(receiver.metrics_port, 'controller_receiver_refused_total{reason="trailers_too_large"}') > 0


async def trickling_body_holder(port: int, seconds: float) -> str:
    """``GET /healthz`` declaring a 1 GB body; reads the answer, then a byte every 5 s."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000000\r\n\r\n")
        first = await answer(reader, 10.0)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                writer.write(b"x")
                await writer.drain()
            except ConnectionError:
                return first
            try:
                if not await asyncio.wait_for(reader.read(4096), 5.0):
                    return first  # closed by the receiver
            except TimeoutError:
                continue
            except ConnectionError:
                return first
        return "held"
    finally:
        writer.close()


def test_420_connections_trickling_bodies_hold_no_slot(receiver: Receiver) -> None:
    """L3, L5: 420 connections (over the chart's 400) each send ``GET /healthz`` with a 1 GB
    ``Content-Length``, read the answer, then send a byte every 5 s for 25 s. None holds its
    slot: each is closed after its answer, and at 5, 12 and 20 s a genuine signed delivery on a
    fresh connection is accepted at its first try, and ``/healthz`` answers 200."""

    async def attack() -> tuple[Counter[str], list[list[int]], list[int]]:
        holders = [asyncio.ensure_future(trickling_body_holder(receiver.port, 25.0)) for _ in range(420)]
        deliveries: list[list[int]] = []
        health: list[int] = []
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=10) as client:
            for at in (5.0, 12.0, 20.0):
                await asyncio.sleep(max(0.0, started + at - time.monotonic()))
                deliveries.append(await genuine_delivery(receiver.url, f"sess_trickle_{int(at)}", time.monotonic() + 5))
                health.append((await client.get(f"http://127.0.0.1:{receiver.port}/healthz")).status_code)
        return Counter(await asyncio.gather(*holders)), deliveries, health

    outcomes, deliveries, health = asyncio.run(attack())
    print(
        f"\nFIGURE receiver, 420 trickling bodies: holders {dict(outcomes)}; deliveries {deliveries}; healthz {health}"
    )
    assert outcomes["held"] == 0, outcomes
    assert deliveries == [[200], [200], [200]], deliveries
    assert health == [200, 200, 200]


def test_the_header_cap_is_exact_however_the_head_is_split(receiver: Receiver) -> None:
    """L3: with the chart's cap, a head of exactly the cap is served and one byte more gets 431,
    sent in one write or split near its end; a head six times the cap made of spaces in a header
    value is refused too."""
    cap = int(CHART.env["CONTROLLER_RECEIVER_MAX_HEADER_BYTES"])

    def head_of(size: int, pad: str = "a") -> bytes:
        bare = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: v\r\n\r\n"
        value = pad * (size - len(bare)) + "v"
        data = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: {value}\r\n\r\n".encode()
        assert len(data) == size
        return data

    async def status_of(pieces: list[bytes]) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", receiver.port)
        try:
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.05)
            return await answer(reader, 10.0)
        finally:
            writer.close()

    async def all_cases() -> dict[tuple[int, str], str]:
        found = {}
        for size in (cap, cap + 1):
            data = head_of(size)
            for name, pieces in {
                "one write": [data],
                "last byte alone": [data[:-1], data[-1:]],
                "blank line split": [data[:-3], data[-3:]],
                "halves": [data[: size // 2], data[size // 2 :]],
            }.items():
                found[(size, name)] = await status_of(pieces)
        found[(6 * cap, "spaces")] = await status_of([head_of(6 * cap, pad=" ")])
        return found

    found = asyncio.run(all_cases())
    too_large = "HTTP/1.1 431 Request Header Fields Too Large"
    expected = {key: ("HTTP/1.1 200 OK" if key[0] == cap else too_large) for key in found}
    assert found == expected


# -- issue 38: admission under an unsigned flood ----------------------------------------------------


async def one_byte_of_a_large_body(port: int, index: int, until: float) -> Counter[str]:
    """Again and again until ``until``: the headers of a delivery without the secret declaring
    256 KiB, one byte of it, then wait for the answer (issue 38's attacker)."""
    seen: Counter[str] = Counter()
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            seen["refused"] += 1
            await asyncio.sleep(0.05)
            continue
        try:
            writer.write(request_head(well_formed_headers(index) + f"Content-Length: {256 * 1024}\r\n\r\n") + b" ")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            seen[await answer(reader, 15.0)] += 1
        finally:
            writer.close()
    return seen


async def single_tries(url: str, count: int, pause: float) -> list[int]:
    """``count`` genuine deliveries, one try each (no retry), ``pause`` seconds apart."""
    statuses = []
    async with httpx.AsyncClient(timeout=30) as client:
        for index in range(count):
            body = json.dumps(action_required("environment_connection", f"sess_admit_{index}")).encode()
            headers = sign_headers(SECRET, f"msg_admit_{index}", int(time.time()), body)
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.TransportError:
                statuses.append(0)
            else:
                statuses.append(response.status_code)
            await asyncio.sleep(pause)
    return statuses


def test_genuine_deliveries_get_through_a_flood_holding_every_slot(receiver: Receiver) -> None:
    """L5: 200 clients without the secret each send a delivery's headers declaring 256 KiB and
    one byte, wait for the answer and start again: every in-flight slot is theirs. A genuine
    delivery (a few KiB, declared) needs no slot, so at least 18 of 20 single tries are 200
    (before: 2 of 19 and 7 of 29, the rest 503 busy)."""

    async def scenario() -> tuple[list[int], Counter[str]]:
        until = time.monotonic() + 12.0
        attackers = [asyncio.ensure_future(one_byte_of_a_large_body(receiver.port, i, until)) for i in range(200)]
        await asyncio.sleep(2.0)  # the flood holds every slot
        statuses = await single_tries(receiver.url, 20, 0.3)
        seen: Counter[str] = Counter()
        for each in await asyncio.gather(*attackers):
            seen.update(each)
        return statuses, seen

    statuses, seen = asyncio.run(scenario())
    print(f"\nFIGURE receiver, unsigned flood holding the slots: genuine {statuses}; flood answers {dict(seen)}")
    assert receiver.process.alive(), receiver.process.output()[-2000:]
    assert statuses.count(200) >= 18, statuses
