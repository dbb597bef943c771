"""The sandbox Pod and workspace PVC as exact manifests (``make_pod``/``make_pvc``), and names.

Like kubespawner's ``make_pod`` tests: the default template is compared against the whole
expected dict, each option against the change it makes to it.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.model import SandboxSpec
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, make_pod, make_pvc

SPEC = SandboxSpec(
    session_id="sess_1",
    environment_id="env_1",
    remote_url="https://api.example.test/v1/agents/env",
    workspace_directory="/workspace",
)
SETTINGS = PodSettings()
HASH = "8ac3c66dc34f8a4c"  # sha256("sess_1")[:16]
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
EXECUTOR_KEY = "sk-proj-executor-NEVER-IN-A-MANIFEST"

DEFAULT_LABELS = {
    "app.kubernetes.io/managed-by": "sandbox-controller",
    "app.kubernetes.io/component": "sandbox",
    "app.kubernetes.io/name": "sandbox",
    "app.kubernetes.io/part-of": "sandbox-controller",
    "sandbox-controller.dev/session-hash": HASH,
}

EXPECTED_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": f"sbx-sess-1-{HASH[:8]}-g1",
        "namespace": "sandboxes",
        "labels": {**DEFAULT_LABELS, "sandbox-controller.dev/generation": "1"},
        "annotations": {
            "sandbox-controller.dev/session-id": "sess_1",
            "sandbox-controller.dev/environment-id": "env_1",
            "sandbox-controller.dev/template": "default",
        },
    },
    "spec": {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]},
        "terminationGracePeriodSeconds": 15,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "executor",
                "image": "sandbox-controller/sandbox-runner:0.171.0",
                "env": [
                    {"name": "REMOTE_URL", "value": "https://api.example.test/v1/agents/env"},
                    {"name": "ENVIRONMENT_ID", "value": "env_1"},
                    {
                        "name": "CODEX_API_KEY",
                        "valueFrom": {"secretKeyRef": {"name": "sandbox-executor-key", "key": "executor-key"}},
                    },
                    {"name": "HOME", "value": "/home/sandbox"},
                    {"name": "TMPDIR", "value": "/tmp"},
                ],
                "workingDir": "/workspace",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    "runAsGroup": 10001,
                },
                "resources": {
                    "requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
                    "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": "/workspace"},
                    {"name": "home", "mountPath": "/home/sandbox"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "workspace", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
        ],
    },
}

EXPECTED_PVC: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {
        "name": f"ws-sess-1-{HASH[:8]}",
        "namespace": "sandboxes",
        "labels": DEFAULT_LABELS,
        "annotations": {"sandbox-controller.dev/session-id": "sess_1"},
    },
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
}


def expected_pod() -> dict[str, Any]:
    return copy.deepcopy(EXPECTED_POD)


def pod(**template: Any) -> dict[str, Any]:
    return make_pod(SPEC, 1, SandboxTemplate(**template), SETTINGS)


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    (only,) = manifest["spec"]["containers"]
    return only  # type: ignore[no-any-return]


# --- the default template ------------------------------------------------------------------


def test_hash_constant_is_the_session_hash() -> None:
    assert names.session_hash("sess_1") == HASH


def test_default_pod_is_exactly_the_restricted_manifest() -> None:
    """L2/L8: non-root, read-only, no token; the executor dials out with the session's ids."""
    assert pod() == EXPECTED_POD


def test_default_pvc_is_exactly_the_claim() -> None:
    """L16: the workspace claim, named per session (no generation: it outlives every pod)."""
    assert make_pvc(SPEC, SandboxTemplate(), SETTINGS) == EXPECTED_PVC


def test_pod_settings_and_spec_flow_into_the_manifest() -> None:
    """L8: namespace, secret name/key, generation and the session's workspace directory are used as given."""
    spec = SandboxSpec("sess_1", "env_9", "https://other.test/remote", workspace_directory="/srv/ws")
    settings = PodSettings(namespace="ns-x", executor_key_secret="keys", executor_key_secret_key="k")
    manifest = make_pod(spec, 7, SandboxTemplate(name="large", image="img:2"), settings)
    expected = expected_pod()
    expected["metadata"].update(
        name=f"sbx-sess-1-{HASH[:8]}-g7",
        namespace="ns-x",
        labels={**DEFAULT_LABELS, "sandbox-controller.dev/generation": "7"},
        annotations={
            "sandbox-controller.dev/session-id": "sess_1",
            "sandbox-controller.dev/environment-id": "env_9",
            "sandbox-controller.dev/template": "large",
        },
    )
    c = container(expected)
    c["image"] = "img:2"
    c["env"][0]["value"] = "https://other.test/remote"
    c["env"][1]["value"] = "env_9"
    c["env"][2]["valueFrom"]["secretKeyRef"] = {"name": "keys", "key": "k"}
    c["workingDir"] = "/srv/ws"
    c["volumeMounts"][0]["mountPath"] = "/srv/ws"
    assert manifest == expected


# --- each option ---------------------------------------------------------------------------


def test_runtime_class() -> None:
    expected = expected_pod()
    expected["spec"]["runtimeClassName"] = "gvisor"
    assert pod(runtime_class_name="gvisor") == expected


def test_node_selector() -> None:
    expected = expected_pod()
    expected["spec"]["nodeSelector"] = {"pool": "sandboxes", "kubernetes.io/arch": "amd64"}
    assert pod(node_selector={"pool": "sandboxes", "kubernetes.io/arch": "amd64"}) == expected


def test_tolerations() -> None:
    toleration = {"key": "sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    expected = expected_pod()
    expected["spec"]["tolerations"] = [toleration]
    assert pod(tolerations=(toleration,)) == expected


def test_image_pull_secrets_and_policy() -> None:
    expected = expected_pod()
    expected["spec"]["imagePullSecrets"] = [{"name": "regcred"}, {"name": "mirror"}]
    container(expected)["imagePullPolicy"] = "Always"
    assert pod(image_pull_secrets=("regcred", "mirror"), image_pull_policy="Always") == expected


def test_active_deadline() -> None:
    expected = expected_pod()
    expected["spec"]["activeDeadlineSeconds"] = 86400
    assert pod(active_deadline_seconds=86400) == expected
    assert pod(active_deadline_seconds=None) == EXPECTED_POD


def test_resources() -> None:
    resources = {"requests": {"cpu": "1"}, "limits": {"cpu": "4", "nvidia.com/gpu": "1"}}
    expected = expected_pod()
    container(expected)["resources"] = resources
    assert pod(resources=resources) == expected


def test_persistent_workspace_mounts_the_session_claim() -> None:
    """L16: with persistence on, the workspace volume is the session's PVC, not an emptyDir."""
    expected = expected_pod()
    expected["spec"]["volumes"][0] = {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": f"ws-sess-1-{HASH[:8]}"},
    }
    assert pod(persist_workspace=True) == expected
    # The claim it mounts is the one make_pvc creates, whatever the generation.
    claim = make_pvc(SPEC, SandboxTemplate(persist_workspace=True), SETTINGS)["metadata"]["name"]
    for generation in (1, 2, 99):
        volumes = make_pod(SPEC, generation, SandboxTemplate(persist_workspace=True), SETTINGS)["spec"]["volumes"]
        assert volumes[0]["persistentVolumeClaim"]["claimName"] == claim


def test_a_ca_bundle_is_mounted_and_named_in_ssl_cert_file() -> None:
    """Users behind a TLS-inspecting proxy (and the real-node tier): with a CA bundle ConfigMap
    named, the pod mounts its ``ca-bundle.crt`` read-only and points ``SSL_CERT_FILE`` at it
    (codex trusts what that names, on top of its usual roots); nothing else changes."""
    expected = expected_pod()
    container(expected)["env"].append({"name": "SSL_CERT_FILE", "value": "/etc/sandbox-ca/ca-bundle.crt"})
    container(expected)["volumeMounts"].append({"name": "ca-bundle", "mountPath": "/etc/sandbox-ca", "readOnly": True})
    items = [{"key": "ca-bundle.crt", "path": "ca-bundle.crt"}]
    expected["spec"]["volumes"].append({"name": "ca-bundle", "configMap": {"name": "proxy-ca", "items": items}})
    settings = PodSettings(ca_bundle_configmap="proxy-ca")
    assert make_pod(SPEC, 1, SandboxTemplate(), settings) == expected
    assert make_pod(SPEC, 1, SandboxTemplate(), PodSettings(ca_bundle_configmap=None)) == EXPECTED_POD


def test_a_proxy_routes_the_sandboxs_https() -> None:
    """A template's httpsProxy and noProxy: both spellings of each in the executor's environment
    (codex honours HTTPS_PROXY for its registration and its WebSocket)."""
    expected = expected_pod()
    container(expected)["env"] += [
        {"name": "HTTPS_PROXY", "value": "http://10.20.30.40:3128"},
        {"name": "https_proxy", "value": "http://10.20.30.40:3128"},
        {"name": "NO_PROXY", "value": ".svc"},
        {"name": "no_proxy", "value": ".svc"},
    ]
    assert pod(https_proxy="http://10.20.30.40:3128", no_proxy=".svc") == expected


def test_pvc_size_and_storage_class() -> None:
    """L16: the claim's size and storage class come from the template."""
    expected = copy.deepcopy(EXPECTED_PVC)
    expected["spec"] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "20Gi"}},
        "storageClassName": "fast",
    }
    template = SandboxTemplate(persist_workspace=True, workspace_size="20Gi", storage_class_name="fast")
    assert make_pvc(SPEC, template, SETTINGS) == expected


def test_codex_sandbox_is_an_explicit_opt_in() -> None:
    """Codex's own sandbox: Unconfined seccomp and an unmasked /proc in a user namespace, nothing more."""
    expected = expected_pod()
    expected["spec"]["hostUsers"] = False
    container(expected)["securityContext"].update(seccompProfile={"type": "Unconfined"}, procMount="Unmasked")
    manifest = pod(codex_sandbox=True)
    assert manifest == expected
    # Still non-root, no escalation, every capability dropped.
    security = container(manifest)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True
    assert "privileged" not in security


def test_a_localhost_seccomp_profile_is_the_only_change() -> None:
    """The template's Localhost profile (Codex's own sandbox within "restricted"): the container's
    seccomp, and nothing else of the pod, changes; no procMount, no host users."""
    expected = expected_pod()
    profile = {"type": "Localhost", "localhostProfile": "sandbox-controller/codex-sandbox.json"}
    container(expected)["securityContext"]["seccompProfile"] = profile
    assert pod(seccomp_profile="sandbox-controller/codex-sandbox.json") == expected


def test_every_option_at_once_composes() -> None:
    template = SandboxTemplate(
        runtime_class_name="gvisor",
        node_selector={"pool": "x"},
        tolerations=({"key": "k", "operator": "Exists"},),
        image_pull_secrets=("regcred",),
        active_deadline_seconds=60,
        persist_workspace=True,
        codex_sandbox=True,
    )
    spec = make_pod(SPEC, 1, template, SETTINGS)["spec"]
    assert {k: spec[k] for k in ("runtimeClassName", "nodeSelector", "activeDeadlineSeconds", "hostUsers")} == {
        "runtimeClassName": "gvisor",
        "nodeSelector": {"pool": "x"},
        "activeDeadlineSeconds": 60,
        "hostUsers": False,
    }
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert "persistentVolumeClaim" in spec["volumes"][0]


def test_template_is_not_aliased_into_the_manifest() -> None:
    """Mutating one manifest (as a client library may) never changes the template or the next pod."""
    template = SandboxTemplate(node_selector={"pool": "x"}, tolerations=({"key": "k"},))
    first = make_pod(SPEC, 1, template, SETTINGS)
    first["spec"]["nodeSelector"]["pool"] = "changed"
    first["spec"]["tolerations"][0]["key"] = "changed"
    container(first)["resources"]["limits"]["cpu"] = "99"
    assert template.node_selector == {"pool": "x"}
    assert template.tolerations == ({"key": "k"},)
    assert make_pod(SPEC, 1, template, SETTINGS)["spec"]["nodeSelector"] == {"pool": "x"}
    assert container(make_pod(SPEC, 1, template, SETTINGS))["resources"]["limits"]["cpu"] == "2"


# --- L2: the executor key -------------------------------------------------------------------


def test_executor_key_only_via_secret_key_ref() -> None:
    """L2: CODEX_API_KEY comes from a Secret reference, never an inline value; no other env var is secret."""
    for template in (SandboxTemplate(), SandboxTemplate(codex_sandbox=True, persist_workspace=True)):
        env = container(make_pod(SPEC, 1, template, SETTINGS))["env"]
        (codex,) = [e for e in env if e["name"] == "CODEX_API_KEY"]
        assert codex == {
            "name": "CODEX_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "sandbox-executor-key", "key": "executor-key"}},
        }
        assert [e["name"] for e in env if "valueFrom" in e] == ["CODEX_API_KEY"]
        assert "envFrom" not in container(make_pod(SPEC, 1, template, SETTINGS))


def test_executor_key_never_appears_in_any_manifest() -> None:
    """L2: the key's value is nowhere in pod or PVC: not env, annotations, labels or args."""
    from controller.config import Settings

    settings = Settings.from_env({"CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY, "CONTROLLER_API_KEY": "sk-controller"})
    assert settings.runner.executor_key is not None  # the controller may hold it; manifests never do
    template = SandboxTemplate(persist_workspace=True, codex_sandbox=True, image_pull_secrets=("regcred",))
    for manifest in (make_pod(SPEC, 1, template, SETTINGS), make_pvc(SPEC, template, SETTINGS)):
        text = json.dumps(manifest)
        assert EXECUTOR_KEY not in text
        assert "sk-controller" not in text
    annotations = make_pod(SPEC, 1, template, SETTINGS)["metadata"]["annotations"]
    assert set(annotations) == {
        names.SESSION_ID_ANNOTATION,
        names.ENVIRONMENT_ID_ANNOTATION,
        names.TEMPLATE_ANNOTATION,
    }


# --- names and labels -----------------------------------------------------------------------

session_ids = st.text(max_size=300)
generations = st.integers(min_value=1, max_value=10**9)


@given(session_ids, generations)
def test_pod_name_is_a_dns_label_for_any_session_id(session_id: str, generation: int) -> None:
    """Pod names are DNS-1123 labels of at most 63 characters, whatever the session id."""
    name = names.pod_name(session_id, generation)
    assert len(name) <= 63
    assert DNS_1123_LABEL.match(name), name
    assert name.endswith(f"-g{generation}")
    assert name == names.pod_name(session_id, generation)  # stable


@given(session_ids, generations, generations)
def test_pod_names_differ_per_generation(session_id: str, a: int, b: int) -> None:
    """L14: a replacement never reuses the name of a pod that may still be terminating."""
    assert (names.pod_name(session_id, a) == names.pod_name(session_id, b)) == (a == b)


@given(session_ids, session_ids)
def test_names_differ_per_session(a: str, b: str) -> None:
    """L1: two sessions never share a pod or claim name, even when their slugs match."""
    if a != b:
        assert names.pod_name(a, 1) != names.pod_name(b, 1)
        assert names.pvc_name(a) != names.pvc_name(b)


@given(session_ids)
def test_pvc_name_is_a_stable_dns_label(session_id: str) -> None:
    """L16: the workspace claim name is a DNS-1123 label, the same for every generation."""
    name = names.pvc_name(session_id)
    assert len(name) <= 63
    assert DNS_1123_LABEL.match(name), name
    assert name == names.pvc_name(session_id)


@given(session_ids, st.none() | generations)
def test_labels_are_valid_label_values(session_id: str, generation: int | None) -> None:
    """Label values are ≤ 63 characters of the allowed alphabet; the session itself is in an annotation."""
    labels = names.labels(session_id, generation)
    for value in labels.values():
        assert len(value) <= 63
        assert LABEL_VALUE.match(value), value
    assert (names.GENERATION_LABEL in labels) == (generation is not None)
    assert names.session_selector(session_id) == f"{names.SESSION_HASH_LABEL}={labels[names.SESSION_HASH_LABEL]}"


def test_long_and_odd_session_ids() -> None:
    """Examples: long, uppercase, unicode, only punctuation, empty."""
    for session_id in ("sess_" + "A" * 200, "Sess.ÄÖÜ/..//émoji🙂", "___", "", "-x-", "0" * 63):
        pod_name = names.pod_name(session_id, 12)
        pvc_name = names.pvc_name(session_id)
        for name in (pod_name, pvc_name):
            assert len(name) <= 63 and DNS_1123_LABEL.match(name), name
    assert names.pod_name("sess_" + "A" * 200, 1).startswith("sbx-sess-aaaa")
    assert names.pod_name("___", 1) == f"sbx-x-{names.session_hash('___')[:8]}-g1"


def test_pod_manifest_labels_select_the_session() -> None:
    """The runner finds a session's pods by the session-hash label; managed pods by the selector labels."""
    labels = pod()["metadata"]["labels"]
    key, _, value = names.session_selector("sess_1").partition("=")
    assert labels[key] == value
    for part in names.managed_selector().split(","):
        k, _, v = part.partition("=")
        assert labels[k] == v


def test_a_template_without_host_users_runs_in_its_own_user_namespace() -> None:
    """``host_users=False`` adds ``hostUsers: false`` to the pod and changes nothing else: the
    security context stays "restricted"'s (RuntimeDefault seccomp, masked /proc)."""
    expected = expected_pod()
    expected["spec"]["hostUsers"] = False
    assert pod(host_users=False) == expected
    assert "hostUsers" not in pod()["spec"]
    localhost = pod(host_users=False, seccomp_profile="sandbox-controller/codex-sandbox.json")
    assert localhost["spec"]["hostUsers"] is False
    assert container(localhost)["securityContext"]["seccompProfile"]["type"] == "Localhost"


def test_template_annotations_are_on_its_pods_and_never_over_the_controllers_own() -> None:
    expected = expected_pod()
    expected["metadata"]["annotations"] = {"example.com/team": "a", **expected["metadata"]["annotations"]}
    assert pod(annotations={"example.com/team": "a"}) == expected


def test_a_restored_pod_runs_its_checkpoint_image_on_its_node_never_pulled_with_its_lineage() -> None:
    """Issue 40: the pod restored from a suspension's record: the checkpoint image (it exists only
    in the containerd of the node that took it, so the pod is bound there and never pulls it),
    annotated with the image and its lineage's first start (the maximum lifetime goes on)."""
    record = checkpoints.Record(
        image="localhost/sandbox-checkpoint/sandboxes/ws-sess-1-8ac3c66d:0b1c2d3e4f50",
        node="node-a",
        environment_id="env_1",
        suspended_at=1_700_000_100.0,
        lineage_started_at=1_700_000_000.25,
    )
    expected = expected_pod()
    expected["metadata"]["annotations"].update(
        {checkpoints.RESTORED_FROM: record.image, checkpoints.LINEAGE_STARTED_AT: "1700000000.250"}
    )
    expected["spec"]["nodeName"] = "node-a"
    container(expected)["image"] = record.image
    container(expected)["imagePullPolicy"] = "Never"
    assert make_pod(SPEC, 1, SandboxTemplate(), SETTINGS, record) == expected
