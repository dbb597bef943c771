"""A sandbox pod whose node lacks its seccomp profile, against a real kube-apiserver: reported,
kept, not replaced.

No scheduler or kubelet serves the namespace: the test reports each pod's status through the
status subresource as they would, with their own words on the real node (tests/node/
test_missing_profile.py proves those on containerd 2.3.7): the scheduler's ``Unschedulable``
when no node carries the profile label the template selects, and the kubelet's
``CreateContainerError`` when the pod's node lacks the profile's file. The lifecycle is the
product's (``lifecycle.work`` with the Kubernetes runner); the session, the store and the clock
are the unit tier's fakes, so the grace period passes at once."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from controller import fleet, lifecycle
from controller.decide import Verdict
from controller.lifecycle import Deps
from controller.runners.kubernetes import names, seccomp
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.runner import KubernetesRunner
from tests.envtest.kubelet import RUNNER_IMAGE
from tests.support.clock import FakeClock
from tests.support.fakes import GRACE, T0, FakeSessions, FakeStore, make_session

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
PROFILE = "sandbox-controller/codex-sandbox.json"
DIGEST = "0123456789abcdef"
# The chart's template with its installer on: the profile, and a node selector on the label.
INSTALLED = SandboxTemplate(
    name="codex-sandbox", image=RUNNER_IMAGE, seccomp_profile=PROFILE, node_selector={seccomp.PROFILE_LABEL: DIGEST}
)
# An operator's own template naming the profile, without the selector.
OWN = SandboxTemplate(name="own-profile", image=RUNNER_IMAGE, seccomp_profile=PROFILE)
# The words of the real node's scheduler and kubelet (containerd 2.3.7), the kubelet root shortened.
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling."
)
NOT_LOADED = (
    f'failed to create containerd container: cannot load seccomp profile "/var/lib/kubelet/seccomp/{PROFILE}": '
    f"open /var/lib/kubelet/seccomp/{PROFILE}: no such file or directory"
)


@dataclass
class Lifecycle:
    """The product's lifecycle over the Kubernetes runner, with the unit tier's fakes around it."""

    deps: Deps
    sessions: FakeSessions
    store: FakeStore
    clock: FakeClock
    reported: list[str]
    """What it reported through ``Deps.on_cannot_start`` (the metric's labels)."""

    def session(self, environment_id: str) -> str:
        """A new session asking for a connection; its executor is not connected."""
        session_id = f"sess_{uuid.uuid4().hex[:12]}"
        self.sessions.put(make_session(session_id, env_id=environment_id))
        self.sessions.connected[environment_id] = False
        return session_id

    def work(self, session_id: str) -> list[Verdict]:
        """A delivery's work, as a worker does it."""
        self.store.want(session_id)
        result = lifecycle.work(session_id, self.deps)
        assert isinstance(result, list), result
        return [d.verdict for d in result]


def _lifecycle(core: client.CoreV1Api, namespace: str, template: SandboxTemplate) -> Lifecycle:
    runner = KubernetesRunner(KubeApi(core), PodSettings(namespace=namespace), lambda name: template)
    sessions, store, clock, reported = FakeSessions(), FakeStore(), FakeClock(T0), list[str]()
    deps = Deps(sessions, store, runner, clock, grace_seconds=GRACE, on_cannot_start=reported.append)
    return Lifecycle(deps, sessions, store, clock, reported)


def _pods(core: client.CoreV1Api, namespace: str, session_id: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=names.session_selector(session_id)).items)


def _events(core: client.CoreV1Api, namespace: str, pod_name: str) -> list[Any]:
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod_name}").items
    return [e for e in found if e.reason == "SandboxCannotStart"]


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _unschedulable(core: client.CoreV1Api, namespace: str, pod_name: str) -> None:
    """As the scheduler reports a pod no node's labels match."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": UNSCHEDULABLE,
        "lastTransitionTime": _stamp(),
    }
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": {"phase": "Pending", "conditions": [condition]}})


def _bind(core: client.CoreV1Api, namespace: str, pod_name: str, node: str) -> None:
    """As the scheduler binds a pod to a node (the binding subresource)."""
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=pod_name), target=client.V1ObjectReference(kind="Node", name=node)
    )
    core.create_namespaced_binding(namespace, body, _preload_content=False)


def _container_error(core: client.CoreV1Api, namespace: str, pod_name: str, message: str) -> None:
    """As the kubelet reports a container the runtime could not create."""
    now = _stamp()
    status = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [
            {
                "name": "executor",
                "image": RUNNER_IMAGE,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "CreateContainerError", "message": message}},
            }
        ],
    }
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": status})


def _running(core: client.CoreV1Api, namespace: str, pod_name: str) -> None:
    """As the kubelet reports the pod's container started (not connected yet)."""
    now = _stamp()
    status = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": [
            {
                "name": "executor",
                "image": RUNNER_IMAGE,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
        ],
    }
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": status})


def test_a_pod_no_node_can_take_for_its_profile_is_reported_and_kept_not_replaced(
    quiet: tuple[client.CoreV1Api, str],
) -> None:
    """L14 (its exception): a session of the template with the chart's profile, and no node has
    the profile's label. The scheduler's Unschedulable is read as that: the look that finds it
    says so once (a Warning Event on the pod, the count by reason) and keeps the pod; looks past
    the grace period keep it still (no delete-and-recreate loop); ``explain`` says why and what
    to do. Once a node has the profile and the pod runs, its executor gets a whole grace period
    from the look that sees it."""
    core, namespace = quiet
    world = _lifecycle(core, namespace, INSTALLED)
    sid = world.session("env_1")
    assert world.work(sid) == [Verdict.START]
    [pod] = _pods(core, namespace, sid)
    assert pod.spec.node_selector == {seccomp.PROFILE_LABEL: DIGEST}
    _unschedulable(core, namespace, pod.metadata.name)

    world.clock.advance(GRACE + 5)  # past the grace: it would be replaced
    assert world.work(sid) == [Verdict.KEEP]
    assert world.reported == [seccomp.NO_NODE]
    [event] = _events(core, namespace, pod.metadata.name)
    assert event.type == "Warning" and event.involved_object.uid == pod.metadata.uid
    assert f"no node is labelled {seccomp.PROFILE_LABEL}={DIGEST}" in event.message, event.message
    assert "sandbox.seccompInstaller" in event.message and sid in event.message

    for _ in range(3):  # later looks, each past another grace: kept, reported once
        world.clock.advance(GRACE + 5)
        assert world.work(sid) == [Verdict.KEEP]
    [still] = _pods(core, namespace, sid)
    assert still.metadata.uid == pod.metadata.uid and still.metadata.deletion_timestamp is None
    assert world.reported == [seccomp.NO_NODE] and len(_events(core, namespace, pod.metadata.name)) == 1
    record = world.store.record(sid)
    assert record is not None and record.cannot_start_since == T0 + GRACE + 5

    told = fleet.explain(sid, world.deps)
    assert told.decision.verdict is Verdict.KEEP and "no node has the seccomp profile" in told.decision.reason
    shown = told.observed["cannot_start"]
    assert shown["kind"] == seccomp.NO_NODE and shown["template"] == INSTALLED.name
    assert shown["for_seconds"] == 3 * (GRACE + 5)

    _bind(core, namespace, pod.metadata.name, "node-with-profile")  # a node got the label
    _running(core, namespace, pod.metadata.name)
    seen_up = world.clock.now()
    assert world.work(sid) == [Verdict.KEEP]
    record = world.store.record(sid)
    assert record is not None and record.cannot_start_since is None and record.disconnected_at == seen_up
    world.clock.advance(GRACE - 1)  # within the grace from that look
    assert world.work(sid) == [Verdict.KEEP]
    world.clock.advance(3)  # past it, still not connected: replaced as usual
    assert world.work(sid) == [Verdict.REPLACE]


def test_a_pod_whose_node_lacks_the_profiles_file_is_reported_and_kept_not_replaced(
    quiet: tuple[client.CoreV1Api, str],
) -> None:
    """L14 (its exception): a template of the operator's own names the profile without the
    node selector, and the pod's node lacks the file: the kubelet's CreateContainerError about
    the seccomp profile is read as that, reported once with the node's name and the runtime's
    words, and the pod kept past the grace (the kubelet retries the container by itself). A
    CreateContainerError about something else is not this: that pod is replaced as before."""
    core, namespace = quiet
    world = _lifecycle(core, namespace, OWN)
    sid = world.session("env_1")
    assert world.work(sid) == [Verdict.START]
    [pod] = _pods(core, namespace, sid)
    assert not pod.spec.node_selector
    _bind(core, namespace, pod.metadata.name, "node-without-profile")
    _container_error(core, namespace, pod.metadata.name, NOT_LOADED)

    for _ in range(3):
        world.clock.advance(GRACE + 5)
        assert world.work(sid) == [Verdict.KEEP]
    assert world.reported == [seccomp.MISSING_ON_NODE]
    [event] = _events(core, namespace, pod.metadata.name)
    assert event.type == "Warning"
    assert f"the seccomp profile {PROFILE} is missing on node node-without-profile" in event.message
    assert "no such file or directory" in event.message
    [still] = _pods(core, namespace, sid)
    assert still.metadata.uid == pod.metadata.uid and still.metadata.deletion_timestamp is None
    assert fleet.explain(sid, world.deps).observed["cannot_start"]["kind"] == seccomp.MISSING_ON_NODE

    other = world.session("env_2")
    assert world.work(other) == [Verdict.START]
    [broken] = _pods(core, namespace, other)
    _bind(core, namespace, broken.metadata.name, "node-without-profile")
    _container_error(core, namespace, broken.metadata.name, 'failed to create containerd container: mount "/x": denied')
    world.clock.advance(GRACE + 5)
    assert world.work(other) == [Verdict.REPLACE]
    assert world.reported == [seccomp.MISSING_ON_NODE]
