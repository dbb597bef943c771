"""``webhook register|rotate --kube-secret``'s store against a real kube-apiserver: it writes the
key the chart's receiver mounts, keeps the Secret's other keys, and reads back what it wrote."""

from __future__ import annotations

import base64
import uuid

import pytest
from kubernetes import client

from controller.config import Secret
from controller.runners.kubernetes.api import KubeApi
from controller.webhook_secrets import DEFAULT_SECRET_KEY, KubeSecret
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import kube_api  # noqa: F401  (the fixture)

OLD = "whsec_" + base64.b64encode(b"the old signing secret, 32 bytes").decode()
NEW = "whsec_" + base64.b64encode(b"the new signing secret, 32 bytes").decode()


def test_kube_secret_creates_then_updates_one_key(kube_api: KubeAPIServer) -> None:  # noqa: F811
    api_client = kube_api.api_client()
    try:
        core = client.CoreV1Api(api_client)
        namespace = f"ns-{uuid.uuid4().hex[:8]}"
        kube_api.create_namespace(namespace)
        store = KubeSecret(KubeApi(core), namespace, "sandbox-controller-webhook")
        assert store.read() == []

        store.write([Secret(OLD)])  # created
        core.patch_namespaced_secret(store.name, namespace, {"data": {"other": base64.b64encode(b"x").decode()}})
        store.write([Secret(NEW), Secret(OLD)])  # updated in place

        data = core.read_namespaced_secret(store.name, namespace).data or {}
        assert base64.b64decode(data[DEFAULT_SECRET_KEY]) == f"{NEW},{OLD}".encode()
        assert base64.b64decode(data["other"]) == b"x"
        assert [s.reveal() for s in store.read()] == [NEW, OLD]
    finally:
        api_client.close()


def test_prepare_is_a_dry_run_that_answers_for_the_write(kube_api: KubeAPIServer) -> None:  # noqa: F811
    """Before the API makes a secret it shows once, ``prepare`` proves the write would succeed
    with a server-side dry run of the very create (or patch): nothing is stored, and a
    namespace that does not exist is refused then, not after the secret exists."""
    from controller.errors import Permanent

    api_client = kube_api.api_client()
    try:
        core = client.CoreV1Api(api_client)
        namespace = f"ns-{uuid.uuid4().hex[:8]}"
        kube_api.create_namespace(namespace)
        store = KubeSecret(KubeApi(core), namespace, "sandbox-controller-webhook")
        store.prepare()  # would create: dry run only
        assert store.read() == []
        store.write([Secret(OLD)])
        store.prepare()  # would patch: dry run only
        assert [s.reveal() for s in store.read()] == [OLD]
        missing = KubeSecret(KubeApi(core), f"absent-{uuid.uuid4().hex[:6]}", "sandbox-controller-webhook")
        with pytest.raises(Permanent, match="answered 404 checking that it may write Secret"):
            missing.prepare()
    finally:
        api_client.close()
