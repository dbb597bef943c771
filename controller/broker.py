"""The broker transports: kombu's Redis transport (one URL) and its Sentinel transport, where a
channel whose connection is gone fails like a lost connection, and a server that is no longer
the master does too.

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

A role change is the same kind of event. When the master becomes a replica (a failover, or an
operator's ``REPLICAOF``), Redis ends the worker's waiting ``BRPOP`` with ``UNBLOCKED`` and
refuses its writes with ``READONLY``; kombu passes those on as errors Celery does not recover
from, and the worker used to exit. The connections here are ``redis_client``'s, which take
such a reply as a lost connection: Celery reconnects (through the sentinels, to the new master)
and the worker goes on.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from controller.redis_client import (
    MasterConnection,
    MasterSSLConnection,
    SentinelMasterConnection,
    SentinelMasterSSLConnection,
)


class _DetachedIsLost:
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        connection = self.connection  # type: ignore[attr-defined]
        if connection is None or connection.client is None:
            raise redis.ConnectionError("this channel's broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        return params


class Channel(_DetachedIsLost, kombu_redis.Channel):
    connection_class = MasterConnection
    connection_class_ssl = MasterSSLConnection


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(_DetachedIsLost, kombu_redis.SentinelChannel):
    connection_class = SentinelMasterConnection
    connection_class_ssl = SentinelMasterSSLConnection  # type: ignore[assignment]


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
