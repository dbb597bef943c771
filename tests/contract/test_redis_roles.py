"""Every Redis client follows the master, against real redis-servers on loopback (a primary and
its replica): a server that is a replica, or becomes one (``REPLICAOF``, as a failover or an
operator does), is a lost connection, never a place to write; and a delivery the receiver
acknowledges is on a replica first (``WAIT``), so a failover cannot lose it.
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

from controller.errors import StoreUnavailable
from controller.inbox import Job, Outcome
from controller.redis_client import Endpoint
from controller.store.pipelined import PipelinedRedis, ReplicaTimeout
from controller.store.redis import RedisInbox
from tests.support.processes import assert_no_process_left, free_port
from tests.support.redis_server import RedisServer, start_in_sync

WRITE = "return redis.call('SET', KEYS[1], ARGV[1])"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its replica, in sync."""
    primary = RedisServer(tmp_path / "primary").start()
    replica = RedisServer(tmp_path / "replica", replica_of=primary)
    try:
        start_in_sync(replica)
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


def test_a_replicated_write_returns_once_a_replica_has_it(pair: tuple[RedisServer, RedisServer]) -> None:
    """L5: with a replica attached, ``replicated`` returns only once the write is on it; while the
    replica does not answer, it fails at the bound (``ReplicaTimeout``, a 503; not the
    connection's timeout, which would close it) though the master took the write; without a
    replica (stopped: the master drops it) there is nothing to wait for and it succeeds."""
    primary, replica = pair

    async def main() -> None:
        client = PipelinedRedis(primary.url, timeout_seconds=3.0, replica_timeout_seconds=1.0)
        write = client.register_script(WRITE)
        try:
            assert await write(keys=["roles:w"], args=["one"], replicated=True) == "OK"
            with replica.client(timeout=1) as on_replica:
                assert on_replica.get("roles:w") == "one"  # there already: no wait needed to see it
            with paused(replica):
                with pytest.raises(ReplicaTimeout):
                    await write(keys=["roles:w"], args=["two"], replicated=True)
                assert await write(keys=["roles:w"], args=["three"]) == "OK"  # the same connection carries on
            replica.stop()
            await asyncio.sleep(1.2)  # the master's word on its replicas is at most a second old
            assert await write(keys=["roles:w"], args=["four"], replicated=True) == "OK"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert primary.client().get("roles:w") == "four"


def test_a_duplicate_is_acknowledged_only_once_the_first_delivery_is_on_a_replica(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    """L5: one receiver queued a delivery but no replica confirmed it (503: the sender retries);
    the retry reaches another receiver, where it is a duplicate. That 2xx is a promise too:
    it waits for the replica, so it fails as well while the replica cannot confirm the first
    delivery's writes, and succeeds once it can."""
    primary, replica = pair
    job = Job("sess_dup", "msg_dup", "agent.session.action_required")

    async def main() -> None:
        first = RedisInbox(PipelinedRedis(primary.url, replica_timeout_seconds=1.0), "roles:queue", 3600)
        second = RedisInbox(PipelinedRedis(primary.url, replica_timeout_seconds=1.0), "roles:queue", 3600)
        assert await second.ready()  # the second receiver's connection exists (it wrote nothing yet)
        try:
            # A delivery before: on the replica, which has confirmed everything up to it.
            assert await first.submit(Job("sess_before", "msg_before", "agent.session.action_required"))
            with paused(replica):
                with pytest.raises(StoreUnavailable):
                    await first.submit(job)
                with pytest.raises(StoreUnavailable):
                    await second.submit(job)
            assert await second.submit(job) is Outcome.DUPLICATE
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())
    with replica.client(timeout=1) as on_replica:
        assert on_replica.llen("roles:queue") == 2


def test_a_server_writing_its_first_append_only_file_is_stopped_not_killed(tmp_path: Path) -> None:
    """Test support: Redis drops a SIGTERM that comes while it writes its first append-only file
    ("Writing initial AOF, can't exit"), as a replica does just after a full sync (the pair
    above, when a test ends right after one); ``RedisServer.stop`` sends it again until the
    server exits by itself, never waiting out the 10 s before a SIGKILL. The rewrite is held
    (``rdb-key-save-delay``: 5 s a key, one key; the SIGTERM to the group ends the child's
    sleep) so that the first SIGTERM certainly comes while it runs."""
    server = RedisServer(tmp_path / "redis").start()
    assert server.process is not None
    try:
        with server.client(timeout=2) as admin:
            admin.set("roles:aof", "kept")
            admin.config_set("rdb-key-save-delay", 5_000_000)
            admin.config_set("appendonly", "no")
            admin.config_set("appendonly", "yes")  # its first append-only file, again
        server.stop()
    finally:
        server.process.kill()
    assert "Writing initial AOF, can't exit" in server.process.output()  # the first SIGTERM was dropped
    assert server.process.proc is not None and server.process.proc.returncode == 0  # exited by itself
