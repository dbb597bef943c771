"""Connection probes for the real-node tier's NetworkPolicy tests.

A probe is a few lines of bash run inside a pod (the runner image's Debian base has bash with
its ``/dev/tcp`` and ``/dev/udp`` redirections, ``timeout``, ``head``, ``wc`` and ``getent``):
every target is tried at once, each for at most ``PROBE_SECONDS``, and one line per target
says ``<label> open`` or ``<label> closed``. TCP: a connection is made or not. DNS: a query
for ``api.openai.com`` sent over UDP to the target's port 53 gets an answer or not.

``Listeners`` accept TCP connections (and close them at once) on addresses the test put in the
node's network namespace, so that a closed probe means the packet was refused on the way, not
that nothing listens.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

PROBE_SECONDS = 4
# A DNS query (id 0x1234, recursion desired) for api.openai.com, type A, class IN, as printf escapes.
_QUERY = (
    r"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    r"\x03api\x06openai\x03com\x00\x00\x01\x00\x01"
)


_FUNCTIONS = """\
tcp() {
  if timeout @SECONDS@ bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "$1 open"; else echo "$1 closed"; fi
}
dns() {
  n=$(timeout @SECONDS@ bash -c "exec 3<>/dev/udp/$2/$3; printf '@QUERY@' >&3; head -c 12 <&3 | wc -c" 2>/dev/null)
  if [ "${n:-0}" -ge 12 ]; then echo "$1 open"; else echo "$1 closed"; fi
}"""


@dataclass(frozen=True)
class Target:
    label: str
    address: str
    port: int
    kind: str = "tcp"
    """``tcp`` (connect) or ``dns`` (a UDP query to ``port``)."""


def script(targets: Sequence[Target], resolve: Sequence[str] = ()) -> str:
    """The bash probing ``targets`` in parallel; also ``resolve <name> <address or nothing>``
    for each name in ``resolve``, through the pod's resolver (its resolv.conf)."""
    lines = [_FUNCTIONS.replace("@SECONDS@", str(PROBE_SECONDS)).replace("@QUERY@", _QUERY)]
    for target in targets:
        lines.append(f"{target.kind} {shlex.quote(target.label)} {target.address} {target.port} &")
    for name in resolve:
        lines.append(f'echo "resolve {name} $(getent hosts {name} | cut -d" " -f1)" &')
    lines.append("wait")
    return "\n".join(lines)


def results(output: str) -> dict[str, str]:
    """``{label: "open" | "closed"}`` and ``{"resolve <name>": address or ""}`` from a probe's output."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("resolve "):
            _, name, *address = line.split()
            found[f"resolve {name}"] = address[0] if address else ""
        elif line.endswith((" open", " closed")):
            label, _, verdict = line.rpartition(" ")
            found[label] = verdict
    return found


def table(*columns: tuple[str, dict[str, str]]) -> str:
    """The results side by side (printed: the tier's evidence in its log)."""
    labels = list(dict.fromkeys(label for _, found in columns for label in found))
    width = max(len(label) for label in labels)
    head = " | ".join(f"{name:>12}" for name, _ in columns)
    rows = [f"{'':{width}} | {head}"]
    rows += [
        f"{label:{width}} | " + " | ".join(f"{found.get(label, '-'):>12}" for _, found in columns) for label in labels
    ]
    return "\n".join(rows)


class Listeners:
    """TCP listeners on ``(address, port)`` pairs in the current network namespace, each
    accepting and closing connections in a daemon thread until ``close``."""

    def __init__(self, endpoints: Iterable[tuple[str, int]]) -> None:
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        for address, port in endpoints:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((address, port))
            server.listen(16)
            server.settimeout(0.5)
            self._sockets.append(server)
        self._threads = [threading.Thread(target=self._serve, args=(s,), daemon=True) for s in self._sockets]
        for thread in self._threads:
            thread.start()

    def _serve(self, server: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for server in self._sockets:
            server.close()

    def __enter__(self) -> Listeners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pod_exec(core: Any, name: str, namespace: str, argv: list[str], timeout: float = 60) -> str:
    """``argv`` run in the pod's first container through the API server (the admin's exec);
    its standard output and error. The exec's WebSocket is closed here (the client's preloading
    path would leave its socket open)."""
    from kubernetes.stream import stream

    client = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        namespace,
        command=argv,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    try:
        client.run_forever(timeout=timeout)
        output: str = client.read_all()
    finally:
        client.close()
        if client.sock is not None:
            client.sock.shutdown()  # close() leaves the socket open once the server has closed
    return output


@contextlib.contextmanager
def pod(core: Any, namespace: str, manifest: dict[str, Any], timeout: float = 120) -> Iterator[Any]:
    """A pod created for the test, Running before it is yielded, deleted after."""
    from tests.support.processes import wait_for

    created = core.create_namespaced_pod(namespace, manifest)
    name = created.metadata.name
    try:

        def running() -> Any:
            found = core.read_namespaced_pod(name, namespace)
            return found if found.status.phase == "Running" else None

        yield wait_for(running, timeout, f"pod {namespace}/{name} to run", interval=0.5)
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


@contextlib.contextmanager
def claim_namespace(core: Any, prefix: str, level: str) -> Iterator[str]:
    """A namespace (``prefix-xxxxxx``) enforcing Pod Security ``level``, with a bound 1 GiB claim
    ``workspace`` (the node's hostPath volume), deleted after."""
    from tests.support.processes import wait_for

    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}
    core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    claim = {
        "metadata": {"name": "workspace"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    try:
        core.create_namespaced_persistent_volume_claim(namespace, claim)
        wait_for(
            lambda: core.read_namespaced_persistent_volume_claim("workspace", namespace).status.phase == "Bound",
            120,
            "the workspace claim to bind",
            interval=0.5,
        )
        yield namespace
    finally:
        core.delete_namespace(namespace)


class ConnectProxy:
    """An HTTP CONNECT proxy on ``address:port`` (the current network namespace): it records each
    tunnel as ``(client address, "host:port")`` and connects ``host`` through ``hosts`` (the
    names it resolves itself) or as given."""

    def __init__(self, address: str, port: int, hosts: dict[str, str]) -> None:
        self.tunnels: list[tuple[str, str]] = []
        self._hosts = hosts
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((address, port))
        self._server.listen(16)
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client, peer[0]), daemon=True).start()

    def _tunnel(self, client: socket.socket, peer: str) -> None:
        head = b""
        with contextlib.suppress(OSError):
            client.settimeout(10)
            while b"\r\n\r\n" not in head and len(head) < 8192:
                chunk = client.recv(4096)
                if not chunk:
                    break
                head += chunk
        method, _, rest = head.split(b"\r\n", 1)[0].decode(errors="replace").partition(" ")
        target = rest.split(" ", 1)[0]
        host, _, port = target.rpartition(":")
        if method != "CONNECT" or not port.isdigit():
            with contextlib.suppress(OSError):
                client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            client.close()
            return
        self.tunnels.append((peer, target))
        try:
            upstream = socket.create_connection((self._hosts.get(host, host), int(port)), timeout=10)
        except OSError:
            with contextlib.suppress(OSError):
                client.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            client.close()
            return
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        client.settimeout(None)
        upstream.settimeout(None)
        self._open += [client, upstream]
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> ConnectProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
