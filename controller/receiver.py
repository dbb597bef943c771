"""The webhook receiver: ``create_app(services) -> Starlette``.

``POST /webhooks`` handles one delivery in this order, and answers at the first step that
decides:

1. read the raw body, at most ``max_body_bytes`` (413; an over-cap ``Content-Length`` is
   refused before reading, a chunked body is cut off while streaming);
2. verify the signature over the raw bytes (L3; 401) — nothing is parsed or stored before;
3. parse the envelope (400 for a verified but malformed body);
4. classify (L4, L9, L10): drop → 200 ``{"status": "ignored", "reason": ...}``;
5. ``inbox.submit(job)`` → 200 ``enqueued`` / ``duplicate`` only once the job is queued
   (L5); ``Transient`` → 503 with ``Retry-After`` so the sender retries.

A bug (any other exception) also answers 503: the sender retries and the event is not lost;
it is logged with its traceback and counted as ``outcome="error"``. The receiver never
answers 410 (that asks OpenAI to disable the endpoint) and no other 5xx.

``GET /healthz`` (process alive), ``GET /readyz`` (``inbox.ready()``), and ``GET /metrics``
when ``counters`` is a ``metrics.Metrics``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controller import events, logs
from controller.clock import Clock
from controller.config import WebhookSettings
from controller.errors import BadPayload, BodyTooLarge, RejectDelivery, SignatureError, Transient
from controller.inbox import Inbox, Job
from controller.metrics import WEBHOOKS_TOTAL, Counters, Metrics
from controller.signing import Verifier

log = logs.get("controller.receiver")

DEFAULT_RETRY_AFTER_SECONDS = 5
MAX_RETRY_AFTER_SECONDS = 600
_MAX_LENGTH_DIGITS = 18


@dataclass(frozen=True)
class ReceiverServices:
    """Everything the receiver needs, built once by the caller (``wiring``)."""

    verifier: Verifier
    inbox: Inbox
    clock: Clock
    max_body_bytes: int
    counters: Counters = field(default_factory=Metrics)

    @classmethod
    def from_settings(
        cls, webhook: WebhookSettings, inbox: Inbox, clock: Clock, counters: Counters | None = None
    ) -> ReceiverServices:
        verifier = Verifier([s.reveal() for s in webhook.secrets], webhook.tolerance_seconds)
        return cls(verifier, inbox, clock, webhook.max_body_bytes, counters if counters is not None else Metrics())


def create_app(services: ReceiverServices) -> Starlette:
    async def webhooks(request: Request) -> Response:
        with contextlib.ExitStack() as context:
            try:
                return await _receive(services, request, context)
            except Exception:
                log.exception("webhook.error", extra={"outcome": "error", "reason": "bug"})
                with contextlib.suppress(Exception):
                    services.counters.inc(WEBHOOKS_TOTAL, outcome="error", reason="bug")
                return _unavailable("error", DEFAULT_RETRY_AFTER_SECONDS)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            ready = await run_in_threadpool(services.inbox.ready)
        except Exception:
            log.exception("readyz.error")
            ready = False
        return JSONResponse({"status": "ready" if ready else "unavailable"}, status_code=200 if ready else 503)

    routes = [
        Route("/webhooks", webhooks, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    counters = services.counters
    if isinstance(counters, Metrics):

        async def metrics(request: Request) -> Response:
            return Response(counters.render(), media_type=counters.content_type)

        routes.append(Route("/metrics", metrics, methods=["GET"]))
    app = Starlette(routes=routes)
    app.state.services = services
    return app


async def _receive(services: ReceiverServices, request: Request, context: contextlib.ExitStack) -> Response:
    try:
        body = await read_body(request, services.max_body_bytes)
        verified = services.verifier.verify(request.headers, body, services.clock.now())
    except RejectDelivery as exc:
        return _rejected(services, exc)
    context.enter_context(logs.bind(webhook_id=verified.webhook_id))
    try:
        event = events.parse(body)
    except BadPayload as exc:
        return _rejected(services, exc)
    context.enter_context(logs.bind(event_id=event.id or None, session_id=event.session_id))

    disposition = events.classify(event)
    if not disposition.enqueue:
        return _answer(services, "ignored", disposition.reason, event, {"reason": disposition.reason})
    job = Job(
        session_id=event.session_id or "",  # classify enqueues only events with a session id
        webhook_id=verified.webhook_id,
        event_type=event.type,
        event_id=event.id,
    )
    try:
        outcome = await run_in_threadpool(services.inbox.submit, job)
    except Transient as exc:
        seconds = retry_after_seconds(exc.retry_after)
        log.warning(
            "webhook.unavailable",
            extra={"outcome": "unavailable", "reason": "inbox", "error": str(exc), "event_type": event.type},
        )
        services.counters.inc(WEBHOOKS_TOTAL, outcome="unavailable", reason="inbox")
        return _unavailable("unavailable", seconds)
    return _answer(services, outcome.value, disposition.reason, event, {})


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, or BodyTooLarge once more than ``limit`` bytes are declared or arrive."""
    declared = request.headers.get("content-length")
    if declared is not None:
        digits = declared.strip()
        if not (digits.isascii() and digits.isdigit()):
            raise BadPayload("Content-Length is not a number")
        if len(digits) > _MAX_LENGTH_DIGITS or int(digits) > limit:
            raise BodyTooLarge(f"body is larger than {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise BodyTooLarge(f"body is larger than {limit} bytes")
    except ClientDisconnect as exc:
        raise BadPayload("client disconnected before the body was complete") from exc
    return bytes(body)


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
    return "payload"


def _rejected(services: ReceiverServices, exc: RejectDelivery) -> Response:
    reason = rejection_reason(exc)
    # Messages name headers and limits, never their values, the body or a secret.
    log.warning(
        "webhook.rejected",
        extra={"outcome": "rejected", "reason": reason, "detail": str(exc), "status_code": exc.status_code},
    )
    services.counters.inc(WEBHOOKS_TOTAL, outcome="rejected", reason=reason)
    return JSONResponse({"status": "rejected", "reason": reason, "detail": str(exc)}, status_code=exc.status_code)


def _answer(
    services: ReceiverServices, outcome: str, reason: str, event: events.Event, extra: dict[str, Any]
) -> Response:
    log.info(f"webhook.{outcome}", extra={"outcome": outcome, "reason": reason, "event_type": event.type})
    services.counters.inc(WEBHOOKS_TOTAL, outcome=outcome, reason=reason)
    return JSONResponse({"status": outcome, **extra})


def _unavailable(status: str, seconds: int) -> Response:
    return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": str(seconds)})
