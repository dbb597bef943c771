"""A sandbox pod in its own user namespace (``hostUsers: false``) on the real node: containerd
2.3 + runc 1.4 run it, Pod Security "restricted" admits it, its root is not the node's root (the
pod's uid 0 maps to an unprivileged range of the node's uids), and a workspace on a
PersistentVolumeClaim is written and read there by the runner's uid."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.node.node import Image, RealNode
from tests.node.probes import pod, pod_exec
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(900)]

RUNNER_UID = 10001


@pytest.fixture(scope="module")
def restricted(node: RealNode) -> Iterator[tuple[Any, str]]:
    """A namespace enforcing "restricted" with a bound workspace claim (a hostPath volume)."""
    core = client.CoreV1Api(node.api_client())
    namespace = f"userns-{uuid.uuid4().hex[:6]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=labels)))
    claim = {
        "metadata": {"name": "workspace"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    core.create_namespaced_persistent_volume_claim(namespace, claim)
    try:
        wait_for(
            lambda: core.read_namespaced_persistent_volume_claim("workspace", namespace).status.phase == "Bound",
            120,
            "the workspace claim to bind",
            interval=0.5,
        )
        yield core, namespace
    finally:
        core.delete_namespace(namespace)


def _pod(image: str) -> dict[str, Any]:
    """The default template's security context (manifests.py) plus ``hostUsers: false``."""
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUNNER_UID,
        "runAsGroup": RUNNER_UID,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "userns-"},
        "spec": {
            "hostUsers": False,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNNER_UID,
                "runAsGroup": RUNNER_UID,
                "fsGroup": RUNNER_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "sandbox",
                    "image": image,
                    "command": ["sleep", "3600"],
                    "workingDir": "/workspace",
                    "securityContext": security,
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                }
            ],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        },
    }


def test_a_pod_without_host_users_runs_in_its_own_user_namespace_under_restricted(
    restricted: tuple[Any, str], images: list[Image]
) -> None:
    core, namespace = restricted
    runner = next(i.ref for i in images if i.name == "sandbox-runner")
    with pod(core, namespace, _pod(runner)) as running:
        name = running.metadata.name
        # uid_map: "<uid inside> <uid on the node> <count>". On the node's own user namespace
        # it is "0 0 4294967295"; here the pod's root is an unprivileged node uid.
        [mapping] = pod_exec(core, name, namespace, ["cat", "/proc/self/uid_map"]).strip().splitlines()
        inside, outside, count = (int(field) for field in mapping.split())
        assert inside == 0 and outside >= 65536 and count == 65536, mapping
        assert pod_exec(core, name, namespace, ["id", "-u"]).strip() == str(RUNNER_UID)
        out = pod_exec(
            core,
            name,
            namespace,
            ["sh", "-c", "echo data > /workspace/f && cat /workspace/f && stat -c %u /workspace/f"],
        )
        assert out.split() == ["data", str(RUNNER_UID)], out
