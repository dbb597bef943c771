"""Standard Webhooks signatures over raw bytes.

Signed content is ``f"{webhook_id}.{timestamp}.".encode() + raw_body``, HMAC-SHA256,
standard base64. A secret ``whsec_<base64>`` is decoded after the prefix; any other
secret is used as its UTF-8 bytes. Either way the key must have at least ``MIN_KEY_BYTES``
(24) bytes, as Standard Webhooks asks (24 to 64 random bytes): an empty or short key (``whsec_``
alone, a truncated file) would let anyone forge deliveries, so it is refused wherever a secret
is taken in. Several secrets may be valid at once (rotation), and
a ``webhook-signature`` header may carry several space-separated ``v1,<sig>`` entries:
a delivery is genuine when any entry matches any secret. Every entry is compared with
every secret's signature (constant-time, no early exit), so timing does not reveal which matched.

``Verifier.precheck`` runs the checks that need no body (headers present and well formed,
timestamp in the window, at least one ``v1`` entry that is the base64 of a 32-byte digest),
so a receiver can refuse a delivery before reading its body;
``Verifier.verify_signed`` then checks the window again and the HMAC over the raw body.

``FileVerifier`` takes its secrets from a file (a mounted Kubernetes Secret) and reads it again
once it has changed (looking at most once a second, when a delivery comes): a rotation that
writes ``NEW,OLD`` into the Secret, and the one that later retires ``OLD``, need no restart of
the receiver. A file it cannot use (not a regular file, unreadable, garbled, a short key)
leaves the last good secrets in use, with a warning and ``on_refused(reason)``.
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

from controller import files, logs
from controller.errors import SignatureError

log = logs.get(__name__)

DEFAULT_TOLERANCE_SECONDS = 300
_PREFIX = "whsec_"
_MAX_HEADER_CHARS = 4096
_DIGEST_CHARS = 44
"""Standard base64 of a 32-byte HMAC-SHA256 digest, padding included."""
_DIGEST_BYTES = hashlib.sha256().digest_size
MIN_KEY_BYTES = 24
"""The shortest HMAC key taken (Standard Webhooks: 24 to 64 random bytes)."""


def secret_key(secret: str) -> bytes:
    """The HMAC key a secret stands for; raises ValueError for a garbled ``whsec_`` secret."""
    if secret.startswith(_PREFIX):
        try:
            return base64.b64decode(secret[len(_PREFIX) :], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("a whsec_ secret must be base64 after its prefix") from exc
    return secret.encode("utf-8")


def key_problem(secret: str) -> str | None:
    """Why ``secret`` cannot sign (never quoting it), or None."""
    try:
        key = secret_key(secret)
    except ValueError:
        return "starts with whsec_ but is not base64"
    if len(key) < MIN_KEY_BYTES:
        form = "after whsec_ decoding" if secret.startswith(_PREFIX) else "as UTF-8"
        return (
            f"has fewer than {MIN_KEY_BYTES} bytes of key material {form}: anyone could guess it "
            f"(use the whsec_ secret `webhook register` or the API gave, 24 to 64 random bytes)"
        )
    return None


def parse_secrets(text: str) -> tuple[list[str], list[str]]:
    """The secrets in ``text`` (separated by commas or lines; blanks skipped) and the problems
    found (by position, never by value): a ``whsec_`` secret that is not base64, or any key
    shorter than ``MIN_KEY_BYTES``, is left out."""
    secrets, problems = [], []
    for position, item in enumerate((s.strip() for s in text.replace("\n", ",").split(",")), start=1):
        if not item:
            continue
        problem = key_problem(item)
        if problem is not None:
            problems.append(f"secret #{position} {problem}")
            continue
        secrets.append(item)
    return secrets, problems


def _keys(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """The HMAC keys of ``secrets``; ValueError (no values quoted) when one cannot sign."""
    keys = []
    for position, secret in enumerate(secrets, start=1):
        problem = key_problem(secret)
        if problem is not None:
            raise ValueError(f"webhook secret #{position} {problem}")
        keys.append(secret_key(secret))
    return tuple(keys)


def sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``v1,<base64>`` entry for one key."""
    return _entry(key, signed_content(webhook_id, timestamp, body)).decode("ascii")


def signed_content(webhook_id: str, timestamp: int, body: bytes) -> bytes:
    return f"{webhook_id}.{timestamp}.".encode() + body


def _entry(key: bytes, content: bytes) -> bytes:
    """``v1,<base64 of HMAC-SHA256>`` (``hmac.digest``: OpenSSL's one-shot HMAC, several times
    cheaper than building an ``hmac.HMAC`` object)."""
    return b"v1," + binascii.b2a_base64(hmac.digest(key, content, "sha256"), newline=False)


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
        self._keys = _keys(secrets)
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
            raise SignatureError("webhook-signature has no v1 entry of a SHA-256 digest in base64")
        return SignedHeaders(webhook_id=webhook_id, timestamp=timestamp, signatures=offered)

    def _check_window(self, timestamp: int, now: float) -> None:
        if timestamp < now - self._tolerance:
            raise SignatureError("webhook-timestamp is too old")
        if timestamp > now + self._tolerance:
            raise SignatureError("webhook-timestamp is too far in the future")

    def verify_signed(self, signed: SignedHeaders, body: bytes, now: float) -> Verified:
        """The delivery's id and timestamp, or SignatureError (never echoing secrets), for headers
        ``precheck`` already passed: the timestamp is checked against the window again (the body
        may have taken a while), then the HMAC over the raw body."""
        self._check_window(signed.timestamp, now)
        self._refresh()
        if self._matches(signed, body):
            return Verified(webhook_id=signed.webhook_id, timestamp=signed.timestamp)
        raise SignatureError("no webhook-signature entry matches")

    def _matches(self, signed: SignedHeaders, body: bytes) -> bool:
        matched = False
        content = signed_content(signed.webhook_id, signed.timestamp, body)
        for key in self._keys:
            expected = _entry(key, content)
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
    delivery costs a clock read more.

    A file that cannot be used leaves the secrets in use as they were, logged (without values)
    and reported as ``on_refused(reason)``: ``not_a_file`` (a FIFO, a directory, a device: read
    without blocking, so the receiver never hangs on one), ``unreadable`` (gone, no permission,
    too large, not UTF-8), ``empty``, or ``invalid`` (a garbled ``whsec_`` secret, or a key
    shorter than ``MIN_KEY_BYTES``: a truncated file must not become a guessable key)."""

    def __init__(
        self,
        path: Path,
        secrets: Iterable[str],
        tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
        min_interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        on_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        super().__init__(secrets, tolerance_seconds)
        self._path = path
        self._stamp = _stamp(path)
        self._min_interval = min_interval
        self._monotonic = monotonic
        self._looked = monotonic()
        self._on_refused = on_refused

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
            secrets, problems = parse_secrets(files.read_small(self._path))
        except files.NotAFile as exc:
            self._refuse("not_a_file", exc.strerror or "not a regular file")
            return
        except OSError as exc:
            self._refuse("unreadable", exc.strerror or type(exc).__name__)
            return
        if problems or not secrets:
            log.warning(
                "the webhook secrets file holds no valid secret list; the secrets in use stay",
                extra={"problems": problems or ["no secret"]},
            )
            self._on_refused("invalid" if problems else "empty")
            return
        logs.redact(secrets)
        self._keys = _keys(secrets)
        log.info("webhook secrets read again", extra={"secrets": len(secrets)})

    def _refuse(self, reason: str, why: str) -> None:
        log.warning(
            "cannot read the webhook secrets file; the secrets in use stay",
            extra={"path": str(self._path), "reason": why},
        )
        self._on_refused(reason)


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
    """The ``v1`` entries that could match: the standard base64 of an HMAC-SHA256 digest (44
    characters, 32 bytes). Any other ``v1`` entry can never equal a signature ``_entry`` makes,
    so a header of only such entries is refused before the body, like a missing one."""
    entries = []
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if version == "v1" and _is_digest(signature):
            entries.append(entry)
    return entries


def _is_digest(signature: str) -> bool:
    if len(signature) != _DIGEST_CHARS:
        return False
    try:  # strict: base64 characters only, padding only at the end (base64's own check is a regex)
        return len(binascii.a2b_base64(signature, strict_mode=True)) == _DIGEST_BYTES
    except (binascii.Error, ValueError):
        return False
