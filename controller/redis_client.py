"""How every process reaches Redis, in one place: from the settings to a client.

Redis is reached at one URL (``CONTROLLER_REDIS_URL``: ``redis://``, ``rediss://`` for TLS, or
``unix://``), or through Redis Sentinel (``CONTROLLER_REDIS_SENTINELS``): the sentinels are
asked which server is the master, and asked again after every lost connection. With sentinels
the URL still gives the password (and user) and the database; its host is the master's name.
``rediss://`` verifies the server's certificate against ``CONTROLLER_REDIS_CA_FILE`` (default:
the system's CAs); with sentinels they are spoken to over TLS too.

``Endpoint`` holds that, and makes the three kinds of client the controller uses:

- ``client``: redis-py's, for the store, the scheduler, metrics and the CLI;
- ``pipelined``: the receiver's one pipelined connection (``store.pipelined``);
- ``broker``: Celery's broker settings (kombu's Redis transport, or its Sentinel transport,
  through ``controller.broker``).

Following the master. A failover or a role change leaves a connection open to a server that is
no longer the master: it refuses writes (``READONLY``), ends a waiting ``BRPOP`` with
``UNBLOCKED``, or says its own master is gone (``MASTERDOWN``). Every client made here takes such
a reply as a lost connection: it drops the connection and raises ``redis.ConnectionError``,
which the store reports as ``StoreUnavailable`` and Celery takes as a reason to reconnect; the
next connection goes to the master the sentinels name then (or that the URL's host resolves
to, for a managed Redis whose failover moves a DNS name).

A refused password. redis-py reports it as ``redis.AuthenticationError``, a kind of
``ConnectionError``, so its retries (ten, with backoff) and its walk over the sentinels would
take it for a lost connection and report it seconds later as Redis being away. Every client made
here raises ``errors.RedisPasswordRefused`` (a ``ConfigError``) at the first refusal instead,
naming the setting (``CONTROLLER_REDIS_URL`` or ``CONTROLLER_REDIS_SENTINEL_PASSWORD``) and the
server, never the password. Likewise a certificate that does not verify against
``CONTROLLER_REDIS_CA_FILE`` (``errors.RedisCertificateRefused``). A lost, refused or timed-out
connection is retried as before. The worker's broker connection (``controller.broker``) uses
these connection classes too: a refused password ends the worker at its start (Celery's
"Unrecoverable error", status 1) instead of a reconnect loop that cannot succeed.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import redis
from redis.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.sentinel import Sentinel, SentinelManagedConnection

from controller.config import PREFIX, QueueSettings
from controller.errors import RedisCertificateRefused, RedisPasswordRefused
from controller.store.pipelined import PipelinedRedis, not_the_master

DEFAULT_TIMEOUT_SECONDS = 3.0


CA_FILE = f"{PREFIX}REDIS_CA_FILE"


class _VerifiesCertificate:
    """For redis-py's TLS connection classes: a certificate that does not verify against the CA
    bundle raises ``RedisCertificateRefused`` at the handshake; redis-py would take it for a
    lost connection and retry it."""

    server = "Redis"

    def _connect(self) -> Any:
        try:
            return super()._connect()  # type: ignore[misc]
        except ssl.SSLCertVerificationError as exc:
            where = f"{self.server} at {self._host_error()}"  # type: ignore[attr-defined]
            raise RedisCertificateRefused(CA_FILE, where, exc.verify_message or str(exc)) from exc


class _AsksSentinel:
    """For the connections to the sentinels: a refused password raises ``RedisPasswordRefused``.
    redis-py would take its ``AuthenticationError`` for a lost connection, retry it with backoff
    (ten times) and then ask the next sentinel, and the next, to report "no master found" some
    ten seconds later."""

    server = "the sentinel"

    def on_connect_check_health(self, check_health: bool = True) -> None:
        try:
            super().on_connect_check_health(check_health=check_health)  # type: ignore[misc]
        except redis.AuthenticationError as exc:
            self.disconnect()  # type: ignore[attr-defined]
            where = f"the sentinel at {self._host_error()}"  # type: ignore[attr-defined]
            raise RedisPasswordRefused(f"{PREFIX}REDIS_SENTINEL_PASSWORD", where, str(exc)) from exc


class SentinelConnection(_AsksSentinel, redis.Connection):
    pass


class SentinelSSLConnection(_AsksSentinel, _VerifiesCertificate, SSLConnection):
    pass


class _FollowsMaster:
    """For redis-py connection classes: a connection is used only once the server says it is
    the master (``ROLE``, after the handshake), and a reply saying it no longer is drops the
    connection; both raise ``redis.ConnectionError`` (the next command connects again)."""

    def on_connect_check_health(self, check_health: bool = True) -> None:
        try:
            super().on_connect_check_health(check_health=check_health)  # type: ignore[misc]
            self.send_command("ROLE", check_health=False)  # type: ignore[attr-defined]
            role = self.read_response()
        except redis.AuthenticationError as exc:  # AUTH refused, or NOAUTH: only the URL can fix it
            self.disconnect()  # type: ignore[attr-defined]
            where = f"Redis at {self._host_error()}"  # type: ignore[attr-defined]
            raise RedisPasswordRefused(f"{PREFIX}REDIS_URL", where, str(exc)) from exc
        except redis.ResponseError:  # ROLE refused (some managed services): take the server's word
            return
        if not (isinstance(role, list) and role and role[0] in ("master", b"master")):
            self.disconnect()  # type: ignore[attr-defined]
            what = role[0] if isinstance(role, list) and role else role
            what = what.decode(errors="replace") if isinstance(what, bytes) else str(what)
            raise redis.ConnectionError(f"Redis is not the master (ROLE: {what}); connecting again")

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ResponseError as exc:
            if not not_the_master(exc):
                raise
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"Redis is no longer the master ({exc}); connecting again") from exc


class MasterConnection(_FollowsMaster, redis.Connection):
    pass


class MasterSSLConnection(_FollowsMaster, _VerifiesCertificate, SSLConnection):
    pass


class MasterUnixConnection(_FollowsMaster, UnixDomainSocketConnection):
    pass


class SentinelMasterConnection(_FollowsMaster, SentinelManagedConnection):
    """Asks the sentinels for the master at each connect (redis-py's), and drops a connection
    whose server turned out not to be the master (``UNBLOCKED`` and ``MASTERDOWN`` too, not
    only ``READONLY`` as redis-py's own does)."""


class SentinelMasterSSLConnection(_FollowsMaster, _VerifiesCertificate, SentinelManagedConnection, SSLConnection):
    pass


@dataclass(frozen=True)
class Endpoint:
    """Where Redis is and how to reach it (see the module's docstring)."""

    url: str = field(repr=False)  # may carry a password
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    @classmethod
    def from_settings(cls, settings: QueueSettings) -> Endpoint:
        assert settings.redis_url is not None  # Settings.require checked it
        password = settings.redis_sentinel_password
        return cls(
            url=settings.redis_url,
            sentinels=settings.redis_sentinels,
            master_name=settings.redis_sentinel_master,
            sentinel_password=password.reveal() if password is not None else None,
            ca_file=settings.redis_ca_file,
        )

    @property
    def tls(self) -> bool:
        return self.url.startswith("rediss://")

    def _url_options(self) -> dict[str, Any]:
        """What the URL says besides where: credentials, database, TLS options of its query."""
        options: dict[str, Any] = parse_url(self.url)  # type: ignore[no-untyped-call]
        if self.tls and self.ca_file:
            options["ssl_ca_certs"] = self.ca_file
        return options

    def _sentinel_options(self, timeout_seconds: float) -> dict[str, Any]:
        options: dict[str, Any] = {"socket_timeout": timeout_seconds, "socket_connect_timeout": timeout_seconds}
        if self.sentinel_password:
            options["password"] = self.sentinel_password
        if self.tls:
            options["ssl"] = True
            options.update({k: v for k, v in self._url_options().items() if k.startswith("ssl_")})
        return options

    def client(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, decode_responses: bool = True) -> redis.Redis:
        """A redis-py client with short timeouts (an unreachable Redis is a quick error, not a
        hang) that follows the master."""
        common: dict[str, Any] = {
            "socket_timeout": timeout_seconds,
            "socket_connect_timeout": timeout_seconds,
            "health_check_interval": 15,
            "decode_responses": decode_responses,
        }
        options = self._url_options()
        if self.sentinels:
            assert self.master_name is not None  # config derives it
            for where in ("host", "port", "connection_class"):
                options.pop(where, None)
            sentinel = Sentinel(self.sentinels, sentinel_kwargs=self._sentinel_options(timeout_seconds), **common)
            for asked in sentinel.sentinels:  # redis-py picks their class (SSLConnection for ssl=True)
                asked.connection_pool.connection_class = SentinelSSLConnection if self.tls else SentinelConnection
            connection = SentinelMasterSSLConnection if self.tls else SentinelMasterConnection
            master: redis.Redis = sentinel.master_for(self.master_name, connection_class=connection, **options)
            return master
        given = options.get("connection_class")
        options["connection_class"] = (
            MasterSSLConnection
            if given is SSLConnection
            else MasterUnixConnection
            if given is UnixDomainSocketConnection
            else MasterConnection
        )
        return redis.Redis(connection_pool=redis.ConnectionPool(**options, **common))

    def pipelined(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> PipelinedRedis:
        """The receiver's client: one pipelined connection, connected lazily on the event loop that
        first uses it, to the master (asking the sentinels first, when there are any)."""
        return PipelinedRedis(
            self.url,
            timeout_seconds,
            sentinels=self.sentinels,
            master_name=self.master_name,
            sentinel_password=self.sentinel_password,
            ca_file=self.ca_file if self.tls else None,
        )

    def broker(self) -> dict[str, Any]:
        """Celery's broker settings: ``broker_url``, ``broker_transport`` (``controller.broker``),
        ``broker_use_ssl`` for TLS, and the transport options Sentinel needs (to be merged into
        ``broker_transport_options``)."""
        conf: dict[str, Any] = {"broker_url": self.url, "broker_transport": "controller.broker:Transport"}
        if self.tls:
            tls = {k: v for k, v in self._url_options().items() if k.startswith("ssl_")}
            tls.setdefault("ssl_cert_reqs", ssl.CERT_REQUIRED)  # kombu's own default for rediss:// is CERT_NONE
            conf["broker_use_ssl"] = tls
        if self.sentinels:
            parts = urlsplit(self.url)
            userinfo = parts.netloc.rpartition("@")[0]
            auth = f"{userinfo}@" if userinfo else ""
            database = parts.path.strip("/") or "0"
            conf["broker_url"] = ";".join(
                f"sentinel://{auth}{_host(host)}:{port}/{database}" for host, port in self.sentinels
            )
            conf["broker_transport"] = "controller.broker:SentinelTransport"
            conf["transport_options"] = {
                "master_name": self.master_name,
                "sentinel_kwargs": self._sentinel_options(DEFAULT_TIMEOUT_SECONDS),
            }
        else:
            conf["transport_options"] = {}
        return conf


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else quote(host, safe=".-_")
