"""Codex's own sandbox (bubblewrap) in a sandbox pod on the real node, in a namespace that
enforces Pod Security "restricted", with the default template's security context (non-root,
every capability dropped, no privilege escalation, read-only root):

- with seccomp RuntimeDefault (the default template) bubblewrap cannot make its user namespace
  and nothing runs;
- with the chart's Localhost profile (``helm/sandbox-controller/files/codex-sandbox-seccomp.json``:
  containerd's RuntimeDefault plus clone, unshare, mount, umount2 and pivot_root) the command
  runs inside the sandbox: it writes the workspace, is refused /etc and the network, while the
  pod itself still reaches the network. "restricted" admits the profile; it refuses the
  Unconfined seccomp a wider grant would take;
- and the way the API runs it: a session of the chart's template with that profile
  (``seccompProfile``), its command sent by the simulator as a sandboxed ``process/start``
  through the real executor in the pod the controller made;
- and the chart's ``helm test`` says whether the cluster gives Codex its sandbox.

docs/kubernetes.md ("Codex's own sandbox in a pod") records these facts and what each missing
syscall does."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from controller.runners.kubernetes import names
from tests.node.conftest import (
    CODEX_SANDBOX_TEMPLATE,
    CODEX_SECCOMP_PROFILE,
    PUBLIC_API_IP,
    RELEASE,
    SANDBOX_NAMESPACE,
    Installed,
    install_seccomp_profile,
)
from tests.node.node import API_PORT, NODE_IP, Image, RealNode
from tests.node.probes import pod, pod_exec
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

pytestmark = [pytest.mark.timeout(1800)]

LOCALHOST_PROFILE = CODEX_SECCOMP_PROFILE
RUNNER_UID = 10001
# Inside the sandbox: the workspace, /etc, the network; then outside it, the network again.
INSIDE = (
    "echo inside; echo data > /workspace/notes.txt && echo wrote-workspace; touch /etc/probe 2>&1;"
    f" bash -c ': > /dev/tcp/{NODE_IP}/{API_PORT} && echo network-open' 2>&1"
)
PROBE = (
    'mkdir -p "$CODEX_HOME"; codex sandbox -c \'sandbox_mode="workspace-write"\' -- sh -c "$INSIDE" 2>&1;'
    f" echo exit=$?; bash -c ': > /dev/tcp/{NODE_IP}/{API_PORT} && echo pod-network-open' 2>&1"
)


@pytest.fixture(scope="module")
def restricted(node: RealNode) -> Iterator[tuple[Any, str]]:
    """A namespace enforcing "restricted", and the profile where the kubelet reads Localhost ones."""
    core = client.CoreV1Api(node.api_client())
    namespace = f"codex-sandbox-{uuid.uuid4().hex[:6]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=labels)))
    install_seccomp_profile(node)
    try:
        yield core, namespace
    finally:
        core.delete_namespace(namespace)


def _runner(images: list[Image]) -> str:
    return next(i.ref for i in images if i.name == "sandbox-runner")


def _pod(image: str, seccomp: dict[str, str]) -> dict[str, Any]:
    """The default template's security context (manifests.py), ``seccomp`` for the pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "codex-sandbox-"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUNNER_UID,
                "runAsGroup": RUNNER_UID,
                "fsGroup": RUNNER_UID,
                "seccompProfile": seccomp,
            },
            "containers": [
                {
                    "name": "sandbox",
                    "image": image,
                    "command": ["sleep", "3600"],
                    "workingDir": "/workspace",
                    "env": [
                        {"name": "HOME", "value": "/home/sandbox"},
                        {"name": "CODEX_HOME", "value": "/home/sandbox/.codex"},
                        {"name": "TMPDIR", "value": "/tmp"},
                        {"name": "INSIDE", "value": INSIDE},
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                        "runAsNonRoot": True,
                        "runAsUser": RUNNER_UID,
                        "runAsGroup": RUNNER_UID,
                    },
                    "volumeMounts": [
                        {"name": name, "mountPath": path}
                        for name, path in (("workspace", "/workspace"), ("home", "/home/sandbox"), ("tmp", "/tmp"))
                    ],
                }
            ],
            "volumes": [{"name": name, "emptyDir": {}} for name in ("workspace", "home", "tmp")],
        },
    }


def test_runtime_default_seccomp_gives_codex_no_sandbox(restricted: tuple[Any, str], images: list[Image]) -> None:
    """The default template: bubblewrap may not create its user namespace; nothing runs inside,
    though the pod itself reaches the network."""
    core, namespace = restricted
    with pod(core, namespace, _pod(_runner(images), {"type": "RuntimeDefault"})) as running:
        output = pod_exec(core, running.metadata.name, namespace, ["sh", "-c", PROBE], timeout=120)
    assert "bwrap: No permissions to create a new namespace" in output, output
    assert "inside" not in output.split("exit=")[0] and "exit=1" in output, output
    assert "pod-network-open" in output, output


def test_the_localhost_profile_gives_codex_its_sandbox_within_restricted(
    restricted: tuple[Any, str], images: list[Image]
) -> None:
    """The chart's Localhost profile, admitted by "restricted": the command runs inside Codex's
    sandbox, writes the workspace, is refused a write to /etc and any socket, while the pod
    itself reaches the network; Unconfined seccomp is refused in the same namespace."""
    core, namespace = restricted
    localhost = {"type": "Localhost", "localhostProfile": LOCALHOST_PROFILE}
    with pod(core, namespace, _pod(_runner(images), localhost)) as running:
        name = running.metadata.name
        output = pod_exec(core, name, namespace, ["sh", "-c", PROBE], timeout=120)
        written = pod_exec(core, name, namespace, ["cat", "/workspace/notes.txt"])
    inside, _, after = output.partition("exit=")
    assert "inside" in inside and "wrote-workspace" in inside, output
    assert "touch: cannot touch '/etc/probe': Read-only file system" in inside, output
    assert f"/dev/tcp/{NODE_IP}/{API_PORT}: Operation not permitted" in inside and "network-open" not in inside
    assert "pod-network-open" in after, output  # exit 1: the last command inside (the socket) failed
    assert written == "data\n"

    with pytest.raises(client.exceptions.ApiException) as refused:
        core.create_namespaced_pod(namespace, _pod(_runner(images), {"type": "Unconfined"}))
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and 'violates PodSecurity "restricted:latest"' in message, message
    assert 'seccompProfile.type to "Unconfined"' in message, message


def test_a_sandboxed_command_through_the_executor_in_the_controllers_pod(installed: Installed) -> None:
    """A session of the template with the Localhost profile: the controller's pod (in the
    sandbox namespace, which enforces "restricted") runs the real executor; commands the
    simulator starts with a workspace-write sandbox request run inside Codex's sandbox
    (linuxSeccomp): one writes the workspace, one is refused /etc (sandboxDenied), one is refused
    a socket to the API's address — which the same executor reaches unsandboxed."""
    headers = {"authorization": f"Bearer {installed.api_key}", "openai-beta": "agents=v1"}
    body = {
        "agent": {"model": "node-test"},
        "environment": {"type": "self_hosted"},
        "input": "hi",
        "metadata": {"sandbox_template": CODEX_SANDBOX_TEMPLATE},
    }
    session = httpx.post(f"{installed.simulator_url}/v1/agents/sessions", json=body, headers=headers, timeout=10)
    session.raise_for_status()
    session_id = session.json()["id"]

    def idle() -> bool:
        found = httpx.get(f"{installed.simulator_url}/v1/agents/sessions/{session_id}", headers=headers, timeout=10)
        return bool(found.json()["status"] == "idle")

    wait_for(idle, 300, "the session's first turn to end idle (its executor connected)", interval=0.5)
    [sandbox_pod] = installed.core.list_namespaced_pod(
        SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
    ).items
    seccomp = sandbox_pod.spec.containers[0].security_context.seccomp_profile
    assert (seccomp.type, seccomp.localhost_profile) == ("Localhost", CODEX_SECCOMP_PROFILE)
    outside = "/etc/probe"
    socket = f"/dev/tcp/{PUBLIC_API_IP}/443"
    sandbox = {"mode": "workspace-write"}
    commands: list[list[str] | dict[str, Any]] = [
        {"argv": ["sh", "-c", "echo inside > notes.txt && cat notes.txt"], "sandbox": sandbox},
        {"argv": ["touch", outside], "sandbox": sandbox},
        {"argv": ["bash", "-c", f": > {socket}"], "sandbox": sandbox},
        ["bash", "-c", f": > {socket} && echo reached"],
    ]
    wrote, refused, offline, online = run_turn(installed.simulator_url, session_id, commands, timeout=300)["commands"]
    assert (wrote["status"], wrote["exit_code"], wrote["stdout"]) == ("completed", 0, "inside\n"), wrote
    assert (wrote["sandbox_type"], wrote["sandbox_denied"]) == ("linuxSeccomp", False)
    assert wrote["cwd"] == "/workspace"
    assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"], refused
    assert refused["sandbox_denied"] is True
    assert offline["exit_code"] != 0 and "Operation not permitted" in offline["stderr"], offline
    assert (online["exit_code"], online["stdout"], online["sandbox_type"]) == (0, "reached\n", "none"), online


HELM_TEST = f"{RELEASE}-sandbox-controller-test-codex-sandbox"


def test_helm_test_says_whether_the_cluster_gives_codex_its_sandbox(installed: Installed) -> None:
    """The chart's `helm test` (tests.codexSandbox): with the profile on the node, its pod's
    `codex sandbox` writes the workspace and is refused /etc and the network, and the test
    passes; with a profile that is only RuntimeDefault in its place, it fails, its pod saying
    Codex cannot build its sandbox and what to install; back again, it passes."""
    import helm_python

    installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])
    profile = install_seccomp_profile(installed.node)
    full = json.loads(profile.read_text())
    runtime_default = {**full, "syscalls": full["syscalls"][:-1]}  # without the five syscalls
    assert set(full["syscalls"][-1]["names"]) == {"clone", "unshare", "mount", "umount2", "pivot_root"}
    profile.write_text(json.dumps(runtime_default))
    try:
        with pytest.raises(helm_python.HelmReleaseError):
            installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])
        log = installed.core.read_namespaced_pod_log(HELM_TEST, SANDBOX_NAMESPACE)
        assert "bwrap: No permissions to create a new namespace" in log, log
        assert "FAIL: Codex cannot build its own sandbox in a sandbox pod here" in log, log
    finally:
        install_seccomp_profile(installed.node)
    installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])  # passes again
