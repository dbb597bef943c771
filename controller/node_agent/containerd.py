"""The node's containerd, through its own ``ctr`` (``CONTROLLER_NODE_AGENT_CTR``) on its socket,
in the CRI's image namespace (``k8s.io``, where the kubelet's pods find their images)."""

from __future__ import annotations

import subprocess

NAMESPACE = "k8s.io"
TIMEOUT_SECONDS = 300.0


class CtrFailed(Exception):
    """``ctr`` failed: the message holds its stderr."""


class Containerd:
    def __init__(self, ctr: str, address: str, timeout: float = TIMEOUT_SECONDS) -> None:
        self._ctr = ctr
        self._address = address
        self._timeout = timeout

    def import_image(self, oci_archive: str, ref: str) -> None:
        """Import the OCI archive's one image under ``ref`` (``--local``: containerd 2's
        transfer service keeps the name only this way)."""
        self._run("image", "import", "--local", "--index-name", ref, oci_archive)

    def images(self) -> list[str]:
        """Every image reference in the namespace."""
        return [line.strip() for line in self._run("image", "ls", "-q").splitlines() if line.strip()]

    def remove(self, ref: str) -> None:
        self._run("image", "rm", ref)

    def _run(self, *args: str) -> str:
        argv = [self._ctr, "--address", self._address, "-n", NAMESPACE, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self._timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CtrFailed(f"ctr {' '.join(args[:2])}: {exc}") from exc
        if done.returncode != 0:
            raise CtrFailed(f"ctr {' '.join(args[:2])} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout
