"""Pure builders of the sandbox Pod and workspace PVC, from a spec and a template.

Secure by default (Pod Security "restricted"): non-root, no privilege escalation, every
capability dropped, seccomp RuntimeDefault, no service-account token, read-only root with
``emptyDir`` where the image writes. Public names are resolved as they are first
(``DNS_OPTIONS``). The executor key reaches the container only through a ``secretKeyRef``
(L2): never inlined, never in an annotation. Codex's own command sandbox (unconfined seccomp,
user namespaces, unmasked /proc) is an explicit per-template opt-in (``codex_sandbox``) that a
"restricted" namespace refuses by design.

A warm pod (``make_warm_pod``) has the same shape, minus what only a session can tell: no
``REMOTE_URL`` and ``ENVIRONMENT_ID`` in its environment, an ``emptyDir`` workspace, and a
downward-API volume of two of its own annotations, which ``claim_patch`` sets when a session
claims it (late binding: the entrypoint waits for them). The key still comes only from the
Secret; the pod still gets no service-account token.

With ``PodSettings.ca_bundle_configmap`` every pod (cold or warm) also mounts that ConfigMap's
``ca-bundle.crt`` read-only and names it in ``SSL_CERT_FILE``: the CAs the executor trusts for
its TLS to the API (users behind a TLS-inspecting proxy; the real-node tier's test CA).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from controller.model import SandboxSpec
from controller.runners.kubernetes import checkpoints, names

RUNNER_UID = 10001
CONTAINER = names.CONTAINER
BINDING_DIRECTORY = "/etc/sandbox-binding"
CA_BUNDLE_KEY = "ca-bundle.crt"
CA_BUNDLE_DIRECTORY = "/etc/sandbox-ca"
DNS_OPTIONS = ({"name": "ndots", "value": "1"},)
"""Resolver options of every sandbox pod: a name with a dot in it (``api.openai.com``) is looked up
as it is first. With Kubernetes' ``ndots:5`` codex's first lookup went through the three search
domains of the cluster (each an A and an AAAA query answered NXDOMAIN) before the name itself:
four rounds to the cluster DNS where one does. Sandboxes reach no cluster Service (their
NetworkPolicy lets them reach only DNS and public addresses), so the search domains serve
them nothing; a name without a dot still gets them."""


@dataclass(frozen=True)
class SandboxTemplate:
    """How one kind of sandbox pod looks. Chosen per session (metadata key or agent id)."""

    name: str = "default"
    image: str = "sandbox-controller/sandbox-runner:0.171.0"
    image_pull_policy: str | None = None
    resources: dict[str, dict[str, str]] = field(
        default_factory=lambda: {
            "requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "1Gi"},
            "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"},
        }
    )
    runtime_class_name: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    active_deadline_seconds: int | None = None
    persist_workspace: bool = False
    workspace_size: str = "5Gi"
    storage_class_name: str | None = None
    codex_sandbox: bool = False
    """Opt-in: Codex's own bubblewrap sandbox (fails Pod Security "restricted")."""
    host_users: bool = True
    """False: the pod runs in its own user namespace (``hostUsers: false``): its uids, root
    included, are unprivileged uids of the node. ``codex_sandbox`` implies it."""
    seccomp_profile: str | None = None
    """A ``Localhost`` seccomp profile for the container, by its path under the kubelet's seccomp
    directory (``sandbox-controller/codex-sandbox.json``: Codex's own sandbox within
    "restricted"; docs/kubernetes.md); None: the pod's ``RuntimeDefault``."""
    warm_pool_size: int = 0
    """Keep this many warm pods of this template started and waiting for a session (0: none)."""
    warm_pool_min: int = 0
    warm_pool_max: int = 0
    """With a max above 0 the pool sizes itself to demand within [min, max] instead of keeping a
    fixed size (``pool.target``): the peak of the placements within any ``warm_interval_seconds``
    of the last ``warm_window_seconds``, plus ``warm_headroom_percent``."""
    warm_window_seconds: int = 600
    warm_interval_seconds: int = 10
    warm_headroom_percent: int = 25
    warm_max_age_seconds: int = 3600
    """A warm pod no session claimed within this is replaced (a fresh image pull policy, key)."""
    https_proxy: str | None = None
    """``HTTPS_PROXY`` of the pod: codex's registration and WebSocket go through it."""
    no_proxy: str | None = None
    """``NO_PROXY`` of the pod."""
    checkpoint_idle: bool = False
    """``suspend: checkpoint``: an idle sandbox is checkpointed (``checkpoints.py``) and the
    session's next pod restored from it; False: it is deleted."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Put on every pod of the template as they are."""

    @property
    def pooled(self) -> bool:
        """Whether sessions of this template are served from a warm pool (a per-session
        workspace volume cannot be mounted before the session is known: never pooled)."""
        return (self.warm_pool_size > 0 or self.sized_by_demand) and not self.persist_workspace

    @property
    def sized_by_demand(self) -> bool:
        """Whether the pool's size follows demand (``warmPool: {min, max}``) rather than being fixed."""
        return self.warm_pool_max > 0


@dataclass(frozen=True)
class PodSettings:
    namespace: str = "sandboxes"
    executor_key_secret: str = "sandbox-executor-key"
    executor_key_secret_key: str = "executor-key"
    workspace_directory: str = "/workspace"
    """Where warm pods mount their workspace (the routing's directory: every session we serve has it)."""
    ca_bundle_configmap: str | None = None
    """A ConfigMap whose ``ca-bundle.crt`` every pod mounts at ``CA_BUNDLE_DIRECTORY``, with
    ``SSL_CERT_FILE`` naming it (codex and OpenSSL-based tools read it); None: the image's CAs."""


def make_pod(
    spec: SandboxSpec,
    generation: int,
    template: SandboxTemplate,
    settings: PodSettings,
    restore: checkpoints.Record | None = None,
) -> dict[str, Any]:
    """The session's cold pod of ``generation``; with ``restore``, restored from that checkpoint:
    its image the checkpoint image (never pulled: it exists only on the node that took it), bound
    to that node, annotated with the image and its lineage's first start (the lifetime goes on)."""
    env = [
        {"name": "REMOTE_URL", "value": spec.remote_url},
        {"name": "ENVIRONMENT_ID", "value": spec.environment_id},
    ]
    workspace: dict[str, Any] = (
        {"name": "workspace", "persistentVolumeClaim": {"claimName": names.pvc_name(spec.session_id)}}
        if template.persist_workspace
        else {"name": "workspace", "emptyDir": {}}
    )
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod_name(spec.session_id, generation),
            "namespace": settings.namespace,
            "labels": names.labels(spec.session_id, generation),
            "annotations": {
                **template.annotations,
                names.SESSION_ID_ANNOTATION: spec.session_id,
                names.ENVIRONMENT_ID_ANNOTATION: spec.environment_id,
                names.TEMPLATE_ANNOTATION: template.name,
            },
        },
        "spec": _pod_spec(env, spec.workspace_directory, workspace, [], template, settings),
    }
    if restore is not None:
        pod["metadata"]["annotations"][checkpoints.RESTORED_FROM] = restore.image
        pod["metadata"]["annotations"][checkpoints.LINEAGE_STARTED_AT] = f"{restore.lineage_started_at:.3f}"
        pod["spec"]["nodeName"] = restore.node
        [container] = pod["spec"]["containers"]
        container["image"] = restore.image
        container["imagePullPolicy"] = "Never"
    return pod


def make_warm_pod(template: SandboxTemplate, settings: PodSettings) -> dict[str, Any]:
    """A pod of the template's warm pool: started before any session, bound by ``claim_patch``."""
    env = [{"name": "BINDING_DIRECTORY", "value": BINDING_DIRECTORY}]
    binding = {
        "name": "binding",
        "downwardAPI": {
            "items": [
                {"path": "environment-id", "fieldRef": {"fieldPath": _annotation(names.ENVIRONMENT_ID_ANNOTATION)}},
                {"path": "remote-url", "fieldRef": {"fieldPath": _annotation(names.REMOTE_URL_ANNOTATION)}},
            ]
        },
    }
    mount = {"name": "binding", "mountPath": BINDING_DIRECTORY, "readOnly": True}
    workspace = {"name": "workspace", "emptyDir": {}}
    pod_spec = _pod_spec(env, settings.workspace_directory, workspace, [(binding, mount)], template, settings)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": names.warm_prefix(template.name),
            "namespace": settings.namespace,
            "labels": names.pool_labels(template.name),
            "annotations": {
                **template.annotations,
                names.TEMPLATE_ANNOTATION: template.name,
                names.SHAPE_ANNOTATION: shape(pod_spec),
            },
        },
        "spec": pod_spec,
    }


def shape(pod_spec: dict[str, Any]) -> str:
    """A digest of a warm pod's spec: a pod of another shape (the template or the settings
    changed since it started) is never claimed, and the pool replaces it."""
    return hashlib.sha256(json.dumps(pod_spec, sort_keys=True).encode()).hexdigest()[:16]


def claim_patch(spec: SandboxSpec, generation: int, claimed_at: float) -> list[dict[str, Any]]:
    """The JSON patch that claims a warm pod for a session: applied only while the pod is still
    ``ready`` (the ``test`` operation, checked by the API server on the current object), so of
    two claims of one pod exactly one succeeds. It gives the pod the session's labels and
    annotations (as ``make_pod`` does) and the binding its entrypoint waits for; never the key."""
    return [
        {"op": "test", "path": _path("labels", names.POOL_STATE_LABEL), "value": names.READY},
        {"op": "replace", "path": _path("labels", names.POOL_STATE_LABEL), "value": names.CLAIMED},
        {"op": "add", "path": _path("labels", names.SESSION_HASH_LABEL), "value": names.session_hash(spec.session_id)},
        {"op": "add", "path": _path("labels", names.GENERATION_LABEL), "value": str(generation)},
        {"op": "add", "path": _path("annotations", names.SESSION_ID_ANNOTATION), "value": spec.session_id},
        {"op": "add", "path": _path("annotations", names.ENVIRONMENT_ID_ANNOTATION), "value": spec.environment_id},
        {"op": "add", "path": _path("annotations", names.REMOTE_URL_ANNOTATION), "value": spec.remote_url},
        {"op": "add", "path": _path("annotations", names.CLAIMED_AT_ANNOTATION), "value": f"{claimed_at:.3f}"},
    ]


def binding_refresh_patch(uid: str) -> list[dict[str, Any]]:
    """The JSON patch that refreshes a claimed pod's binding (``pool.binding_refresh_due``): a
    label, which makes the kubelet sync the pod again; applied only to that pod (its UID) while
    it is still claimed."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": _path("labels", names.POOL_STATE_LABEL), "value": names.CLAIMED},
        {"op": "add", "path": _path("labels", names.BINDING_REFRESHED_LABEL), "value": "true"},
    ]


def _path(kind: str, key: str) -> str:
    """The JSON pointer of a label or an annotation (``~`` and ``/`` escaped)."""
    return f"/metadata/{kind}/{key.replace('~', '~0').replace('/', '~1')}"


def _annotation(key: str) -> str:
    return f"metadata.annotations['{key}']"


def _ca_bundle(settings: PodSettings) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The CA bundle's environment variable and (volume, mount), when the settings name one."""
    if not settings.ca_bundle_configmap:
        return [], []
    volume = {
        "name": "ca-bundle",
        "configMap": {"name": settings.ca_bundle_configmap, "items": [{"key": CA_BUNDLE_KEY, "path": CA_BUNDLE_KEY}]},
    }
    mount = {"name": "ca-bundle", "mountPath": CA_BUNDLE_DIRECTORY, "readOnly": True}
    return [{"name": "SSL_CERT_FILE", "value": f"{CA_BUNDLE_DIRECTORY}/{CA_BUNDLE_KEY}"}], [(volume, mount)]


def _proxy_env(template: SandboxTemplate) -> list[dict[str, Any]]:
    """The template's proxy, in both spellings tools read."""
    env: list[dict[str, Any]] = []
    if template.https_proxy:
        env += [{"name": n, "value": template.https_proxy} for n in ("HTTPS_PROXY", "https_proxy")]
    if template.no_proxy:
        env += [{"name": n, "value": template.no_proxy} for n in ("NO_PROXY", "no_proxy")]
    return env


def _pod_spec(
    binding_env: list[dict[str, Any]],
    workspace_directory: str,
    workspace: dict[str, Any],
    extra: list[tuple[dict[str, Any], dict[str, Any]]],
    template: SandboxTemplate,
    settings: PodSettings,
) -> dict[str, Any]:
    ca_env, ca_volumes = _ca_bundle(settings)
    extra = [*extra, *ca_volumes]
    container_security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUNNER_UID,
        "runAsGroup": RUNNER_UID,
    }
    pod_security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": RUNNER_UID,
        "runAsGroup": RUNNER_UID,
        "fsGroup": RUNNER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if template.seccomp_profile:
        container_security["seccompProfile"] = {"type": "Localhost", "localhostProfile": template.seccomp_profile}
    if template.codex_sandbox:
        container_security["seccompProfile"] = {"type": "Unconfined"}
        container_security["procMount"] = "Unmasked"
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "env": [
            *binding_env,
            {
                "name": "CODEX_API_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": settings.executor_key_secret, "key": settings.executor_key_secret_key}
                },
            },
            {"name": "HOME", "value": "/home/sandbox"},
            {"name": "TMPDIR", "value": "/tmp"},
            *ca_env,
            *_proxy_env(template),
        ],
        "workingDir": workspace_directory,
        "securityContext": container_security,
        "resources": {k: dict(v) for k, v in template.resources.items()},
        "volumeMounts": [
            {"name": "workspace", "mountPath": workspace_directory},
            {"name": "home", "mountPath": "/home/sandbox"},
            {"name": "tmp", "mountPath": "/tmp"},
            *(mount for _, mount in extra),
        ],
    }
    if template.image_pull_policy:
        container["imagePullPolicy"] = template.image_pull_policy
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsConfig": {"options": [dict(option) for option in DNS_OPTIONS]},
        "terminationGracePeriodSeconds": 15,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [
            workspace,
            {"name": "home", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            *(volume for volume, _ in extra),
        ],
    }
    if template.codex_sandbox or not template.host_users:
        pod_spec["hostUsers"] = False
    if template.runtime_class_name:
        pod_spec["runtimeClassName"] = template.runtime_class_name
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in template.image_pull_secrets]
    if template.active_deadline_seconds:
        pod_spec["activeDeadlineSeconds"] = template.active_deadline_seconds
    return pod_spec


def make_pvc(spec: SandboxSpec, template: SandboxTemplate, settings: PodSettings) -> dict[str, Any]:
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": template.workspace_size}},
    }
    if template.storage_class_name:
        pvc_spec["storageClassName"] = template.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": names.pvc_name(spec.session_id),
            "namespace": settings.namespace,
            "labels": names.labels(spec.session_id),
            "annotations": {names.SESSION_ID_ANNOTATION: spec.session_id},
        },
        "spec": pvc_spec,
    }
