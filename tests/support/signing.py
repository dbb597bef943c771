"""Checking a whole delivery in one call, as tests want it.

The receiver checks in two steps, ``Verifier.precheck`` on the headers before the body is
read, then ``Verifier.verify_signed`` over the raw body; ``verify`` is the two in a row.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.signing import Verified, Verifier


def verify(verifier: Verifier, headers: Mapping[str, str], body: bytes, now: float) -> Verified:
    """The delivery's id and timestamp, or SignatureError (never echoing secrets)."""
    return verifier.verify_signed(verifier.precheck(headers, now), body, now)
