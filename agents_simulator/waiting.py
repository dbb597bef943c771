"""Loopback ports and bounded polling, shared by ``sandbox-controller dev`` and the tests.

Written once here (the tests import it too); the product package never needs it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """A bounded wait ran out. An ``AssertionError``, so a test waiting on it fails (not errors)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll until ``condition()`` is truthy and return it; raise ``TimedOut`` naming ``what`` after
    ``timeout`` seconds. An exception from ``condition`` counts as "not yet" (the thing is not up)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise TimedOut(f"timed out after {timeout}s waiting for {what} (last error: {last_error!r})")
        time.sleep(interval)
