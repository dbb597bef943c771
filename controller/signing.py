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

``FileVerifier`` takes its secrets from a file (a mounted Kubernetes Secret) and reads it again
once it has changed (looking at most once a second, when a delivery comes): a rotation that
writes ``NEW,OLD`` into the Secret, and the one that later retires ``OLD``, need no restart of
the receiver.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controller import logs
from controller.errors import SignatureError

log = logs.get(__name__)

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


def parse_secrets(text: str) -> tuple[list[str], list[str]]:
    """The secrets in ``text`` (separated by commas or lines; blanks skipped) and the problems
    found (by position, never by value): a ``whsec_`` secret that is not base64 is left out."""
    secrets, problems = [], []
    for position, item in enumerate((s.strip() for s in text.replace("\n", ",").split(",")), start=1):
        if not item:
            continue
        try:
            secret_key(item)
        except ValueError:
            problems.append(f"secret #{position} starts with whsec_ but is not base64")
            continue
        secrets.append(item)
    return secrets, problems


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
        self._refresh()
        if self._matches(signed, body):
            return Verified(webhook_id=signed.webhook_id, timestamp=signed.timestamp)
        raise SignatureError("no webhook-signature entry matches")

    def _matches(self, signed: SignedHeaders, body: bytes) -> bool:
        matched = False
        for key in self._keys:
            expected = sign(key, signed.webhook_id, signed.timestamp, body).encode("ascii")
            for entry in signed.signatures:
                # Every secret against every entry, in constant time and without stopping at a
                # match: how long this takes does not tell which secret or entry matched.
                matched |= hmac.compare_digest(expected, entry)
        return matched

    def _refresh(self) -> None:
        """Take up changed secrets (never here: they were given)."""


class FileVerifier(Verifier):
    """A ``Verifier`` whose secrets live in a file that may be rewritten (a mounted Secret: the
    kubelet swaps the file in place within about a minute of the Secret's change).

    A delivery that comes ``min_interval`` seconds or more after the last look has a look at the
    file (a ``stat``); only when it changed since it was last read (its inode, size or
    modification time) is it read again, before that delivery is checked. So a new secret is
    accepted, and a retired one refused, within a second of the file's change; between looks a
    delivery costs a clock read more. A file that cannot be read or holds no valid secret
    leaves the secrets in use as they were (logged, without values)."""

    def __init__(
        self,
        path: Path,
        secrets: Iterable[str],
        tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
        min_interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(secrets, tolerance_seconds)
        self._path = path
        self._stamp = _stamp(path)
        self._min_interval = min_interval
        self._monotonic = monotonic
        self._looked = monotonic()

    def _refresh(self) -> None:
        now = self._monotonic()
        if now - self._looked < self._min_interval:
            return
        self._looked = now
        stamp = _stamp(self._path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            secrets, problems = parse_secrets(self._path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("cannot read the webhook secrets file; the secrets in use stay", extra={"reason": str(exc)})
            return
        if problems or not secrets:
            log.warning(
                "the webhook secrets file holds no valid secret list; the secrets in use stay",
                extra={"problems": problems or ["no secret"]},
            )
            return
        logs.redact(secrets)
        self._keys = tuple(secret_key(s) for s in secrets)
        log.info("webhook secrets read again", extra={"secrets": len(secrets)})


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten or swapped (the kubelet swaps a symlink)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


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
