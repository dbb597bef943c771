"""Every Redis client follows the master, against real redis-servers on loopback (a primary and
its replica): a server that is a replica, or becomes one (``REPLICAOF``, as a failover or an
operator does), is a lost connection, never a place to write.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from controller.redis_client import Endpoint
from controller.store.pipelined import PipelinedRedis
from tests.support.processes import assert_no_process_left, free_port, wait_for
from tests.support.redis_server import RedisServer

WRITE = "return redis.call('SET', KEYS[1], ARGV[1])"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica, in sync."""
    primary = RedisServer(tmp_path / "primary").start()
    replica = RedisServer(tmp_path / "replica", replica_of=primary).start()
    try:
        wait_for(replica.in_sync, 30, "the replica to sync")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()
    assert_no_process_left(tmp_path)


def demote(server: RedisServer) -> None:
    """The server becomes a replica (of an address where nothing listens: it keeps its data)."""
    with server.client(timeout=2) as admin:
        admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))


def promote(server: RedisServer) -> None:
    with server.client(timeout=2) as admin:
        admin.execute_command("REPLICAOF", "NO", "ONE")


@contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """SIGSTOP the server for the block (a replica that stopped answering: a stall, a partition)."""
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.process.pid, signal.SIGCONT)


def test_the_pipelined_client_writes_only_to_the_master(pair: tuple[RedisServer, RedisServer]) -> None:
    """A connection is used once the server says it is the master (``ROLE``): a replica is a
    connection failure (→ 503); a master demoted under an open connection refuses the write
    (``READONLY``), which drops the connection: the commands fail with ConnectionError, the next
    one connects again, and once the server is the master again it is written to."""
    primary, replica = pair

    async def main() -> None:
        to_replica = PipelinedRedis(replica.url)
        with pytest.raises(redis.ConnectionError, match="not the master"):
            await to_replica.ping()
        await to_replica.aclose()
        client = PipelinedRedis(primary.url)
        write = client.register_script(WRITE)
        try:
            assert await write(keys=["roles:k"], args=["one"]) == "OK"
            demote(primary)
            with pytest.raises(redis.ConnectionError, match="no longer the master"):
                await write(keys=["roles:k"], args=["two"])
            with pytest.raises(redis.ConnectionError, match="not the master"):
                await client.ping()  # connects again: still a replica
            promote(primary)
            assert await write(keys=["roles:k"], args=["three"]) == "OK"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert primary.client().get("roles:k") == "three"


def test_the_sync_client_writes_only_to_the_master(pair: tuple[RedisServer, RedisServer]) -> None:
    """redis-py's client as ``redis_client`` makes it (store, scheduler, metrics, CLI): the same."""
    primary, replica = pair
    with pytest.raises(redis.ConnectionError, match="not the master"):
        Endpoint(replica.url).client(timeout_seconds=1).set("roles:sync", "x")
    client = Endpoint(primary.url).client(timeout_seconds=1)
    try:
        client.set("roles:sync", "one")
        demote(primary)
        with pytest.raises(redis.ConnectionError, match="master"):
            client.set("roles:sync", "two")
        promote(primary)
        client.set("roles:sync", "three")
        assert client.get("roles:sync") == "three"
    finally:
        client.close()
