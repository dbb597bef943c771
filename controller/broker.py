"""The broker transport: kombu's Redis transport, where a channel whose connection is gone
fails like a lost connection.

Celery 5.7.0 reconnects after a broker outage by letting go of the old connection's transport
first and closing its channels afterwards. Anything that then touches an old channel (putting
its unacknowledged jobs back as it closes, or acknowledging a job that finished after the
reconnect) asks the detached transport for its address and raises ``AttributeError`` ("'NoneType'
object has no attribute 'hostname'"). Celery calls that unrecoverable and the whole worker exits,
so nothing works the queue once Redis is back.

Here such a channel raises ``redis.ConnectionError`` instead, which Celery and kombu already
handle as a lost connection: the close is skipped, the acknowledgement is logged as failed, and
the job stays in the broker's unacked index until the visibility timeout puts it back on the
queue (``queue.make_app``). A job may so run twice; leases and the idempotent session→sandbox
mapping make that harmless, and losing it is not an option.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection is None or self.connection.client is None:
            raise redis.ConnectionError("this channel's broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel
