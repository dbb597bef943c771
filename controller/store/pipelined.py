"""One pipelined Redis connection for the receiver: every delivery's script on one socket.

redis-py's asyncio client takes a pooled connection per command: with 64 deliveries in flight
that is 64 sockets and a write and a read per command; the receiver's Redis step cost about
130 µs of CPU per delivery with it, 35–50 µs with this client (~10 µs a call on its own,
against ~40 µs; one receiver process, 16 clients, BENCHMARKS.md). Redis answers a connection's commands in the order
they came, so one connection carries them all: the commands issued in one turn of the event
loop go out in one write, their futures wait in a FIFO, and each read resolves as many futures
as it holds replies (under load, several per write and per read).

Only what the receiver needs: scripts (``EVALSHA``, falling back to ``EVAL`` when Redis answers
``NOSCRIPT``), ``PING``, and ``AUTH``/``SELECT`` from the URL (``redis://``, ``rediss://`` with
its ``ssl_*`` parameters, and ``unix://``: the schemes the config accepts, parsed by redis-py).
Errors are redis-py's, so the store translates them as it does any other
(``store.redis._translated``):

- a refused or lost connection fails every command waiting on it with ``redis.ConnectionError``;
  the next command connects again;
- a command not answered within ``timeout_seconds`` closes the connection (Redis answers in
  order, so every command behind it would wait too): they fail with ``redis.TimeoutError``;
- an error reply raises ``redis.ResponseError`` (``NoScriptError`` for ``NOSCRIPT``), except one
  saying the server is not the master (``READONLY``, ``UNBLOCKED``, ``MASTERDOWN``: a failover or
  role change happened): that closes the connection, and its commands fail with
  ``redis.ConnectionError``;
- credentials refused by Redis or a sentinel (``AUTH`` refused, or ``NOAUTH``) raise
  ``errors.RedisPasswordRefused`` (a ``ConfigError`` naming the setting, never the password) at
  once: no other sentinel is asked, since only the setting can fix it; so does a certificate
  that does not verify against the CA bundle (``errors.RedisCertificateRefused``).

The master: each connection asks ``ROLE`` first and is used only if the server says it is the
master. With sentinels (``sentinels``, ``master_name``), the address is asked of them at each
connect (``SENTINEL GET-MASTER-ADDR-BY-NAME``, one sentinel after another until one answers), so
after a failover the next connection goes to the new master.

Replicas: ``execute(..., replicated=True)`` returns only once the command's writes are on at
least one replica (``WAIT 1``, bounded by ``replica_timeout_seconds``; past it,
``ReplicaTimeout``), when the master has replicas (``ROLE`` lists them; asked again every
second). Redis's replication is asynchronous: without this a write the master acknowledged is
lost if the master dies before sending it on. ``WAIT`` covers what the master had written by the
connection's previous command (since Redis 7.0; before, the connection's own writes), and the
commands of one connection run in order, so one ``WAIT`` sent after several commands covers them
all: the callers that ask in one turn of the event loop share one.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.exceptions import MasterDownError, NoScriptError, ReadOnlyError

from controller.errors import RedisCertificateRefused, RedisPasswordRefused

Arg = str | int | float | bytes
ROLE_REFRESH_SECONDS = 1.0
"""How long a connection trusts the master's last word on how many replicas it has."""


class ReplicaTimeout(redis.TimeoutError):
    """The master has replicas, and none confirmed a write within the bound."""


def not_the_master(error: redis.ResponseError) -> bool:
    """Whether an error reply says the server is not (or no longer) the master."""
    text = str(error)
    return isinstance(error, ReadOnlyError | MasterDownError) or text.startswith(
        ("READONLY", "UNBLOCKED", "MASTERDOWN")
    )


def command(*args: Arg) -> bytes:
    """One command in the Redis protocol (text as UTF-8: a lone surrogate raises UnicodeEncodeError)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else (arg if isinstance(arg, str) else repr(arg)).encode("utf-8")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def parse(buffer: bytes | bytearray, start: int = 0) -> tuple[Any, int] | None:
    """The reply beginning at ``start`` and where it ends, or None while it is incomplete.
    Text comes back as ``str``; an error reply as a ``redis.ResponseError`` value."""
    end = buffer.find(b"\r\n", start)
    if end < 0:
        return None
    kind, line, after = buffer[start], bytes(buffer[start + 1 : end]), end + 2
    if kind == 0x2B:  # +
        return line.decode("utf-8", "replace"), after
    if kind == 0x2D:  # -
        text = line.decode("utf-8", "replace")
        return (NoScriptError(text) if text.startswith("NOSCRIPT") else redis.ResponseError(text)), after
    if kind == 0x3A:  # :
        return int(line), after
    if kind == 0x24:  # $
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return None
        return bytes(buffer[after : after + size]).decode("utf-8", "replace"), after + size + 2
    if kind == 0x2A:  # *
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            parsed = parse(buffer, after)
            if parsed is None:
                return None
            item, after = parsed
            items.append(item)
        return items, after
    raise redis.InvalidResponse(f"unexpected reply type {chr(kind)!r} from Redis")


def tls_context(options: Mapping[str, Any]) -> ssl.SSLContext:
    """TLS for a ``rediss://`` URL, from the query parameters redis-py and Celery read:
    ``ssl_cert_reqs`` (required, the default; optional; none), ``ssl_ca_certs``, and
    ``ssl_certfile``/``ssl_keyfile`` for a client certificate."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs") or None)
    required = str(options.get("ssl_cert_reqs") or "required").lower().removeprefix("cert_")
    if required not in ("required", "optional", "none"):
        raise ValueError(f"ssl_cert_reqs must be required, optional or none, not {required!r}")
    if required != "required":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL if required == "optional" else ssl.CERT_NONE
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile") or None)
    return context


class _Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_seconds: float) -> None:
        self._loop = loop
        self._timeout = timeout_seconds
        self._transport: asyncio.Transport | None = None
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._buffer = bytearray()
        self._watchdog: asyncio.TimerHandle | None = None
        self._outgoing: list[bytes] = []
        self._unsent_wait: asyncio.Future[Any] | None = None
        self.closed = False
        self.replicas = 0
        """Replicas the master listed at the last ``ROLE`` (``role_asked_at``, loop time)."""
        self.role_asked_at = -math.inf

    def role_due(self) -> bool:
        """Whether the master's last word on its replicas (``ROLE``) is older than a second."""
        return self._loop.time() - self.role_asked_at >= ROLE_REFRESH_SECONDS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def send(self, payload: bytes) -> asyncio.Future[Any]:
        if self.closed or self._transport is None:
            raise redis.ConnectionError("the connection to Redis is closed")
        answer: asyncio.Future[Any] = self._loop.create_future()
        self._waiting.append((answer, self._loop.time() + self._timeout))
        if not self._outgoing:
            self._loop.call_soon(self._flush)
        self._outgoing.append(payload)
        if self._watchdog is None:
            self._arm()
        return answer

    def wait_for_replica(self, timeout_ms: int) -> asyncio.Future[Any]:
        """``WAIT 1 timeout_ms``: how many replicas have every write this connection sent so far.
        Shared with the other callers until it is written: sent later, it covers their writes too."""
        if self._unsent_wait is None:
            self._unsent_wait = self.send(command("WAIT", 1, timeout_ms))
        return self._unsent_wait

    def _flush(self) -> None:
        """Write every command issued since the last flush at once: one system call for the
        deliveries that reached Redis in the same turn of the event loop."""
        outgoing, self._outgoing = self._outgoing, []
        self._unsent_wait = None
        if self._transport is not None and not self.closed:
            self._transport.write(b"".join(outgoing))

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        position = 0
        waiting = self._waiting
        try:
            while waiting:
                parsed = parse(buffer, position)
                if parsed is None:
                    break
                value, position = parsed
                answer, _ = waiting.popleft()
                if isinstance(value, redis.ResponseError) and not_the_master(value):
                    # A failover or role change: nothing more goes to this server.
                    lost = redis.ConnectionError(f"Redis is no longer the master ({value}); connecting again")
                    if not answer.done():
                        answer.set_exception(lost)
                    self.close(lost)
                    return
                if answer.done():  # its caller was cancelled
                    continue
                if isinstance(value, redis.ResponseError):
                    answer.set_exception(value)
                else:
                    answer.set_result(value)
        except (redis.InvalidResponse, ValueError) as exc:
            self.close(redis.ConnectionError(f"unreadable reply from Redis: {exc}"))
            return
        if position:
            del buffer[:position]
        if buffer and not waiting:
            self.close(redis.ConnectionError("Redis sent a reply nobody asked for"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(redis.ConnectionError("the connection to Redis was lost"))

    def close(self, error: redis.RedisError | None = None) -> None:
        self._fail(error or redis.ConnectionError("the connection to Redis was closed"))
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, error: redis.RedisError) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._waiting:
            answer, _ = self._waiting.popleft()
            if not answer.done():
                answer.set_exception(error)

    def _arm(self) -> None:
        self._watchdog = self._loop.call_at(self._waiting[0][1], self._check)

    def _check(self) -> None:
        self._watchdog = None
        if not self._waiting:
            return
        if self._waiting[0][1] <= self._loop.time():
            self.close(redis.TimeoutError(f"Redis did not answer within {self._timeout:g} seconds"))
        else:
            self._arm()


class PipelinedRedis:
    """A lazily connected client on one connection, used from one event loop.

    With ``sentinels`` the URL's host is not an address but the master's name at the sentinels
    (``master_name`` when it differs: the URL lower-cases hosts); ``sentinel_password`` is their
    own password, and with a ``rediss://`` URL they are spoken to over TLS too. ``ca_file``: the CA
    bundle that signed the servers' certificates (``rediss://``)."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float = 3.0,
        *,
        sentinels: Sequence[tuple[str, int]] = (),
        master_name: str | None = None,
        sentinel_password: str | None = None,
        ca_file: str | None = None,
        replica_timeout_seconds: float = 1.0,
    ) -> None:
        """``replica_timeout_seconds`` (at most half of ``timeout_seconds``): how long a write may
        take to reach a replica (``execute(..., replicated=True)``)."""
        options: dict[str, Any] = dict(parse_url(url))
        if ca_file:
            options["ssl_ca_certs"] = ca_file
        self._host = str(options.get("host", "localhost"))
        self._port = int(options.get("port", 6379))
        self._path = options.get("path")
        self._db = int(options.get("db", 0) or 0)
        self._username = options.get("username")
        self._password = options.get("password")
        self._tls = tls_context(options) if options.get("connection_class") is SSLConnection else None
        self._timeout = timeout_seconds
        self._sentinels = list(sentinels)
        self._master_name = master_name or self._host
        self._sentinel_password = sentinel_password
        # WAIT blocks the connection: it must end well before the commands behind it time out.
        self._replica_timeout_ms = max(1, int(min(replica_timeout_seconds, timeout_seconds / 2) * 1000))
        self._connection: _Connection | None = None
        self._connecting: asyncio.Lock | None = None

    async def execute(self, *args: Arg, replicated: bool = False) -> Any:
        """Send one command and return its reply; with ``replicated``, once its writes are on a
        replica too (when the master has any; ``ReplicaTimeout`` past the bound)."""
        connection = self._connection
        if connection is None or connection.closed:
            connection = await self._connect()
        reply = await connection.send(command(*args))
        if replicated and (connection.replicas or connection.role_due()):
            await self._replicated(connection)
        return reply

    async def ping(self) -> bool:
        return bool(await self.execute("PING") == "PONG")

    def register_script(self, text: str) -> Script:
        return Script(self, text)

    async def aclose(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def _replicated(self, connection: _Connection) -> None:
        """Return once ``connection``'s writes are on at least one replica, or at once when the
        master has none. On the same connection: a new one's ``WAIT`` would count nothing."""
        if connection.role_due():
            connection.role_asked_at = asyncio.get_running_loop().time()  # the callers meanwhile go by the last answer
            _check_master(await _role(connection), connection, "")
        if connection.replicas == 0:
            return
        acked = await asyncio.shield(connection.wait_for_replica(self._replica_timeout_ms))
        if int(acked) < 1:
            connection.role_asked_at = -math.inf  # the replica may be gone: ask again next time
            raise ReplicaTimeout(f"no replica confirmed the write within {self._replica_timeout_ms} ms")

    async def _connect(self) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._connection is not None and not self._connection.closed:
                return self._connection  # another caller connected meanwhile
            host, port = await self._master_address()
            where = f"{host}:{port}" if not self._path else str(self._path)
            try:
                async with asyncio.timeout(self._timeout):
                    connection = await self._open(host, port)
                    try:
                        if self._password:
                            credentials = [self._username, self._password] if self._username else [self._password]
                            await _authenticate(connection, credentials, "CONTROLLER_REDIS_URL", f"Redis at {where}")
                        if self._db:
                            await connection.send(command("SELECT", self._db))
                        role = await _role(connection)
                    except BaseException:
                        connection.close()
                        raise
            except TimeoutError as exc:  # connecting, or the set-up (AUTH, SELECT, ROLE) unanswered
                raise redis.TimeoutError(f"Redis did not answer within {self._timeout:g} seconds") from exc
            except OSError as exc:
                raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
            except redis.ResponseError as exc:
                if refuses_credentials(exc):  # NOAUTH: a password is required and the URL gives none
                    raise RedisPasswordRefused("CONTROLLER_REDIS_URL", f"Redis at {where}", str(exc)) from exc
                raise redis.AuthenticationError(f"Redis refused the connection's setup: {exc}") from exc  # SELECT
            _check_master(role, connection, where)
            connection.role_asked_at = asyncio.get_running_loop().time()
            self._connection = connection
            return connection

    async def _open(self, host: str, port: int, server: str = "Redis") -> _Connection:
        """A connection to ``server`` (Redis, or a sentinel) at ``host:port``; a certificate that
        does not verify is ``RedisCertificateRefused``: no reconnection can fix it."""
        loop = asyncio.get_running_loop()
        connection = _Connection(loop, self._timeout)
        try:
            if self._path:
                await loop.create_unix_connection(lambda: connection, str(self._path))
            else:
                server_hostname = host if self._tls else None
                await loop.create_connection(
                    lambda: connection, host, port, ssl=self._tls, server_hostname=server_hostname
                )
        except ssl.SSLCertVerificationError as exc:
            connection.close()
            where = f"{server} at {host}:{port}"
            raise RedisCertificateRefused("CONTROLLER_REDIS_CA_FILE", where, exc.verify_message or str(exc)) from exc
        except BaseException:
            connection.close()
            raise
        return connection

    async def _master_address(self) -> tuple[str, int]:
        """The URL's address, or the one the first sentinel that answers gives for the master
        (that sentinel is asked first next time)."""
        if not self._sentinels:
            return self._host, self._port
        problems = []
        each = max(0.2, self._timeout / len(self._sentinels))  # one that never answers leaves time for the rest
        for index, (host, port) in enumerate(list(self._sentinels)):
            try:
                async with asyncio.timeout(each):
                    sentinel = await self._open(host, port, "the sentinel")
                    try:
                        setting, where = "CONTROLLER_REDIS_SENTINEL_PASSWORD", f"the sentinel at {host}:{port}"
                        if self._sentinel_password:
                            await _authenticate(sentinel, [self._sentinel_password], setting, where)
                        asked = command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._master_name)
                        try:
                            address = await sentinel.send(asked)
                        except redis.ResponseError as exc:
                            if refuses_credentials(exc):  # NOAUTH: it wants a password and none is set
                                raise RedisPasswordRefused(setting, where, str(exc)) from exc
                            raise
                    finally:
                        sentinel.close()
            except (OSError, redis.RedisError) as exc:  # TimeoutError is an OSError
                problems.append(f"sentinel {host}:{port}: {exc or type(exc).__name__}")
                continue
            if not address:
                problems.append(f"sentinel {host}:{port} knows no master {self._master_name!r}")
                continue
            self._sentinels.insert(0, self._sentinels.pop(index))
            return str(address[0]), int(address[1])
        raise redis.ConnectionError(f"no sentinel named the master: {'; '.join(problems)}")


def refuses_credentials(error: redis.ResponseError) -> bool:
    """Whether an error reply refuses the connection's credentials: a wrong password or user
    (``WRONGPASS``; ``ERR invalid password`` before Redis 6), a password where none is set, or
    none where one is required (``NOAUTH``) -- what redis-py raises ``AuthenticationError`` for."""
    text = str(error)
    return text.startswith(("WRONGPASS", "NOAUTH")) or any(
        phrase in text for phrase in ("invalid password", "no password is set", "without any password configured")
    )


async def _authenticate(connection: _Connection, credentials: Sequence[Arg], setting: str, where: str) -> None:
    """``AUTH``; a refusal is ``RedisPasswordRefused`` (naming ``setting``, never the password):
    a configuration error, which no reconnection can fix."""
    try:
        await connection.send(command("AUTH", *credentials))
    except redis.ResponseError as exc:
        raise RedisPasswordRefused(setting, where, str(exc)) from exc


async def _role(connection: _Connection) -> Any:
    """``ROLE``'s reply; a server that refuses the command (some managed services rename or
    forbid it) counts as a master without known replicas."""
    try:
        return await connection.send(command("ROLE"))
    except redis.ResponseError as exc:
        if not_the_master(exc) or refuses_credentials(exc):  # NOAUTH is no refusal of ROLE alone
            raise
        return ["master", 0, []]


def _check_master(role: Any, connection: _Connection, where: str) -> None:
    """Take a ``ROLE`` reply: the number of replicas of a master; a server that is not the
    master closes the connection (``redis.ConnectionError``)."""
    if isinstance(role, list) and role and role[0] == "master":
        connection.replicas = len(role[2]) if len(role) > 2 and isinstance(role[2], list) else 0
        return
    what = role[0] if isinstance(role, list) and role else role
    error = redis.ConnectionError(f"Redis{' at ' + where if where else ''} is a {what}, not the master")
    connection.close(error)
    raise error


class Script:
    """A Lua script called by its SHA1 (``EVALSHA``); sent whole (``EVAL``, which also caches it)
    when Redis does not have it, as after a restart."""

    def __init__(self, client: PipelinedRedis, text: str) -> None:
        self._client = client
        self._text = text
        self._sha = hashlib.sha1(text.encode("utf-8")).hexdigest()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = (), replicated: bool = False) -> Any:
        """Run the script; with ``replicated``, return once its writes are on a replica too
        (``PipelinedRedis.execute``)."""
        try:
            return await self._client.execute("EVALSHA", self._sha, len(keys), *keys, *args, replicated=replicated)
        except NoScriptError:
            return await self._client.execute("EVAL", self._text, len(keys), *keys, *args, replicated=replicated)
