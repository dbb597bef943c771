"""The node's kubelet, as the agent uses it: its checkpoint API,
``POST /checkpoint/{namespace}/{pod}/{container}`` (ContainerCheckpoint, beta and on by default
in Kubernetes 1.30+). The kubelet has the runtime write the container's archive under its
checkpoints directory and answers ``{"items": [<host path>]}``; the container runs on.

TLS: the kubelet's serving certificate (or its CA) verifies the chain; the host name is not
checked, since the agent dials the node's address, which a kubelet's self-signed certificate
does not name. The service account token (read at each call: a projected token rotates) is sent
as a bearer token when its file exists; a cluster's kubelet authorizes ``nodes/checkpoint``
with it. It is never logged.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

TIMEOUT_SECONDS = 300.0
"""How long a checkpoint may take (CRIU dumps the container's memory: 110 MB took 2-4 s here)."""
MAX_ANSWER_BYTES = 64 * 1024
"""The most of an answer's body read: the archive's path, or the error (its first lines are what
the pod's answer carries); never the whole of a body that goes on."""


class Kubelet:
    def __init__(self, url: str, ca_file: str, token_file: str, timeout: float = TIMEOUT_SECONDS) -> None:
        self._url = url.rstrip("/")
        self._ca_file = ca_file
        self._token_file = Path(token_file)
        self._timeout = timeout

    def checkpoint(self, namespace: str, pod: str, container: str) -> tuple[int, str]:
        """The kubelet's status and body for a checkpoint of ``container`` in ``namespace/pod``.
        A failure to reach it raises ``OSError`` (``urllib.error.URLError``)."""
        path = "/".join(urllib.parse.quote(part, safe="") for part in (namespace, pod, container))
        request = urllib.request.Request(f"{self._url}/checkpoint/{path}", method="POST")
        token = self._token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        context = ssl.create_default_context(cafile=self._ca_file)
        context.check_hostname = False
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=context) as answer:
                return answer.status, answer.read(MAX_ANSWER_BYTES).decode(errors="replace")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read(MAX_ANSWER_BYTES).decode(errors="replace")

    def _token(self) -> str:
        try:
            return self._token_file.read_text().strip()
        except FileNotFoundError:
            return ""
