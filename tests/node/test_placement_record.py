"""The warm-pool placement record on a real cluster (kube-controller-manager runs its garbage
collector here, unlike the kube tier's API server alone): a Lease owned by the placed pod lives
exactly as long as the pod. (The chart's worker writing it with the chart's Role, end to end,
is ``test_real_node.py::test_a_webhook_is_served_by_a_warm_pod_which_is_never_reused``.)"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from controller.model import SandboxSpec
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.placement import Placement
from tests.node.conftest import Installed
from tests.support.pods import pod_of
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(1800)]


def _unschedulable_pod(core: Any, namespace: str) -> Any:
    """A pod no node takes (it stays Pending, alive to a placement, and pulls nothing)."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "placed-"},
        "spec": {
            "nodeSelector": {"sandbox-controller.dev/test": "nowhere"},
            "containers": [{"name": "c", "image": "sandbox-controller/none:0"}],
        },
    }
    return core.create_namespaced_pod(namespace, body)


def test_the_placement_record_lives_exactly_as_long_as_its_pod(installed: Installed) -> None:
    """L1: the placement record of a session's generation (a Lease owned by the pod) stays while
    its pod lives, and the garbage collector deletes it once the pod is gone: a record never
    outlives its pod, and never lapses before it."""
    core = installed.core
    namespace = f"placement-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    leases = client.CoordinationV1Api(core.api_client)
    pools = Placement(KubeApi(core), PodSettings(namespace=namespace), [SandboxTemplate()], lambda *what: None)
    try:
        kept, gone = (SandboxSpec(f"sess_{uuid.uuid4().hex}", "env_1", "http://127.0.0.1:1") for _ in range(2))
        pods = {spec.session_id: pod_of(_unschedulable_pod(core, namespace)) for spec in (kept, gone)}
        for spec in (kept, gone):
            assert pools.placed(spec.session_id, 1, pods[spec.session_id]) == pods[spec.session_id].ref

        def lease(spec: SandboxSpec) -> Any | None:
            try:
                return leases.read_namespaced_lease(names.placement_name(spec.session_id, 1), namespace)
            except client.exceptions.ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        core.delete_namespaced_pod(pods[gone.session_id].name, namespace)
        wait_for(lambda: lease(gone) is None, 120, "the garbage collector to delete the gone pod's record", 0.5)
        # The collector has acted on this namespace since: the live pod's record is still there.
        record = lease(kept)
        assert record is not None and record.metadata.owner_references[0].uid == pods[kept.session_id].uid
        assert pools.holder(kept.session_id, 1) == pods[kept.session_id].ref
        assert pools.holder(gone.session_id, 1) is None
    finally:
        core.delete_namespace(namespace)
