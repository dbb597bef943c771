"""The Kubernetes runner's section: where sandbox pods run and what they are made from."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable
from controller.config.reader import PREFIX, Reader


@dataclass(frozen=True, repr=False)
class KubernetesSettings(Printable):
    namespace: str = "sandboxes"
    """Namespace the sandbox pods run in (labelled to enforce Pod Security "restricted")."""
    image: str = "sandbox-controller/sandbox-runner:0.171.0"
    """The runner image (runner_image/) of the default template."""
    executor_key_secret: str = "sandbox-executor-key"
    """Secret in the sandbox namespace holding the environment key under ``executor-key`` (L2)."""
    templates_file: str | None = None
    """JSON file of named sandbox templates (see runners/kubernetes/templates.py)."""
    runtime_class: str | None = None
    """RuntimeClass of the default template, e.g. gvisor."""
    user_namespaces: bool = False
    """The cluster runs pods in their own user namespace (Kubernetes 1.33+ on containerd 2.0+ and
    runc 1.2+, or CRI-O): the default template's pods get ``hostUsers: false``, so a sandbox's
    root is an unprivileged uid of the node. Templates inherit it (``hostUsers`` overrides)."""
    watch_pods: bool = True
    """The active scheduler watches the sandbox pods and has the session of a pod that was
    deleted, failed, restarted or became Ready looked at at once; partial sweeps then leave
    sessions whose pod is watched to the watch. Needs ``watch`` on pods (the chart's Role)."""
    ca_bundle_configmap: str | None = None
    """ConfigMap in the sandbox namespace whose ``ca-bundle.crt`` (PEM) every sandbox pod mounts
    read-only, with ``SSL_CERT_FILE`` pointing at it: the CAs the executor trusts (for example a
    TLS-inspecting proxy's). None: the image's own CA list."""
    checkpoint_timeout_seconds: float = 60.0
    """How long a worker waits for the node agent's checkpoint of an idle sandbox of a template
    with ``suspend: checkpoint`` before it stops the sandbox without one."""


def kubernetes(r: Reader) -> KubernetesSettings:
    return KubernetesSettings(
        namespace=r.text("KUBERNETES_NAMESPACE", KubernetesSettings.namespace),
        image=r.text("KUBERNETES_IMAGE", KubernetesSettings.image),
        executor_key_secret=r.text("KUBERNETES_EXECUTOR_KEY_SECRET", KubernetesSettings.executor_key_secret),
        templates_file=r.get(PREFIX + "KUBERNETES_TEMPLATES_FILE") or None,
        runtime_class=r.get(PREFIX + "KUBERNETES_RUNTIME_CLASS") or None,
        user_namespaces=r.flag("KUBERNETES_USER_NAMESPACES", KubernetesSettings.user_namespaces),
        watch_pods=r.flag("KUBERNETES_WATCH_PODS", KubernetesSettings.watch_pods),
        ca_bundle_configmap=r.object_name("KUBERNETES_CA_BUNDLE_CONFIGMAP"),
        checkpoint_timeout_seconds=r.number(
            "KUBERNETES_CHECKPOINT_TIMEOUT_SECONDS", KubernetesSettings.checkpoint_timeout_seconds, float, 1.0, 3600
        ),
    )
