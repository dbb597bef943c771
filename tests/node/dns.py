"""Cluster DNS for the real-node tier: ``<service>.<namespace>.svc.cluster.local`` → the
Service's ClusterIP, read from the API server. A stand-in for CoreDNS (which is not built
here): a UDP server of a few dozen lines that answers A queries for Services and nothing else
(NXDOMAIN for other names, an empty answer for other record types). It listens on the node's
address inside the test's network namespace; the kubelet's ``clusterDNS`` points pods at it.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

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


def answer(packet: bytes, lookup: Lookup) -> bytes:
    """The response to one query packet."""
    (ident, _flags, qdcount) = struct.unpack("!HHH", packet[:6])
    name, qtype, end = _question(packet)
    question = packet[12:end]
    rcode, records = _NXDOMAIN, b""
    suffix = ".svc." + CLUSTER_DOMAIN
    parts = name[: -len(suffix)].split(".") if name.endswith(suffix) else []
    if len(parts) == 2:
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

    def __init__(self, address: str, lookup: Lookup) -> None:
        self.address = address
        self._lookup = lookup
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
                self._socket.sendto(answer(packet, self._lookup), peer)
            except (ValueError, IndexError, struct.error, OSError):
                continue

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._socket.close()
