"""The Redis protocol pieces of ``store.pipelined``: commands out, replies in (pure)."""

from __future__ import annotations

import ssl

import pytest
import redis
from redis.asyncio.connection import parse_url
from redis.exceptions import NoScriptError

from controller.store.pipelined import command, parse, tls_context


def test_a_command_is_an_array_of_bulk_strings() -> None:
    assert command("EVALSHA", "ab", 1, "k", 1.5, b"\x00") == (
        b"*6\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n$3\r\n1.5\r\n$1\r\n\x00\r\n"
    )
    assert command("SET", "k", "é") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"


def test_text_that_has_no_utf8_form_is_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        command("GET", "\ud800")


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        (b"+OK\r\n", "OK"),
        (b":42\r\n", 42),
        (b":-1\r\n", -1),
        (b"$5\r\nhello\r\n", "hello"),
        (b"$0\r\n\r\n", ""),
        (b"$-1\r\n", None),
        (b"*-1\r\n", None),
        (b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n+x\r\n", [1, "ab", ["x"]]),
        (b"$4\r\na\r\nb\r\n", "a\r\nb"),
    ],
)
def test_replies_are_parsed_whole(wire: bytes, value: object) -> None:
    assert parse(wire + b"+next\r\n") == (value, len(wire))


@pytest.mark.parametrize(
    "wire", [b"", b"+OK", b":4", b"$5\r\nhel", b"$5\r\nhello", b"*2\r\n:1\r\n", b"*2\r\n:1\r\n$1\r\n"]
)
def test_an_incomplete_reply_waits_for_more(wire: bytes) -> None:
    assert parse(wire) is None


def test_error_replies_are_values_of_redis_error_types() -> None:
    parsed = parse(b"-NOSCRIPT No matching script\r\n")
    assert parsed is not None and isinstance(parsed[0], NoScriptError)
    parsed = parse(b"-WRONGTYPE Operation against a key\r\n")
    assert parsed is not None and type(parsed[0]) is redis.ResponseError
    assert str(parsed[0]) == "WRONGTYPE Operation against a key"


def test_an_unknown_reply_type_is_a_protocol_error() -> None:
    with pytest.raises(redis.InvalidResponse):
        parse(b"%1\r\n")


def test_tls_follows_the_urls_ssl_parameters() -> None:
    """``rediss://`` verifies the server by default; ``ssl_cert_reqs`` (as Celery requires it
    in the URL) relaxes that; anything else is refused rather than guessed."""
    strict = tls_context(parse_url("rediss://:pw@redis.example:6380/0"))
    assert (strict.verify_mode, strict.check_hostname) == (ssl.CERT_REQUIRED, True)
    for given, mode in (("CERT_REQUIRED", ssl.CERT_REQUIRED), ("optional", ssl.CERT_OPTIONAL), ("none", ssl.CERT_NONE)):
        context = tls_context(parse_url(f"rediss://redis.example:6380/0?ssl_cert_reqs={given}"))
        assert context.verify_mode == mode
        assert context.check_hostname is (mode == ssl.CERT_REQUIRED)
    with pytest.raises(ValueError, match="ssl_cert_reqs"):
        tls_context(parse_url("rediss://redis.example/0?ssl_cert_reqs=maybe"))
