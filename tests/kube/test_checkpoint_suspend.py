"""Suspend with memory on Kubernetes (issue 40), the controller's half, against a real
kube-apiserver: the product's lifecycle over the Kubernetes runner, with a stand-in for the node
agent that answers checkpoint requests as ``controller.node_agent`` does (an annotation on the
pod), and the kubelet's reports written through the status subresource as in
``test_missing_profile``. The node tier (tests/node/test_checkpoint_suspend.py) runs the real
agent, kubelet, containerd and CRIU.

Shown here: an idle stop asks the pod's agent, deletes the pod and records the checkpoint on the
workspace claim; the next start creates the pod from the checkpoint image on that node, carrying
the lineage (the lifetime goes on), counted ``restored``; a restored pod seen running spends the
record; a restored pod whose image is gone fails, and the next pod starts afresh, counted
``fresh_start``; an agent's error or silence is a plain stop with nothing recorded."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from controller.decide import Verdict
from controller.model import SessionStatus
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.runner import KubernetesRunner
from tests.envtest.kubelet import RUNNER_IMAGE
from tests.support.fakes import World, make_session, verdicts

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
TEMPLATE = SandboxTemplate(name="checkpointed", image=RUNNER_IMAGE, persist_workspace=True, checkpoint_idle=True)
NODE = "node-a"
IDLE = 600.0


class Agent:
    """The node agent's part, on every pod of the namespace: answers each pending request with a
    checkpoint image named as the real agent names it (``error``: with that error instead;
    ``silent``: never)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, error: str = "", silent: bool = False) -> None:
        self.core, self.namespace, self.error, self.silent = core, namespace, error, silent
        self.answered: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Agent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pod in self.core.list_namespaced_pod(self.namespace, label_selector=names.managed_selector()).items:
                request = checkpoints.pending_request(pod.metadata.annotations or {})
                if request is None or self.silent:
                    continue
                [claim] = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.name == "workspace"]
                image = checkpoints.image_ref(self.namespace, claim, pod.metadata.uid)
                answer = (
                    checkpoints.Answer(request, error=self.error)
                    if self.error
                    else checkpoints.Answer(request, image=image, size_bytes=5_400_000, seconds=1.5)
                )
                body = checkpoints.answer_patch(pod.metadata.uid, answer)
                self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, body)
                self.answered.append(pod.metadata.name)


def _world(core: client.CoreV1Api, namespace: str, outcomes: list[str], timeout: float = 10.0) -> World:
    runner = KubernetesRunner(
        KubeApi(core),
        PodSettings(namespace=namespace),
        lambda name: TEMPLATE,
        checkpointing=True,
        checkpoint_timeout_seconds=timeout,
        on_resume=outcomes.append,
    )
    world = World(idle_timeout=IDLE)
    world.runner = runner  # type: ignore[assignment]
    world.deps = replace(world.deps, runner=runner)
    return world


def _asks(world: World) -> None:
    world.sessions.put(make_session(status=SessionStatus.REQUIRES_ACTION))


def _idles(world: World) -> None:
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(world.clock.now())))
    world.clock.advance(IDLE + 1)


def _live(core: client.CoreV1Api, namespace: str) -> list[Any]:
    pods = core.list_namespaced_pod(namespace, label_selector=names.session_selector("sess_1")).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _record(core: client.CoreV1Api, namespace: str) -> checkpoints.Record | None:
    claim = core.read_namespaced_persistent_volume_claim(names.pvc_name("sess_1"), namespace)
    return checkpoints.record_of(claim.metadata.annotations or {})


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _bind(core: client.CoreV1Api, namespace: str, pod_name: str) -> None:
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=pod_name), target=client.V1ObjectReference(kind="Node", name=NODE)
    )
    core.create_namespaced_binding(namespace, body, _preload_content=False)


def _status(core: client.CoreV1Api, namespace: str, pod: Any, state: dict[str, Any], phase: str) -> None:
    """As the kubelet reports the pod's one container."""
    status = {
        "phase": phase,
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp()}],
        "containerStatuses": [
            {
                "name": names.CONTAINER,
                "image": pod.spec.containers[0].image,
                "imageID": "",
                "ready": phase == "Running",
                "restartCount": 0,
                "state": state,
            }
        ],
    }
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": status})


def _running(core: client.CoreV1Api, namespace: str, pod: Any) -> None:
    _status(core, namespace, pod, {"running": {"startedAt": _stamp()}}, "Running")


def _started(world: World, core: client.CoreV1Api, namespace: str) -> Any:
    """The session's one live pod, once a connection request started it; running on ``NODE``."""
    [pod] = _live(core, namespace)
    if not pod.spec.node_name:
        _bind(core, namespace, pod.metadata.name)
    pod = core.read_namespaced_pod(pod.metadata.name, namespace)
    _running(core, namespace, pod)
    return pod


def _suspended(world: World, core: client.CoreV1Api, namespace: str) -> tuple[Any, checkpoints.Record]:
    """A session started, connected, then idle past the timeout: its suspension."""
    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    first = _started(world, core, namespace)
    _idles(world)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.stopped == ["idle"]
    record = _record(core, namespace)
    assert record is not None
    return first, record


def test_an_idle_pod_is_checkpointed_deleted_recorded_and_its_next_pod_restored_on_its_node(
    quiet: tuple[client.CoreV1Api, str],
) -> None:
    """L11, issue 40: the idle stop asks the pod's node agent for a checkpoint, deletes the pod and
    records the image on the claim (``explain`` shows it); the next connection request creates
    the pod from that image, bound to that node and never pulled, carrying the lineage's first
    start into the store's record (the lifetime goes on); it is counted ``restored``. Seen
    running, its restore took: the record is spent."""
    core, namespace = quiet
    outcomes: list[str] = []
    world = _world(core, namespace, outcomes)
    with Agent(core, namespace) as agent:
        first, record = _suspended(world, core, namespace)
    assert agent.answered == [first.metadata.name]
    assert _live(core, namespace) == []  # deleted (no kubelet here confirms it: it stays terminating)
    assert record.image == checkpoints.image_ref(namespace, names.pvc_name("sess_1"), first.metadata.uid)
    assert record.node == NODE and record.environment_id == "env_1" and record.restore_generation is None
    assert record.lineage_started_at == pytest.approx(first.metadata.creation_timestamp.timestamp(), abs=1)
    found = world.runner.suspended("sess_1")  # type: ignore[attr-defined]
    assert found is not None and found["size_bytes"] == 5_400_000
    assert outcomes == []

    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    [restored] = _live(core, namespace)
    assert restored.metadata.labels[names.GENERATION_LABEL] == "2"
    assert restored.spec.node_name == NODE
    assert restored.spec.containers[0].image == record.image
    assert restored.spec.containers[0].image_pull_policy == "Never"
    assert restored.metadata.annotations[checkpoints.RESTORED_FROM] == record.image
    stored = world.store.record("sess_1")
    assert stored is not None and stored.lineage_started_at == pytest.approx(record.lineage_started_at, abs=0.01)
    assert outcomes == ["restored"]
    marked = _record(core, namespace)
    assert marked is not None and marked.restore_generation == 2
    assert world.runner.suspended("sess_1") is None  # type: ignore[attr-defined]

    _running(core, namespace, restored)
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert _record(core, namespace) is None


def test_a_restored_pod_whose_image_is_gone_fails_and_the_next_one_starts_afresh(
    quiet: tuple[client.CoreV1Api, str],
) -> None:
    """Issue 40: the checkpoint image is gone from the node (the kubelet's ``ErrImageNeverPull``):
    the restored pod has failed, the session's next pod is a fresh one of the template's image on
    the same claim, logged and counted ``fresh_start``, and the record is dropped."""
    core, namespace = quiet
    outcomes: list[str] = []
    world = _world(core, namespace, outcomes)
    with Agent(core, namespace):
        _suspended(world, core, namespace)
    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    [restored] = _live(core, namespace)
    message = f'Container image "{restored.spec.containers[0].image}" is not present with pull policy of Never'
    _status(core, namespace, restored, {"waiting": {"reason": "ErrImageNeverPull", "message": message}}, "Pending")
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    [fresh] = _live(core, namespace)
    assert fresh.metadata.labels[names.GENERATION_LABEL] == "3"
    assert fresh.spec.containers[0].image == RUNNER_IMAGE
    assert checkpoints.RESTORED_FROM not in (fresh.metadata.annotations or {})
    assert [v.persistent_volume_claim.claim_name for v in fresh.spec.volumes if v.name == "workspace"] == [
        names.pvc_name("sess_1")
    ]
    assert outcomes == ["restored", "fresh_start"]
    assert _record(core, namespace) is None


@pytest.mark.parametrize("agent", ["error", "silent"])
def test_without_a_checkpoint_the_idle_pod_is_only_stopped_and_nothing_is_recorded(
    quiet: tuple[client.CoreV1Api, str], agent: str
) -> None:
    """Issue 40: the agent answers with an error (the kubelet refused, CRIU failed), or never
    answers within the timeout: the idle pod is deleted all the same, nothing is recorded, and the
    next start is an ordinary fresh one (no restore to count)."""
    core, namespace = quiet
    outcomes: list[str] = []
    world = _world(core, namespace, outcomes, timeout=2.0)
    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    _started(world, core, namespace)
    _idles(world)
    with Agent(core, namespace, error="checkpointing failed: criu failed", silent=agent == "silent"):
        assert verdicts(world.deliver()) == [Verdict.STOP]
    assert _live(core, namespace) == []
    assert _record(core, namespace) is None
    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    [fresh] = _live(core, namespace)
    assert fresh.spec.containers[0].image == RUNNER_IMAGE
    assert outcomes == []


def test_a_checkpoint_past_the_maximum_lifetime_is_not_restored(quiet: tuple[client.CoreV1Api, str]) -> None:
    """Issue 40, L11: a lineage older than the maximum lifetime is not restored (a restore would
    be stopped at once for its age): a fresh pod starts its own lineage, counted ``fresh_start``."""
    core, namespace = quiet
    outcomes: list[str] = []
    world = _world(core, namespace, outcomes)
    with Agent(core, namespace):
        _suspended(world, core, namespace)
    world.runner = KubernetesRunner(  # type: ignore[assignment]
        KubeApi(core),
        PodSettings(namespace=namespace),
        lambda name: TEMPLATE,
        checkpointing=True,
        max_lifetime_seconds=0.5,
        on_resume=outcomes.append,
    )
    world.deps = replace(world.deps, runner=world.runner)
    time.sleep(0.6)  # the lineage (the first pod's creation, the API's clock) is now past 0.5 s
    _asks(world)
    assert verdicts(world.deliver()) == [Verdict.START]
    [fresh] = _live(core, namespace)
    assert fresh.spec.containers[0].image == RUNNER_IMAGE
    assert outcomes == ["fresh_start"]
    stored = world.store.record("sess_1")
    assert stored is not None and not stored.lineage_started_at
