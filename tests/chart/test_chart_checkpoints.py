"""Suspend with memory in the chart (``sandbox.checkpoints``, issue 40): the node agent's
DaemonSet, its RBAC, the worker's extra grants, the setting of its wait, and the sandbox pod
policy's constant for checkpoint images (its CEL is evaluated by the API server in
``tests/kube/test_chart_on_apiserver.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.runners.kubernetes import checkpoints
from tests.chart.test_chart import (  # noqa: F401
    CHART,
    CHECKPOINTS,
    CREDENTIALS,
    NAMESPACE,
    RELEASE,
    _cel_variables,
    _full,
    _pod_policy,
    chart,
    helm,
    merge,
    of_kind,
    one,
    render,
)

AGENT = "checkpoint-agent"
RESUMABLE = {"suspend": "checkpoint", "workspacePersistence": {"size": "1Gi"}}


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _controller_role(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Role", _full(objects))


def _agent_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == AGENT]


def test_the_node_agent_is_off_by_default(chart: Any) -> None:  # noqa: F811
    """Without sandbox.checkpoints nothing of the agent is rendered, nothing is granted for it,
    and the pod policy admits no checkpoint image; the worker's wait is set all the same."""
    objects = render(chart, CREDENTIALS)
    assert _agent_objects(objects) == []
    assert of_kind(objects, "DaemonSet") == [] and of_kind(objects, "ClusterRole") == []
    assert ("", "persistentvolumeclaims", "patch") not in _grants(_controller_role(objects))
    assert _cel_variables(_pod_policy(objects)[0])["checkpoints"] is False
    assert one(objects, "ConfigMap", _full(objects))["data"]["CONTROLLER_KUBERNETES_CHECKPOINT_TIMEOUT_SECONDS"] == "60"


def test_a_template_that_checkpoints_needs_the_node_agent(chart: Any, helm: Any) -> None:  # noqa: F811
    """A template with ``suspend: checkpoint`` fails the render unless the agent runs: its
    requests would never be answered (each idle stop would wait the whole timeout)."""
    with pytest.raises(helm.errors.HelmError, match=r"suspend: checkpoint: set sandbox.checkpoints.enabled=true"):
        render(chart, merge(CREDENTIALS, {"sandbox": {"templates": {"resumable": RESUMABLE}}}))


def test_the_node_agent_runs_the_controllers_image_as_the_nodes_root_with_exactly_its_host_paths(
    chart: Any,  # noqa: F811
) -> None:
    """A DaemonSet in the release namespace runs ``sandbox-controller node-agent`` from the
    workers' image, as uid 0 (the kubelet's archives and containerd's socket are root's) with no
    capability, no privilege escalation and a read-only root; on the node's network (it dials
    its kubelet at the node's IP) with its own ServiceAccount's token (the kubelet checks it).
    Its host paths are exactly the kubelet's checkpoints/ directory, containerd's socket, ctr
    and the kubelet's CA, each mounted where its setting says."""
    values = merge(
        CHECKPOINTS,
        {
            "sandbox": {
                "checkpoints": {
                    "kubeletRootDir": "/k/",
                    "kubeletPort": 10255,
                    "containerdSocket": "/run/k3s/containerd/containerd.sock",
                    "ctr": "/opt/bin/ctr",
                    "kubeletCAFile": "/etc/kubernetes/pki/ca.crt",
                    "nodeSelector": {"pool": "sandboxes"},
                    "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                }
            },
            "logLevel": "DEBUG",
        },
    )
    objects = render(chart, values)
    full = _full(objects)
    name = f"{full}-{AGENT}"
    daemon = one(objects, "DaemonSet", name)
    assert daemon["metadata"]["namespace"] == NAMESPACE
    assert daemon["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "sandbox-controller",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": AGENT,
    }
    template = daemon["spec"]["template"]
    assert daemon["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    assert spec["serviceAccountName"] == name and spec["automountServiceAccountToken"] is True
    assert one(objects, "ServiceAccount", name)["metadata"]["namespace"] == NAMESPACE
    assert spec["hostNetwork"] is True and not spec.get("hostPID") and not spec.get("hostIPC")
    assert spec["nodeSelector"] == {"pool": "sandboxes"}
    assert spec["tolerations"] == [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["securityContext"]["runAsUser"] == 0 and spec["securityContext"]["runAsNonRoot"] is False
    [container] = spec["containers"]
    assert not spec.get("initContainers")
    worker = one(objects, "Deployment", f"{full}-worker")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == worker["image"]
    assert container["command"] == worker["command"] == ["sandbox-controller"]
    assert container["args"] == ["node-agent"]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "limits" in container["resources"] and "requests" in container["resources"]

    hosts = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert hosts == {
        "kubelet-checkpoints": {"path": "/k/checkpoints", "type": "DirectoryOrCreate"},
        "containerd-socket": {"path": "/run/k3s/containerd/containerd.sock", "type": "Socket"},
        "ctr": {"path": "/opt/bin/ctr", "type": "File"},
        "kubelet-ca": {"path": "/etc/kubernetes/pki/ca.crt", "type": "File"},
    }
    others = [v for v in spec["volumes"] if "hostPath" not in v]
    assert others == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["ctr"]["readOnly"] is True and mounts["kubelet-ca"]["readOnly"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["CONTROLLER_NODE_AGENT_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    names = [e["name"] for e in container["env"]]
    assert names.index("HOST_IP") < names.index("CONTROLLER_NODE_AGENT_KUBELET_URL")  # $(HOST_IP) is expanded
    values_of = {k: e.get("value") for k, e in env.items()}
    assert values_of["CONTROLLER_NODE_AGENT_KUBELET_URL"] == "https://$(HOST_IP):10255"
    for setting, volume in (
        ("CONTROLLER_NODE_AGENT_CHECKPOINT_DIRECTORY", "kubelet-checkpoints"),
        ("CONTROLLER_NODE_AGENT_CONTAINERD_ADDRESS", "containerd-socket"),
        ("CONTROLLER_NODE_AGENT_CTR", "ctr"),
        ("CONTROLLER_NODE_AGENT_KUBELET_CA_FILE", "kubelet-ca"),
    ):
        assert values_of[setting] == mounts[volume]["mountPath"], setting
    assert values_of["CONTROLLER_NODE_AGENT_CHECKPOINT_DIRECTORY"] == "/var/lib/kubelet/checkpoints"
    assert values_of["CONTROLLER_NODE_AGENT_CONTAINERD_ADDRESS"] == "/run/containerd/containerd.sock"
    assert values_of["CONTROLLER_NODE_AGENT_CTR"] == "/usr/local/bin/ctr"
    assert values_of["CONTROLLER_NODE_AGENT_KUBELET_CA_FILE"] == "/etc/kubelet-ca/kubelet.crt"
    # The ServiceAccount token the pod mounts (automountServiceAccountToken) is what it sends the kubelet.
    assert (
        values_of["CONTROLLER_NODE_AGENT_KUBELET_TOKEN_FILE"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    assert (
        values_of["CONTROLLER_NODE_AGENT_POLL_SECONDS"],
        values_of["CONTROLLER_NODE_AGENT_IMAGE_GRACE_SECONDS"],
    ) == (
        "1",
        "60",
    )
    config = one(objects, "ConfigMap", full)["data"]
    assert values_of["CONTROLLER_KUBERNETES_NAMESPACE"] == config["CONTROLLER_KUBERNETES_NAMESPACE"]
    assert values_of["CONTROLLER_LOG_LEVEL"] == config["CONTROLLER_LOG_LEVEL"] == "DEBUG"
    # Nothing else: no Secret (no Redis, no API key), no ConfigMap of the controller's settings.
    assert not container.get("envFrom")
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert set(names) == {
        "CONTROLLER_LOG_LEVEL",
        "CONTROLLER_KUBERNETES_NAMESPACE",
        "HOST_IP",
        *(k for k in values_of if k.startswith("CONTROLLER_NODE_AGENT_")),
    }
    assert len([k for k in names if k.startswith("CONTROLLER_NODE_AGENT_")]) == 9


def test_the_node_agent_may_list_and_answer_sandbox_pods_list_claims_and_checkpoint_nodes_only(
    chart: Any,  # noqa: F811
) -> None:
    """L2: the agent's Role, in the sandbox namespace, grants exactly what it uses: pods list and
    patch (the requests, its answers) and PVCs list (the records: which images are still named);
    its ClusterRole exactly ``create`` on ``nodes/checkpoint`` (how the kubelet authorizes its
    checkpoint API); both bound to its own ServiceAccount only. No Secrets, no pod creation."""
    objects = render(chart, CHECKPOINTS)
    full = _full(objects)
    name = f"{full}-{AGENT}"
    sandbox_ns = one(objects, "ConfigMap", full)["data"]["CONTROLLER_KUBERNETES_NAMESPACE"]
    role = one(objects, "Role", name)
    assert role["metadata"]["namespace"] == sandbox_ns
    assert _grants(role) == {("", "pods", "list"), ("", "pods", "patch"), ("", "persistentvolumeclaims", "list")}
    [cluster_role] = of_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes/checkpoint"], "verbs": ["create"]}]
    assert cluster_role["metadata"]["name"] == f"{NAMESPACE}-{name}"  # two releases of one name differ
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    binding = one(objects, "RoleBinding", name)
    assert binding["metadata"]["namespace"] == sandbox_ns
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    assert binding["subjects"] == subject
    [cluster_binding] = of_kind(objects, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == subject
    for o in objects:
        if o["kind"] in ("Role", "ClusterRole"):
            assert not any(r.get("resourceNames") or r.get("nonResourceURLs") for r in o["rules"])
            assert "secrets" not in {res for r in o["rules"] for res in r["resources"]}


@pytest.mark.parametrize(
    ("sandbox", "checkpointing"),
    [
        ({"checkpoints": {"enabled": True}, "templates": {"resumable": RESUMABLE}}, True),
        ({"checkpoints": {"enabled": True}, "templates": {"default": RESUMABLE, "other": {}}}, True),
        ({"checkpoints": {"enabled": True}, "templates": {"plain": {"suspend": "stop"}}}, False),
        ({"checkpoints": {"enabled": True}}, False),
    ],
    ids=["a template checkpoints", "the default template checkpoints", "suspend stop", "no template checkpoints"],
)
def test_a_template_that_checkpoints_grants_the_worker_patch_on_pods_and_claims(
    chart: Any,  # noqa: F811
    sandbox: dict[str, Any],
    checkpointing: bool,
) -> None:
    """L2: the worker asks for a checkpoint by annotating the pod and records it on the claim:
    with a template that says ``suspend: checkpoint`` (and only then) its Role adds exactly
    ``patch`` on pods and on PVCs, nothing else."""
    objects = render(chart, merge(CREDENTIALS, {"sandbox": sandbox}))
    base = {
        ("", resource, verb)
        for resource in ("pods", "persistentvolumeclaims")
        for verb in ("create", "get", "list", "watch", "delete")
    } | {("", "events", "create")}
    extra = {("", "pods", "patch"), ("", "persistentvolumeclaims", "patch")}
    assert _grants(_controller_role(objects)) == (base | extra if checkpointing else base)


def test_the_workers_wait_for_an_answer_is_a_value(chart: Any) -> None:  # noqa: F811
    objects = render(chart, merge(CHECKPOINTS, {"sandbox": {"checkpoints": {"timeoutSeconds": 90}}}))
    assert one(objects, "ConfigMap", _full(objects))["data"]["CONTROLLER_KUBERNETES_CHECKPOINT_TIMEOUT_SECONDS"] == "90"


def test_the_pod_policy_knows_checkpoint_images_only_with_the_agent(chart: Any) -> None:  # noqa: F811
    """The policy's ``checkpoints`` constant follows sandbox.checkpoints, its image rule names
    the repository the agent names images under (checkpoints.IMAGE_REPOSITORY, then the pod's
    namespace and its workspace claim), never for
    ephemeral containers, and its refusal says so."""
    policy, _ = _pod_policy(render(chart, CHECKPOINTS))
    assert _cel_variables(policy)["checkpoints"] is True
    [rule] = [v for v in policy["spec"]["validations"] if "allowedImages" in v["expression"]]
    containers, _, ephemeral = rule["expression"].partition("&& variables.ephemeral.all(")
    assert f"'{checkpoints.IMAGE_REPOSITORY}/' + request.namespace + '/' + variables.workspaceClaim" in containers
    assert "Never" in containers and "sandbox-checkpoint" not in ephemeral
    assert "checkpoint image of the workspace claim the pod mounts" in rule["message"]


@pytest.mark.parametrize(
    "sandbox",
    [
        {"templates": {"bad": {"suspend": "pause"}}},
        {"checkpoints": {"timeoutSeconds": 0}},
        {"checkpoints": {"timeoutSeconds": 3601}},
        {"checkpoints": {"pollSeconds": 0}},
        {"checkpoints": {"imageGraceSeconds": 86401}},
        {"checkpoints": {"kubeletPort": 0}},
        {"checkpoints": {"ctr": "ctr"}},
        {"checkpoints": {"containerdSocket": "run/containerd.sock"}},
        {"checkpoints": {"kubeletCAFile": ""}},
        {"checkpoints": {"kubeletRoot": "/var/lib/kubelet"}},
    ],
    ids=[
        "suspend pause",
        "timeout 0",
        "timeout above 3600",
        "poll 0",
        "grace above a day",
        "port 0",
        "relative ctr",
        "relative socket",
        "empty CA",
        "unknown key",
    ],
)
def test_the_schema_refuses_broken_checkpoint_values(helm: Any, chart: Any, sandbox: dict[str, Any]) -> None:  # noqa: F811
    with pytest.raises(helm.errors.HelmValuesError):
        chart.render(merge(CHECKPOINTS, {"sandbox": sandbox}), name=RELEASE, namespace=NAMESPACE, is_install=True)


def test_the_notes_name_the_node_agent(chart: Any) -> None:  # noqa: F811
    notes = chart.render(CHECKPOINTS, name=RELEASE, namespace=NAMESPACE)["sandbox-controller/templates/NOTES.txt"]
    assert f"{RELEASE}-sandbox-controller-{AGENT}" in notes and "Pod Security" in notes
    plain = chart.render(CREDENTIALS, name=RELEASE, namespace=NAMESPACE)["sandbox-controller/templates/NOTES.txt"]
    assert AGENT not in plain


def test_lint_is_clean_with_the_node_agent(helm: Any) -> None:  # noqa: F811
    report = helm.lint(str(CHART), CHECKPOINTS, strict=True, namespace=NAMESPACE, kube_version="v1.37.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
