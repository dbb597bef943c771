"""Clients of a test Redis by URL, with short timeouts, for tests and benchmarks.

The processes build theirs from the settings (``controller.redis_client.Endpoint``, Sentinel
included); tests that start their own ``redis-server`` only have its URL.
"""

from __future__ import annotations

import redis

from controller.redis_client import Endpoint
from controller.store.pipelined import PipelinedRedis


def connect(url: str, timeout_seconds: float = 3.0) -> redis.Redis:
    """A client of the Redis at ``url`` with short timeouts, so an unreachable Redis becomes a
    quick 503, not a hang (``Endpoint.client``)."""
    return Endpoint(url).client(timeout_seconds)


def connect_async(url: str, timeout_seconds: float = 3.0) -> PipelinedRedis:
    """The receiver's kind of client for the Redis at ``url``: one pipelined connection
    (``store.pipelined``), connected lazily on the event loop that first uses it, with a short
    timeout so an unreachable Redis becomes a quick 503 (``Endpoint.pipelined``)."""
    return Endpoint(url).pipelined(timeout_seconds)
