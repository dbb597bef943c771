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
- and the chart's ``helm test`` says, node by node, whether the cluster gives Codex its sandbox;
- and the runner image's startup self-test logs whether it does, in the pod at hand.

No test puts the profile on the node: the chart's node installer (``sandbox.seccompInstaller``,
a DaemonSet) writes it into the kubelet's seccomp directory and labels the node, and the
template naming the profile selects the labelled nodes (the ``helm test`` test replaces the file
with a RuntimeDefault copy, then removes it, to see the node answered "no"; the installer's next
pod restores it).

docs/kubernetes.md ("Codex's own sandbox in a pod") records these facts and what each missing
syscall does."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
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
    NAMESPACE,
    PUBLIC_API_IP,
    RELEASE,
    SANDBOX_NAMESPACE,
    Installed,
    seccomp_profile_path,
)
from tests.node.node import API_PORT, NODE_IP, Image
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
def restricted(installed: Installed) -> Iterator[tuple[Any, str]]:
    """A namespace enforcing "restricted"; the chart installed (its installer put the profile
    where the kubelet reads Localhost ones)."""
    core = client.CoreV1Api(installed.node.api_client())
    namespace = f"codex-sandbox-{uuid.uuid4().hex[:6]}"
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=labels)))
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


SELF_TEST = "codex sandbox self-test"


def _self_test_line(core: Any, name: str, namespace: str) -> dict[str, Any]:
    """The runner's startup self-test line in pod ``name``'s log, once there."""

    def line() -> dict[str, Any] | None:
        log = core.read_namespaced_pod_log(name, namespace)
        found = [json.loads(x) for x in log.splitlines() if x.startswith("{") and SELF_TEST in x]
        return found[0] if found else None

    found: dict[str, Any] = wait_for(line, 60, f"the self-test's line in {name}'s log", interval=0.5)
    return found


def test_the_runners_startup_self_test_says_whether_codex_gets_its_sandbox(
    restricted: tuple[Any, str], images: list[Image]
) -> None:
    """The runner image's own entrypoint (a warm runner here: it waits for a binding, so nothing
    registers) logs at start whether Codex's sandbox works on this node, judged by what its
    sandboxed command did: unavailable with RuntimeDefault (bubblewrap's words), works with the
    chart's Localhost profile."""
    core, namespace = restricted
    answers = {}
    for name, seccomp in (
        ("runtime-default", {"type": "RuntimeDefault"}),
        ("localhost", {"type": "Localhost", "localhostProfile": LOCALHOST_PROFILE}),
    ):
        manifest = _pod(_runner(images), seccomp)
        container = manifest["spec"]["containers"][0]
        del container["command"]  # the image's entrypoint
        # As the controller's pods: CODEX_HOME is the image's.
        container["env"] = [e for e in container["env"] if e["name"] not in ("CODEX_HOME", "INSIDE")]
        container["env"] += [{"name": "BINDING_DIRECTORY", "value": "/tmp"}, {"name": "CODEX_API_KEY", "value": "x"}]
        with pod(core, namespace, manifest) as running:
            answers[name] = _self_test_line(core, running.metadata.name, namespace)
            answers[name]["log"] = core.read_namespaced_pod_log(running.metadata.name, namespace)
    unavailable, works = answers["runtime-default"], answers["localhost"]
    assert unavailable["sandbox"] == "unavailable", unavailable
    assert unavailable["why"].startswith(
        "nothing ran in Codex's sandbox: bwrap: No permissions to create a new namespace"
    ), unavailable
    assert works["sandbox"] == "works", works
    print(f"self-test: {unavailable['seconds']}s (RuntimeDefault), {works['seconds']}s (Localhost profile)")


def test_the_charts_installer_puts_the_profile_on_the_node_and_labels_it(installed: Installed) -> None:
    """sandbox.seccompInstaller: the DaemonSet's pod on the node wrote the chart's profile, byte
    for byte, where the kubelet reads Localhost profiles (no test put it there) and labelled the
    node with the file's digest, logging it. With the file and the label gone, its next pod puts
    both back."""
    node, core = installed.node, installed.core
    path = seccomp_profile_path(node)
    daemon = client.AppsV1Api(node.api_client()).read_namespaced_daemon_set(INSTALLER, NAMESPACE)
    assert daemon.status.number_ready == daemon.status.desired_number_scheduled == 1
    [pod_] = _installer_pods(installed)
    assert _ready(pod_) and pod_.spec.node_name == node.name
    assert path.read_bytes() == _chart_profile()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert core.read_node(node.name).metadata.labels[INSTALLED_LABEL] == _chart_digest()
    log = core.read_namespaced_pod_log(pod_.metadata.name, NAMESPACE, container="install")
    [line] = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert line == {
        "message": "seccomp profile installed",
        "node": node.name,
        "path": str(path),
        "digest": _chart_digest(),
    }

    path.unlink()
    core.patch_node(node.name, {"metadata": {"labels": {INSTALLED_LABEL: None}}})
    assert INSTALLED_LABEL not in (core.read_node(node.name).metadata.labels or {})
    started = time.monotonic()
    _reinstall(installed)
    assert path.read_bytes() == _chart_profile()
    assert core.read_node(node.name).metadata.labels[INSTALLED_LABEL] == _chart_digest()
    print(f"installer: profile and label back {time.monotonic() - started:.1f}s after its pod was deleted")


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
    # The runner's startup self-test, beside the executor: Codex's sandbox works in this pod.
    self_test = _self_test_line(installed.core, sandbox_pod.metadata.name, SANDBOX_NAMESPACE)
    assert self_test["sandbox"] == "works", self_test
    seccomp = sandbox_pod.spec.containers[0].security_context.seccomp_profile
    assert (seccomp.type, seccomp.localhost_profile) == ("Localhost", CODEX_SECCOMP_PROFILE)
    # Placed only on a node the chart's installer labelled as having this profile.
    assert sandbox_pod.spec.node_selector[INSTALLED_LABEL] == _chart_digest()
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
INSTALLER = f"{RELEASE}-sandbox-controller-seccomp-installer"
INSTALLED_LABEL = "sandbox-controller/codex-sandbox-seccomp"


def _chart_profile() -> bytes:
    from tests.chart.test_chart import CHART

    return (CHART / "files" / "codex-sandbox-seccomp.json").read_bytes()


def _chart_digest() -> str:
    return hashlib.sha256(_chart_profile()).hexdigest()[:16]


def _installer_pods(installed: Installed) -> list[Any]:
    selector = "app.kubernetes.io/component=seccomp-installer"
    pods: list[Any] = installed.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return pods


def _ready(pod: Any) -> bool:
    conditions = pod.status.conditions or []
    return not pod.metadata.deletion_timestamp and any(c.type == "Ready" and c.status == "True" for c in conditions)


def _reinstall(installed: Installed) -> Any:
    """Delete the installer's pod; its DaemonSet's next pod writes the profile again and labels
    the node. Returns that pod, once Ready (its init container, which does both, has finished)."""
    [old] = _installer_pods(installed)
    installed.core.delete_namespaced_pod(old.metadata.name, NAMESPACE, grace_period_seconds=0)

    def replaced() -> Any:
        fresh = [p for p in _installer_pods(installed) if p.metadata.uid != old.metadata.uid and _ready(p)]
        return fresh[0] if fresh else None

    return wait_for(replaced, 180, "the installer's new pod to be Ready", interval=0.5)


def _check_lines(log: str) -> list[dict[str, Any]]:
    """The JSON lines of the `helm test` check's log (one a node, then a summary)."""
    return [json.loads(x) for x in log.splitlines() if x.startswith("{")]


def _no_probe_left(installed: Installed) -> None:
    selector = "sandbox-controller/codex-sandbox-check=probe"

    def gone() -> bool:
        return not installed.core.list_namespaced_pod(SANDBOX_NAMESPACE, label_selector=selector).items

    wait_for(gone, 60, "the check's probe pods to be deleted", interval=0.5)


def _failing_check(installed: Installed) -> dict[str, Any]:
    """Run the `helm test` of Codex's sandbox, see it fail, and return its line for the node."""
    import helm_python

    with pytest.raises(helm_python.HelmReleaseError):
        installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])
    log = installed.core.read_namespaced_pod_log(HELM_TEST, NAMESPACE)
    [node_line, summary] = _check_lines(log)
    assert summary == {
        "message": "codex sandbox check done", "passed": False, "yes": [], "no": [installed.node.name], "skipped": [],
    }, log  # fmt: skip
    assert node_line["node"] == installed.node.name and node_line["sandbox"] == "no", log
    _no_probe_left(installed)
    return node_line


def test_helm_test_says_per_node_whether_the_cluster_gives_codex_its_sandbox(installed: Installed) -> None:
    """The chart's `helm test` (tests.codexSandbox) asks every node at test time: a probe pod
    pinned to each runs `codex sandbox` and judges by what the command printed and was refused.
    With the profile on the node the node's line says yes (the workspace written; $HOME, /etc and
    a socket refused) and the test passes; with a profile that is only RuntimeDefault in its
    place the node's line says no, with bubblewrap's words, and the test fails; with the file
    gone (the label left) the probe's container cannot be created and the line says so from the
    pod's status; with the installer's file back it passes again. No probe pod is left behind."""
    node = installed.node.name
    passed = installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST], logs=True)
    lines = _check_lines(passed["logs"])
    [yes] = [x for x in lines if x.get("node") == node]
    assert yes["sandbox"] == "yes", passed["logs"]
    assert yes["why"] == (
        "Codex's sandbox works here: the sandboxed command wrote the workspace and was refused $HOME, /etc and a socket"
    )
    assert lines[-1] == {"message": "codex sandbox check done", "passed": True, "yes": [node], "no": [], "skipped": []}
    _no_probe_left(installed)

    profile = seccomp_profile_path(installed.node)
    full = json.loads(profile.read_text())
    runtime_default = {**full, "syscalls": full["syscalls"][:-1]}  # without the five syscalls
    assert set(full["syscalls"][-1]["names"]) == {"clone", "unshare", "mount", "umount2", "pivot_root"}
    profile.write_text(json.dumps(runtime_default))
    try:
        refused = _failing_check(installed)
        assert refused["why"].startswith(
            "nothing ran in Codex's sandbox: bwrap: No permissions to create a new namespace"
        ), refused
        assert "sessions with automatic review do not get Codex's sandbox on this node" in refused["why"]
        assert any("bwrap: No permissions" in line for line in refused["output"]), refused

        profile.unlink()
        missing = _failing_check(installed)
        assert missing["why"].startswith("the pod's seccomp profile could not be loaded on this node ("), missing
        assert "cannot load seccomp profile" in missing["why"] and str(profile) in missing["why"], missing
        print(f"profile missing: {missing['why']}")
    finally:
        _reinstall(installed)  # the chart's installer writes it again
    installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])  # passes again
    _no_probe_left(installed)


def test_user_namespaces_do_not_narrow_what_the_profile_must_allow(
    restricted: tuple[Any, str], images: list[Image], installed: Installed
) -> None:
    """In a pod with its own user namespace (hostUsers: false), bubblewrap still needs all five
    syscalls the chart's profile adds to RuntimeDefault: with each one left out (or with
    RuntimeDefault) it fails as it does without a user namespace, with the whole profile Codex's
    sandbox works there too. The runtime's seccomp filter is the same whatever the pod's user
    namespace (containerd allows those syscalls only to a container with CAP_SYS_ADMIN, which
    "restricted" never grants), and it is checked before the kernel looks at namespaces."""
    core, namespace = restricted
    installed_profile = seccomp_profile_path(installed.node)
    directory = installed_profile.parent / "narrowed"
    full = json.loads(installed_profile.read_text())
    extra = full["syscalls"][-1]["names"]
    variants: dict[str, Any] = {"RuntimeDefault": None, "profile": full}
    for name in extra:
        kept = {"names": [n for n in extra if n != name], "action": "SCMP_ACT_ALLOW"}
        variants[f"without-{name}"] = {**full, "syscalls": [*full["syscalls"][:-1], kept]}
    results: dict[str, str] = {}
    directory.mkdir(exist_ok=True)
    try:
        for label, profile in variants.items():
            if profile is None:
                seccomp = {"type": "RuntimeDefault"}
            else:
                (directory / f"{label}.json").write_text(json.dumps(profile))
                seccomp = {"type": "Localhost", "localhostProfile": f"sandbox-controller/narrowed/{label}.json"}
            manifest = _pod(_runner(images), seccomp)
            manifest["spec"]["hostUsers"] = False
            with pod(core, namespace, manifest) as running:
                name = running.metadata.name
                output = pod_exec(core, name, namespace, ["sh", "-c", PROBE], timeout=120)
                uid_map = pod_exec(core, name, namespace, ["cat", "/proc/self/uid_map"])
            inside = output.partition("exit=")[0]
            ok = "wrote-workspace" in inside and "Operation not permitted" in inside
            errors = [line for line in inside.splitlines() if "bwrap" in line]
            results[label] = "works" if ok else (errors[0] if errors else inside.strip()[:300])
            assert uid_map.split()[:2] != ["0", "0"], uid_map  # the pod's root is not the node's
            print(f"{label}: {results[label]}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert results == {
        "RuntimeDefault": NO_NAMESPACES,
        "profile": "works",
        "without-clone": NO_NAMESPACES,
        "without-mount": "bwrap: Failed to make / slave: Operation not permitted",
        "without-pivot_root": "bwrap: pivot_root: Operation not permitted",
        "without-umount2": "bwrap: unmount old root: Operation not permitted",
        "without-unshare": "bwrap: unshare user ns: Operation not permitted",
    }


NO_NAMESPACES = (
    "bwrap: No permissions to create a new namespace, likely because the kernel does not allow non-privileged user "
    "namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'."
)
