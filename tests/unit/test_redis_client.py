"""``redis_client.Endpoint``: one URL or a Sentinel set, with TLS, turned into each kind of client
(nothing is dialled: clients connect lazily; the contract and system tests connect for real)."""

from __future__ import annotations

import ssl
from pathlib import Path

from redis.sentinel import SentinelConnectionPool

from controller import queue
from controller.config import PREFIX, Settings
from controller.redis_client import (
    Endpoint,
    MasterConnection,
    MasterSSLConnection,
    MasterUnixConnection,
    SentinelMasterConnection,
    SentinelMasterSSLConnection,
)


def endpoint(**values: str) -> Endpoint:
    return Endpoint.from_settings(Settings.from_env({PREFIX + k: v for k, v in values.items()}).queue)


def test_one_url_gives_clients_that_follow_the_master(tmp_path: Path) -> None:
    plain = endpoint(REDIS_URL="redis://:pw@redis.internal:6380/3")
    pool = plain.client().connection_pool
    assert pool.connection_class is MasterConnection
    assert (pool.connection_kwargs["host"], pool.connection_kwargs["port"], pool.connection_kwargs["db"]) == (
        "redis.internal",
        6380,
        3,
    )
    assert plain.broker() == {
        "broker_url": "redis://:pw@redis.internal:6380/3",
        "broker_transport": "controller.broker:Transport",
        "transport_options": {},
    }
    assert (
        endpoint(REDIS_URL="unix:///run/redis.sock").client().connection_pool.connection_class is MasterUnixConnection
    )


def test_tls_verifies_against_the_ca_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    tls = endpoint(REDIS_URL="rediss://:pw@redis.internal:6380/0", REDIS_CA_FILE=str(ca))
    pool = tls.client().connection_pool
    assert pool.connection_class is MasterSSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    broker = tls.broker()
    assert broker["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    # Without a CA file: the system's CAs, and still verified (kombu's own default is CERT_NONE).
    assert endpoint(REDIS_URL="rediss://redis.internal:6380/0").broker()["broker_use_ssl"] == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED
    }


def test_a_sentinel_set_names_the_master_for_every_client(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    sentinels = endpoint(
        REDIS_URL="rediss://:p%40ss@mymaster/2",
        REDIS_SENTINELS="10.0.0.1:26379,[fd00::3]:26381",
        REDIS_SENTINEL_PASSWORD="sentinel-pw",
        REDIS_CA_FILE=str(ca),
    )
    client = sentinels.client()
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster"
    assert pool.connection_class is SentinelMasterSSLConnection
    assert (pool.connection_kwargs["password"], pool.connection_kwargs["db"]) == ("p@ss", 2)
    [first, _] = pool.sentinel_manager.sentinels
    asked = first.connection_pool.connection_kwargs
    assert (asked["host"], asked["port"], asked["password"], asked["ssl_ca_certs"]) == (
        "10.0.0.1",
        26379,
        "sentinel-pw",
        str(ca),
    )
    broker = sentinels.broker()
    assert broker["broker_url"] == "sentinel://:p%40ss@10.0.0.1:26379/2;sentinel://:p%40ss@[fd00::3]:26381/2"
    assert broker["broker_transport"] == "controller.broker:SentinelTransport"
    assert broker["transport_options"]["master_name"] == "mymaster"
    assert broker["transport_options"]["sentinel_kwargs"]["password"] == "sentinel-pw"
    plain = endpoint(REDIS_URL="redis://:pw@mymaster/0", REDIS_SENTINELS="s:26379").client()
    assert plain.connection_pool.connection_class is SentinelMasterConnection


def test_the_celery_app_takes_its_broker_from_the_endpoint() -> None:
    settings = Settings.from_env(
        {
            PREFIX + "REDIS_URL": "redis://:pw@mymaster/0",
            PREFIX + "REDIS_SENTINELS": "127.0.0.1:26379",
            PREFIX + "QUEUE_VISIBILITY_TIMEOUT_SECONDS": "40",
        }
    )
    conf = queue.make_app(settings).conf
    assert conf.broker_url == "sentinel://:pw@127.0.0.1:26379/0"
    assert conf.broker_transport == "controller.broker:SentinelTransport"
    options = conf.broker_transport_options
    assert options["master_name"] == "mymaster" and options["visibility_timeout"] == 40
