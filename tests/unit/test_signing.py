"""Standard Webhooks verification over raw bytes (controller/signing.py)."""

from __future__ import annotations

import base64
import hmac
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from controller import signing
from controller.errors import SignatureError
from controller.signing import Verifier, secret_key, sign, sign_headers
from tests.support.clock import FakeClock
from tests.support.signing import verify

# Standard Webhooks specification test vector.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# The official openai Python SDK's webhook test vector.
OPENAI_SECRET = "whsec_RdvaYFYUXuIFuEbvZHwMfYFhUf7aMYjYcmM24+Aj40c="
OPENAI_ID = "wh_685c059ae39c8190af8c71ed1022a24d"
OPENAI_TIMESTAMP = 1750861210
OPENAI_BODY = (
    b'{"id": "evt_685c059ae3a481909bdc86819b066fb6", "object": "event", "created_at": 1750861210, '
    b'"type": "response.completed", "data": {"id": "resp_123"}}'
)
OPENAI_SIGNATURE = "v1,gUAg4R2hWouRZqRQG4uJypNS8YK885G838+EHb4nKBY="

OLD_SECRET = "whsec_" + base64.b64encode(b"the old signing secret, 32 bytes").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"the new signing secret, 32 bytes").decode()


def headers(webhook_id: str, timestamp: int | str, signature: str) -> dict[str, str]:
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


def spec_headers(**overrides: str) -> dict[str, str]:
    return {**headers(SPEC_ID, SPEC_TIMESTAMP, SPEC_SIGNATURE), **overrides}


def test_standard_webhooks_vector() -> None:
    """L3: the Standard Webhooks specification's vector verifies."""
    verified = verify(Verifier([SPEC_SECRET]), spec_headers(), SPEC_BODY, now=SPEC_TIMESTAMP)
    assert (verified.webhook_id, verified.timestamp) == (SPEC_ID, SPEC_TIMESTAMP)
    assert sign(secret_key(SPEC_SECRET), SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_openai_sdk_vector() -> None:
    """L3: the official openai SDK's vector verifies."""
    delivery = headers(OPENAI_ID, OPENAI_TIMESTAMP, OPENAI_SIGNATURE)
    verified = verify(Verifier([OPENAI_SECRET]), delivery, OPENAI_BODY, now=OPENAI_TIMESTAMP)
    assert (verified.webhook_id, verified.timestamp) == (OPENAI_ID, OPENAI_TIMESTAMP)
    assert sign_headers(OPENAI_SECRET, OPENAI_ID, OPENAI_TIMESTAMP, OPENAI_BODY) == delivery


@pytest.mark.parametrize("signer", [OLD_SECRET, NEW_SECRET])
def test_rotation_accepts_old_and_new_secret(signer: str) -> None:
    """L3: during rotation a delivery signed with either configured secret verifies."""
    delivery = sign_headers(signer, "msg_rot", 1_700_000_000, b"{}")
    verify(Verifier([OLD_SECRET, NEW_SECRET]), delivery, b"{}", now=1_700_000_000)


@pytest.mark.parametrize(
    "entries",
    [
        ["old", "new"],
        ["bogus", "new"],
        ["v2,abc", "bogus", "", "old"],
        ["new", "v1a,zzz"],
    ],
)
def test_rotation_header_with_several_entries(entries: list[str]) -> None:
    """L3: any matching entry of a space-separated signature list is enough."""
    body, ts = b'{"a": 1}', 1_700_000_000
    known = {
        "old": sign(secret_key(OLD_SECRET), "msg_multi", ts, body),
        "new": sign(secret_key(NEW_SECRET), "msg_multi", ts, body),
        "bogus": "v1," + base64.b64encode(b"x" * 32).decode(),
    }
    header = " ".join(known.get(entry, entry) for entry in entries)
    verify(Verifier([OLD_SECRET, NEW_SECRET]), headers("msg_multi", ts, header), body, now=TS)


@pytest.mark.parametrize("first", ["old", "new"])
def test_every_entry_is_compared_with_every_secret_even_after_a_match(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L3: the comparison does not stop at the first match (its time does not tell which matched)."""
    body, ts = b'{"a": 1}', 1_700_000_000
    old, new = (sign(secret_key(s), "msg_multi", ts, body) for s in (OLD_SECRET, NEW_SECRET))
    header = " ".join([old, new] if first == "old" else [new, old])
    compared: list[bool] = []
    real_compare = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append(real_compare(a, b))
        return compared[-1]

    monkeypatch.setattr(signing.hmac, "compare_digest", compare_digest)
    verify(Verifier([OLD_SECRET, NEW_SECRET]), headers("msg_multi", ts, header), body, now=TS)
    assert len(compared) == 4  # two secrets × two entries
    assert compared.count(True) == 2


def test_header_of_only_wrong_entries_rejected() -> None:
    """L3: several entries, none of them matching, is still a rejection."""
    body, ts = b'{"a": 1}', 1_700_000_000
    header = " ".join(sign(key, "msg_multi", ts, body) for key in (b"k1", b"k2", b"k3"))
    with pytest.raises(SignatureError):
        verify(Verifier([OLD_SECRET, NEW_SECRET]), headers("msg_multi", ts, header), body, now=TS)


def test_retired_secret_is_rejected() -> None:
    """L3: once the old secret is removed, its signatures no longer verify."""
    delivery = sign_headers(OLD_SECRET, "msg_old", 1_700_000_000, b"{}")
    with pytest.raises(SignatureError):
        verify(Verifier([NEW_SECRET]), delivery, b"{}", now=1_700_000_000)


@pytest.mark.parametrize("age", [-300, -1, 0, 1, 300])
def test_window_edges_accepted(age: int) -> None:
    """L3: timestamps up to exactly 300 s old or 300 s ahead are accepted."""
    clock = FakeClock(SPEC_TIMESTAMP)
    clock.advance(age)
    verify(Verifier([SPEC_SECRET], tolerance_seconds=300), spec_headers(), SPEC_BODY, now=clock.now())


@pytest.mark.parametrize("age", [-301, 301, -86_400, 86_400])
def test_window_edges_rejected(age: int) -> None:
    """L3: a timestamp 301 s or more away from now is stale (or from the future) and rejected."""
    clock = FakeClock(SPEC_TIMESTAMP)
    clock.advance(age)
    with pytest.raises(SignatureError, match=r"too old|future"):
        verify(Verifier([SPEC_SECRET], tolerance_seconds=300), spec_headers(), SPEC_BODY, now=clock.now())


@pytest.mark.parametrize(
    "body",
    [b'{"test": 2432232315}', b'{"test":2432232314}', SPEC_BODY + b" ", SPEC_BODY + b"\n", b""],
)
def test_tampered_body_rejected(body: bytes) -> None:
    """L3: the raw bytes are verified; any change (even whitespace) fails."""
    with pytest.raises(SignatureError):
        verify(Verifier([SPEC_SECRET]), spec_headers(), body, now=SPEC_TIMESTAMP)


def test_tampered_id_or_timestamp_rejected() -> None:
    """L3: id and timestamp are part of the signed content."""
    verifier = Verifier([SPEC_SECRET])
    with pytest.raises(SignatureError):
        verify(verifier, spec_headers(**{"webhook-id": SPEC_ID + "x"}), SPEC_BODY, now=SPEC_TIMESTAMP)
    with pytest.raises(SignatureError):
        verify(verifier, spec_headers(**{"webhook-timestamp": str(SPEC_TIMESTAMP + 1)}), SPEC_BODY, now=SPEC_TIMESTAMP)


def test_plain_secret_used_as_utf8_bytes() -> None:
    """L3: a secret without the whsec_ prefix is its UTF-8 bytes."""
    secret = "a plain shared secret ✓"
    assert secret_key(secret) == secret.encode("utf-8")
    delivery = sign_headers(secret, "msg_plain", 1_700_000_000, b"{}")
    assert delivery["webhook-signature"] == sign(secret.encode("utf-8"), "msg_plain", 1_700_000_000, b"{}")
    verify(Verifier([secret]), delivery, b"{}", now=1_700_000_000)
    # The same key bytes written as a whsec_ secret verify the same delivery.
    verify(Verifier(["whsec_" + base64.b64encode(secret.encode()).decode()]), delivery, b"{}", now=1_700_000_000)


def test_plain_secret_is_not_base64_decoded() -> None:
    """L3: without the whsec_ prefix, even base64-looking text is used verbatim."""
    plain = SPEC_SECRET.removeprefix("whsec_")
    with pytest.raises(SignatureError):
        verify(Verifier([plain]), spec_headers(), SPEC_BODY, now=SPEC_TIMESTAMP)


def test_whsec_secret_is_base64_decoded_not_used_verbatim() -> None:
    """L3: a whsec_ secret is never used as its literal text."""
    delivery = headers(SPEC_ID, SPEC_TIMESTAMP, sign(SPEC_SECRET.encode(), SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY))
    with pytest.raises(SignatureError):
        verify(Verifier([SPEC_SECRET]), delivery, SPEC_BODY, now=SPEC_TIMESTAMP)


@pytest.mark.parametrize(
    "broken",
    [
        {"webhook-id": None},
        {"webhook-timestamp": None},
        {"webhook-signature": None},
        {"webhook-id": ""},
        {"webhook-id": "   "},
        {"webhook-timestamp": ""},
        {"webhook-timestamp": "soon"},
        {"webhook-timestamp": "-1614265330"},
        {"webhook-timestamp": "1614265330.0"},
        {"webhook-timestamp": "0x603a4f72"},
        {"webhook-timestamp": "١٦١٤٢٦٥٣٣٠"},  # Arabic-Indic digits: isdigit() but not ASCII
        {"webhook-timestamp": "9" * 5000},
        {"webhook-signature": ""},
        {"webhook-signature": "v1,"},
        {"webhook-signature": "v1"},
        {"webhook-signature": "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
        {"webhook-signature": "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
        {"webhook-signature": "v1,not base64 at all"},
        {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"},
        {"webhook-signature": SPEC_SIGNATURE + "é"},
        {"webhook-signature": SPEC_SIGNATURE.replace(",", ",\x00")},
        {"webhook-signature": (SPEC_SIGNATURE + " ") * 200},
        {"webhook-id": SPEC_ID + "\n"},
        {"webhook-id": "msg_é"},
    ],
)
def test_garbled_headers_rejected(broken: dict[str, str | None]) -> None:
    """L3: missing, empty, non-numeric, non-ASCII, oversized or malformed headers are rejected (401)."""
    delivery: dict[str, str] = {k: v for k, v in {**spec_headers(), **broken}.items() if v is not None}
    with pytest.raises(SignatureError) as caught:
        verify(Verifier([SPEC_SECRET]), delivery, SPEC_BODY, now=SPEC_TIMESTAMP)
    assert caught.value.status_code == 401
    assert SPEC_SECRET not in str(caught.value)
    assert SPEC_SIGNATURE.partition(",")[2] not in str(caught.value)


def test_verifier_needs_a_valid_secret() -> None:
    """L3: no secret, or a whsec_ secret that is not base64, is a configuration error."""
    with pytest.raises(ValueError):
        Verifier([])
    with pytest.raises(ValueError):
        Verifier(["whsec_not*base64"])


@pytest.mark.parametrize(
    "broken",
    [
        {"webhook-id": None},
        {"webhook-timestamp": None},
        {"webhook-signature": None},
        {"webhook-id": "   "},
        {"webhook-timestamp": "soon"},
        {"webhook-timestamp": "١٦١٤٢٦٥٣٣٠"},
        {"webhook-timestamp": "9" * 5000},
        {"webhook-timestamp": str(SPEC_TIMESTAMP - 301)},
        {"webhook-timestamp": str(SPEC_TIMESTAMP + 301)},
        {"webhook-signature": "v1,"},
        {"webhook-signature": "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="},
        {"webhook-signature": "v1," + "A" * 5000},
        {"webhook-signature": "v1,not base64 at all"},
        {"webhook-signature": "v1,AAAA v2,zzz"},
        {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"},  # padding cut
        {"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1O*="},
        {"webhook-signature": "v1," + "A" * 64},  # base64, but not of 32 bytes
        {"webhook-id": "msg_é"},
    ],
)
def test_precheck_refuses_without_a_body(broken: dict[str, str | None]) -> None:
    """L3: what can be told from the headers alone (missing, garbled, oversized, outside the
    window, no v1 entry that is the base64 of a SHA-256 digest) is refused by the pre-check,
    exactly as verify refuses it."""
    delivery: dict[str, str] = {k: v for k, v in {**spec_headers(), **broken}.items() if v is not None}
    verifier = Verifier([SPEC_SECRET])
    with pytest.raises(SignatureError) as early:
        verifier.precheck(delivery, now=SPEC_TIMESTAMP)
    with pytest.raises(SignatureError) as late:
        verify(verifier, delivery, SPEC_BODY, now=SPEC_TIMESTAMP)
    assert str(early.value) == str(late.value)


def test_precheck_passes_well_formed_headers_it_cannot_verify() -> None:
    """L3: the pre-check is no verification: a well-formed entry that matches nothing passes it
    (only the body can tell) and is refused by verify."""
    other = "v1," + "A" * 43 + "="  # the base64 of a 32-byte digest, of no secret's
    delivery = spec_headers(**{"webhook-signature": f"{other} v1,AAAA v2,zzz " + SPEC_SIGNATURE})
    verifier = Verifier([SPEC_SECRET])
    signed = verifier.precheck(delivery, now=SPEC_TIMESTAMP + 300)
    assert (signed.webhook_id, signed.timestamp) == (SPEC_ID, SPEC_TIMESTAMP)
    assert signed.signatures == (other.encode(), SPEC_SIGNATURE.encode())  # v1,AAAA can never match: dropped
    forged = spec_headers(**{"webhook-signature": other})
    verifier.precheck(forged, now=SPEC_TIMESTAMP)
    with pytest.raises(SignatureError, match="no webhook-signature entry matches"):
        verify(verifier, forged, SPEC_BODY, now=SPEC_TIMESTAMP)


# -- secrets from a file that a rotation rewrites ------------------------------------------------


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _swap(directory: Path, name: str, text: str) -> None:
    """Rewrite ``name`` as the kubelet updates a mounted Secret: the new content in a fresh
    directory, then an atomic swap of the ``..data`` symlink the file's own symlink goes through."""
    fresh = directory / f"..{len(list(directory.iterdir()))}"
    fresh.mkdir()
    (fresh / name).write_text(text)
    (directory / "..data_tmp").symlink_to(fresh.name)
    (directory / "..data_tmp").rename(directory / "..data")
    if not (directory / name).is_symlink():
        (directory / name).symlink_to(f"..data/{name}")


TS = 1_700_000_000
SIGNED_NEW = sign_headers(NEW_SECRET, "msg_new", TS, b"{}")


def _on_old_secret(directory: Path) -> tuple[signing.FileVerifier, Ticks]:
    """A receiver's verifier reading ``directory/secrets``, which holds the old secret."""
    _swap(directory, "secrets", OLD_SECRET)
    ticks = Ticks()
    return signing.FileVerifier(directory / "secrets", [OLD_SECRET], monotonic=ticks), ticks


def test_a_rotated_secrets_file_is_read_again_when_a_delivery_matches_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """L3: the receiver reads its mounted secrets file again once it has changed (the delivery
    that comes a second or more after the last look): a rotation (NEW,OLD written into the
    Secret) and its end (OLD retired) need no restart; the log names counts, never values."""
    caplog.set_level(logging.INFO, logger="controller.signing")
    verifier, ticks = _on_old_secret(tmp_path)
    ticks.now += 5
    with pytest.raises(SignatureError):
        verify(verifier, SIGNED_NEW, b"{}", now=TS)  # the file has not changed: still refused

    _swap(tmp_path, "secrets", f"{NEW_SECRET},{OLD_SECRET}")
    ticks.now += 1
    assert verify(verifier, SIGNED_NEW, b"{}", now=TS).webhook_id == "msg_new"
    assert verify(verifier, sign_headers(OLD_SECRET, "msg_old", TS, b"{}"), b"{}", now=TS).webhook_id == "msg_old"
    assert any(r.getMessage() == "webhook secrets read again" and r.secrets == 2 for r in caplog.records)
    assert NEW_SECRET not in caplog.text and OLD_SECRET not in caplog.text

    _swap(tmp_path, "secrets", NEW_SECRET)  # the rotation finished: the old secret is retired
    ticks.now += 1
    with pytest.raises(SignatureError):
        verify(verifier, sign_headers(OLD_SECRET, "msg_old2", TS, b"{}"), b"{}", now=TS)
    assert verify(verifier, SIGNED_NEW, b"{}", now=TS).webhook_id == "msg_new"


def test_a_secrets_file_is_looked_at_most_once_a_second_and_a_bad_one_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Deliveries look at the file at most once a second (a change within the second waits for
    the next look); a file that is garbled, empty or gone leaves the secrets in use as they
    were (a warning, no values)."""
    verifier, ticks = _on_old_secret(tmp_path)
    ticks.now += 1
    with pytest.raises(SignatureError):
        verify(verifier, SIGNED_NEW, b"{}", now=TS)  # looked: unchanged
    _swap(tmp_path, "secrets", NEW_SECRET)
    with pytest.raises(SignatureError):
        verify(verifier, SIGNED_NEW, b"{}", now=TS)  # changed, but looked less than a second ago
    ticks.now += 1
    assert verify(verifier, SIGNED_NEW, b"{}", now=TS).webhook_id == "msg_new"

    signed_third = sign_headers(OLD_SECRET, "msg_third", TS, b"{}")
    for bad in ("whsec_not base64!", "  ,\n"):
        _swap(tmp_path, "secrets", bad)
        ticks.now += 1
        with pytest.raises(SignatureError):
            verify(verifier, signed_third, b"{}", now=TS)
        assert verify(verifier, SIGNED_NEW, b"{}", now=TS).webhook_id == "msg_new"  # kept
    (tmp_path / "secrets").unlink()
    ticks.now += 1
    with pytest.raises(SignatureError):
        verify(verifier, signed_third, b"{}", now=TS)
    assert verify(verifier, SIGNED_NEW, b"{}", now=TS).webhook_id == "msg_new"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3 and all("the secrets in use stay" in w for w in warnings)
    assert "not base64!" not in caplog.text


# -- weak secrets are refused ------------------------------------------------------------------

SHORT = [
    "whsec_",  # an empty HMAC key: anyone can sign with it
    "wh",  # a truncated file
    "whsec_" + base64.b64encode(b"x" * 23).decode(),  # one byte short, whsec_ form
    "y" * 23,  # one byte short, plain form
]


@pytest.mark.parametrize("short", SHORT)
def test_a_key_shorter_than_24_bytes_is_refused_by_name_never_by_value(short: str) -> None:
    """L3: Standard Webhooks asks for 24 to 64 random bytes: a shorter key (after whsec_
    decoding, or as plain UTF-8) is refused wherever a secret is taken in, and the problem
    never quotes it."""
    secrets, problems = signing.parse_secrets(f"{NEW_SECRET},{short}")
    assert secrets == [NEW_SECRET]
    assert len(problems) == 1 and problems[0].startswith("secret #2 has fewer than 24 bytes of key material")
    with pytest.raises(ValueError, match="fewer than 24 bytes") as raised:
        Verifier([NEW_SECRET, short])
    if len(short) > 6:
        assert short not in problems[0] and short not in str(raised.value)


def test_a_key_of_exactly_24_bytes_is_taken() -> None:
    """L3: the bound is inclusive, in both forms."""
    for secret in ("whsec_" + base64.b64encode(b"k" * 24).decode(), "p" * 24):
        assert signing.parse_secrets(secret) == ([secret], [])
        Verifier([secret])


def _refusals(tmp_path: Path) -> tuple[signing.FileVerifier, Ticks, list[str]]:
    _swap(tmp_path, "secrets", OLD_SECRET)
    ticks, refused = Ticks(), []
    verifier = signing.FileVerifier(tmp_path / "secrets", [OLD_SECRET], monotonic=ticks, on_refused=refused.append)
    return verifier, ticks, refused


@pytest.mark.parametrize("short", ["whsec_", "wh"])
def test_a_secrets_file_truncated_to_a_short_key_keeps_the_last_good_secret(
    tmp_path: Path, short: str, caplog: pytest.LogCaptureFixture
) -> None:
    """L3: a secrets file truncated to ``whsec_`` or ``wh`` is not taken up: the genuine secret
    still verifies, a delivery forged with the short key is refused, and the refusal is a
    warning and ``on_refused("invalid")`` (the receiver's metric)."""
    verifier, ticks, refused = _refusals(tmp_path)
    _swap(tmp_path, "secrets", short)
    ticks.now += 1
    forged_key = secret_key(short)
    forged = headers("msg_forged", TS, sign(forged_key, "msg_forged", TS, b"{}"))
    with pytest.raises(SignatureError):
        verify(verifier, forged, b"{}", now=TS)
    assert verify(verifier, sign_headers(OLD_SECRET, "msg_ok", TS, b"{}"), b"{}", now=TS).webhook_id == "msg_ok"
    assert refused == ["invalid"]
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "the secrets in use stay" in warning.getMessage()


def _bounded(call: Callable[[], object]) -> None:
    """Run ``call`` in a thread; fail (instead of hanging the suite) if it blocks for 5 s."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (call(), done.set()), daemon=True)
    thread.start()
    assert done.wait(5), "blocked on the secrets path"


@pytest.mark.parametrize("make", ["fifo", "directory"])
def test_a_secrets_path_that_is_not_a_regular_file_is_refused_without_blocking(
    tmp_path: Path, make: str, caplog: pytest.LogCaptureFixture
) -> None:
    """L3: a FIFO (which would block a reader until something writes to it) or a directory put
    where the secrets file was is refused at once, as ``not_a_file``; the last good secret stays."""
    verifier, ticks, refused = _refusals(tmp_path)
    target = tmp_path / "..data" / "secrets"
    target.unlink()
    os.mkfifo(target) if make == "fifo" else target.mkdir()
    ticks.now += 1
    ok = sign_headers(OLD_SECRET, "msg_ok", TS, b"{}")
    _bounded(lambda: verify(verifier, ok, b"{}", now=TS))
    assert refused == ["not_a_file"]
    assert any("not a regular file" in str(getattr(r, "reason", "")) for r in caplog.records)
    assert verify(verifier, ok, b"{}", now=TS).webhook_id == "msg_ok"
