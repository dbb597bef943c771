"""The warm-pool placement protocol (``runners/kubernetes/placement.py``) against a real
kube-apiserver: the placement record is a Lease owned by the placed pod; the first placement to
create it decides its session's generation; a look at the session's pods defers to it, and it
does not lapse with the API server's event TTL. No kubelet here: the pods stay Pending (alive,
STARTING), which is all a placement looks at. The whole protocol, racing for real with the
test kubelet and the real codex, is ``test_warm_pool.py``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.model import SandboxSpec
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, claim_patch, make_warm_pod
from controller.runners.kubernetes.objects import Pod, PodRef
from controller.runners.kubernetes.placement import Placement
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import ensure_binaries, kube_api  # noqa: F401  (the fixture)
from tests.support.pods import pod_of
from tests.support.processes import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
TEMPLATE = SandboxTemplate(name="fast", image="sandbox-runner:test", warm_pool_size=2)


class _World:
    """A namespace of its own on an API server, and the placement protocol's view of it."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.api_client = server.api_client()
        self.core = client.CoreV1Api(self.api_client)
        self.namespace = f"ns-{uuid.uuid4().hex[:8]}"
        server.create_namespace(self.namespace)
        self.settings = PodSettings(namespace=self.namespace)
        self.placed: list[tuple[str, str, str]] = []
        self.pools = Placement(KubeApi(self.core), self.settings, [TEMPLATE], lambda *what: self.placed.append(what))

    def claimed(self, spec: SandboxSpec, generation: int, claimed_at: float | None = None) -> Pod:
        """A warm pod of the pool, claimed for ``spec`` (as a placement's claim does), at
        ``claimed_at`` by the claiming worker's clock."""
        warm = self.core.create_namespaced_pod(self.namespace, make_warm_pod(TEMPLATE, self.settings))
        patch = claim_patch(spec, generation, time.time() if claimed_at is None else claimed_at)
        return pod_of(self.core.patch_namespaced_pod(warm.metadata.name, self.namespace, patch))

    def lease(self, spec: SandboxSpec, generation: int) -> Any:
        leases = client.CoordinationV1Api(self.api_client)
        return leases.read_namespaced_lease(names.placement_name(spec.session_id, generation), self.namespace)

    def events(self, pod: Pod) -> list[Any]:
        selector = f"involvedObject.name={pod.name}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)

    def live(self, pod: Pod) -> bool:
        try:
            found = self.core.read_namespaced_pod(pod.name, self.namespace)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return bool(found.metadata.uid == pod.uid and found.metadata.deletion_timestamp is None)

    def close(self) -> None:
        self.api_client.close()


@pytest.fixture
def world(kube_api: KubeAPIServer) -> Iterator[_World]:  # noqa: F811
    made = _World(kube_api)
    yield made
    made.close()


def _spec() -> SandboxSpec:
    return SandboxSpec(f"sess_{uuid.uuid4().hex}", f"env_{uuid.uuid4().hex[:12]}", "http://127.0.0.1:1", "/workspace")


def test_the_first_record_decides_and_is_a_lease_owned_by_its_pod(world: _World) -> None:
    """L1: two placements of one session's generation record their pods: the first to create
    the record owns the generation, the second is told the first's pod. The record is a Lease
    named after the session and generation, owned by the pod (its uid: a newer pod of that name
    is not it), labelled as the controller's and carrying ids only; ``kubectl describe`` of the
    winner shows the claim, the loser's shows nothing."""
    spec = _spec()
    first, second = world.claimed(spec, 1), world.claimed(spec, 1)
    assert world.pools.holder(spec.session_id, 1) is None
    assert world.pools.placed(spec.session_id, 1, first) == first.ref
    assert world.pools.placed(spec.session_id, 1, second) == first.ref
    assert world.pools.holder(spec.session_id, 1) == PodRef(first.name, first.uid)
    assert world.pools.holder(spec.session_id, 2) is None

    lease = world.lease(spec, 1)
    [owner] = lease.metadata.owner_references
    assert (owner.api_version, owner.kind, owner.name, owner.uid) == ("v1", "Pod", first.name, first.uid)
    assert lease.spec.holder_identity == first.name
    assert lease.metadata.labels["app.kubernetes.io/managed-by"] == names.MANAGED_BY
    assert lease.metadata.labels[names.SESSION_HASH_LABEL] == names.session_hash(spec.session_id)
    assert lease.metadata.annotations[names.SESSION_ID_ANNOTATION] == spec.session_id
    assert lease.metadata.annotations[names.ENVIRONMENT_ID_ANNOTATION] == spec.environment_id
    assert spec.remote_url not in json.dumps(client.ApiClient().sanitize_for_serialization(lease))
    assert [(e.reason, spec.session_id in e.message) for e in world.events(first)] == [("SandboxClaimed", True)]
    assert world.events(second) == []


def test_a_look_adopts_the_earliest_claim_when_nobody_recorded_one_and_deletes_the_rest(world: _World) -> None:
    """L1: two claims of one session's generation, neither recorded (their placements stopped
    between claim and record): a look at the session's pods records the earliest claim, returns
    it, and deletes the other; a placement that comes back later defers to the record."""
    spec = _spec()
    early = world.claimed(spec, 1, claimed_at=time.time() - 5)
    late = world.claimed(spec, 1)
    assert world.pools.settled(spec.session_id, [late, early]) == early
    assert world.pools.holder(spec.session_id, 1) == early.ref
    wait_for(lambda: not world.live(late), 30, "the unrecorded claim to be deleted")
    assert world.live(early)
    assert world.pools.placed(spec.session_id, 1, late) == early.ref


def test_the_record_outlives_the_event_ttl_and_not_the_workers_clocks_decides() -> None:
    """L1, with a worker's clock 20 s behind: the API server keeps Events for ``--event-ttl``
    (an hour by default; 3 s here) and the placement record outlives it, so long as its pod
    lives. A claim of the same generation that turns up later (a placement that stalled between
    its claim and its record) bears an earlier claim time, written by a slow clock: a look at
    the session's pods still returns the recorded pod and deletes the stale claim. (With the
    record an Event, it lapsed with the TTL, and the look recorded the earliest claim instead:
    it deleted the pod that served the session.)"""
    server = KubeAPIServer(ensure_binaries(), extra_apiserver_args=["--event-ttl=3s"])
    server.start()
    world = _World(server)
    try:
        spec = _spec()
        placed = world.claimed(spec, 1)
        assert world.pools.placed(spec.session_id, 1, placed) == placed.ref
        assert world.events(placed)  # the claim, for kubectl describe …
        wait_for(lambda: not world.events(placed), 60, "the API server to drop the event (its TTL)", interval=0.5)
        assert world.pools.holder(spec.session_id, 1) == placed.ref  # … the record stays

        stale = world.claimed(spec, 1, claimed_at=float(placed.annotations[names.CLAIMED_AT_ANNOTATION]) - 20)
        assert world.pools.settled(spec.session_id, [placed, stale]) == placed
        wait_for(lambda: not world.live(stale), 30, "the stale claim to be deleted")
        assert world.live(placed)
    finally:
        world.close()
        server.stop()
