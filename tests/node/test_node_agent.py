"""The node agent (``sandbox-controller node-agent``, controller/node_agent/) on the real node,
alone: a host process in the node's network namespace, as the chart's DaemonSet pod would be
on a node, with the tier's API server (a kubeconfig), kubelet, checkpoints directory and
containerd. A checkpoint request on a managed sandbox pod is answered with a checkpoint image
in the node's containerd (the kubelet's archive gone), from which a new pod on the same claim
gets the process back with its memory; a pod the controller does not manage is never
checkpointed, whatever it asks; an image nothing names is deleted after the grace, one a
claim's record names is kept. The controller's side (the request at an idle stop, the record,
the restore) is not in this test.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.runners.kubernetes import checkpoints, names
from tests.node.checkpoints import (
    beats,
    delete_pod,
    first_beat,
    manifest,
    run_pod,
)
from tests.node.node import KUBELET_PORT, NODE_IP, ROOT, Daemon, Image, RealNode, say
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(900)]

GRACE_SECONDS = 2.0
POLL_SECONDS = 0.5
CLAIM = "workspace"  # checkpoint_space's claim


@contextlib.contextmanager
def node_agent(node: RealNode, namespace: str) -> Iterator[Daemon]:
    """The agent for ``namespace`` on the node, its settings as the chart would give them (the
    token file absent: the tier's kubelet lets anyone in); stopped with SIGTERM after, and
    checked to be gone, having ended cleanly."""
    prefix = "CONTROLLER_NODE_AGENT_"
    env = {
        "KUBECONFIG": node.kubeconfig,
        "PYTHONPATH": str(ROOT),
        "CONTROLLER_KUBERNETES_NAMESPACE": namespace,
        prefix + "NODE_NAME": node.name,
        prefix + "KUBELET_URL": f"https://{NODE_IP}:{KUBELET_PORT}",
        prefix + "KUBELET_CA_FILE": str(node.workdir / "kubelet-pki" / "kubelet.crt"),
        prefix + "KUBELET_TOKEN_FILE": str(node.workdir / "no-such-token"),
        prefix + "CHECKPOINT_DIRECTORY": str(checkpoints_directory(node)),
        prefix + "CONTAINERD_ADDRESS": str(node.containerd_socket),
        prefix + "CTR": str(node.bin_dir / "ctr"),
        prefix + "POLL_SECONDS": str(POLL_SECONDS),
        prefix + "IMAGE_GRACE_SECONDS": str(GRACE_SECONDS),
    }
    # A log of its own (the node appends to a name's log).
    agent = node.spawn(
        f"node-agent-{secrets.token_hex(4)}", [sys.executable, "-m", "controller", "node-agent"], env=env
    )
    try:

        def started() -> bool:
            agent.check()
            return any(line.get("event") == "node agent started" for line in log_lines(agent))

        wait_for(started, 60, "the node agent to start")
        yield agent
    finally:
        agent.stop()
        assert agent.proc.poll() == 0, (agent.proc.returncode, agent.log.read_text()[-2000:])
        assert not [pid for pid, argv in node.processes() if "node-agent" in argv], node.processes()
        assert any(line.get("event") == "node agent stopped" for line in log_lines(agent))


def log_lines(agent: Daemon) -> list[dict[str, Any]]:
    lines = []
    for line in agent.log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                lines.append(found)
    return lines


def checkpoints_directory(node: RealNode) -> Path:
    return node.workdir / "kubelet" / "checkpoints"


def archives_of(node: RealNode, namespace: str, pod: str) -> list[str]:
    directory = checkpoints_directory(node)
    prefix = f"checkpoint-{pod}_{namespace}-"
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(prefix)) if directory.exists() else []


def node_images(node: RealNode) -> set[str]:
    return set(node.ctr("image", "ls", "-q").stdout.split())


def sandbox_manifest(name: str, image: str, uid: int, session_id: str, managed: bool = True) -> dict[str, Any]:
    """tests/node/checkpoints.py's pod, labelled and annotated as the controller's sandbox pod
    of ``session_id`` (unless not ``managed``)."""
    pod = manifest(name, image, uid)
    pod["metadata"]["annotations"][names.SESSION_ID_ANNOTATION] = session_id
    if managed:
        pod["metadata"]["labels"] = names.labels(session_id, 1)
    return pod


def request_checkpoint(core: Any, namespace: str, name: str) -> str:
    nonce = secrets.token_hex(8)
    core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {checkpoints.CHECKPOINT_REQUEST: nonce}}})
    return nonce


def answer(core: Any, namespace: str, name: str, request: str) -> checkpoints.Answer | None:
    found = core.read_namespaced_pod(name, namespace)
    return checkpoints.answer_of(found.metadata.annotations or {}, request)


def test_the_agent_answers_a_managed_pods_request_with_an_image_a_new_pod_restores_and_deletes_it_when_unnamed(
    node: RealNode, checkpoint_namespace: tuple[Any, str, int], images: list[Image]
) -> None:
    """A managed sandbox pod asks (``CHECKPOINT_REQUEST``): the agent answers with the image
    ``image_ref(claim, pod uid)``, which is in the node's containerd, and the kubelet's archive is
    gone. A pod that is not managed, asking first, is never checkpointed (no answer, no archive,
    still running). A new pod naming the image on the same claim prints the token the first drew
    before the checkpoint and counts on. Once no pod names the image (nor any claim's record), the
    agent deletes it after the grace."""
    core, namespace, uid = checkpoint_namespace
    controller = next(i.ref for i in images if i.name == "sandbox-controller")
    session_id = f"sess_{secrets.token_hex(4)}"
    # Created (and asking) first: were it served at all, it would be served before the other.
    stranger = run_pod(core, namespace, sandbox_manifest("stranger", controller, uid, session_id, managed=False))
    first = run_pod(core, namespace, sandbox_manifest("first", controller, uid, session_id))
    token, _ = first_beat(core, namespace, "first")
    first_beat(core, namespace, "stranger")
    with node_agent(node, namespace) as agent:
        stranger_request = request_checkpoint(core, namespace, "stranger")
        request = request_checkpoint(core, namespace, "first")
        found = wait_for(lambda: answer(core, namespace, "first", request), 180, "the agent's answer")
        assert found.ok, found
        image = checkpoints.image_ref(namespace, CLAIM, first.metadata.uid)
        assert found.image == image and found.size_bytes > 0 and found.seconds > 0
        say(f"node agent: {found.size_bytes} bytes in {found.seconds:.2f}s (kubelet, image, import)")
        assert image in node_images(node)
        assert archives_of(node, namespace, "first") == []
        [taken] = [line for line in log_lines(agent) if line.get("event") == "checkpoint taken"]
        assert (taken["session_id"], taken["pod"], taken["image"]) == (session_id, "first", image)

        assert answer(core, namespace, "stranger", stranger_request) is None
        assert archives_of(node, namespace, "stranger") == []
        assert core.read_namespaced_pod("stranger", namespace).status.phase == "Running"
        assert stranger.metadata.name not in {line.get("pod") for line in log_lines(agent)}
        delete_pod(core, namespace, "stranger")

        # As the controller does: the record on the claim, then the pod deleted.
        record = checkpoints.Record(
            image=image, node=node.name, environment_id="env", suspended_at=1.0, lineage_started_at=1.0
        )
        annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: record.encode()})
        checkpointed = max(n for _, n in beats(core, namespace, "first"))
        delete_pod(core, namespace, "first")
        restored = run_pod(core, namespace, sandbox_manifest("restored", image, uid, session_id))
        try:
            assert restored.spec.volumes[0].persistent_volume_claim.claim_name == CLAIM

            def counted_on() -> list[tuple[str, int]]:
                return [beat for beat in beats(core, namespace, "restored") if beat[1] > checkpointed]

            later = wait_for(counted_on, 60, "the restored process to count past the checkpoint", interval=0.5)
            assert {beat[0] for beat in later} == {token}, later
            # The record gone, the restored pod's container still names the image: kept.
            annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: None})
            stays(lambda: image in node_images(node), 3 * GRACE_SECONDS, "the image a pod names")
        finally:
            delete_pod(core, namespace, "restored")
            annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: None})

        wait_for(lambda: image not in node_images(node), 60, "the agent to delete the unnamed image", interval=0.5)
        [deleted] = [line for line in log_lines(agent) if line.get("event") == "checkpoint image deleted"]
        assert deleted["image"] == image


def test_an_image_a_claims_record_names_is_kept_and_one_nothing_names_is_deleted(
    node: RealNode, checkpoint_namespace: tuple[Any, str, int], images: list[Image]
) -> None:
    """Two checkpoint images on the node (tags of the controller image under the checkpoint
    repository), one named by the claim's record: the agent deletes the other after the grace
    and, at that very look and later ones, keeps the recorded one; once the record is gone, it
    deletes that one too."""
    core, namespace, _ = checkpoint_namespace
    controller = next(i.ref for i in images if i.name == "sandbox-controller")
    recorded = checkpoints.image_ref(namespace, CLAIM, secrets.token_hex(6))
    unnamed = checkpoints.image_ref(namespace, CLAIM, secrets.token_hex(6))
    for ref in (recorded, unnamed):
        node.ctr("image", "tag", controller, ref)
    record = checkpoints.Record(
        image=recorded, node=node.name, environment_id="env", suspended_at=1.0, lineage_started_at=1.0
    )
    annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: record.encode()})
    try:
        with node_agent(node, namespace) as agent:
            wait_for(lambda: unnamed not in node_images(node), 60, "the agent to delete the unnamed image")
            assert recorded in node_images(node)
            stays(lambda: recorded in node_images(node), 3 * GRACE_SECONDS, "the image the claim's record names")
            annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: None})
            wait_for(lambda: recorded not in node_images(node), 60, "the agent to delete the image the record left")
            deleted = {line["image"] for line in log_lines(agent) if line.get("event") == "checkpoint image deleted"}
            assert deleted == {recorded, unnamed}
    finally:
        for ref in (recorded, unnamed):
            node.ctr("image", "rm", ref, check=False)
        annotate_claim(core, namespace, {checkpoints.CHECKPOINT_RECORD: None})


def stays(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """``condition`` holds at every look over ``seconds`` (what must not change: the agent looks
    every ``GRACE_SECONDS / 2``, so this spans several of its looks)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), f"{what} did not stay"
        time.sleep(0.25)


def annotate_claim(core: Any, namespace: str, annotations: dict[str, str | None]) -> None:
    core.patch_namespaced_persistent_volume_claim(CLAIM, namespace, {"metadata": {"annotations": annotations}})


def test_the_agent_leaves_the_archives_of_other_namespaces_alone(
    node: RealNode, checkpoint_namespace: tuple[Any, str, int]
) -> None:
    """The agent removes only what a crashed agent of its namespace left in the checkpoints
    directory (older than the grace); another namespace's archive stays."""
    _, namespace, _ = checkpoint_namespace
    directory = checkpoints_directory(node)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = "2026-12-06T16:10:03Z"
    stray = directory / f"checkpoint-sbx-x-g1_{namespace}-{checkpoints.CONTAINER}-{stamp}.tar"
    foreign = directory / f"checkpoint-web-1_default-{checkpoints.CONTAINER}-{stamp}.tar"
    for path in (stray, foreign):
        path.write_bytes(b"x")
        os.utime(path, (1.0, 1.0))
    try:
        with node_agent(node, namespace) as agent:
            wait_for(lambda: not stray.exists(), 60, "the agent to remove the stray archive")
            assert foreign.exists()
            removed = [line["file"] for line in log_lines(agent) if line.get("event") == "checkpoint archive removed"]
            assert removed == [stray.name]
    finally:
        stray.unlink(missing_ok=True)
        foreign.unlink(missing_ok=True)
