"""The `helm test` of Codex's own sandbox, node by node (tests.codexSandbox): what the chart
renders, the check's decisions (files/codex-sandbox-check.py: which nodes to probe, each node's
answer from its probe pod) and the probe's own judgement, run by bash against stand-ins for codex
that exit 0 with nothing run, or run the command unconfined. The real probe on a real kubelet,
with and without the profile, is in tests/node/test_codex_sandbox.py."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from controller.runners.kubernetes import seccomp
from tests.chart.test_chart import (  # noqa: F401 (chart and helm: the fixtures)
    CHART,
    CREDENTIALS,
    NAMESPACE,
    _full,
    chart,
    helm,
    merge,
    of_kind,
    one,
    probe_pod,
    render,
)

CHECK = CHART / "files" / "codex-sandbox-check.py"
PROFILE_LABEL = seccomp.PROFILE_LABEL
DIGEST = hashlib.sha256((CHART / "files" / "codex-sandbox-seccomp.json").read_bytes()).hexdigest()[:16]


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("codex_sandbox_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def test_the_check_runs_at_test_time_with_only_what_it_needs(chart: Any) -> None:  # noqa: F811
    """One hook pod in the release namespace runs the check (the chart's file, in the controller
    image); its ServiceAccount may list nodes and create, list and delete pods (and read their
    logs) in the sandbox namespace, nothing else. It probes the nodes tests.codexSandbox.nodeSelector
    names, with its tolerations; with the installer on, the probes also select the installer's
    label (as the profile's templates do), which is not a filter on the nodes to answer for."""
    values = {
        "tests": {
            "codexSandbox": {
                "enabled": True,
                "nodeSelector": {"pool": "sandboxes"},
                "tolerations": [{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}],
            }
        },
        "sandbox": {"seccompInstaller": {"enabled": True}},
    }
    objects = render(chart, merge(CREDENTIALS, values))
    name = f"{_full(objects)}-test-codex-sandbox"
    sandboxes = f"{NAMESPACE}-sandboxes"
    hooks = [o for o in objects if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert [o["metadata"]["name"] for o in hooks if "codex" in o["metadata"]["name"]] == [name]
    pod = one(objects, "Pod", name)
    assert pod["metadata"]["namespace"] == NAMESPACE and pod["spec"]["serviceAccountName"] == name
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["python", "/check/check.py"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SANDBOX_NAMESPACE"] == sandboxes and env["NODE_SELECTOR"] == '{"pool":"sandboxes"}'
    assert one(objects, "ConfigMap", name)["data"]["check.py"] == CHECK.read_text()

    [cluster_role] = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith(name)]
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    role = one(objects, "Role", name)
    assert role["metadata"]["namespace"] == sandboxes
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "list", "delete", "deletecollection"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    for binding in (one(objects, "RoleBinding", name), *[
        b for b in of_kind(objects, "ClusterRoleBinding") if b["metadata"]["name"].endswith(name)
    ]):  # fmt: skip
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]

    probe = probe_pod(objects)
    assert probe["metadata"]["namespace"] == sandboxes and "generateName" in probe["metadata"]
    assert probe["spec"]["nodeSelector"] == {"pool": "sandboxes", PROFILE_LABEL: DIGEST}
    assert probe["spec"]["tolerations"] == values["tests"]["codexSandbox"]["tolerations"]
    assert probe["spec"]["automountServiceAccountToken"] is False
    [container] = probe["spec"]["containers"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]


def test_which_nodes_are_probed(check: ModuleType) -> None:
    """Cordoned nodes and nodes with a NoSchedule/NoExecute taint the probes do not tolerate are
    skipped (no sandbox would be placed there); a PreferNoSchedule taint, or a tolerated one, is not."""
    tolerations = [
        {"key": "pool", "operator": "Equal", "value": "sandboxes", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists"},
    ]
    assert check.not_for_sandboxes(_node("a"), tolerations) is None
    assert check.not_for_sandboxes(_node("b", unschedulable=True), tolerations) == "cordoned (spec.unschedulable)"
    taint = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    why = check.not_for_sandboxes(_node("c", taints=[taint]), tolerations)
    assert why is not None and why.startswith("tainted dedicated=db:NoSchedule"), why
    assert check.not_for_sandboxes(_node("d", taints=[{**taint, "effect": "PreferNoSchedule"}]), []) is None
    ok = [{"key": "pool", "value": "sandboxes", "effect": "NoSchedule"}, {"key": "gpu", "effect": "NoExecute"}]
    assert check.not_for_sandboxes(_node("e", taints=ok), tolerations) is None
    wrong_value = {"key": "pool", "value": "other", "effect": "NoSchedule"}
    assert check.not_for_sandboxes(_node("f", taints=[wrong_value]), tolerations) is not None
    assert check.not_for_sandboxes(_node("g", taints=[taint]), [{"operator": "Exists"}]) is None


def test_a_node_without_the_installers_label_is_answered_no_unprobed(check: ModuleType) -> None:
    probe = {"spec": {"nodeSelector": {PROFILE_LABEL: DIGEST}}}
    assert check.unlabelled(_node("a", {PROFILE_LABEL: DIGEST}), probe) is None
    why = check.unlabelled(_node("b", {PROFILE_LABEL: "0123456789abcdef"}), probe)
    assert why is not None and f"not labelled {PROFILE_LABEL}={DIGEST}" in why and "installer" in why
    assert check.unlabelled(_node("c"), {"spec": {}}) is None


def _pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"status": {"phase": phase, **status}}


def test_each_nodes_answer_comes_from_its_probe_or_its_pods_status(check: ModuleType) -> None:
    """The probe's last `node …: yes|no: …` line is the answer of a pod that ran; a pod that
    ended without one, or whose container cannot be created (a seccomp profile the node lacks),
    answers no with the kubelet's words; a pod still starting has no answer yet."""
    yes = "sandbox-ran\nwritten\nnode n1: yes: Codex's sandbox works here: …\n"
    assert check.answer(_pod("Succeeded"), yes) == ("yes", "Codex's sandbox works here: …")
    no = "bwrap: No permissions to create a new namespace\nnode n1: no: nothing ran in Codex's sandbox: bwrap: …\n"
    assert check.answer(_pod("Failed"), no) == ("no", "nothing ran in Codex's sandbox: bwrap: …")
    assert check.answer(_pod("Failed"), yes) == ("no", "the probe said yes but its pod failed")
    rejected = _pod("Failed", reason="NodeAffinity", message="Pod was rejected: Predicate NodeAffinity failed")
    said, why = check.answer(rejected, "")
    assert said == "no" and "NodeAffinity: Pod was rejected" in why, why
    killed = _pod("Failed", containerStatuses=[{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}])
    assert check.answer(killed, "sandbox-ran\n") == (
        "no",
        "the probe pod failed without an answer: its container exited 137 (OOMKilled)",
    )
    message = 'failed to create containerd container: cannot load seccomp profile "/var/lib/kubelet/seccomp/x.json"'
    waiting = {"reason": "CreateContainerError", "message": message}
    missing = _pod("Pending", containerStatuses=[{"state": {"waiting": waiting}}])
    said, why = check.answer(missing, None)
    assert said == "no" and why == f"the pod's seccomp profile could not be loaded on this node ({message})"
    creating = _pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ContainerCreating"}}}])
    assert check.answer(creating, None) is None and check.answer(_pod("Running"), None) is None
    assert check.late(creating, 200) == "no answer within 200s: its container is waiting: ContainerCreating"
    assert check.late(_pod("Pending"), 200) == "no answer within 200s: the pod is Pending"


def test_the_probe_is_pinned_to_its_node(check: ModuleType) -> None:
    probe = {"metadata": {"generateName": "p-"}, "spec": {"containers": []}}
    pinned = check.probe_for(probe, "node-a")
    assert pinned["spec"]["nodeName"] == "node-a"
    assert pinned["metadata"]["labels"] == {check.CHECK_LABEL: "probe"}
    assert probe == {"metadata": {"generateName": "p-"}, "spec": {"containers": []}}  # the template is kept


def _run_probe(chart: Any, tmp_path: Path, codex: str) -> tuple[int, str]:  # noqa: F811
    """The rendered probe's script under bash with ``codex`` (a stand-in) on PATH, its
    /workspace and /etc/probe the test's."""
    objects = render(chart, merge(CREDENTIALS, {"tests": {"codexSandbox": {"enabled": True}}}))
    [container] = probe_pod(objects)["spec"]["containers"]
    workspace, home, bin_ = tmp_path / "workspace", tmp_path / "home", tmp_path / "bin"
    for directory in (workspace, home, bin_):
        directory.mkdir(parents=True)
    # The test's own directories for /workspace and /etc: an unconfined stand-in really writes.
    script = container["args"][0].replace("/workspace", str(workspace)).replace("/etc/probe", str(tmp_path / "etc"))
    (bin_ / "codex").write_text(codex)
    (bin_ / "codex").chmod(0o755)
    env = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TMPDIR": str(tmp_path),
        "NODE_NAME": "node-a",
    }
    done = subprocess.run(["bash", "-c", script], env=env, cwd=workspace, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils' timeout, as the runner image has")
def test_the_probe_judges_by_what_ran_not_by_codexs_exit_code(chart: Any, tmp_path: Path) -> None:  # noqa: F811
    """A codex that exits 0 having run nothing (as seen in hardened containers) is a no; so is
    one that runs the command unconfined (it writes $HOME and reaches a socket)."""
    status, out = _run_probe(chart, tmp_path / "nothing", "#!/bin/sh\nexit 0\n")
    assert status == 1, out
    last = out.splitlines()[-1]
    assert last.startswith("node node-a: no: nothing ran in Codex's sandbox: codex printed nothing"), out

    unconfined = '#!/bin/bash\nwhile [ "$1" != -- ]; do shift; done; shift; exec "$@"\n'
    status, out = _run_probe(chart, tmp_path / "unconfined", unconfined)
    assert status == 1, out
    last = out.splitlines()[-1]
    assert last.startswith("node node-a: no: the sandboxed command was not refused a write to $HOME"), out
    assert "sandbox-ran" in out and "written" in out  # it ran: the answer is from what it was allowed

    refused = '#!/bin/sh\necho "bwrap: No permissions to create a new namespace"; exit 1\n'
    status, out = _run_probe(chart, tmp_path / "refused", refused)
    assert status == 1, out
    assert out.splitlines()[-1].startswith(
        "node node-a: no: nothing ran in Codex's sandbox: bwrap: No permissions to create a new namespace"
    ), out
