"""A sandbox pod in its own user namespace (``hostUsers: false``) on the real node: containerd
2.3 + runc 1.4 run it, Pod Security "restricted" admits it, its root is not the node's root (the
pod's uid 0 maps to an unprivileged range of the node's uids), and a workspace on a
PersistentVolumeClaim is written and read there by the runner's uid: first a pod made by hand,
then a session's own sandbox pod, made by the controller from a template with ``hostUsers:
false`` (the chart's sandbox namespace enforces "restricted"), its commands run by the real
executor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from controller.runners.kubernetes import names
from tests.node.conftest import SANDBOX_NAMESPACE, USER_NAMESPACE_TEMPLATE, Installed
from tests.node.node import Image, RealNode
from tests.node.probes import claim_namespace, pod, pod_exec
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

pytestmark = [pytest.mark.timeout(900)]

RUNNER_UID = 10001


@pytest.fixture(scope="module")
def restricted(node: RealNode) -> Iterator[tuple[Any, str]]:
    """A namespace enforcing "restricted" with a bound workspace claim (a hostPath volume)."""
    core = client.CoreV1Api(node.api_client())
    with claim_namespace(core, "userns", "restricted") as namespace:
        yield core, namespace


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


def _node_uid_of_root(mapping: str) -> int:
    """The node uid that uid 0 of a ``/proc/<pid>/uid_map`` is (one line: inside, outside, count)."""
    [line] = mapping.strip().splitlines()
    inside, outside, count = (int(field) for field in line.split())
    assert inside == 0 and count == 65536, mapping
    return outside


def test_a_sessions_sandbox_pod_of_a_host_users_false_template_runs_in_its_own_user_namespace(
    installed: Installed,
) -> None:
    """A session of the template with ``hostUsers: false``: the controller's pod in the sandbox
    namespace (Pod Security "restricted", enforced) has ``hostUsers: false``, its uid 0 is an
    unprivileged uid of the node, and the real executor's commands, as the runner's uid, write
    and read the session's workspace on its PersistentVolumeClaim; the file is the runner's."""
    headers = {"authorization": f"Bearer {installed.api_key}", "openai-beta": "agents=v1"}
    body = {
        "agent": {"model": "node-test"},
        "environment": {"type": "self_hosted"},
        "input": "hi",
        "metadata": {"sandbox_template": USER_NAMESPACE_TEMPLATE},
    }
    session = httpx.post(f"{installed.simulator_url}/v1/agents/sessions", json=body, headers=headers, timeout=10)
    session.raise_for_status()
    session_id = session.json()["id"]

    def idle() -> bool:
        found = httpx.get(f"{installed.simulator_url}/v1/agents/sessions/{session_id}", headers=headers, timeout=10)
        return bool(found.json()["status"] == "idle")

    wait_for(idle, 300, "the session's first turn to end idle (its executor connected)", interval=0.5)
    labels = installed.core.read_namespace(SANDBOX_NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    [sandbox_pod] = installed.core.list_namespaced_pod(
        SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
    ).items
    assert sandbox_pod.spec.host_users is False
    [volume] = [v for v in sandbox_pod.spec.volumes if v.name == "workspace"]
    assert volume.persistent_volume_claim.claim_name == names.pvc_name(session_id)
    commands: list[list[str] | dict[str, Any]] = [
        ["cat", "/proc/self/uid_map"],
        ["sh", "-c", "echo data > notes.txt && cat notes.txt && stat -c %u notes.txt && id -u"],
    ]
    uid_map, workspace = run_turn(installed.simulator_url, session_id, commands, timeout=300)["commands"]
    assert (uid_map["status"], uid_map["exit_code"]) == ("completed", 0), uid_map
    assert _node_uid_of_root(uid_map["stdout"]) >= 65536, uid_map
    assert (workspace["exit_code"], workspace["cwd"]) == (0, "/workspace"), workspace
    assert workspace["stdout"].split() == ["data", str(RUNNER_UID), str(RUNNER_UID)], workspace
