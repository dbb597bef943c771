"""``webhook register|rotate --kube-secret``'s store against a real kube-apiserver: it writes the
key the chart's receiver mounts, keeps the Secret's other keys, and reads back what it wrote."""

from __future__ import annotations

import base64
import uuid

from kubernetes import client

from controller.config import Secret
from controller.webhook_secrets import DEFAULT_SECRET_KEY, KubeSecret
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import kube_api  # noqa: F401  (the fixture)


def test_kube_secret_creates_then_updates_one_key(kube_api: KubeAPIServer) -> None:  # noqa: F811
    api_client = kube_api.api_client()
    try:
        core = client.CoreV1Api(api_client)
        namespace = f"ns-{uuid.uuid4().hex[:8]}"
        kube_api.create_namespace(namespace)
        store = KubeSecret(core, namespace, "sandbox-controller-webhook")
        assert store.read() == []

        store.write([Secret("whsec_b2xk")])  # created
        core.patch_namespaced_secret(store.name, namespace, {"data": {"other": base64.b64encode(b"x").decode()}})
        store.write([Secret("whsec_bmV3"), Secret("whsec_b2xk")])  # updated in place

        data = core.read_namespaced_secret(store.name, namespace).data or {}
        assert base64.b64decode(data[DEFAULT_SECRET_KEY]) == b"whsec_bmV3,whsec_b2xk"
        assert base64.b64decode(data["other"]) == b"x"
        assert [s.reveal() for s in store.read()] == ["whsec_bmV3", "whsec_b2xk"]
    finally:
        api_client.close()
