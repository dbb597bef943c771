"""Standard Webhooks signatures over raw bytes.

Signed content is ``f"{webhook_id}.{timestamp}.".encode() + raw_body``, HMAC-SHA256,
standard base64. A secret ``whsec_<base64>`` is decoded after the prefix; any other
secret is used as its UTF-8 bytes. Several secrets may be valid at once (rotation), and
a ``webhook-signature`` header may carry several space-separated ``v1,<sig>`` entries:
a delivery is genuine when any entry matches any secret. Every entry is compared with
every secret's signature (constant-time, no early exit), so timing does not reveal which matched.

``Verifier.precheck`` runs the checks that need no body (headers present and well formed,
timestamp in the window), so a receiver can refuse a delivery before reading its body;
``Verifier.verify`` runs them again and then checks the HMAC over the raw body.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controller.errors import SignatureError

DEFAULT_TOLERANCE_SECONDS = 300
_PREFIX = "whsec_"
_MAX_HEADER_CHARS = 4096


def secret_key(secret: str) -> bytes:
    """The HMAC key a secret stands for; raises ValueError for a garbled ``whsec_`` secret."""
    if secret.startswith(_PREFIX):
        try:
            return base64.b64decode(secret[len(_PREFIX) :], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("a whsec_ secret must be base64 after its prefix") from exc
    return secret.encode("utf-8")


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` entry for one key."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def sign_headers(secret: str | Sequence[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers a sender attaches (used by the simulator and tests). Several secrets
    (a rotation's overlap) give one space-separated ``v1,`` entry each, newest first."""
    secrets = [secret] if isinstance(secret, str) else list(secret)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(secret_key(s), webhook_id, timestamp, body) for s in secrets),
    }


@dataclass(frozen=True)
class Verified:
    webhook_id: str
    timestamp: int


@dataclass(frozen=True)
class SignedHeaders:
    """The three headers of a delivery, well formed and in the window, not yet checked against the body."""

    webhook_id: str
    timestamp: int
    signatures: tuple[bytes, ...]


class Verifier:
    """Checks deliveries against a list of secrets within a replay window."""

    def __init__(self, secrets: Iterable[str], tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS) -> None:
        self._keys = tuple(secret_key(s) for s in secrets)
        if not self._keys:
            raise ValueError("at least one webhook secret is needed")
        self._tolerance = tolerance_seconds

    def precheck(self, headers: Mapping[str, str], now: float) -> SignedHeaders:
        """The checks that need no body: the three headers present and well formed, the timestamp
        within the window, at least one ``v1`` entry. Raises SignatureError; cheap enough to run
        before a single body byte is read."""
        webhook_id = _header(headers, "webhook-id")
        raw_timestamp = _header(headers, "webhook-timestamp")
        raw_signatures = _header(headers, "webhook-signature")
        if not raw_timestamp.isascii() or not raw_timestamp.isdigit():
            raise SignatureError("webhook-timestamp is not a Unix timestamp")
        timestamp = int(raw_timestamp)
        self._check_window(timestamp, now)
        offered = tuple(entry.encode("ascii") for entry in _v1_entries(raw_signatures))
        if not offered:
            raise SignatureError("webhook-signature has no v1 entry")
        return SignedHeaders(webhook_id=webhook_id, timestamp=timestamp, signatures=offered)

    def _check_window(self, timestamp: int, now: float) -> None:
        if timestamp < now - self._tolerance:
            raise SignatureError("webhook-timestamp is too old")
        if timestamp > now + self._tolerance:
            raise SignatureError("webhook-timestamp is too far in the future")

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> Verified:
        """Return the delivery's id and timestamp, or raise SignatureError (never echoing secrets)."""
        return self.verify_signed(self.precheck(headers, now), body, now)

    def verify_signed(self, signed: SignedHeaders, body: bytes, now: float) -> Verified:
        """``verify`` for headers ``precheck`` already passed: the timestamp is checked against
        the window again (the body may have taken a while), then the HMAC over the raw body."""
        self._check_window(signed.timestamp, now)
        matched = False
        for key in self._keys:
            expected = sign(key, signed.webhook_id, signed.timestamp, body).encode("ascii")
            for entry in signed.signatures:
                # Every secret against every entry, in constant time and without stopping at a
                # match: how long this takes does not tell which secret or entry matched.
                matched |= hmac.compare_digest(expected, entry)
        if matched:
            return Verified(webhook_id=signed.webhook_id, timestamp=signed.timestamp)
        raise SignatureError("no webhook-signature entry matches")


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None or not value.strip():
        raise SignatureError(f"missing {name} header")
    if len(value) > _MAX_HEADER_CHARS:
        raise SignatureError(f"{name} header is too long")
    if not value.isascii() or not value.isprintable():
        raise SignatureError(f"{name} header has characters outside printable ASCII")
    return value.strip()


def _v1_entries(header: str) -> list[str]:
    entries = []
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if version == "v1" and signature:
            entries.append(entry)
    return entries
