"""Suspend with memory on Kubernetes, path (a) of issue 40, on the real node (kubelet v1.37,
containerd 2.3 + runc 1.4, CRIU 4.2): the kubelet's checkpoint API writes a running container's
archive, the archive becomes a checkpoint image (imported with ``ctr``, no registry), and a new
pod whose container names that image gets the process tree back, with its memory, on a new pod
IP and the same workspace claim. What is judged is what the background process prints
(tests/node/checkpoints.py: a token it drew at start and holds only in memory, and its counter
going on past the checkpoint). docs/kubernetes.md ("Suspend with memory") has the commands, the
errors on the way and what a cluster needs; BENCHMARKS.md the figures.
"""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.node.checkpoints import (
    BEAT,
    CONTAINER,
    beats,
    checkpoint,
    checkpoint_image,
    delete_pod,
    first_beat,
    kubelet_checkpoint,
    last_beat_in,
    manifest,
    run_pod,
)
from tests.node.node import NODE_IP, Image, RealNode
from tests.node.probes import pod_exec
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(900)]

LINK_PORT = 7431
TCP_CLOSE = "tcp-close\n"


def test_a_pods_background_process_keeps_its_memory_across_checkpoint_and_restore_from_an_image(
    node: RealNode, checkpoint_namespace: tuple[Any, str, int], images: list[Image]
) -> None:
    """The kubelet checkpoints the running container (an archive under its checkpoint
    directory); the pod is deleted; a new pod naming the checkpoint image on the same claim runs
    the same process again: it prints the token it drew before the checkpoint (a fresh start
    would draw another) and counts on past it, on a new pod IP, and its file held open on the
    workspace is the claim's file, which it goes on writing."""
    core, namespace, uid = checkpoint_namespace
    controller = next(i.ref for i in images if i.name == "sandbox-controller")
    first = run_pod(core, namespace, manifest("first", controller, uid))
    token, _ = first_beat(core, namespace, "first")
    archive = checkpoint(node, namespace, "first")
    checkpointed = last_beat_in(archive)
    delete_pod(core, namespace, "first")
    with checkpoint_image(node, archive) as ref:
        restored = run_pod(core, namespace, manifest("restored", ref, uid))
        try:
            assert restored.status.pod_ip != first.status.pod_ip

            def counted_on() -> list[tuple[str, int]]:
                return [beat for beat in beats(core, namespace, "restored") if beat[1] > checkpointed]

            later = wait_for(counted_on, 60, "the restored process to count past the checkpoint", interval=0.5)
            assert {beat[0] for beat in later} == {token}, later
            written = pod_exec(core, "restored", namespace, ["cat", "/workspace/beats"]).split()
            assert str(later[0][1]) in written, written[-10:]
        finally:
            delete_pod(core, namespace, "restored")


class _Listener:
    """A TCP server on the node's address (the test is in its network namespace) that accepts
    and holds connections, recording each peer's address."""

    def __init__(self) -> None:
        self.peers: list[str] = []
        self._held: list[socket.socket] = []
        self._server = socket.create_server((NODE_IP, LINK_PORT))
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.peers.append(peer[0])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()
        for conn in self._held:
            conn.close()


def test_an_established_link_stops_the_checkpoint_unless_criu_closes_it_and_the_restored_process_reconnects(
    node: RealNode, checkpoint_namespace: tuple[Any, str, int], images: list[Image]
) -> None:
    """The executor always holds a link to the API. With it up, the kubelet's checkpoint fails
    (CRIU: "Connected TCP socket, consider using --tcp-established option"; no runtime setting
    of the CRI asks for it) and the container runs on untouched. With CRIU configured to close
    established connections (``tcp-close``, here the pod's ``org.criu.config``; on a cluster's
    node ``/etc/criu/runc.conf``) the checkpoint is written, and the restored process finds its
    link closed ("Broken pipe") and connects again, from the new pod's IP, keeping its memory."""
    core, namespace, uid = checkpoint_namespace
    controller = next(i.ref for i in images if i.name == "sandbox-controller")
    listener = _Listener()
    config = node.workdir / "criu-tcp-close.conf"
    config.write_text(TCP_CLOSE)
    config.chmod(0o644)
    link = f"{NODE_IP}:{LINK_PORT}"
    try:
        run_pod(core, namespace, manifest("linked", controller, uid, link=link))
        token, _ = first_beat(core, namespace, "linked")
        status, body = kubelet_checkpoint(node, namespace, "linked")
        assert status == 500 and "criu failed: type DUMP" in body, (status, body)
        [dump_log] = re.findall(r"path= (\S+criu-dump\.log)", body)
        assert "Connected TCP socket, consider using --tcp-established option" in Path(dump_log).read_text()
        seen = len(beats(core, namespace, "linked"))
        wait_for(lambda: len(beats(core, namespace, "linked")) > seen, 30, "the container to run on", interval=0.5)
        assert core.read_namespaced_pod("linked", namespace).status.phase == "Running"
        assert {beat[0] for beat in beats(core, namespace, "linked")} == {token}
        delete_pod(core, namespace, "linked")

        closing = run_pod(core, namespace, manifest("closing", controller, uid, link=link, criu_config=str(config)))
        token, _ = first_beat(core, namespace, "closing")
        archive = checkpoint(node, namespace, "closing")
        delete_pod(core, namespace, "closing")
        with checkpoint_image(node, archive) as ref:
            reopened = run_pod(core, namespace, manifest("reopened", ref, uid, link=link, criu_config=str(config)))
            try:

                def reconnected() -> str:
                    log = core.read_namespaced_pod_log("reopened", namespace, container=CONTAINER)
                    return log if "link reconnected" in log else ""

                log = wait_for(reconnected, 60, "the restored process to connect again", interval=0.5)
                assert "link lost: [Errno 32] Broken pipe" in log, log[-2000:]
                after = log[log.index("link reconnected") :]
                assert {m.group(1) for m in BEAT.finditer(after)} == {token}, after[:500]
                wait_for(lambda: reopened.status.pod_ip in listener.peers, 30, "the new link from the new pod IP")
                assert closing.status.pod_ip != reopened.status.pod_ip
            finally:
                delete_pod(core, namespace, "reopened")
    finally:
        listener.close()
