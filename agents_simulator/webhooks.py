"""Signed webhook deliveries with retries, the way OpenAI sends them.

Each event gets one id (``evt_…``), used as ``webhook-id`` on every attempt and every
re-send; each attempt gets a fresh ``webhook-timestamp`` and signature. Every (event, URL)
pair is its own asyncio task, so a slow or failing receiver never holds up other events.
Any non-2xx answer (redirects included), connection error or timeout is retried with
exponential backoff, capped, until ``max_attempts`` or the horizon is reached.

``hold(seconds, order)`` makes deliveries late and out of order, as a real sender's queues do
now and then: every delivery whose first attempt comes in the next ``seconds`` waits until
then, and the held ones go out one by one in ``order`` (``fifo``, ``reverse`` or ``shuffle``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from agents_simulator.endpoints import Target
from agents_simulator.state import new_id
from controller.clock import Clock
from controller.signing import sign_headers

log = logging.getLogger("agents_simulator.webhooks")


@dataclass(frozen=True)
class RetryPolicy:
    initial_seconds: float
    max_seconds: float
    horizon_seconds: float
    max_attempts: int
    timeout_seconds: float

    def delay_after(self, failures: int) -> float:
        """Backoff before the attempt that follows ``failures`` failed ones."""
        return float(min(self.initial_seconds * 2 ** (failures - 1), self.max_seconds))


@dataclass(frozen=True)
class StoredEvent:
    id: str
    type: str
    created_at: int
    body: bytes

    def to_json(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Attempt:
    number: int
    started_at: float
    webhook_timestamp: int
    status_code: int | None = None
    error: str | None = None
    duration_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass
class Delivery:
    id: str
    event_id: str
    event_type: str
    url: str
    resend: bool
    state: str = "pending"  # pending | delivered | failed
    held: bool = False  # its first attempt waited for a hold to end
    attempts: list[Attempt] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "url": self.url,
            "resend": self.resend,
            "state": self.state,
            "held": self.held,
            "attempts": [
                {
                    "number": a.number,
                    "started_at": a.started_at,
                    "webhook_timestamp": a.webhook_timestamp,
                    "status_code": a.status_code,
                    "error": a.error,
                    "duration_seconds": a.duration_seconds,
                }
                for a in self.attempts
            ],
        }


HOLD_ORDERS = ("fifo", "reverse", "shuffle")
RELEASE_SPACING_SECONDS = 0.05
"""Between two held deliveries going out, so that they arrive in the order they were let go."""


class _Hold:
    """Deliveries waiting for one hold to end; ``release`` lets them go in its order."""

    def __init__(self, until: float, order: str, seed: int | None) -> None:
        self.until = until
        self.order = order
        self._random = random.Random(seed)
        self._waiting: list[asyncio.Future[None]] = []

    async def wait(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        await waiter

    async def release(self, delay: float) -> None:
        await asyncio.sleep(delay)
        waiting = list(self._waiting)
        if self.order == "reverse":
            waiting.reverse()
        elif self.order == "shuffle":
            self._random.shuffle(waiting)
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)
            await asyncio.sleep(RELEASE_SPACING_SECONDS)


class WebhookSender:
    """Publishes events to every configured URL and to every registered endpoint subscribed to
    the event's type (``targets``); keeps every event and delivery for inspection."""

    def __init__(
        self,
        urls: tuple[str, ...],
        secret: str | None,
        policy: RetryPolicy,
        clock: Clock,
        targets: Callable[[str], list[Target]] | None = None,
    ) -> None:
        self._urls = urls
        self._secret = secret
        self._targets = targets
        self._policy = policy
        self._clock = clock
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.events: dict[str, StoredEvent] = {}
        self.deliveries: list[Delivery] = []
        self._hold: _Hold | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(follow_redirects=False, timeout=self._policy.timeout_seconds)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def publish(self, event_type: str, data: Mapping[str, Any]) -> StoredEvent:
        """Record the event and start one delivery per URL."""
        created_at = int(self._clock.now())
        event_id = new_id("evt")
        envelope = {
            "id": event_id,
            "object": "event",
            "created_at": created_at,
            "type": event_type,
            "data": data,
        }
        event = StoredEvent(event_id, event_type, created_at, json.dumps(envelope, separators=(",", ":")).encode())
        self.events[event_id] = event
        log.info("event", extra={"event_id": event_id, "type": event_type, "session_id": data.get("id")})
        self._deliver_everywhere(event, resend=False)
        return event

    def resend(self, event_id: str) -> list[Delivery] | None:
        """Deliver a recorded event again (same webhook-id): a duplicate on purpose."""
        event = self.events.get(event_id)
        if event is None:
            return None
        return self._deliver_everywhere(event, resend=True)

    def hold(self, seconds: float, order: str = "fifo", seed: int | None = None) -> float:
        """Hold every delivery that starts in the next ``seconds``, then send the held ones in
        ``order``; returns when the hold ends (the simulator's clock). A new hold replaces the
        current one for deliveries that start from now on."""
        if not 0 < seconds <= 3600:
            raise ValueError("hold seconds must be between 0 and 3600")
        if order not in HOLD_ORDERS:
            raise ValueError(f"unknown order {order!r}; one of {list(HOLD_ORDERS)}")
        hold = _Hold(self._clock.now() + seconds, order, seed)
        self._hold = hold
        self._start(hold.release(seconds))
        return hold.until

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _deliver_everywhere(self, event: StoredEvent, resend: bool) -> list[Delivery]:
        started = []
        configured = [Target(url, self._configured_secrets) for url in self._urls]
        registered = self._targets(event.type) if self._targets is not None else []
        for target in configured + registered:
            delivery = Delivery(new_id("dlv"), event.id, event.type, target.url, resend)
            self.deliveries.append(delivery)
            self._start(self._run(event, delivery, target.secrets))
            started.append(delivery)
        return started

    def _configured_secrets(self) -> Sequence[str]:
        assert self._secret is not None
        return [self._secret]

    async def _run(self, event: StoredEvent, delivery: Delivery, secrets: Callable[[], Sequence[str]]) -> None:
        hold = self._hold
        if hold is not None and self._clock.now() < hold.until:
            delivery.held = True
            await hold.wait()
        first = self._clock.now()
        while True:
            if await self._attempt(event, delivery, secrets()):
                delivery.state = "delivered"
                return
            failures = len(delivery.attempts)
            delay = self._policy.delay_after(failures)
            out_of_time = self._clock.now() + delay - first > self._policy.horizon_seconds
            if failures >= self._policy.max_attempts or out_of_time:
                delivery.state = "failed"
                log.warning("delivery gave up", extra={"event_id": event.id, "attempts": failures})
                return
            await asyncio.sleep(delay)

    async def _attempt(self, event: StoredEvent, delivery: Delivery, secrets: Sequence[str]) -> bool:
        assert self._client is not None
        now = self._clock.now()
        timestamp = int(now)
        attempt = Attempt(number=len(delivery.attempts) + 1, started_at=now, webhook_timestamp=timestamp)
        delivery.attempts.append(attempt)
        headers = {"content-type": "application/json", "user-agent": "sandbox-controller-simulator"}
        headers.update(sign_headers(secrets, event.id, timestamp, event.body))
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            response = await self._client.post(delivery.url, content=event.body, headers=headers)
            attempt.status_code = response.status_code
        except httpx.HTTPError as exc:
            attempt.error = type(exc).__name__
        attempt.duration_seconds = round(loop.time() - began, 4)
        return attempt.ok
