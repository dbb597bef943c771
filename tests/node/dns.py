"""Cluster DNS for the real-node tier: ``<service>.<namespace>.svc.cluster.local`` → the
Service's ClusterIP, read from the API server, and a few fixed names (``api.openai.com`` → the
simulator's public-range address). A stand-in for CoreDNS (which is not built here): a UDP
server of a few dozen lines that answers A queries for those names and nothing else (NXDOMAIN
for other names, an empty answer for other record types). It listens on the node's address
inside the test's network namespace; pods reach it only through the DNS pods in kube-system
(``RELAY``, behind the ``kube-dns`` Service the kubelet's ``clusterDNS`` names), as the sandbox
NetworkPolicy allows DNS only to those.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Mapping

CLUSTER_DOMAIN = "cluster.local"
_A, _IN = 1, 1
_NOERROR, _NXDOMAIN, _SERVFAIL = 0, 3, 2

# (service, namespace) -> ClusterIP, or None when there is no such Service.
Lookup = Callable[[str, str], "str | None"]


def _question(packet: bytes) -> tuple[str, int, int]:
    """(name, qtype, offset after the question) of the first question."""
    labels, offset = [], 12
    while (length := packet[offset]) != 0:
        if length & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    qtype, _qclass = struct.unpack("!HH", packet[offset + 1 : offset + 5])
    return ".".join(labels), qtype, offset + 5


def answer(packet: bytes, lookup: Lookup, hosts: Mapping[str, str] | None = None) -> bytes:
    """The response to one query packet (``hosts``: fixed names → addresses)."""
    (ident, _flags, qdcount) = struct.unpack("!HHH", packet[:6])
    name, qtype, end = _question(packet)
    question = packet[12:end]
    rcode, records = _NXDOMAIN, b""
    suffix = ".svc." + CLUSTER_DOMAIN
    parts = name[: -len(suffix)].split(".") if name.endswith(suffix) else []
    address: str | None = None
    if hosts and name in hosts:
        address, rcode = hosts[name], _NOERROR
    elif len(parts) == 2:
        try:
            address = lookup(parts[0], parts[1])
        except Exception:
            address, rcode = None, _SERVFAIL
        else:
            rcode = _NOERROR if address else _NXDOMAIN
    if address and qtype == _A:
        # Name pointer to the question (offset 12), A, IN, TTL 5 s, 4 bytes.
        records = struct.pack("!HHHIH", 0xC00C, _A, _IN, 5, 4) + socket.inet_aton(address)
    flags = 0x8000 | 0x0400 | 0x0100 | 0x0080 | rcode  # response, authoritative, RD copied, RA
    header = struct.pack("!HHHHHH", ident, flags, min(qdcount, 1), 1 if records else 0, 0, 0)
    return header + question + records


class ClusterDNS:
    """A UDP DNS server on ``address``:53 in a daemon thread."""

    def __init__(self, address: str, lookup: Lookup, hosts: Mapping[str, str] | None = None) -> None:
        self.address = address
        self._lookup = lookup
        self._hosts = dict(hosts or {})
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((address, 53))
        self._socket.settimeout(0.5)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)

    def start(self) -> ClusterDNS:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                packet, peer = self._socket.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                self._socket.sendto(answer(packet, self._lookup, self._hosts), peer)
            except (ValueError, IndexError, struct.error, OSError):
                continue

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._socket.close()


# The DNS pods (kube-system, ``k8s-app: kube-dns``): stdlib Python in the controller image, relaying
# each UDP query on port 53 to the test's server (argv[1]) and its answer back.
RELAY = """
import socket, sys, threading
upstream = (sys.argv[1], 53)
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", 53))
print("dns relay: :53 ->", upstream, flush=True)

def relay(query, client):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as up:
        up.settimeout(3)
        try:
            up.sendto(query, upstream)
            server.sendto(up.recvfrom(4096)[0], client)
        except OSError:
            pass

while True:
    query, client = server.recvfrom(4096)
    threading.Thread(target=relay, args=(query, client), daemon=True).start()
"""
