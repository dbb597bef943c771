"""Pure builders of the sandbox Pod and workspace PVC, from a spec and a template.

Secure by default (Pod Security "restricted"): non-root, no privilege escalation, every
capability dropped, seccomp RuntimeDefault, no service-account token, read-only root with
``emptyDir`` where the image writes. The executor key reaches the container only through a
``secretKeyRef`` (L2): never inlined, never in an annotation. Codex's own command sandbox
(unconfined seccomp, user namespaces, unmasked /proc) is an explicit per-template opt-in
(``codex_sandbox``) that a "restricted" namespace refuses by design.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.model import SandboxSpec
from controller.runners.kubernetes import names

RUNNER_UID = 10001
CONTAINER = "executor"


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


@dataclass(frozen=True)
class PodSettings:
    namespace: str = "sandboxes"
    executor_key_secret: str = "sandbox-executor-key"
    executor_key_secret_key: str = "executor-key"


def make_pod(spec: SandboxSpec, generation: int, template: SandboxTemplate, settings: PodSettings) -> dict[str, Any]:
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
    if template.codex_sandbox:
        container_security["seccompProfile"] = {"type": "Unconfined"}
        container_security["procMount"] = "Unmasked"
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": template.image,
        "env": [
            {"name": "REMOTE_URL", "value": spec.remote_url},
            {"name": "ENVIRONMENT_ID", "value": spec.environment_id},
            {
                "name": "CODEX_API_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": settings.executor_key_secret, "key": settings.executor_key_secret_key}
                },
            },
            {"name": "HOME", "value": "/home/sandbox"},
            {"name": "TMPDIR", "value": "/tmp"},
        ],
        "workingDir": spec.workspace_directory,
        "securityContext": container_security,
        "resources": {k: dict(v) for k, v in template.resources.items()},
        "volumeMounts": [
            {"name": "workspace", "mountPath": spec.workspace_directory},
            {"name": "home", "mountPath": "/home/sandbox"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if template.image_pull_policy:
        container["imagePullPolicy"] = template.image_pull_policy
    workspace: dict[str, Any] = (
        {"name": "workspace", "persistentVolumeClaim": {"claimName": names.pvc_name(spec.session_id)}}
        if template.persist_workspace
        else {"name": "workspace", "emptyDir": {}}
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 15,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [workspace, {"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
    }
    if template.codex_sandbox:
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
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod_name(spec.session_id, generation),
            "namespace": settings.namespace,
            "labels": names.labels(spec.session_id, generation),
            "annotations": {
                names.SESSION_ID_ANNOTATION: spec.session_id,
                names.ENVIRONMENT_ID_ANNOTATION: spec.environment_id,
                names.TEMPLATE_ANNOTATION: template.name,
            },
        },
        "spec": pod_spec,
    }


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
