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

An acknowledgement Redis refuses must still give the worker its credit back. kombu's Redis
transport (5.7.0, ``kombu/transport/redis.py``, ``QoS.ack`` and ``QoS.reject``) removes the
job from the broker's unacked index first and forgets the delivery locally only if that
worked. When the removal fails (the master made a replica: ``READONLY``; or unreachable),
Celery logs "Couldn't ack" (or "Couldn't reject") and goes on, but the channel still counts the
job as one it holds. A worker holds at most ``concurrency`` jobs (``prefetch_multiplier=1``), so
once that many acknowledgements have failed the channel never asks Redis for a job again;
its connection is not broken, so Celery never reconnects either: the worker sits idle until it
is restarted. Here the delivery is forgotten locally whatever Redis answered (``_QoS``): the
job stays in the unacked index, and the visibility timeout puts it back on the queue, as for
any job a worker took and could not acknowledge.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from controller.redis_client import (
    MasterConnection,
    MasterSSLConnection,
    SentinelMasterConnection,
    SentinelMasterSSLConnection,
)


class _QoS(kombu_redis.QoS):
    """kombu's Redis ack emulation, where a delivery is forgotten locally (its prefetch credit
    returned) even when Redis refuses to remove it from the unacked index; the error is raised
    as before (Celery logs it), and the visibility timeout puts the job back on the queue."""

    def ack(self, delivery_tag: str) -> None:
        try:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
        except Exception:
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]
            raise

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]
        except Exception:
            virtual.QoS.ack(self, delivery_tag)  # type: ignore[no-untyped-call]  # forgotten here only
            raise


class _DetachedIsLost:
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        connection = self.connection  # type: ignore[attr-defined]
        if connection is None or connection.client is None:
            raise redis.ConnectionError("this channel's broker connection was closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        return params


class Channel(_DetachedIsLost, kombu_redis.Channel):
    QoS = _QoS
    connection_class = MasterConnection
    connection_class_ssl = MasterSSLConnection


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(_DetachedIsLost, kombu_redis.SentinelChannel):
    QoS = _QoS
    connection_class = SentinelMasterConnection
    connection_class_ssl = SentinelMasterSSLConnection  # type: ignore[assignment]


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel
