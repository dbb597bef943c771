"""Redis Sentinel and TLS for every kind of client ``redis_client`` makes (redis-py's for the
store, scheduler, metrics and CLI; the receiver's pipelined one; Celery's broker), against real
servers on loopback: a primary, its replica and three ``redis-server --sentinel`` processes,
all with passwords, as the settings name them (``CONTROLLER_REDIS_SENTINELS`` and the rest).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from controller import queue
from controller.config import Settings
from controller.errors import ConfigError, RedisCertificateRefused, RedisPasswordRefused
from controller.inbox import Job
from controller.redis_client import Endpoint
from tests.support.processes import assert_no_process_left, wait_for
from tests.support.redis_server import RedisServer, ReplicatedRedis, Tls

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    servers = ReplicatedRedis(tmp_path / "ha")
    try:
        yield servers.start()
    finally:
        servers.stop()
    assert_no_process_left(tmp_path)


@pytest.fixture
def ha_tls(tmp_path: Path) -> Iterator[ReplicatedRedis]:
    servers = ReplicatedRedis(tmp_path / "ha", tls=Tls.create(tmp_path / "tls"))
    try:
        yield servers.start()
    finally:
        servers.stop()
    assert_no_process_left(tmp_path)


def endpoint(servers: ReplicatedRedis) -> tuple[Settings, Endpoint]:
    settings = Settings.from_env(servers.settings())
    return settings, Endpoint.from_settings(settings.queue)


async def pipelined_write(target: Endpoint, key: str, value: str) -> str:
    client = target.pipelined()
    try:
        write = client.register_script("return redis.call('SET', KEYS[1], ARGV[1])")
        return str(await write(keys=[key], args=[value], replicated=True))
    finally:
        await client.aclose()


def test_every_client_finds_the_master_through_the_sentinels_and_follows_a_failover(ha: ReplicatedRedis) -> None:
    """The primary is SIGKILLed: the sentinels promote the replica, and each client (made before
    the kill, kept across it as a process keeps its clients) writes to the new master; what the
    receiver's client acknowledged before the kill is there."""
    settings, target = endpoint(ha)
    store_client = target.client(timeout_seconds=1)
    publish = queue.publisher(queue.make_app(settings), "test:sentinel-queue")
    receiver = target.pipelined()
    write = receiver.register_script("return redis.call('SET', KEYS[1], ARGV[1])")

    async def receiver_write(key: str, value: str) -> str:
        return str(await write(keys=[key], args=[value], replicated=True))

    loop = asyncio.new_event_loop()
    try:
        store_client.set("sentinel:store", "before")
        publish(Job("sess_before", "", "timer"))
        assert loop.run_until_complete(receiver_write("sentinel:receiver", "before")) == "OK"
        assert ha.master() is ha.primary

        ha.primary.kill()
        wait_for(lambda: ha.sentinels.master_ports() == {ha.replica.port}, 60, "the sentinels to promote the replica")

        wait_for(
            lambda: store_client.set("sentinel:store", "after"), 30, "the store's client to write to the new master"
        )
        wait_for(lambda: publish(Job("sess_after", "", "timer")) or True, 30, "a publish to the new master")
        wait_for(
            lambda: loop.run_until_complete(receiver_write("sentinel:receiver", "after")) == "OK",
            30,
            "the receiver's client to write to the new master",
        )
    finally:
        loop.run_until_complete(receiver.aclose())
        loop.close()
        store_client.close()
    with ha.replica.client(timeout=1) as new_master:
        assert new_master.execute_command("ROLE")[0] == "master"
        assert new_master.get("sentinel:store") == "after"
        assert new_master.get("sentinel:receiver") == "after"
        assert new_master.llen("test:sentinel-queue") == 2  # the job queued before the kill survived


def refused_logins(client: redis.Redis) -> int:
    """How many logins the server refused so far (its ACL log counts each failed AUTH/HELLO)."""
    return sum(int(entry["count"]) for entry in client.execute_command("ACL", "LOG") if entry["reason"] == "auth")


def refused_at_sentinels(servers: ReplicatedRedis) -> int:
    total = 0
    for port in servers.sentinels.ports:
        with servers.sentinels.client(port) as client:
            total += refused_logins(client)
    return total


def test_wrong_passwords_are_refused_at_once_as_a_config_error(ha: ReplicatedRedis) -> None:
    """The sentinels' password and the master's are each checked where they belong, and a wrong
    one is a configuration error (``RedisPasswordRefused``, a ``ConfigError``) naming the
    setting, never the password, raised at the first refusal: each client logs in once (the
    servers' ACL logs count one refused login per client) where redis-py's retries and its walk
    over the sentinels would take the refusal for a lost connection, try again dozens of times
    and report Redis as away (a ``ConnectionError``, ten seconds later). A sentinel that drops
    the connection is not a refusal: both clients reach the master through the next sentinel."""

    def refused_once(target: Endpoint, setting: str, wrong: str, count: Callable[[], int]) -> None:
        for attempt in (
            lambda: target.client(timeout_seconds=1).ping(),
            lambda: asyncio.run(pipelined_write(target, "sentinel:x", "x")),
        ):
            before = count()
            with pytest.raises(RedisPasswordRefused) as refused:
                attempt()
            assert isinstance(refused.value, ConfigError) and refused.value.setting == setting
            assert setting in str(refused.value) and wrong not in str(refused.value)
            assert count() - before == 1

    wrong_sentinel = {**ha.settings(), "CONTROLLER_REDIS_SENTINEL_PASSWORD": "not-the-sentinel-password"}
    target = Endpoint.from_settings(Settings.from_env(wrong_sentinel).queue)
    refused_once(
        target, "CONTROLLER_REDIS_SENTINEL_PASSWORD", "not-the-sentinel-password", lambda: refused_at_sentinels(ha)
    )

    def refused_at_master() -> int:
        with ha.primary.client(timeout=1) as client:
            return refused_logins(client)

    wrong_master = {**ha.settings(), "CONTROLLER_REDIS_URL": "redis://:not-the-password@mymaster/0"}
    target = Endpoint.from_settings(Settings.from_env(wrong_master).queue)
    refused_once(target, "CONTROLLER_REDIS_URL", "not-the-password", refused_at_master)

    # A lost connection is not a refused password: the client goes on to a sentinel that answers.
    # The first sentinel named accepts each connection and closes it at once (a sentinel
    # restarting, a proxy resetting); both clients still reach the master through the next one.
    # How often a client asks the dropping sentinel again first is redis-py's choice (8.1 asked
    # it several times, 8.2 once): the promise is only that it was asked and did not stop them.
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    done = threading.Event()
    accepted = 0

    def reset() -> None:
        nonlocal accepted
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            accepted += 1
            connection.close()

    resetting = threading.Thread(target=reset)
    resetting.start()
    try:
        sentinels = f"127.0.0.1:{listener.getsockname()[1]},{ha.sentinels.addresses}"
        settings = Settings.from_env({**ha.settings(), "CONTROLLER_REDIS_SENTINELS": sentinels})
        dropped = Endpoint.from_settings(settings.queue)
        client = dropped.client(timeout_seconds=1)
        try:
            assert client.ping()
        finally:
            client.close()
        asked_by_the_client = accepted
        assert asyncio.run(pipelined_write(dropped, "sentinel:dropped", "x")) == "OK"
        asked_by_the_pipelined_client = accepted - asked_by_the_client
    finally:
        done.set()
        resetting.join(timeout=10)
        listener.close()
    assert asked_by_the_client >= 1
    assert asked_by_the_pipelined_client >= 1


def test_tls_to_the_sentinels_and_the_master_is_verified_against_the_ca_file(ha_tls: ReplicatedRedis) -> None:
    """``rediss://`` with ``CONTROLLER_REDIS_CA_FILE``: every client speaks TLS to the sentinels
    and the master and checks their certificates against that CA; without it (the system's CAs,
    which never signed the test CA's certificates) the connection is refused at the first
    handshake, as a configuration error naming ``CONTROLLER_REDIS_CA_FILE`` (redis-py's
    retries took it for a lost connection: 11 handshakes at each sentinel, about 12 s)."""
    settings, target = endpoint(ha_tls)
    client = target.client(timeout_seconds=2)
    try:
        client.set("tls:store", "yes")
        assert client.get("tls:store") == "yes"
    finally:
        client.close()
    assert asyncio.run(pipelined_write(target, "tls:receiver", "yes")) == "OK"
    queue.publisher(queue.make_app(settings), "test:tls-queue")(Job("sess_tls", "", "timer"))
    with ha_tls.primary.client(timeout=1) as direct:
        assert direct.llen("test:tls-queue") == 1
        assert direct.get("tls:receiver") == "yes"

    unverified = {k: v for k, v in ha_tls.settings().items() if k != "CONTROLLER_REDIS_CA_FILE"}
    untrusted = Endpoint.from_settings(Settings.from_env(unverified).queue)
    refused = "CONTROLLER_REDIS_CA_FILE: the sentinel at 127.0.0.1:"
    with pytest.raises(RedisCertificateRefused, match=refused):
        untrusted.client(timeout_seconds=2).ping()
    with pytest.raises(RedisCertificateRefused, match=refused):
        asyncio.run(pipelined_write(untrusted, "tls:x", "x"))


def test_tls_without_sentinels_as_a_managed_redis_offers_it(tmp_path: Path) -> None:
    """One ``rediss://`` URL (a managed Redis's primary endpoint) and ``CONTROLLER_REDIS_CA_FILE``:
    the store's client, the receiver's and the broker reach it over TLS, checked against the CA;
    without the CA file the store's and the receiver's clients refuse it (a configuration error
    naming ``CONTROLLER_REDIS_CA_FILE``)."""
    tls = Tls.create(tmp_path / "tls")
    server = RedisServer(tmp_path / "redis", password="tls-test-password", tls=tls).start()
    try:
        settings = Settings.from_env({"CONTROLLER_REDIS_URL": server.url, "CONTROLLER_REDIS_CA_FILE": str(tls.ca_file)})
        target = Endpoint.from_settings(settings.queue)
        client = target.client(timeout_seconds=2)
        try:
            client.set("tls:plain", "yes")
        finally:
            client.close()
        assert asyncio.run(pipelined_write(target, "tls:receiver", "yes")) == "OK"
        queue.publisher(queue.make_app(settings), "test:tls-plain")(Job("sess_tls", "", "timer"))
        with server.client(timeout=1) as direct:
            assert (direct.get("tls:plain"), direct.get("tls:receiver"), direct.llen("test:tls-plain")) == (
                "yes",
                "yes",
                1,
            )
        untrusted = Endpoint.from_settings(Settings.from_env({"CONTROLLER_REDIS_URL": server.url}).queue)
        refused = "CONTROLLER_REDIS_CA_FILE: Redis at 127.0.0.1:"
        with pytest.raises(RedisCertificateRefused, match=refused):
            untrusted.client(timeout_seconds=2).ping()
        with pytest.raises(RedisCertificateRefused, match=refused):
            asyncio.run(pipelined_write(untrusted, "tls:x", "x"))
    finally:
        server.stop()
    assert_no_process_left(tmp_path)
