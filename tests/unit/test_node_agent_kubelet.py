"""The node agent's client of the kubelet's checkpoint API (controller/node_agent/kubelet.py),
against a TLS server on loopback: the chain is verified against the configured CA while the
host name is not (a kubelet's certificate does not name the address the agent dials), the
service account token goes as a bearer token only when its file exists, and a refusal comes back
as its status and body."""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.node_agent.kubelet import MAX_ANSWER_BYTES, Kubelet
from tests.support.tls import TestCA


class _Kubelet(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None]] = []
    answer = (200, b'{"items":["/var/lib/kubelet/checkpoints/x.tar"]}')

    def do_POST(self) -> None:
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization")))
        status, body = type(self).answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A kubelet stand-in on loopback whose certificate names only ``kubelet.invalid``; its URL
    and its CA's file."""
    ca = TestCA("kubelet test CA")
    served = ca.issue(tmp_path / "tls", ["kubelet.invalid"])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Kubelet)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.certfile, served.keyfile)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _Kubelet.seen = []
    _Kubelet.answer = (200, b'{"items":["/var/lib/kubelet/checkpoints/x.tar"]}')
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca.write(tmp_path / "ca.crt")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_checkpoint_is_posted_with_the_bearer_token_over_a_verified_chain(
    kubelet: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca = kubelet
    token = tmp_path / "token"
    token.write_text("a-service-account-token\n")
    status, body = Kubelet(url, str(ca), str(token)).checkpoint("sandboxes", "sbx-s1-g1", "sandbox")
    assert (status, body) == (200, '{"items":["/var/lib/kubelet/checkpoints/x.tar"]}')
    assert _Kubelet.seen == [("POST", "/checkpoint/sandboxes/sbx-s1-g1/sandbox", "Bearer a-service-account-token")]


def test_no_token_file_sends_no_authorization_and_a_refusal_is_its_status_and_body(
    kubelet: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca = kubelet
    _Kubelet.answer = (500, b"checkpointing of sandboxes/p/sandbox failed (criu failed: type DUMP)")
    status, body = Kubelet(url, str(ca), str(tmp_path / "absent")).checkpoint("sandboxes", "p", "sandbox")
    assert (status, body) == (500, "checkpointing of sandboxes/p/sandbox failed (criu failed: type DUMP)")
    assert _Kubelet.seen[0][2] is None


def test_a_kubelet_whose_certificate_another_ca_issued_is_refused(kubelet: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = kubelet
    stranger = TestCA("another CA").write(tmp_path / "other.crt")
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        Kubelet(url, str(stranger), str(tmp_path / "absent")).checkpoint("sandboxes", "p", "sandbox")
    assert _Kubelet.seen == []


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_is_read_only_up_to_its_bound(kubelet: tuple[str, Path], tmp_path: Path, status: int) -> None:
    """A kubelet (or whatever answers on its port) that sends 8 MiB is read only as far as the
    bound: the agent never holds a body that goes on."""
    url, ca = kubelet
    _Kubelet.answer = (status, b"x" * (8 << 20))
    got, body = Kubelet(url, str(ca), str(tmp_path / "absent")).checkpoint("sandboxes", "p", "sandbox")
    assert got == status and len(body) == MAX_ANSWER_BYTES
