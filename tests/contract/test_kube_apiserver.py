"""Contract tests proving the envtest kube-apiserver is a real one: PodSecurity
admission and RBAC are enforced, and TokenRequest-minted ServiceAccount tokens
authenticate."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.envtest.fixtures import kube_api  # noqa: F401  (pytest fixture)

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _ns(prefix: str) -> str:
    # No namespace controller runs, so deleted namespaces never go away:
    # always use fresh names.
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _pod(name: str, *, compliant: bool) -> client.V1Pod:
    if compliant:
        pod_sc = client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=1000,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        )
        ctr_sc = client.V1SecurityContext(
            allow_privilege_escalation=False,
            capabilities=client.V1Capabilities(drop=["ALL"]),
            run_as_non_root=True,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        )
    else:
        pod_sc = None
        ctr_sc = client.V1SecurityContext(privileged=True, allow_privilege_escalation=True)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            security_context=pod_sc,
            containers=[
                client.V1Container(
                    name="main",
                    image="busybox:1.36",
                    command=["sleep", "3600"],
                    security_context=ctr_sc,
                )
            ],
        ),
    )


def test_pod_security_restricted_is_enforced(kube_api):  # noqa: F811
    ns = _ns("psa")
    kube_api.create_namespace(ns, labels=RESTRICTED)
    with kube_api.api_client() as api:
        core = client.CoreV1Api(api)

        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod(ns, _pod("bad", compliant=False))
        assert exc.value.status == 403, exc.value.body
        body = json.loads(exc.value.body)
        assert "violates PodSecurity" in body["message"], body["message"]
        assert '"restricted:latest"' in body["message"], body["message"]
        assert "privileged" in body["message"], body["message"]

        created = core.create_namespaced_pod(ns, _pod("good", compliant=True))
        assert created.metadata.uid
        got = core.read_namespaced_pod("good", ns)
        assert got.spec.automount_service_account_token is False
        # No scheduler/kubelet: the pod is stored but never runs.
        assert got.status.phase == "Pending"


def test_service_account_token_is_bound_by_rbac(kube_api):  # noqa: F811
    ns = _ns("rbac")
    kube_api.create_namespace(ns)
    with kube_api.api_client() as api:
        core = client.CoreV1Api(api)
        rbac = client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
        rbac.create_namespaced_role(
            ns,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="pod-reader"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="reader-pods"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=ns)],
            ),
        )
        core.create_namespaced_secret(
            ns, client.V1Secret(metadata=client.V1ObjectMeta(name="s"), string_data={"k": "v"})
        )

    token = kube_api.service_account_token(ns, "reader")
    assert token.count(".") == 2  # a JWT

    with kube_api.api_client(token) as api:
        core = client.CoreV1Api(api)
        # Allowed: list pods in its namespace.
        pods = core.list_namespaced_pod(ns)
        assert pods.items == []

        # Who am I: the token authenticates as the ServiceAccount.
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{ns}:reader"

        # Refused: secrets (same namespace) and pods in another namespace.
        for call in (
            lambda: core.read_namespaced_secret("s", ns),
            lambda: core.list_namespaced_secret(ns),
            lambda: core.list_namespaced_pod("default"),
        ):
            with pytest.raises(ApiException) as exc:
                call()
            assert exc.value.status == 403, exc.value.body
            assert f"system:serviceaccount:{ns}:reader" in json.loads(exc.value.body)["message"]


def test_bad_token_is_unauthorized(kube_api):  # noqa: F811
    with kube_api.api_client("not-a-token") as api:
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(api).list_namespace()
        assert exc.value.status == 401


def test_pod_without_service_account_is_rejected(kube_api):  # noqa: F811
    """Documents the no-controller-manager gotcha: ServiceAccount admission
    rejects a pod whose ServiceAccount doesn't exist, even with
    automountServiceAccountToken: false."""
    ns = _ns("nosa")
    kube_api.create_namespace(ns, default_service_account=False)
    with kube_api.api_client() as api:
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(api).create_namespaced_pod(ns, _pod("p", compliant=True))
        assert exc.value.status == 403, exc.value.body
        assert "service account" in json.loads(exc.value.body)["message"]
