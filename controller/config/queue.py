"""The queue's section: Redis (a URL, or Sentinels that name the master, TLS) and the
delivery of jobs (leases, redelivery, retries, recovery)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from controller import files
from controller.config.masked import Printable, Secret
from controller.config.reader import DAY, PREFIX, Reader
from controller.credentials import url_password

MAX_CA_FILE_BYTES = 16 * 1024 * 1024
"""A CA bundle is PEM text: a system's whole bundle is a few hundred KiB."""


@dataclass(frozen=True, repr=False)
class QueueSettings(Printable):
    redis_url: str | None = None
    """Redis for the queue, de-duplication, leases and the session→sandbox mapping. With
    ``redis_sentinels`` it still gives the password and database; its host is the master's name
    (``redis://:PASSWORD@mymaster/0``)."""
    redis_sentinels: tuple[tuple[str, int], ...] = ()
    """Redis Sentinel addresses (``CONTROLLER_REDIS_SENTINELS``, comma-separated ``host:port``):
    every process asks them for the master and follows it through a failover."""
    redis_sentinel_master: str | None = None
    """The master's name at the sentinels (default: the host of ``redis_url``)."""
    redis_sentinel_password: Secret | None = None
    """The sentinels' own password (their ``requirepass``), if they have one."""
    redis_ca_file: str | None = None
    """CA bundle that signed the Redis server's (and the sentinels') TLS certificate, for a
    ``rediss://`` URL (default: the system's CAs)."""
    lease_ttl_seconds: float = 10.0
    """A worker's hold on one session, renewed every third of it while the work runs; a dead
    worker's sessions are free again after this."""
    visibility_timeout_seconds: int = 300
    """Unacknowledged jobs of a dead worker process are redelivered after this."""
    task_max_retries: int = 50
    recovery_interval_seconds: float = 5.0
    """How often the active scheduler re-enqueues wanted work that no job is going to do."""
    recovery_after_seconds: float = 15.0
    """A session enqueued this long ago whose lease was never taken counts as lost and is
    enqueued again (a job merely waiting in the queue is not duplicated before that)."""

    @property
    def redis_password_set(self) -> bool:
        """Whether connecting to Redis takes a password (in the URL's userinfo or ``?password=``)."""
        return self.redis_url is not None and url_password(self.redis_url) is not None


@dataclass(frozen=True)
class RedisConnection:
    """How to reach Redis besides its URL: read and checked together, since they must agree."""

    sentinels: tuple[tuple[str, int], ...]
    master: str | None
    password: Secret | None
    ca_file: str | None


def redis_url(r: Reader) -> str | None:
    url = r.get(PREFIX + "REDIS_URL") or None
    if url and not url.startswith(("redis://", "rediss://", "unix://")):
        r.problems.append(f"{PREFIX}REDIS_URL must be a redis://, rediss:// or unix:// URL")
    return url


def redis_connection(r: Reader, url: str | None) -> RedisConnection:
    """Sentinel addresses, the master's name, the sentinels' password and the TLS CA file."""
    sentinels = tuple(p for p in (_address(r, "REDIS_SENTINELS", w) for w in r.words("REDIS_SENTINELS")) if p)
    master = r.get(PREFIX + "REDIS_SENTINEL_MASTER", "").strip() or None
    password = r.secret("REDIS_SENTINEL_PASSWORD")
    ca_file = r.get(PREFIX + "REDIS_CA_FILE", "").strip() or None
    scheme = (url or "").partition("://")[0]
    host = _url_host(url or "")
    if sentinels:
        if scheme == "unix":
            r.problems.append(f"{PREFIX}REDIS_SENTINELS needs a redis:// or rediss:// {PREFIX}REDIS_URL")
        elif url and master and host and host != master:
            r.problems.append(
                f"{PREFIX}REDIS_SENTINEL_MASTER is {master!r} but {PREFIX}REDIS_URL names {host!r}: with "
                "sentinels the URL's host is the master's name (they must agree)"
            )
        elif url and not (master or host):
            r.problems.append(f"{PREFIX}REDIS_SENTINEL_MASTER (or the host of {PREFIX}REDIS_URL) must name the master")
        master = master or host or None
    elif master or password:
        r.problems.append(
            f"{PREFIX}REDIS_SENTINEL_MASTER and {PREFIX}REDIS_SENTINEL_PASSWORD need {PREFIX}REDIS_SENTINELS"
        )
    if ca_file:
        if url and scheme != "rediss":
            r.problems.append(f"{PREFIX}REDIS_CA_FILE is for TLS: {PREFIX}REDIS_URL must be a rediss:// URL")
        try:  # a regular file, read without blocking (a FIFO is refused, not waited on)
            files.read_small(ca_file, limit=MAX_CA_FILE_BYTES)
        except OSError as exc:
            r.problems.append(f"{PREFIX}REDIS_CA_FILE: cannot read {ca_file}: {exc.strerror}")
    return RedisConnection(sentinels, master, password, ca_file)


def queue(r: Reader, url: str | None, connection: RedisConnection) -> QueueSettings:
    return QueueSettings(
        redis_url=url,
        redis_sentinels=connection.sentinels,
        redis_sentinel_master=connection.master,
        redis_sentinel_password=connection.password,
        redis_ca_file=connection.ca_file,
        lease_ttl_seconds=r.number("LEASE_TTL_SECONDS", QueueSettings.lease_ttl_seconds, float, 1.0, 3600),
        visibility_timeout_seconds=r.number(
            "QUEUE_VISIBILITY_TIMEOUT_SECONDS", QueueSettings.visibility_timeout_seconds, int, 1, DAY
        ),
        task_max_retries=r.number("TASK_MAX_RETRIES", QueueSettings.task_max_retries, int, 0, 10_000),
        recovery_interval_seconds=r.number(
            "RECOVERY_INTERVAL_SECONDS", QueueSettings.recovery_interval_seconds, float, 0.5, 3600
        ),
        recovery_after_seconds=r.number(
            "RECOVERY_AFTER_SECONDS", QueueSettings.recovery_after_seconds, float, 1.0, DAY
        ),
    )


def _address(r: Reader, name: str, text: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port`` for an IPv6 address), or None with the problem noted."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        r.problems.append(f"{PREFIX}{name}: {text!r} is not host:port")
        return None
    return host, int(port)


def _url_host(url: str) -> str:
    """The host of a URL as written (case kept: a Sentinel master's name is case-sensitive)."""
    host = urlsplit(url).netloc.rpartition("@")[2]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() and not host.endswith("]") else host
