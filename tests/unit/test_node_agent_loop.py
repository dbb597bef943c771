"""The node agent's loop (controller/node_agent/agent.py) against stand-ins for the API server,
the kubelet and containerd: what it answers, that the archives never stay, that an answer the
API server did not take is sent again rather than taken again, that a failing look does not end
the loop, and what it deletes. (tests/node/test_node_agent.py runs it on the real node.)"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from controller.config import NodeAgentSettings
from controller.errors import KubernetesUnavailable
from controller.node_agent.agent import Agent
from controller.node_agent.containerd import CtrFailed
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.objects import Claim, Pod

NODE, NS, STAMP = "node-a", "sandboxes", "2026-12-06T16:10:03Z"


def sandbox(name: str = "sbx-s1-g1", request: str = "nonce-1", claim: str | None = "ws-s1") -> Pod:
    return Pod(
        name=name,
        uid=f"0123456789ab-{name}",
        labels=names.labels("s1", 1),
        annotations={names.SESSION_ID_ANNOTATION: "s1", checkpoints.CHECKPOINT_REQUEST: request},
        node_name=NODE,
        workspace_claim=claim,
        images=("runner:1",),
    )


class FakeKube:
    def __init__(self, pods: list[Pod], claims: list[Claim] | None = None) -> None:
        self.pods = pods
        self.claims = claims or []
        self.patch_fails = 0
        self.list_fails = 0
        self.patched: list[tuple[str, list[dict[str, Any]]]] = []

    def list_pods(self, namespace: str, selector: str, node: str | None = None) -> list[Pod]:
        if node is None:  # the collection's look: every pod of the namespace
            return list(self.pods)
        assert (namespace, selector, node) == (NS, names.managed_selector(), NODE)
        if self.list_fails:
            self.list_fails -= 1
            raise KubernetesUnavailable("cannot reach Kubernetes to list pods")
        return list(self.pods)

    def list_claims(self, namespace: str, selector: str) -> list[Claim]:
        return list(self.claims)

    def patch_pod_if(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> Pod | None:
        if self.patch_fails:
            self.patch_fails -= 1
            raise KubernetesUnavailable("cannot reach Kubernetes to patch pods")
        self.patched.append((name, patch))
        found = next(p for p in self.pods if p.name == name)
        annotations = {**found.annotations, checkpoints.CHECKPOINT_ANSWER: patch[1]["value"]}
        self.pods = [p if p.name != name else Pod(**{**p.__dict__, "annotations": annotations}) for p in self.pods]
        return found


class FakeKubelet:
    def __init__(self, directory: Path, status: int = 200) -> None:
        self.directory = directory
        self.status = status
        self.calls: list[tuple[str, str, str]] = []

    def checkpoint(self, namespace: str, pod: str, container: str) -> tuple[int, str]:
        self.calls.append((namespace, pod, container))
        if self.status != 200:
            return self.status, "checkpointing of x failed (rpc error: criu failed: type DUMP)"
        name = f"checkpoint-{pod}_{namespace}-{container}-{STAMP}.tar"
        (self.directory / name).write_bytes(b"archive" * 100)
        return 200, json.dumps({"items": [f"/var/lib/kubelet/checkpoints/{name}"]})


class FakeContainerd:
    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.held: list[str] = []
        self.imported: list[tuple[str, bytes]] = []

    def import_image(self, oci_archive: str, ref: str) -> None:
        if self.fail:
            raise CtrFailed(f"ctr image import exited 1: {self.fail}")
        self.imported.append((ref, Path(oci_archive).read_bytes()))
        self.held.append(ref)

    def images(self) -> list[str]:
        return list(self.held)

    def remove(self, ref: str) -> None:
        self.held.remove(ref)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def agent(
    tmp_path: Path, kube: FakeKube, kubelet: FakeKubelet, containerd: FakeContainerd, clock: Clock | None = None
) -> Agent:
    settings = NodeAgentSettings(node_name=NODE, checkpoint_directory=str(tmp_path), image_grace_seconds=60.0)
    return Agent(settings, NS, kube, kubelet, containerd, threading.Event(), clock or Clock())  # type: ignore[arg-type]


def answer_on(kube: FakeKube, name: str = "sbx-s1-g1") -> checkpoints.Answer:
    found = next(p for p in kube.pods if p.name == name)
    answer = checkpoints.answer_of(found.annotations, found.annotations[checkpoints.CHECKPOINT_REQUEST])
    assert answer is not None
    return answer


def test_a_request_is_answered_with_the_image_named_by_claim_and_pod_uid_and_no_file_stays(tmp_path: Path) -> None:
    kube, kubelet, containerd = FakeKube([sandbox()]), FakeKubelet(tmp_path), FakeContainerd()
    assert agent(tmp_path, kube, kubelet, containerd).step() is True
    answer = answer_on(kube)
    assert answer.ok and answer.image == checkpoints.image_ref(NS, "ws-s1", "0123456789ab-sbx-s1-g1")
    assert answer.size_bytes == 700 and answer.seconds >= 0
    assert kubelet.calls == [(NS, "sbx-s1-g1", checkpoints.CONTAINER)]
    [(ref, oci)] = containerd.imported
    assert ref == answer.image and b"org.criu.checkpoint.container.name" in oci
    assert list(tmp_path.iterdir()) == []
    assert kube.patched[0][1][0] == {"op": "test", "path": "/metadata/uid", "value": "0123456789ab-sbx-s1-g1"}


def test_an_import_that_fails_is_answered_with_ctrs_words_and_both_archives_are_removed(tmp_path: Path) -> None:
    kube, kubelet = FakeKube([sandbox()]), FakeKubelet(tmp_path)
    agent(tmp_path, kube, kubelet, FakeContainerd(fail="content digest not found")).step()
    answer = answer_on(kube)
    assert not answer.ok and "content digest not found" in answer.error
    assert list(tmp_path.iterdir()) == []


def test_a_kubelet_refusal_is_answered_with_its_body(tmp_path: Path) -> None:
    kube = FakeKube([sandbox()])
    agent(tmp_path, kube, FakeKubelet(tmp_path, status=500), FakeContainerd()).step()
    assert answer_on(kube).error.startswith("the kubelet answered 500: checkpointing of x failed")


def test_a_pod_without_a_workspace_claim_is_answered_with_an_error_and_never_checkpointed(tmp_path: Path) -> None:
    kube, kubelet = FakeKube([sandbox(claim=None)]), FakeKubelet(tmp_path)
    agent(tmp_path, kube, kubelet, FakeContainerd()).step()
    assert "no workspace claim" in answer_on(kube).error and kubelet.calls == []


def test_an_answer_the_api_server_did_not_take_is_sent_again_not_taken_again(tmp_path: Path) -> None:
    kube, kubelet, containerd = FakeKube([sandbox()]), FakeKubelet(tmp_path), FakeContainerd()
    kube.patch_fails = 1
    served = agent(tmp_path, kube, kubelet, containerd)
    with pytest.raises(KubernetesUnavailable):
        served.step()
    served.step()
    assert answer_on(kube).ok and len(kubelet.calls) == 1 and len(containerd.imported) == 1


def test_a_failing_look_is_logged_and_the_loop_goes_on_until_stopped(tmp_path: Path) -> None:
    kube, kubelet, containerd = FakeKube([sandbox()]), FakeKubelet(tmp_path), FakeContainerd()
    kube.list_fails = 1
    settings = NodeAgentSettings(node_name=NODE, checkpoint_directory=str(tmp_path), poll_seconds=0.1)
    stop = threading.Event()
    loop = Agent(settings, NS, kube, kubelet, containerd, stop)  # type: ignore[arg-type]
    runner = threading.Thread(target=loop.run)
    runner.start()
    try:
        for _ in range(100):
            if kube.patched:
                break
            stop.wait(0.1)
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive() and answer_on(kube).ok


def test_collection_deletes_an_image_nothing_names_after_the_grace_and_keeps_a_recorded_one(tmp_path: Path) -> None:
    recorded = checkpoints.image_ref(NS, "ws-s1", "aaaaaaaaaaaa")
    forgotten = checkpoints.image_ref(NS, "ws-s2", "bbbbbbbbbbbb")
    # Another release's sandbox namespace on the same node: its agent's, never this one's to delete.
    theirs = checkpoints.image_ref("other-sandboxes", "ws-s2", "cccccccccccc")
    record = checkpoints.Record(image=recorded, node=NODE, environment_id="e", suspended_at=1, lineage_started_at=1)
    kube = FakeKube([], [Claim("ws-s1", {checkpoints.CHECKPOINT_RECORD: record.encode()})])
    containerd, clock = FakeContainerd(), Clock()
    containerd.held = [recorded, forgotten, theirs, "localhost/sandbox-controller:node"]
    stray = tmp_path / f"checkpoint-sbx-s2-g1_{NS}-{checkpoints.CONTAINER}-{STAMP}.tar"  # a crashed agent's
    young = tmp_path / f"checkpoint-sbx-s3-g1_{NS}-{checkpoints.CONTAINER}-{STAMP}.tar"  # being written
    for path, age in ((stray, 61), (young, 59)):
        path.write_bytes(b"x")
        os.utime(path, (clock.now + 60 - age, clock.now + 60 - age))
    collecting = agent(tmp_path, kube, FakeKubelet(tmp_path), containerd, clock)
    collecting.collect()
    assert sorted(containerd.held) == sorted([recorded, forgotten, theirs, "localhost/sandbox-controller:node"])
    clock.now += 60
    collecting.collect()
    assert sorted(containerd.held) == sorted([recorded, theirs, "localhost/sandbox-controller:node"])
    assert not stray.exists() and young.exists()


def test_a_stop_during_a_checkpoint_ends_the_loop_after_the_answer_is_on_the_pod(tmp_path: Path) -> None:
    """SIGTERM sets the stop event (agent.run); here it comes while the kubelet is checkpointing."""
    kube = FakeKube([sandbox(), sandbox("sbx-s2-g1", request="nonce-2")])
    stop = threading.Event()

    class StoppedMidway(FakeKubelet):
        def checkpoint(self, namespace: str, pod: str, container: str) -> tuple[int, str]:
            stop.set()
            return super().checkpoint(namespace, pod, container)

    kubelet = StoppedMidway(tmp_path)
    settings = NodeAgentSettings(node_name=NODE, checkpoint_directory=str(tmp_path))
    Agent(settings, NS, kube, kubelet, FakeContainerd(), stop).run()  # type: ignore[arg-type]
    assert answer_on(kube).ok and len(kubelet.calls) == 1  # the second request waits for the next agent


def test_the_node_agent_command_refuses_to_start_without_its_node_and_kubelet(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from controller.cli import main

    for key in [k for k in os.environ if k.startswith("CONTROLLER_")]:
        monkeypatch.delenv(key)
    assert main(["node-agent"]) == 2
    err = capsys.readouterr().err
    assert "CONTROLLER_NODE_AGENT_NODE_NAME is required for `node-agent`" in err
    assert "CONTROLLER_NODE_AGENT_KUBELET_URL is required for `node-agent`" in err
