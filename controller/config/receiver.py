"""The receiver's sections: webhook deliveries (``WebhookSettings``) and the limits of its
HTTP server (``ReceiverSettings``)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable, Secret
from controller.config.reader import DAY, PREFIX, Reader
from controller.signing import parse_secrets


@dataclass(frozen=True, repr=False)
class WebhookSettings(Printable):
    secrets: tuple[Secret, ...] = ()
    """Signing secrets (comma-separated; several during rotation). ``whsec_`` ones are base64."""
    secrets_file: str | None = None
    """Where ``secrets`` were read from (``…_WEBHOOK_SECRETS_FILE``): the receiver reads it again
    once it changes (a rotation, no restart)."""
    tolerance_seconds: int = 300
    """Replay window, both ways."""
    max_body_bytes: int = 256 * 1024
    """Deliveries above this get 413."""
    dedup_ttl_seconds: int = 73 * 3600
    """How long a ``webhook-id`` is remembered: beyond the sender's 72-hour retry horizon."""
    body_timeout_seconds: float = 10.0
    """A delivery's whole body must arrive within this once its headers are in (408 otherwise)."""
    max_in_flight: int = 100
    """Deliveries one receiver process reads or handles at once; beyond this a new one gets 503
    (the sender retries) before its body is read. Each may buffer up to ``max_body_bytes``."""


@dataclass(frozen=True, repr=False)
class ReceiverSettings(Printable):
    """Limits of the receiver's HTTP server, so slow or hostile clients stay cheap."""

    max_connections: int = 400
    """Open connections (or requests in progress, of any path); a request beyond this gets 503.
    A backstop on sockets: the body budget is ``WebhookSettings.max_in_flight``."""
    max_header_bytes: int = 16 * 1024
    """A request whose headers exceed this gets 431 and the connection is closed."""
    header_timeout_seconds: float = 10.0
    """A connection whose request headers are not complete this long after it opened (or after
    its previous response) is closed."""


def signing_secrets(r: Reader) -> tuple[Secret, ...]:
    """``WEBHOOK_SECRETS`` (or its ``_FILE``): each one checked (``signing.parse_secrets``)."""
    value = r.raw_secret("WEBHOOK_SECRETS")
    if not value:
        return ()
    secrets, problems = parse_secrets(value)
    where = f"{PREFIX}WEBHOOK_SECRETS{'_FILE' if r.env.get(PREFIX + 'WEBHOOK_SECRETS_FILE') else ''}"
    r.problems += [f"{where}: {problem}" for problem in problems]
    return tuple(Secret(s) for s in secrets)


def webhook(r: Reader, secrets: tuple[Secret, ...]) -> WebhookSettings:
    return WebhookSettings(
        secrets=secrets,
        secrets_file=r.get(PREFIX + "WEBHOOK_SECRETS_FILE") or None,
        tolerance_seconds=r.number("WEBHOOK_TOLERANCE_SECONDS", WebhookSettings.tolerance_seconds, int, 1, 3600),
        max_body_bytes=r.number("WEBHOOK_MAX_BODY_BYTES", WebhookSettings.max_body_bytes, int, 1024, 16 * 1024 * 1024),
        dedup_ttl_seconds=r.number("WEBHOOK_DEDUP_TTL_SECONDS", WebhookSettings.dedup_ttl_seconds, int, 1, 30 * DAY),
        body_timeout_seconds=r.number(
            "WEBHOOK_BODY_TIMEOUT_SECONDS", WebhookSettings.body_timeout_seconds, float, 0.1, 300
        ),
        max_in_flight=r.number("WEBHOOK_MAX_IN_FLIGHT", WebhookSettings.max_in_flight, int, 1, 10_000),
    )


def receiver(r: Reader) -> ReceiverSettings:
    return ReceiverSettings(
        max_connections=r.number("RECEIVER_MAX_CONNECTIONS", ReceiverSettings.max_connections, int, 1, 100_000),
        max_header_bytes=r.number(
            "RECEIVER_MAX_HEADER_BYTES", ReceiverSettings.max_header_bytes, int, 1024, 1024 * 1024
        ),
        header_timeout_seconds=r.number(
            "RECEIVER_HEADER_TIMEOUT_SECONDS", ReceiverSettings.header_timeout_seconds, float, 0.1, 300
        ),
    )
