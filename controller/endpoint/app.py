"""The webhook receiver: ``create_app(services) -> Starlette``.

``POST /webhooks`` handles one delivery in this order, and answers at the first step that
decides:

1. check the signature headers without the body (``Verifier.precheck``: present, well
   formed, timestamp within the window; 401), so a delivery that cannot be genuine costs no
   body buffer;
2. a delivery declaring a body of more than ``SLOTLESS_BODY_BYTES`` (or chunked) takes one of
   ``max_in_flight`` slots for deliveries being read or handled at once — when all are taken,
   cutting off (408) the delivery that has read its body longest, if for at least
   ``READING_GRACE_SECONDS`` (``InFlight``) — or is answered 503 with ``Retry-After`` (the
   sender retries): each one may buffer a whole body, so this is what bounds the receiver's
   memory under a flood. A smaller declared body (a genuine delivery is a few KiB) needs no
   slot: it is no more than the HTTP server holds for any connection, so a flood holding every
   slot with bodies it never finishes does not keep genuine deliveries out;
3. read the raw body, at most ``max_body_bytes`` (413; an over-cap ``Content-Length`` is
   refused before reading, a chunked body is cut off while streaming) and within
   ``body_timeout_seconds`` of the headers (408: a body trickled slowly holds no slot for long);
4. verify the signature over the raw bytes (L3; 401) — nothing is parsed or stored before;
5. parse the envelope (400 for a verified but malformed body);
6. classify (L4, L9, L10): drop → 200 ``{"status": "ignored", "reason": ...}``;
7. a job the queue can never hold (an id that is not encodable text, or absurdly long) → 422
   ``unqueueable``: no retry of the sender's can change it, so it is not a 503;
8. ``await inbox.submit(job)`` (on the event loop: one Redis round trip) → 200 ``enqueued`` /
   ``duplicate`` only once the job is queued (L5); ``Transient`` → 503 with ``Retry-After`` so
   the sender retries.

A rejection answered before the whole body was read (steps 1–3) closes the connection.

A bug (any other exception) also answers 503: the sender retries and the event is not lost;
it is logged with its traceback and counted as ``outcome="error"``. The receiver never
answers 410 (that asks OpenAI to disable the endpoint) and no other 5xx.

``GET /healthz`` (process alive) and ``GET /readyz`` (``inbox.ready()``). ``GET /metrics`` is not
here: ``serve`` serves it on ``CONTROLLER_METRICS_PORT``, off the public port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from controller import events, logs
from controller.clock import Clock
from controller.config import WebhookSettings
from controller.errors import (
    BadPayload,
    BodyTimeout,
    BodyTooLarge,
    ConfigError,
    RejectDelivery,
    SignatureError,
    Transient,
    Unqueueable,
)
from controller.inbox import Inbox, Job
from controller.metrics import SECRETS_REFUSED_TOTAL, WEBHOOKS_TOTAL, Counters, Metrics
from controller.signing import FileVerifier, Verified, Verifier
from controller.trust import MAX_ID_CHARS

log = logs.get("controller.receiver")  # the name its log lines have always carried

DEFAULT_RETRY_AFTER_SECONDS = 5
MAX_RETRY_AFTER_SECONDS = 600
_MAX_LENGTH_DIGITS = 18
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_IN_FLIGHT = 100
MAX_SESSION_ID_CHARS = MAX_ID_CHARS
"""Longer session ids are refused (422): none the Agents API issues comes close."""
_MAX_LOGGED_CHARS = 256
LOG_EVERY_SECONDS = 10.0
"""A rejection or busy line is written at most this often per reason, with the count since the
last (``logs.Throttle``): an unsigned flood costs no log volume; the metric counts every one."""


@dataclass(frozen=True)
class ReceiverServices:
    """Everything the receiver needs, built once by the caller (``wiring``)."""

    verifier: Verifier
    inbox: Inbox
    clock: Clock
    max_body_bytes: int
    counters: Counters = field(default_factory=Metrics)
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    prestart: bool = False
    """Enqueue self-hosted session creations too (``events.classify``; some agents pre-start)."""
    log_every: logs.Throttle = field(default_factory=lambda: logs.Throttle(LOG_EVERY_SECONDS))
    """Which rejection and busy lines are written (``LOG_EVERY_SECONDS``)."""

    @classmethod
    def from_settings(
        cls,
        webhook: WebhookSettings,
        inbox: Inbox,
        clock: Clock,
        counters: Counters | None = None,
        prestart: bool = False,
    ) -> ReceiverServices:
        secrets = [s.reveal() for s in webhook.secrets]
        counted = counters if counters is not None else Metrics()

        def refused(reason: str) -> None:
            counted.inc(SECRETS_REFUSED_TOTAL, reason=reason)

        verifier = (
            FileVerifier(Path(webhook.secrets_file), secrets, webhook.tolerance_seconds, on_refused=refused)
            if webhook.secrets_file
            else Verifier(secrets, webhook.tolerance_seconds)
        )
        return cls(
            verifier,
            inbox,
            clock,
            webhook.max_body_bytes,
            counted,
            webhook.body_timeout_seconds,
            webhook.max_in_flight,
            prestart,
        )


SLOTLESS_BODY_BYTES = 64 * 1024
"""A delivery declaring a body of at most this many bytes is read without an in-flight slot: its
body is no more than the HTTP server holds for any connection anyway (``server.BODY_BUFFER_BYTES``
waiting for the app), so it needs no share of the budget, and a flood of deliveries that hold
slots with bodies they never finish cannot keep it out (a genuine delivery is a few KiB)."""

READING_GRACE_SECONDS = 1.0
"""A delivery still reading its body this long after it took its slot may be cut off (408) to
give the slot to a newer one when the budget is full: a genuine sender's body arrives in
milliseconds, a trickled one holds a slot for nothing."""


class Reading:
    """One delivery's slot, while it reads its body: the clock that cuts it off."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.deadline: asyncio.Timeout | None = None
        self.evicted = False


class InFlight:
    """Deliveries being read or handled at once, up to ``limit`` (one event loop: no lock).

    When every slot is taken, the delivery that has been reading its body longest (at least
    ``READING_GRACE_SECONDS``) is cut off to make room: its body deadline is brought forward to
    now (it answers 408 and gives its slot back); the newcomer takes the slot at once. Only when
    no reader is that old does the newcomer get 503."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._reading: dict[Reading, None] = {}  # insertion-ordered: oldest first

    def take(self) -> Reading | None:
        """A slot (give it back with ``give``), or None when none is free and none can be freed."""
        now = asyncio.get_running_loop().time()  # monotonic: a wall-clock step frees no slot
        if self.count - self._evicting() >= self.limit:
            oldest = next((r for r in self._reading if not r.evicted and r.deadline is not None), None)
            if oldest is None or now - oldest.started < READING_GRACE_SECONDS:
                return None
            oldest.evicted = True
            assert oldest.deadline is not None
            oldest.deadline.reschedule(now)
        self.count += 1
        reading = Reading(now)
        self._reading[reading] = None
        return reading

    def read(self, reading: Reading) -> None:
        """``reading``'s body is in: it no longer holds a slot for a client."""
        self._reading.pop(reading, None)

    def give(self, reading: Reading) -> None:
        self._reading.pop(reading, None)
        self.count -= 1

    def _evicting(self) -> int:
        return sum(1 for r in self._reading if r.evicted)


@dataclass(frozen=True)
class Answer:
    """A JSON answer, rendered once (as Starlette's ``JSONResponse`` renders it)."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...]

    @classmethod
    def json(cls, content: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None) -> Answer:
        body = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
        extra = tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items())
        return cls(
            status, body, (*extra, (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json"))
        )

    async def __call__(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": list(self.headers)})
        await send({"type": "http.response.body", "body": self.body})


_JOB_TEXT = tuple(item.name for item in fields(Job) if item.name != "received_at")  # a float the receiver sets
_QUEUED = {outcome: Answer.json({"status": outcome}) for outcome in ("enqueued", "duplicate")}
_SIGNATURE_HEADERS = frozenset((b"webhook-id", b"webhook-timestamp", b"webhook-signature", b"content-length"))


class ReceiverApp(Starlette):
    """Starlette for every route, except that ``POST /webhooks`` skips its middleware and
    router: the delivery handler is a plain ASGI callable that answers every error itself
    (a bug is a 503), so the hot path pays for no layer it does not use."""

    def __init__(self, routes: list[Route], webhooks: Webhooks) -> None:
        super().__init__(routes=routes)
        self._webhooks = webhooks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/webhooks" and scope["method"] == "POST":
            await self._webhooks(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


class Webhooks:
    """``POST /webhooks`` as an ASGI app (see the module docstring for the steps)."""

    def __init__(self, services: ReceiverServices) -> None:
        self._services = services
        self._in_flight = InFlight(services.max_in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services = self._services
        try:
            answer = await _receive(services, signature_headers(scope), receive, self._in_flight)
        except Exception:
            answer = _bug(services)
        await answer(send)


def create_app(services: ReceiverServices) -> Starlette:
    webhooks = Webhooks(services)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            ready = await services.inbox.ready()
        except Exception:
            log.exception("readyz.error")
            ready = False
        if ready:
            return JSONResponse({"status": "ready"})
        retry = {"Retry-After": str(DEFAULT_RETRY_AFTER_SECONDS)}  # every 503 says when to come back
        return JSONResponse({"status": "unavailable"}, status_code=503, headers=retry)

    routes = [
        Route("/webhooks", webhooks, methods=["POST"]),  # reached only under a root path; 405 for other methods
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    app = ReceiverApp(routes, webhooks)
    app.state.services = services
    return app


def signature_headers(scope: Scope) -> dict[str, str]:
    """The headers the receiver reads (each one's first occurrence, as Starlette's ``Headers.get``)."""
    found: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in _SIGNATURE_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


async def _receive(
    services: ReceiverServices, headers: Mapping[str, str], receive: Receive, in_flight: InFlight
) -> Answer:
    try:
        signed = services.verifier.precheck(headers, services.clock.now())
        declared = declared_length(headers, services.max_body_bytes)
    except RejectDelivery as exc:
        return _rejected(services, exc, close=True)  # the body is never read
    slot = None
    if declared is None or declared > SLOTLESS_BODY_BYTES:
        slot = in_flight.take()
        if slot is None:
            count = services.log_every.count("unavailable.busy")
            if count:
                log.warning("webhook.unavailable", extra={"outcome": "unavailable", "reason": "busy", "count": count})
            services.counters.inc(WEBHOOKS_TOTAL, outcome="unavailable", reason="busy")
            return _unavailable("unavailable", DEFAULT_RETRY_AFTER_SECONDS, close=True)
    try:
        try:
            body = await read_body(receive, services.max_body_bytes, services.body_timeout_seconds, slot)
        except RejectDelivery as exc:
            return _rejected(services, exc, close=True)  # the rest of the body is never read
        if slot is not None:
            in_flight.read(slot)
        try:
            verified = services.verifier.verify_signed(signed, body, services.clock.now())
        except RejectDelivery as exc:
            return _rejected(services, exc)
        with logs.bind(webhook_id=verified.webhook_id):
            try:
                return await _verified(services, verified, body)
            except Exception:
                return _bug(services)  # logged with the ids bound
    finally:
        if slot is not None:
            in_flight.give(slot)


async def _verified(services: ReceiverServices, verified: Verified, body: bytes) -> Answer:
    try:
        event = events.parse(body)
    except BadPayload as exc:
        return _rejected(services, exc)
    with logs.bind(event_id=loggable(event.id) or None, session_id=loggable(event.session_id)):
        try:
            return await _queued(services, verified, event)
        except Exception:
            return _bug(services)  # logged with the ids bound


async def _queued(services: ReceiverServices, verified: Verified, event: events.Event) -> Answer:
    disposition = events.classify(event, services.prestart)
    malformed = disposition is events.MALFORMED_SESSION_ID
    if not disposition.enqueue and not malformed:
        return _answer(services, "ignored", disposition.reason, event, {"reason": disposition.reason})
    job = Job(
        session_id=event.session_id or "",  # classify enqueues only events with a session id
        webhook_id=verified.webhook_id,
        event_type=event.type,
        event_id=event.id,
        received_at=services.clock.now(),
    )
    try:
        check_queueable(job)
        if malformed:
            # Verified work for an id that can never be a key, a path or an argument (L2): a
            # 4xx with a reason, not a 503 the sender would retry for 72 hours.
            raise Unqueueable("session id does not match the id pattern")
    except Unqueueable as exc:
        return _rejected(services, exc)
    try:
        outcome = await services.inbox.submit(job)
    except ConfigError as exc:  # e.g. Redis refused the password: the operator must fix a setting
        log.error("webhook.unavailable", extra={"outcome": "unavailable", "reason": "config", "error": str(exc)})
        services.counters.inc(WEBHOOKS_TOTAL, outcome="unavailable", reason="config")
        return _unavailable("unavailable", DEFAULT_RETRY_AFTER_SECONDS)
    except Transient as exc:
        seconds = retry_after_seconds(exc.retry_after)
        log.warning(
            "webhook.unavailable",
            extra={
                "outcome": "unavailable",
                "reason": "inbox",
                "error": str(exc),
                "event_type": loggable(event.type),
            },
        )
        services.counters.inc(WEBHOOKS_TOTAL, outcome="unavailable", reason="inbox")
        return _unavailable("unavailable", seconds)
    return _answer(services, outcome.value, disposition.reason, event, {})


async def read_body(
    receive: Receive,
    limit: int,
    timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS,
    slot: Reading | None = None,
) -> bytes:
    """The raw body, or BodyTooLarge once more than ``limit`` bytes arrive (a declared length over
    it is refused before, by ``declared_length``), or BodyTimeout when it has not all arrived
    within ``timeout_seconds`` (or ``slot`` was cut off for a newer delivery: ``InFlight``)."""
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_seconds) as deadline:
            if slot is not None:
                slot.deadline = deadline
            while True:
                message = await receive()
                if message["type"] != "http.request":  # http.disconnect
                    raise BadPayload("client disconnected before the body was complete")
                chunk: bytes = message.get("body", b"")
                more: bool = message.get("more_body", False)
                if not more and not body and len(chunk) <= limit:
                    return chunk  # the whole body in one message: no copy
                body += chunk
                if len(body) > limit:
                    raise BodyTooLarge(f"body is larger than {limit} bytes")
                if not more:
                    return bytes(body)
    except TimeoutError as exc:
        if slot is not None and slot.evicted:
            raise BodyTimeout("body still incomplete when a newer delivery needed its slot") from exc
        raise BodyTimeout(f"body did not arrive within {timeout_seconds:g} seconds") from exc


def declared_length(headers: Mapping[str, str], limit: int) -> int | None:
    """The body length ``Content-Length`` declares (None: chunked), or BadPayload when it is not
    a number, BodyTooLarge when it is over ``limit``: told from the head alone."""
    declared = headers.get("content-length")
    if declared is None:
        return None
    digits = declared.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise BadPayload("Content-Length is not a number")
    if len(digits) > _MAX_LENGTH_DIGITS or int(digits) > limit:
        raise BodyTooLarge(f"body is larger than {limit} bytes")
    return int(digits)


def check_queueable(job: Job) -> None:
    """Raise Unqueueable for a job no retry could ever queue: text that cannot be encoded
    (a lone surrogate such as JSON ``"\\ud800"`` has no UTF-8 form, so Redis and the broker
    refuse it) or a session id longer than ``MAX_SESSION_ID_CHARS``."""
    for name in _JOB_TEXT:
        value = getattr(job, name)
        if not isinstance(value, str):
            raise Unqueueable(f"{name} is not a string")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Unqueueable(f"{name} is not encodable text (lone surrogate)") from exc
    if len(job.session_id) > MAX_SESSION_ID_CHARS:
        raise Unqueueable(f"session id is longer than {MAX_SESSION_ID_CHARS} characters")


def loggable(value: str | None) -> str | None:
    """An id fit for a JSON log line: lone surrogates escaped, absurd lengths cut."""
    if value is None:
        return None
    if len(value) > _MAX_LOGGED_CHARS:
        value = value[:_MAX_LOGGED_CHARS] + "…"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def retry_after_seconds(hint: float | None) -> int:
    """A whole number of seconds for ``Retry-After``: the hint rounded up, within bounds."""
    if hint is None or not math.isfinite(hint):
        return DEFAULT_RETRY_AFTER_SECONDS
    return int(min(MAX_RETRY_AFTER_SECONDS, max(1, math.ceil(hint))))


def rejection_reason(exc: RejectDelivery) -> str:
    """A fixed word for logs and metric labels."""
    if isinstance(exc, SignatureError):
        return "signature"
    if isinstance(exc, BodyTooLarge):
        return "too_large"
    if isinstance(exc, BodyTimeout):
        return "timeout"
    if isinstance(exc, Unqueueable):
        return "unqueueable"
    return "payload"


def _rejected(services: ReceiverServices, exc: RejectDelivery, close: bool = False) -> Answer:
    reason = rejection_reason(exc)
    count = services.log_every.count(f"rejected.{reason}")
    if count:
        # Messages name headers and limits, never their values, the body or a secret.
        log.warning(
            "webhook.rejected",
            extra={
                "outcome": "rejected",
                "reason": reason,
                "detail": str(exc),
                "status_code": exc.status_code,
                "count": count,
            },
        )
    services.counters.inc(WEBHOOKS_TOTAL, outcome="rejected", reason=reason)
    headers = {"Connection": "close"} if close else None
    return Answer.json({"status": "rejected", "reason": reason, "detail": str(exc)}, exc.status_code, headers)


def _answer(
    services: ReceiverServices, outcome: str, reason: str, event: events.Event, extra: dict[str, Any]
) -> Answer:
    log.info(f"webhook.{outcome}", extra={"outcome": outcome, "reason": reason, "event_type": loggable(event.type)})
    services.counters.inc(WEBHOOKS_TOTAL, outcome=outcome, reason=reason)
    return _QUEUED[outcome] if not extra and outcome in _QUEUED else Answer.json({"status": outcome, **extra})


def _bug(services: ReceiverServices) -> Answer:
    """A bug (an unexpected exception, being handled): logged with its traceback, 503 (the sender
    retries, the event is not lost)."""
    log.exception("webhook.error", extra={"outcome": "error", "reason": "bug"})
    with contextlib.suppress(Exception):
        services.counters.inc(WEBHOOKS_TOTAL, outcome="error", reason="bug")
    return _unavailable("error", DEFAULT_RETRY_AFTER_SECONDS)


def _unavailable(status: str, seconds: int, close: bool = False) -> Answer:
    headers = {"Retry-After": str(seconds), **({"Connection": "close"} if close else {})}
    return Answer.json({"status": status}, 503, headers)
