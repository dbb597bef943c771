"""The Helm chart against the real kube-apiserver v1.37 (RBAC and PodSecurity admission on).

* Every object the chart renders (default values and each ``ci/*.yaml``) is applied with a
  server-side dry run and ``fieldValidation=Strict``: the API server itself checks each one
  against its 1.37 schema (unknown or duplicate fields are errors, not warnings), runs
  admission (PodSecurity, ServiceAccount, NamespaceLifecycle) and stores nothing.
* The controller's own pods (every Deployment/StatefulSet template and the ``helm test`` pod)
  are admitted in a namespace that *enforces* Pod Security "restricted".
* RBAC proven live: the chart's ServiceAccount, Role and RoleBinding are created for real, and
  the Kubernetes runner, authenticated with that ServiceAccount's token, does the controller's
  whole job in the sandbox namespace; the same token is refused Secrets, ``pods/exec``, pods
  outside the sandbox namespace and anything cluster-wide.
* ``helm install`` / ``helm uninstall`` with Helm 4's own library (helm-python-sdk) against the
  same API server.
* Suspend with memory (``sandbox.checkpoints``): the node agent's objects, its pod's need of a
  privileged release namespace, its token's and the worker's grants, and the pod policy's rule
  for checkpoint images, run by the API server.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from controller.errors import RunnerRejected
from controller.model import Health, SandboxSpec
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, claim_patch, make_pod, make_warm_pod
from controller.runners.kubernetes.runner import KubernetesRunner
from controller.runners.kubernetes.watch import PodWatch
from tests.chart.test_chart import CASE_IDS, CASES, CHART, CHECKPOINTS, CREDENTIALS, EXECUTOR_KEY, _helm, merge
from tests.envtest.cluster import KubeAPIServer
from tests.support.processes import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]

RELEASE = "demo"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
FIELD_MANAGER = "chart-dry-run"
RUNNER_IMAGE = "sandbox-runner:test"
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
# What the runner uses, and nothing else (issue 3: "pods and PVCs: create, get, list, watch,
# delete; events: create").
EXPECTED_GRANTS = {
    ("", resource, verb)
    for resource in ("pods", "persistentvolumeclaims")
    for verb in ("create", "get", "list", "watch", "delete")
} | {("", "events", "create")}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def admin(kube_api: KubeAPIServer) -> Iterator[client.ApiClient]:
    api = kube_api.api_client()
    yield api
    api.close()


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def render(chart: Any, values: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
    """Every object the chart renders for release ``demo`` in ``namespace`` (NOTES.txt aside).

    As ``tests.chart.test_chart.render``, with the release namespace as a parameter (each test
    here needs a fresh one: without a namespace controller, namespaces are never deleted)."""
    manifests = chart.render(values, name=RELEASE, namespace=namespace, is_install=True)
    objects = []
    for name, text in sorted(manifests.items()):
        if name.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def _dry_run_apply(dynamic: DynamicClient, obj: dict[str, Any], *, dry_run: bool = True) -> dict[str, Any]:
    """Server-side apply with strict field validation (``dryRun=All`` unless told otherwise)."""
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kwargs: dict[str, Any] = {
        "field_manager": FIELD_MANAGER,
        "force_conflicts": True,
        # DynamicClient has no keyword for fieldValidation; it passes query_params through.
        "query_params": [("fieldValidation", "Strict")],
    }
    if dry_run:
        kwargs["dry_run"] = "All"
    result = dynamic.server_side_apply(resource, body=obj, namespace=obj["metadata"].get("namespace"), **kwargs)
    applied: dict[str, Any] = result.to_dict()
    return applied


def _dry_run_create(dynamic: DynamicClient, obj: dict[str, Any]) -> dict[str, Any]:
    """A plain create (POST) with ``dryRun=All`` and strict field validation."""
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    result = dynamic.create(
        resource,
        body=obj,
        namespace=obj["metadata"].get("namespace"),
        dry_run="All",
        query_params=[("fieldValidation", "Strict")],
    )
    created: dict[str, Any] = result.to_dict()
    return created


def _case_values(case: str, values: dict[str, Any], release_ns: str) -> dict[str, Any]:
    """The case's values; a fixed sandbox namespace name is made unique for this run."""
    sandbox = values.get("sandbox", {}).get("namespace", {})
    if sandbox.get("name"):
        return merge(values, {"sandbox": {"namespace": {"name": f"{release_ns}-{sandbox['name']}"[:63]}}})
    return values


# -- every rendered object, server-side dry run ------------------------------------------------


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_every_rendered_object_passes_a_strict_server_side_dry_run(
    kube_api: KubeAPIServer, admin: client.ApiClient, chart: Any, case: str, values: dict[str, Any]
) -> None:
    """Every object the chart renders is valid against the Kubernetes 1.37 schemas and passes
    admission: server-side apply (and create) with dryRun=All and fieldValidation=Strict.

    Nothing is skipped: the only object applied for real is the sandbox Namespace the chart
    creates (namespaced objects cannot even be dry-run into a namespace that does not exist;
    NamespaceLifecycle admission refuses them). When the values say the chart does not create
    it (``sandbox.namespace.create: false``), the test creates it as an admin would, labelled
    for "restricted". The ``helm test`` hook Pods are dry-run like the rest: they only name
    Services by DNS name, which the API server does not resolve."""
    release_ns = _unique("rel")
    # The release namespace enforces "restricted" too: the helm-test Pod is enforced here.
    kube_api.create_namespace(release_ns, RESTRICTED)
    values = _case_values(case, values, release_ns)
    objects = render(chart, values, release_ns)
    dynamic = DynamicClient(admin)

    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "CONTROLLER_KUBERNETES_NAMESPACE" in o["data"])
    sandbox_ns = config["data"]["CONTROLLER_KUBERNETES_NAMESPACE"]
    if namespaces:
        [namespace] = namespaces
        assert namespace["metadata"]["name"] == sandbox_ns
        applied = _dry_run_apply(dynamic, namespace, dry_run=False)  # strict validation, for real
        assert applied["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        # Its default ServiceAccount, as the controller-manager (absent here) makes it: the
        # network-policy `helm test` pod runs there under it.
        client.CoreV1Api(admin).create_namespaced_service_account(sandbox_ns, {"metadata": {"name": "default"}})
    else:
        assert values["sandbox"]["namespace"]["create"] is False, case
        kube_api.create_namespace(sandbox_ns, RESTRICTED)

    kinds: dict[str, int] = {}
    for obj in objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
        if obj["kind"] == "Namespace":
            continue  # applied above, for real and strictly validated
        expected_ns = obj["metadata"].get("namespace")
        if obj["kind"] in POLICY_KINDS:
            assert expected_ns is None  # cluster-scoped; the binding selects the sandbox namespace
        else:
            assert expected_ns in (release_ns, sandbox_ns), (obj["kind"], obj["metadata"]["name"])
        applied = _dry_run_apply(dynamic, copy.deepcopy(obj))
        assert applied["metadata"]["name"] == obj["metadata"]["name"]
        assert applied["metadata"].get("namespace") == expected_ns
        created = _dry_run_create(dynamic, copy.deepcopy(obj))
        assert created["metadata"]["uid"]  # the server built the whole object, then dropped it
        # Dry run means nothing was stored.
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        with pytest.raises(ApiException) as missing:
            dynamic.get(resource, name=obj["metadata"]["name"], namespace=expected_ns)
        assert missing.value.status == 404

    # Only core kinds (no CRDs); no cluster-scoped object besides the sandbox Namespace and the
    # sandbox pod policy with its binding (admission policies are cluster-scoped).
    allowed = {
        "ConfigMap", "DaemonSet", "Deployment", "Ingress", "Namespace", "NetworkPolicy", "Pod",
        "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount", "StatefulSet",
    } | POLICY_KINDS  # fmt: skip
    assert set(kinds) <= allowed, set(kinds) - allowed
    pre_puller = values.get("sandbox", {}).get("prePuller", {}).get("enabled", False)
    assert kinds.get("DaemonSet", 0) == (1 if pre_puller else 0)  # the image pre-puller, when asked for
    assert kinds["Deployment"] >= 2 and kinds["Pod"] == 2  # the helm test hooks: readyz, network policy
    assert kinds["ValidatingAdmissionPolicy"] == kinds["ValidatingAdmissionPolicyBinding"] == 1
    assert kinds["NetworkPolicy"] >= 1


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_the_sandbox_network_policy_is_accepted_as_rendered(
    kube_api: KubeAPIServer, admin: client.ApiClient, chart: Any, case: str, values: dict[str, Any]
) -> None:
    """The sandbox egress policy (private ranges and user CIDRs excepted, DNS only to the DNS
    peers, extra destinations) passes the API server's own NetworkPolicy validation (each
    ``except`` inside its ``cidr``, valid peers and ports), and the server keeps every rule as
    rendered. This proves the policy is well-formed, not that a CNI enforces it."""
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns)
    values = merge(_case_values(case, values, release_ns), {"sandbox": {"namespace": {"create": False}}})
    objects = render(chart, values, release_ns)
    [policy] = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-sandboxes")]
    kube_api.create_namespace(policy["metadata"]["namespace"])
    created = _dry_run_create(DynamicClient(admin), copy.deepcopy(policy))
    egress = created["spec"]["egress"]
    assert egress == policy["spec"]["egress"]
    public = [r for r in egress if any(p.get("ipBlock", {}).get("cidr") == "0.0.0.0/0" for p in r["to"])]
    [rule] = public
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"} <= set(
        rule["to"][0]["ipBlock"]["except"]
    )
    # The server does check: an exception outside its block is refused.
    broken = copy.deepcopy(policy)
    broken["spec"]["egress"][1]["to"][0]["ipBlock"] = {"cidr": "203.0.113.0/24", "except": ["10.0.0.0/8"]}
    with pytest.raises(ApiException) as refused:
        _dry_run_create(DynamicClient(admin), broken)
    assert refused.value.status == 422


def test_strict_validation_is_really_on(kube_api: KubeAPIServer, admin: client.ApiClient, chart: Any) -> None:
    """The dry run above would catch a typo: an unknown field is refused under Strict."""
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns)
    objects = render(chart, CREDENTIALS, release_ns)
    typo = copy.deepcopy(next(o for o in objects if o["kind"] == "Deployment"))
    typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    dynamic = DynamicClient(admin)
    with pytest.raises(ApiException) as refused:
        _dry_run_create(dynamic, copy.deepcopy(typo))
    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert 'strict decoding error: unknown field "spec.template.spec.containers[0].imagePullPolicyy"' in message
    # Server-side apply refuses it too (kube-apiserver answers 500 for a patch it cannot type).
    with pytest.raises(ApiException) as refused:
        _dry_run_apply(dynamic, copy.deepcopy(typo))
    assert "imagePullPolicyy: field not declared in schema" in (refused.value.body or "")


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_controller_pods_are_admitted_where_restricted_is_enforced(
    kube_api: KubeAPIServer, admin: client.ApiClient, chart: Any, case: str, values: dict[str, Any]
) -> None:
    """L2: the controller's own pods (receiver, worker, scheduler, bundled Redis, the helm test
    pods) pass Pod Security "restricted" *enforcement*. PodSecurity only warns on workload
    templates, so each template is dry-run as a bare Pod in a namespace that enforces it (the
    network-policy helm test pod in the sandbox namespace, enforcing it too)."""
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns, RESTRICTED)
    values = _case_values(case, values, release_ns)
    objects = render(chart, values, release_ns)
    for elsewhere in {o["metadata"]["namespace"] for o in objects if o["kind"] == "Pod"} - {release_ns}:
        kube_api.create_namespace(elsewhere, RESTRICTED)
    core = client.CoreV1Api(admin)
    # The ServiceAccount admission plugin wants the pods' ServiceAccount to exist.
    for sa in (o for o in objects if o["kind"] == "ServiceAccount"):
        core.create_namespaced_service_account(release_ns, sa)
    dynamic = DynamicClient(admin)
    admitted = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            template = copy.deepcopy(obj["spec"]["template"])
            # The StatefulSet controller adds a volume per claim template (here: Redis's data).
            for claim in obj["spec"].get("volumeClaimTemplates", []):
                claim_name = f"{claim['metadata']['name']}-{obj['metadata']['name']}-0"
                volume = {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}}
                template["spec"].setdefault("volumes", []).append(volume)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": obj["metadata"]["name"], "namespace": release_ns, **template["metadata"]},
                "spec": template["spec"],
            }
        elif obj["kind"] == "Pod":
            pod = obj
        else:
            continue
        _dry_run_create(dynamic, copy.deepcopy(pod))
        admitted.append(pod["metadata"]["name"])
    assert len(admitted) >= 5, admitted  # receiver, worker, scheduler, two helm test pods (+ Redis)


# -- RBAC proven live ---------------------------------------------------------------------------


class _Rbac:
    """The chart's ServiceAccount, Role, RoleBinding, executor key Secret and sandbox pod policy,
    created for real by the admin (as `helm install` would), and a client with the
    ServiceAccount's own token. The sandbox namespace carries ``sandbox_labels``."""

    def __init__(
        self,
        kube_api: KubeAPIServer,
        chart: Any,
        sandbox_labels: dict[str, str] = RESTRICTED,
        extra_values: dict[str, Any] | None = None,
    ) -> None:
        self.release_ns = _unique("rel")
        self.sandbox_ns = _unique("sbx")
        kube_api.create_namespace(self.release_ns)
        kube_api.create_namespace(self.sandbox_ns, sandbox_labels)
        image, _, tag = RUNNER_IMAGE.partition(":")
        values = merge(
            CREDENTIALS,
            {
                "sandbox": {
                    "namespace": {"name": self.sandbox_ns, "create": False},
                    "image": {"repository": image, "tag": tag},
                }
            },
        )
        self.objects = render(chart, merge(values, extra_values or {}), self.release_ns)
        admin = kube_api.api_client()
        dynamic = DynamicClient(admin)
        wanted = {"ServiceAccount", "Role", "RoleBinding"} | POLICY_KINDS
        for obj in self.objects:
            is_executor_key = obj["kind"] == "Secret" and obj["metadata"].get("namespace") == self.sandbox_ns
            if obj["kind"] in wanted or is_executor_key:  # the admin (helm) creates these
                _dry_run_apply(dynamic, copy.deepcopy(obj), dry_run=False)
        [sa] = _controllers(self.objects, "ServiceAccount")
        [secret] = [
            o for o in self.objects if o["kind"] == "Secret" and o["metadata"].get("namespace") == self.sandbox_ns
        ]
        [role] = _controllers(self.objects, "Role")
        [policy] = [o for o in self.objects if o["kind"] == "ValidatingAdmissionPolicy"]
        self.sa_name: str = sa["metadata"]["name"]
        self.secret_name: str = secret["metadata"]["name"]
        self.role_name: str = role["metadata"]["name"]
        self.policy_name: str = policy["metadata"]["name"]
        self.admin = admin
        self.token = kube_api.service_account_token(self.release_ns, self.sa_name)
        self.api = kube_api.api_client(self.token)
        self.core = client.CoreV1Api(self.api)
        self.dynamic = DynamicClient(self.api)
        self._wait_for_the_policy()

    def runner(self, template: SandboxTemplate, namespace: str | None = None) -> KubernetesRunner:
        return KubernetesRunner(KubeApi(self.core), self.pod_settings(namespace), lambda name: template)

    def pod_settings(self, namespace: str | None = None) -> PodSettings:
        return PodSettings(namespace=namespace or self.sandbox_ns, executor_key_secret=self.secret_name)

    def runner_pod(self, template: SandboxTemplate | None = None) -> dict[str, Any]:
        """A pod exactly as the controller builds it (make_pod), for this sandbox namespace."""
        return make_pod(_spec(), 1, template or SandboxTemplate(image=RUNNER_IMAGE), self.pod_settings())

    def create_as_controller(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A dry-run create with the chart's own ServiceAccount token (RBAC and admission run)."""
        return _dry_run_create(self.dynamic, copy.deepcopy(pod))

    def refusal(self, pod: dict[str, Any]) -> str:
        """The API server's message refusing ``pod`` (created with the chart's token); fails if admitted."""
        with pytest.raises(ApiException) as refused:
            self.create_as_controller(pod)
        assert refused.value.status == 403, refused.value.body
        message: str = json.loads(refused.value.body)["message"]
        return message

    def _wait_for_the_policy(self) -> None:
        """A new policy takes effect once the API server has loaded it: retry a known-bad dry
        run until the policy refuses it (bounded)."""
        bad = self.runner_pod()
        bad["spec"]["containers"][0]["image"] = "not-a-runner:latest"
        deadline = time.monotonic() + 60
        while True:
            try:
                self.create_as_controller(bad)
            except ApiException as exc:
                if exc.status == 403 and f"ValidatingAdmissionPolicy '{self.policy_name}'" in (exc.body or ""):
                    return
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"the sandbox pod policy {self.policy_name} took no effect within 60 s")
            time.sleep(0.2)

    def close(self) -> None:
        self.api.close()
        self.admin.close()


@pytest.fixture(scope="module")
def rbac(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Rbac]:
    world = _Rbac(kube_api, chart)
    yield world
    world.close()


@pytest.fixture(scope="module")
def unguarded(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Rbac]:
    """The chart's objects with a sandbox namespace that enforces no Pod Security level: the
    pod policy stands alone (as where sandbox.namespace.create=false and nobody labelled it)."""
    world = _Rbac(kube_api, chart, sandbox_labels={"pod-security.kubernetes.io/enforce": "privileged"})
    # Another Secret in the sandbox namespace that a foreign pod would like to read.
    client.CoreV1Api(world.admin).create_namespaced_secret(
        world.sandbox_ns, client.V1Secret(metadata=client.V1ObjectMeta(name="other-secret"), string_data={"k": "v"})
    )
    yield world
    world.close()


def _controllers(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The controller's own objects of a kind (a component's, e.g. a node agent's, are labelled with it)."""
    return [o for o in objects if o["kind"] == kind and "app.kubernetes.io/component" not in o["metadata"]["labels"]]


def _spec() -> SandboxSpec:
    session = f"sess_{uuid.uuid4().hex}"
    return SandboxSpec(session, f"env_{uuid.uuid4().hex[:12]}", "http://127.0.0.1:1", "/workspace")


def _grants(role: Any) -> set[tuple[str, str, str]]:
    """A Role's rules as (API group, resource, verb) triples."""
    return {
        (group, resource, verb)
        for rule in role.rules
        for group in rule.api_groups
        for resource in rule.resources
        for verb in rule.verbs
    }


def test_the_role_is_exactly_least_privilege(rbac: _Rbac) -> None:
    """L2: the live Role grants exactly pods and PVCs (create/get/list/watch/delete) and events
    (create) in the sandbox namespace: no Secrets, no pods/exec, no resourceNames tricks, and
    nothing binds the ServiceAccount cluster-wide."""
    rbac_api = client.RbacAuthorizationV1Api(rbac.admin)
    role = rbac_api.read_namespaced_role(rbac.role_name, rbac.sandbox_ns)
    assert _grants(role) == EXPECTED_GRANTS
    assert not any(rule.resource_names or rule.non_resource_urls for rule in role.rules)
    bindings = rbac_api.list_namespaced_role_binding(rbac.sandbox_ns).items
    assert [(b.role_ref.kind, b.role_ref.name) for b in bindings] == [("Role", rbac.role_name)]
    subject = (rbac.sa_name, rbac.release_ns)
    assert [(s.name, s.namespace) for s in bindings[0].subjects] == [subject]
    for binding in rbac_api.list_cluster_role_binding().items:
        assert subject not in [(s.name, s.namespace) for s in binding.subjects or []], binding.metadata.name
    # Nothing in the release namespace either: the controller reads its own secrets from files.
    assert rbac_api.list_namespaced_role_binding(rbac.release_ns).items == []


@pytest.mark.parametrize(
    "template",
    [
        SandboxTemplate(image="sandbox-runner:test"),
        SandboxTemplate(image="sandbox-runner:test", persist_workspace=True, workspace_size="1Gi"),
    ],
    ids=["default", "persistent-workspace"],
)
def test_the_controller_does_its_whole_job_with_the_charts_service_account(
    rbac: _Rbac, template: SandboxTemplate
) -> None:
    """L2: with only the chart's ServiceAccount token the runner ensures a sandbox (pod, and
    the workspace PVC when persistence is on), reads its status, finds it, lists what it
    manages, releases it and discards the session's leftovers; every pod it builds is
    admitted under "restricted"; the scheduler's pod watch lists and watches the sandbox pods and
    sees the released pod go. (No kubelet here: pods stay Pending, i.e. STARTING.)"""
    runner = rbac.runner(template)
    spec = _spec()
    watch = PodWatch(KubeApi(rbac.core), rbac.sandbox_ns, timeout_seconds=2)  # the scheduler's: list + watch
    seen: list[str] = []
    watch.start(seen.append)
    try:
        wait_for(watch.live, 30, "the pod watch to list and watch with the chart's token")
        _whole_job(rbac, template, runner, spec)
        wait_for(lambda: spec.session_id in seen, 30, "the watch to see the released pod go")
        assert watch.live() and watch.lists == 1
    finally:
        watch.stop()


def _whole_job(rbac: _Rbac, template: SandboxTemplate, runner: KubernetesRunner, spec: SandboxSpec) -> None:
    handle = runner.ensure(spec, 1)
    assert runner.ensure(spec, 1) == handle  # idempotent (L1)
    assert runner.status(handle) is Health.STARTING
    assert runner.find(spec.session_id) == handle
    assert handle in runner.list_managed()
    pod = rbac.core.read_namespaced_pod(handle.name, rbac.sandbox_ns)
    [key_env] = [e for e in pod.spec.containers[0].env if e.name == "CODEX_API_KEY"]
    assert key_env.value is None and key_env.value_from.secret_key_ref.name == rbac.secret_name
    if template.persist_workspace:
        claim = rbac.core.read_namespaced_persistent_volume_claim(names.pvc_name(spec.session_id), rbac.sandbox_ns)
        assert claim.spec.resources.requests["storage"] == "1Gi"
    runner.release(handle)
    # An unbound pod is deleted at once (no kubelet to wait for).
    assert runner.status(handle) is Health.GONE
    assert runner.find(spec.session_id) is None
    assert handle not in runner.list_managed()
    runner.discard(spec.session_id)
    runner.discard(spec.session_id)  # idempotent
    # The PVC is deleted; the pvc-protection finalizer (no controller here to clear it) may keep
    # it visible as terminating.
    try:
        claim = rbac.core.read_namespaced_persistent_volume_claim(names.pvc_name(spec.session_id), rbac.sandbox_ns)
    except ApiException as exc:
        assert exc.status == 404
    else:
        assert template.persist_workspace and claim.metadata.deletion_timestamp is not None


def test_the_token_cannot_read_secrets(rbac: _Rbac) -> None:
    """L2: the controller's token is refused the executor key: no get, no list of Secrets, in
    the sandbox namespace or its own."""
    for call in (
        lambda: rbac.core.read_namespaced_secret(rbac.secret_name, rbac.sandbox_ns),
        lambda: rbac.core.list_namespaced_secret(rbac.sandbox_ns),
        lambda: rbac.core.list_namespaced_secret(rbac.release_ns),
        lambda: rbac.core.list_secret_for_all_namespaces(),
    ):
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403
        assert "cannot" in (refused.value.body or "")


def test_the_token_cannot_exec_into_sandboxes(rbac: _Rbac) -> None:
    """L2: no ``pods/exec`` (nor attach, port-forward): a real exec request with the token is
    refused by RBAC before any upgrade, and the API server's own access review agrees."""
    runner = rbac.runner(SandboxTemplate(image="sandbox-runner:test"))
    spec = _spec()
    handle = runner.ensure(spec, 1)
    try:
        with pytest.raises(ApiException) as refused:
            rbac.core.connect_post_namespaced_pod_exec(handle.name, rbac.sandbox_ns, command=["id"], stdout=True)
        assert refused.value.status == 403
        assert 'cannot create resource "pods/exec"' in json.loads(refused.value.body)["message"]
    finally:
        runner.release(handle)
    for subresource in ("exec", "attach", "portforward"):
        assert not _can(rbac, "create", "pods", rbac.sandbox_ns, subresource=subresource), subresource


@pytest.mark.parametrize(
    ("verb", "resource", "where"),
    [
        ("get", "secrets", "sandbox"),
        ("list", "secrets", "sandbox"),
        ("watch", "secrets", "sandbox"),
        ("create", "pods", "release"),
        ("list", "pods", "release"),
        ("get", "secrets", "release"),
        ("create", "pods", "other"),
        ("list", "nodes", None),
        ("list", "namespaces", None),
        ("list", "pods", None),
        ("update", "pods", "sandbox"),
        ("patch", "pods", "sandbox"),
        ("create", "serviceaccounts/token", "sandbox"),
        ("create", "rolebindings", "sandbox"),
    ],
)
def test_the_token_is_denied_everything_else(rbac: _Rbac, verb: str, resource: str, where: str | None) -> None:
    """L2: outside "pods/PVCs/events in the sandbox namespace" the token gets nothing: not
    Secrets, not pods elsewhere, nothing cluster-scoped, no way to escalate."""
    namespace = {"sandbox": rbac.sandbox_ns, "release": rbac.release_ns, "other": "default", None: None}[where]
    group = "rbac.authorization.k8s.io" if resource == "rolebindings" else ""
    name, _, sub = resource.partition("/")
    assert not _can(rbac, verb, name, namespace, subresource=sub or None, group=group)


def test_the_token_is_allowed_what_the_role_grants(rbac: _Rbac) -> None:
    """The access reviews are not vacuous: every granted (resource, verb) is allowed."""
    for _, resource, verb in sorted(EXPECTED_GRANTS):
        assert _can(rbac, verb, resource, rbac.sandbox_ns), (verb, resource)


def test_a_missing_permission_is_reported_by_name(rbac: _Rbac) -> None:
    """L2: pointed at a namespace where it has no Role, the runner raises RunnerRejected that
    names the permission to grant (not a retryable error)."""
    runner = rbac.runner(SandboxTemplate(image="sandbox-runner:test"), namespace=rbac.release_ns)
    with pytest.raises(RunnerRejected, match=r"grant the controller's service account 'list' on 'pods'"):
        runner.ensure(_spec(), 1)


def _can(
    rbac: _Rbac,
    verb: str,
    resource: str,
    namespace: str | None,
    *,
    subresource: str | None = None,
    group: str = "",
) -> bool:
    """A SelfSubjectAccessReview made with the controller's own token."""
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource=resource, subresource=subresource, namespace=namespace, group=group
            )
        )
    )
    answer = client.AuthorizationV1Api(rbac.api).create_self_subject_access_review(review)
    return bool(answer.status.allowed)


# -- the sandbox pod policy, proven live ------------------------------------------------------


def _mount_other_secret(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "loot", "secret": {"secretName": "other-secret"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "loot", "mountPath": "/loot", "readOnly": True})


def _env_from_other_secret(pod: dict[str, Any]) -> None:
    ref = {"secretKeyRef": {"name": "other-secret", "key": "k"}}
    pod["spec"]["containers"][0]["env"].append({"name": "LOOT", "valueFrom": ref})


def _env_from_all_of_other_secret(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "other-secret"}}]


def _host_path(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "host", "mountPath": "/host"})


def _foreign_image(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["image"] = "attacker.example.com/miner:latest"


def _host_network(pod: dict[str, Any]) -> None:
    pod["spec"]["hostNetwork"] = True


def _host_pid(pod: dict[str, Any]) -> None:
    pod["spec"]["hostPID"] = True


def _service_account_token(pod: dict[str, Any]) -> None:
    del pod["spec"]["automountServiceAccountToken"]  # the ServiceAccount plugin mounts a token


def _root(pod: dict[str, Any]) -> None:
    for ctx in (pod["spec"]["securityContext"], pod["spec"]["containers"][0]["securityContext"]):
        ctx.update(runAsNonRoot=False, runAsUser=0)


def _privilege_escalation(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


def _capabilities(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["SYS_ADMIN"]}


def _unconfined(pod: dict[str, Any]) -> None:
    pod["spec"]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}


def _init_container(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = [dict(pod["spec"]["containers"][0], name="init")]


def _config_map(pod: dict[str, Any]) -> None:
    pod["spec"]["volumes"].append({"name": "cm", "configMap": {"name": "any-config"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "cm", "mountPath": "/cm", "readOnly": True})


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (_mount_other_secret, "may reference only the executor key Secret"),
        (_env_from_other_secret, "may reference only the executor key Secret"),
        (_env_from_all_of_other_secret, "may reference only the executor key Secret"),
        (_host_path, "mount no hostPath volume"),
        (_foreign_image, "run only the runner images sandbox-runner:test"),
        (_host_network, "no host network, PID or IPC namespace"),
        (_host_pid, "no host network, PID or IPC namespace"),
        (_service_account_token, "automountServiceAccountToken: false"),
        (_root, "run as non-root"),
        (_privilege_escalation, "without privilege escalation"),
        (_capabilities, "capabilities drop ALL"),
        (_unconfined, "seccomp RuntimeDefault or Localhost"),
        (_init_container, "no init containers"),
        (_config_map, "mount only emptyDir, persistentVolumeClaim, executor key, CA bundle"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_a_foreign_pod_shape_is_refused_by_the_charts_admission_policy(
    unguarded: _Rbac, change: Callable[[dict[str, Any]], None], refusal: str
) -> None:
    """L2: with the chart's own ServiceAccount token (which RBAC lets create pods there), a pod
    in the sandbox namespace that differs from the runner's shape in one way is refused by the
    chart's ValidatingAdmissionPolicy, not by RBAC and not by Pod Security (this namespace
    enforces none): another Secret, a hostPath, a foreign image, a host namespace, a
    service-account token, root, privilege escalation, capabilities, unconfined seccomp, a
    ConfigMap volume (none is named by sandbox.caBundle here)."""
    pod = unguarded.runner_pod()
    unguarded.create_as_controller(pod)  # the unchanged pod is admitted: only the change differs
    change(pod)
    message = unguarded.refusal(pod)
    assert f"ValidatingAdmissionPolicy '{unguarded.policy_name}'" in message
    assert "denied request" in message and refusal in message, message
    assert "PodSecurity" not in message and "cannot" not in message


@pytest.mark.parametrize(
    "template",
    [
        SandboxTemplate(image=RUNNER_IMAGE),
        SandboxTemplate(image=RUNNER_IMAGE, persist_workspace=True, workspace_size="1Gi", storage_class_name="fast"),
        SandboxTemplate(
            image=RUNNER_IMAGE,
            image_pull_policy="IfNotPresent",
            node_selector={"kubernetes.io/os": "linux"},
            tolerations=({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},),
            image_pull_secrets=("regcred",),
            active_deadline_seconds=3600,
        ),
        SandboxTemplate(image=RUNNER_IMAGE, runtime_class_name="gvisor"),
        # Codex's own sandbox within "restricted": the chart's Localhost seccomp profile.
        SandboxTemplate(image=RUNNER_IMAGE, seccomp_profile="sandbox-controller/codex-sandbox.json"),
    ],
    ids=["default", "persistent-workspace", "scheduling", "runtime-class", "codex-seccomp-profile"],
)
def test_every_pod_the_controller_makes_is_admitted_by_the_policy(
    unguarded: _Rbac, rbac: _Rbac, template: SandboxTemplate
) -> None:
    """L2: every template option of make_pod passes the chart's policy, with the chart's token,
    both where Pod Security enforces nothing and where it enforces "restricted"."""
    if template.runtime_class_name:
        _ensure_runtime_class(unguarded.admin, template.runtime_class_name)
    for world in (unguarded, rbac):
        created = world.create_as_controller(world.runner_pod(template))
        assert created["metadata"]["uid"]


def test_the_runner_reports_a_refused_pod_as_rejected(unguarded: _Rbac) -> None:
    """A template whose image the chart does not allow: the runner's real create is refused by
    the policy and reported as RunnerRejected (not retried), with the policy's reason."""
    runner = unguarded.runner(SandboxTemplate(image="registry.example.com/other:1"))
    with pytest.raises(RunnerRejected, match=r"admission refused.*run only the runner images"):
        runner.ensure(_spec(), 1)


def test_the_codex_sandbox_opt_in_is_refused_unless_allowed(unguarded: _Rbac) -> None:
    """L2: Codex's own sandbox (seccomp Unconfined, unmasked /proc) is outside the restricted
    shape: the policy refuses it unless sandbox.podPolicy.allowCodexSandbox (off by default)."""
    message = unguarded.refusal(unguarded.runner_pod(SandboxTemplate(image=RUNNER_IMAGE, codex_sandbox=True)))
    assert "seccomp RuntimeDefault or Localhost" in message


def test_the_codex_sandbox_opt_in_is_admitted_when_allowed(kube_api: KubeAPIServer, chart: Any) -> None:
    """With sandbox.podPolicy.allowCodexSandbox the opt-in shape (seccomp Unconfined, unmasked
    /proc) is admitted, and only inside a user namespace (hostUsers: false)."""
    privileged = {"pod-security.kubernetes.io/enforce": "privileged"}
    world = _Rbac(kube_api, chart, privileged, {"sandbox": {"podPolicy": {"allowCodexSandbox": True}}})
    try:
        pod = world.runner_pod(SandboxTemplate(image=RUNNER_IMAGE, codex_sandbox=True))
        assert pod["spec"]["hostUsers"] is False
        assert world.create_as_controller(pod)["metadata"]["uid"]
        # Unconfined seccomp outside a user namespace (the API server itself refuses Unmasked there).
        pod["spec"]["hostUsers"] = True
        del pod["spec"]["containers"][0]["securityContext"]["procMount"]
        assert "seccomp RuntimeDefault or Localhost" in world.refusal(pod)
    finally:
        world.close()


def test_the_policy_binds_only_the_sandbox_namespace(unguarded: _Rbac) -> None:
    """The policy checks the sandbox namespace only: the same foreign pod, created by the admin
    in the release namespace, is not its business (dry run)."""
    pod = unguarded.runner_pod()
    _foreign_image(pod)
    pod["metadata"]["namespace"] = unguarded.release_ns
    created = _dry_run_create(DynamicClient(unguarded.admin), pod)
    assert created["metadata"]["namespace"] == unguarded.release_ns


# -- every way to add or change a sandbox pod's containers -----------------------------------------

# Pod subresources that take an update or patch yet change no container: the API server keeps
# the spec of a pods/status write (its status strategy copies the old spec), and pods/proxy
# passes HTTP methods on to the pod's port (admission sees a CONNECT; no pod object is written).
CHANGES_NO_CONTAINER = {"pods/status", "pods/proxy"}


def test_the_policy_sees_every_pod_subresource_that_can_change_containers(unguarded: _Rbac) -> None:
    """L2: the API server's own discovery lists the pod subresources it serves; every one that
    can be written with update or patch (and so change the pod) is matched by the chart's
    policy, except pods/status and pods/proxy, which cannot change a container. The others are
    create-only, connect-only or read-only (binding, eviction, exec, attach, portforward, log)."""
    resources = client.CoreV1Api(unguarded.admin).get_api_resources().resources
    writable = {r.name for r in resources if r.name.startswith("pods/") and {"update", "patch"} & set(r.verbs or [])}
    assert "pods/ephemeralcontainers" in writable and "pods/resize" in writable  # what the server serves
    policy = client.AdmissionregistrationV1Api(unguarded.admin).read_validating_admission_policy(unguarded.policy_name)
    [rule] = policy.spec.match_constraints.resource_rules
    assert set(rule.operations) == {"CREATE", "UPDATE"}
    assert writable - CHANGES_NO_CONTAINER <= set(rule.resources), writable - set(rule.resources)
    others = {r.name for r in resources if r.name.startswith("pods/")} - writable
    for name in others:  # nothing else can write a pod
        verbs = set(next(r for r in resources if r.name == name).verbs or [])
        assert verbs <= {"create", "get", "list"}, (name, verbs)


def _restricted_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _ephemeral(**changes: Any) -> dict[str, Any]:
    container = {"name": "debug", "image": RUNNER_IMAGE, "securityContext": _restricted_context()}
    container.update(changes)
    return container


@pytest.fixture(scope="module")
def sandbox_pod(unguarded: _Rbac) -> Iterator[str]:
    """A runner pod that exists (created by the admin, admitted by the policy), to add to."""
    pod = unguarded.runner_pod()
    created = client.CoreV1Api(unguarded.admin).create_namespaced_pod(unguarded.sandbox_ns, pod)
    yield created.metadata.name
    client.CoreV1Api(unguarded.admin).delete_namespaced_pod(created.metadata.name, unguarded.sandbox_ns)


def _add_ephemeral(world: _Rbac, pod_name: str, container: dict[str, Any]) -> Any:
    """Add an ephemeral container as the cluster admin (dry run: the pod is left as it was)."""
    return client.CoreV1Api(world.admin).patch_namespaced_pod_ephemeralcontainers(
        pod_name, world.sandbox_ns, {"spec": {"ephemeralContainers": [container]}}, dry_run="All"
    )


@pytest.mark.parametrize(
    ("container", "refusal"),
    [
        (_ephemeral(image="attacker.example.com/miner:latest"), "run only the runner images"),
        (
            _ephemeral(env=[{"name": "LOOT", "valueFrom": {"secretKeyRef": {"name": "other-secret", "key": "k"}}}]),
            "may reference only the executor key Secret",
        ),
        (_ephemeral(envFrom=[{"secretRef": {"name": "other-secret"}}]), "may reference only the executor key Secret"),
        (_ephemeral(securityContext={**_restricted_context(), "runAsNonRoot": False, "runAsUser": 0}), "non-root"),
        (_ephemeral(securityContext={**_restricted_context(), "allowPrivilegeEscalation": True}), "escalation"),
        (
            _ephemeral(
                securityContext={**_restricted_context(), "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}}
            ),
            "capabilities drop ALL",
        ),
        (
            _ephemeral(securityContext={**_restricted_context(), "seccompProfile": {"type": "Unconfined"}}),
            "seccomp RuntimeDefault or Localhost",
        ),
        (_ephemeral(targetContainerName="executor"), "may not target a container"),
    ],
    ids=["foreign-image", "secret-env", "secret-env-from", "root", "escalation", "capability", "seccomp", "target"],
)
def test_an_ephemeral_container_of_a_foreign_shape_is_refused(
    unguarded: _Rbac, sandbox_pod: str, container: dict[str, Any], refusal: str
) -> None:
    """L2: ``pods/ephemeralcontainers`` adds containers to a running sandbox pod; the policy holds
    each to the rules of the pod's own containers (allowed image, only the executor key Secret,
    the restricted security context) and refuses one that targets the sandbox container's
    processes, whoever asks (here the cluster admin; the controller's Role cannot at all)."""
    with pytest.raises(ApiException) as refused:
        _add_ephemeral(unguarded, sandbox_pod, container)
    assert refused.value.status == 403, refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert f"ValidatingAdmissionPolicy '{unguarded.policy_name}'" in message and refusal in message, message


def test_an_ephemeral_container_of_the_runners_shape_is_admitted(unguarded: _Rbac, sandbox_pod: str) -> None:
    """The refusals above are the policy's, not the API server's: the same request with an
    allowed image and the restricted context is admitted (dry run)."""
    patched = _add_ephemeral(unguarded, sandbox_pod, _ephemeral())
    assert [c.name for c in patched.spec.ephemeral_containers] == ["debug"]


def test_changing_a_sandbox_pods_image_is_refused(unguarded: _Rbac, sandbox_pod: str) -> None:
    """L2: a container's image is mutable on a live pod (pods UPDATE/PATCH): a foreign one is
    refused as on creation."""
    core = client.CoreV1Api(unguarded.admin)
    container = core.read_namespaced_pod(sandbox_pod, unguarded.sandbox_ns).spec.containers[0].name
    patch = {"spec": {"containers": [{"name": container, "image": "attacker.example.com/miner:latest"}]}}
    with pytest.raises(ApiException) as refused:
        core.patch_namespaced_pod(sandbox_pod, unguarded.sandbox_ns, patch, dry_run="All")
    assert refused.value.status == 403 and "run only the runner images" in (refused.value.body or "")


@pytest.mark.parametrize("subresource", ["ephemeralcontainers", "resize"])
def test_the_token_cannot_change_a_sandbox_pods_containers_through_a_subresource(rbac: _Rbac, subresource: str) -> None:
    """L2: the controller's Role grants no pods subresource: neither update nor patch of
    ephemeral containers or of resources (the policy is the second line, for everyone else)."""
    for verb in ("update", "patch"):
        assert not _can(rbac, verb, "pods", rbac.sandbox_ns, subresource=subresource), (verb, subresource)


def _ensure_runtime_class(admin: client.ApiClient, name: str) -> None:
    try:
        client.NodeV1Api(admin).create_runtime_class(
            client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=name), handler="runsc")
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


# -- helm install with Helm's own library --------------------------------------------------------


def test_helm_installs_and_uninstalls_the_chart(kube_api: KubeAPIServer, admin: client.ApiClient, chart: Any) -> None:
    """`helm install` (Helm 4's library, server-side apply) creates every object on the 1.37 API
    server (the sandbox pod policy included); `helm upgrade` keeps the bundled Redis's
    generated password; `helm uninstall` removes them again. No kubelet: nothing waits for pods."""
    helm = _helm()
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns)
    with helm.Config(
        kube_apiserver=kube_api.server_url,
        kube_token=kube_api.admin_token,
        kube_ca_file=kube_api.ca_file,
        namespace=release_ns,
    ) as cfg:
        release = cfg.install(chart, RELEASE, CREDENTIALS, namespace=release_ns, timeout=120)
        assert release["status"] == "deployed", release
        sandbox_ns = f"{release_ns}-sandboxes"
        core = client.CoreV1Api(admin)
        assert core.read_namespace(sandbox_ns).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
        apps = client.AppsV1Api(admin)
        deployments = {d.metadata.name for d in apps.list_namespaced_deployment(release_ns).items}
        assert deployments == {f"{RELEASE}-sandbox-controller-{c}" for c in ("receiver", "worker", "scheduler")}
        secret = core.read_namespaced_secret(f"{RELEASE}-sandbox-controller-executor-key", sandbox_ns)
        assert base64.b64decode(secret.data["executor-key"]).decode() == EXECUTOR_KEY
        policies = client.AdmissionregistrationV1Api(admin)
        policy = f"{RELEASE}-sandbox-controller-{release_ns}-sandbox-pods"
        assert policies.read_validating_admission_policy(policy).spec.failure_policy == "Fail"
        assert policies.read_validating_admission_policy_binding(policy).spec.policy_name == policy
        # The bundled Redis's generated password survives an upgrade (lookup finds its Secret).
        password = _redis_auth(core, release_ns)
        upgraded = cfg.upgrade(chart, RELEASE, merge(CREDENTIALS, {"logLevel": "DEBUG"}), namespace=release_ns)
        assert upgraded["status"] == "deployed" and upgraded["revision"] == 2, upgraded
        assert _redis_auth(core, release_ns) == password
        assert cfg.uninstall(RELEASE, timeout=120)["release"]["status"] == "uninstalled"
        assert apps.list_namespaced_deployment(release_ns).items == []
        assert core.list_namespaced_secret(sandbox_ns).items == []
        assert policy not in {p.metadata.name for p in policies.list_validating_admission_policy().items}


def _redis_auth(core: client.CoreV1Api, release_ns: str) -> str:
    """The bundled Redis's password, checked against the controller's URL in the same Secret."""
    secret = core.read_namespaced_secret(f"{RELEASE}-sandbox-controller-redis-auth", release_ns)
    password = base64.b64decode(secret.data["redis-password"]).decode()
    url = base64.b64decode(secret.data["redis-url"]).decode()
    assert len(password) == 32 and password.isalnum()
    assert url == f"redis://:{password}@{RELEASE}-sandbox-controller-redis.{release_ns}.svc:6379/0"
    return password


# -- warm pools ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pooled(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Rbac]:
    """The chart with a template that keeps a warm pool (its sandbox namespace enforces "restricted")."""
    world = _Rbac(kube_api, chart, extra_values={"sandbox": {"templates": {"fast": {"warmPool": {"size": 1}}}}})
    yield world
    world.close()


def test_with_a_warm_pool_the_role_adds_only_patch_on_pods_and_create_and_get_on_leases(pooled: _Rbac) -> None:
    """L2: a template with a warm pool adds exactly three grants: patch on pods (the claim), and
    create and get on leases (the placement record)."""
    role = client.RbacAuthorizationV1Api(pooled.admin).read_namespaced_role(pooled.role_name, pooled.sandbox_ns)
    warm = {
        ("", "pods", "patch"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get"),
    }
    assert _grants(role) == EXPECTED_GRANTS | warm


def test_a_warm_pod_and_its_claim_are_admitted_and_the_downward_volume_is_narrow(pooled: _Rbac) -> None:
    """L2, L1: with the chart's token, a warm pod (make_warm_pod) is admitted by Pod Security
    "restricted" and the chart's pod policy; its claim (a patch, an UPDATE the policy checks
    too) succeeds once and only once; a downward-API volume reaching beyond the pod's
    annotations is refused."""
    template = SandboxTemplate(name="fast", image=RUNNER_IMAGE, warm_pool_size=1)
    runner = KubernetesRunner(KubeApi(pooled.core), pooled.pod_settings(), lambda name: template, [template])
    runner.tend_pools()
    [warm] = pooled.core.list_namespaced_pod(pooled.sandbox_ns, label_selector=names.pool_selector("fast")).items
    assert warm.spec.automount_service_account_token is False
    spec = _spec()
    handle = runner.ensure(spec, 1)
    assert handle.name == warm.metadata.name and handle.environment_id == spec.environment_id
    with pytest.raises(ApiException) as again:  # a second claim of the same pod fails its test
        pooled.core.patch_namespaced_pod(warm.metadata.name, pooled.sandbox_ns, claim_patch(_spec(), 1, time.time()))
    assert again.value.status in (409, 422), again.value.body
    assert runner.find(spec.session_id) == handle

    wide = make_warm_pod(template, pooled.pod_settings())
    [binding] = [v for v in wide["spec"]["volumes"] if v["name"] == "binding"]
    binding["downwardAPI"]["items"].append({"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}})
    message = pooled.refusal(wide)
    assert "downward-API annotation volumes" in message, message
    client.CoreV1Api(pooled.admin).delete_collection_namespaced_pod(pooled.sandbox_ns)


@pytest.fixture(scope="module")
def with_ca_bundle(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Rbac]:
    """The chart with sandbox.caBundle set, its sandbox namespace enforcing no Pod Security level
    (the pod policy stands alone)."""
    pem = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"
    world = _Rbac(
        kube_api,
        chart,
        sandbox_labels={"pod-security.kubernetes.io/enforce": "privileged"},
        extra_values={"sandbox": {"caBundle": {"pem": pem}}},
    )
    yield world
    world.close()


def test_the_ca_bundle_volume_and_no_other_config_map_is_admitted(with_ca_bundle: _Rbac) -> None:
    """L2: with sandbox.caBundle set, the pods the controller makes (cold and warm) mount its
    ConfigMap and are admitted with the chart's token; a pod mounting another ConfigMap is not."""
    [bundle] = [o for o in with_ca_bundle.objects if o["metadata"]["name"].endswith("-ca-bundle")]
    settings = PodSettings(
        namespace=with_ca_bundle.sandbox_ns,
        executor_key_secret=with_ca_bundle.secret_name,
        ca_bundle_configmap=bundle["metadata"]["name"],
    )
    template = SandboxTemplate(image=RUNNER_IMAGE)
    cold = make_pod(_spec(), 1, template, settings)
    warm = make_warm_pod(SandboxTemplate(name="fast", image=RUNNER_IMAGE, warm_pool_size=1), settings)
    for admitted in (cold, warm):
        assert {"name": "ca-bundle", "mountPath": "/etc/sandbox-ca", "readOnly": True} in admitted["spec"][
            "containers"
        ][0]["volumeMounts"]
        assert with_ca_bundle.create_as_controller(admitted)["metadata"]["uid"]
    other = copy.deepcopy(cold)
    [volume] = [v for v in other["spec"]["volumes"] if v["name"] == "ca-bundle"]
    volume["configMap"]["name"] = "any-config"
    assert "CA bundle (sandbox.caBundle)" in with_ca_bundle.refusal(other)


# -- suspend with memory (sandbox.checkpoints, issue 40) -------------------------------------------
# The node agent's objects pass a strict server-side dry run and its pod needs a privileged
# release namespace; its token and the worker's are allowed exactly what the protocol needs
# (runners/kubernetes/checkpoints.py); and the sandbox pod policy's CEL, run by the API server,
# admits a checkpoint image only in its own session's pod (the claim its `workspace` volume
# names), only with imagePullPolicy Never, and only when the agent is on.

PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}
AGENT = "checkpoint-agent"
CHECKPOINT_VALUES = {"sandbox": CHECKPOINTS["sandbox"]}  # the credentials come from _Rbac
PERSISTENT = SandboxTemplate(image=RUNNER_IMAGE, persist_workspace=True, workspace_size="1Gi")


class _Resumable(_Rbac):
    """The chart with the node agent and a template that checkpoints, created as `helm install`
    would (the agent's ClusterRole and its binding too), with a client for the agent's token."""

    def __init__(self, kube_api: KubeAPIServer, chart: Any, sandbox_labels: dict[str, str]) -> None:
        super().__init__(kube_api, chart, sandbox_labels, CHECKPOINT_VALUES)
        dynamic = DynamicClient(self.admin)
        for obj in self.objects:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                _dry_run_apply(dynamic, copy.deepcopy(obj), dry_run=False)
        [agent] = [o for o in self.objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith(AGENT)]
        self.agent_sa: str = agent["metadata"]["name"]
        self.agent_api = kube_api.api_client(kube_api.service_account_token(self.release_ns, self.agent_sa))

    def restored_pod(self, claim: str | None = None) -> dict[str, Any]:
        """A session's pod restored from its checkpoint, as the runner makes it: the persistent
        template's pod (its workspace ``claim``, default a new session's), its image the
        checkpoint image of that claim never pulled, bound to the node that holds the image."""
        pod = make_pod(_spec(), 2, PERSISTENT, self.pod_settings())
        [workspace] = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
        if claim is not None:
            workspace["persistentVolumeClaim"]["claimName"] = claim
        image = checkpoints.image_ref(
            pod["metadata"]["namespace"], workspace["persistentVolumeClaim"]["claimName"], "0b6021622c1f-4e7a"
        )
        pod["metadata"]["annotations"][checkpoints.RESTORED_FROM] = image
        pod["spec"]["nodeName"] = "node-a"
        [container] = pod["spec"]["containers"]
        container["image"] = image
        container["imagePullPolicy"] = "Never"
        return pod

    def close(self) -> None:
        self.agent_api.close()
        super().close()


@pytest.fixture(scope="module")
def resumable(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Resumable]:
    """Its sandbox namespace enforces no Pod Security level: the pod policy stands alone."""
    world = _Resumable(kube_api, chart, PRIVILEGED)
    yield world
    world.close()


@pytest.fixture(scope="module")
def resumable_restricted(kube_api: KubeAPIServer, chart: Any) -> Iterator[_Resumable]:
    world = _Resumable(kube_api, chart, RESTRICTED)
    yield world
    world.close()


def _agent_can(
    world: _Resumable, verb: str, resource: str, namespace: str | None, subresource: str | None = None, name: str = ""
) -> bool:
    """A SelfSubjectAccessReview made with the agent's own token."""
    attributes = client.V1ResourceAttributes(
        verb=verb, resource=resource, subresource=subresource, namespace=namespace, name=name or None
    )
    review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes))
    return bool(client.AuthorizationV1Api(world.agent_api).create_self_subject_access_review(review).status.allowed)


# -- the agent's objects ------------------------------------------------------------------------


def test_the_agents_objects_pass_a_strict_server_side_dry_run(
    kube_api: KubeAPIServer,
    admin: client.ApiClient,
    chart: Any,
) -> None:
    """The DaemonSet (its hostPath types, host network, fieldRefs), its ServiceAccount, Role,
    RoleBinding, ClusterRole and ClusterRoleBinding are valid against the 1.37 schemas with
    fieldValidation=Strict, and nothing is stored."""
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns, PRIVILEGED)
    objects = render(chart, CHECKPOINTS, release_ns)
    dynamic = DynamicClient(admin)
    [namespace] = [o for o in objects if o["kind"] == "Namespace"]
    _dry_run_apply(dynamic, namespace, dry_run=False)
    # Its default ServiceAccount, as the controller-manager (absent here) makes it: the
    # network-policy `helm test` pod runs there under it.
    client.CoreV1Api(admin).create_namespaced_service_account(
        namespace["metadata"]["name"], {"metadata": {"name": "default"}}
    )
    agents = [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == AGENT]
    kinds = sorted(o["kind"] for o in agents)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding", "ServiceAccount"]
    for obj in objects:
        if obj["kind"] == "Namespace":
            continue
        applied = _dry_run_apply(dynamic, copy.deepcopy(obj))
        assert applied["metadata"]["name"] == obj["metadata"]["name"]
        assert _dry_run_create(dynamic, copy.deepcopy(obj))["metadata"]["uid"]


def _agent_pod(objects: list[dict[str, Any]], namespace: str) -> dict[str, Any]:
    [daemon] = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith(AGENT)]
    template = copy.deepcopy(daemon["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": daemon["metadata"]["name"], "namespace": namespace, **template["metadata"]},
        "spec": template["spec"],
    }


@pytest.mark.parametrize(
    ("level", "admitted"), [("restricted", False), ("baseline", False), ("privileged", True)], ids=str
)
def test_the_agents_pod_needs_a_privileged_release_namespace(
    kube_api: KubeAPIServer,
    admin: client.ApiClient,
    chart: Any,
    level: str,
    admitted: bool,
) -> None:
    """What docs/kubernetes.md and NOTES say: the agent's pod (host network, host paths, root)
    is refused by Pod Security "restricted" and "baseline" enforcement and admitted where the
    release namespace is "privileged" (PodSecurity only warns on the DaemonSet itself, so its
    template is dry-run as a bare Pod)."""
    release_ns = _unique("rel")
    kube_api.create_namespace(release_ns, {"pod-security.kubernetes.io/enforce": level})
    objects = render(chart, CHECKPOINTS, release_ns)
    core = client.CoreV1Api(admin)
    [sa] = [o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith(AGENT)]
    core.create_namespaced_service_account(release_ns, sa)
    pod = _agent_pod(objects, release_ns)
    if admitted:
        assert _dry_run_create(DynamicClient(admin), pod)["spec"]["hostNetwork"] is True
        return
    with pytest.raises(ApiException) as refused:
        _dry_run_create(DynamicClient(admin), pod)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert f'violates PodSecurity "{level}:latest"' in message and "host namespaces" in message, message


# -- RBAC, live -----------------------------------------------------------------------------------


def test_the_agents_token_may_checkpoint_nodes_and_answer_on_sandbox_pods_only(resumable: _Resumable) -> None:
    """L2: with its own token the agent may create ``nodes/checkpoint`` (what the kubelet asks
    the API server about a POST /checkpoint, for any node: names are not known ahead), list and
    patch pods and list PVCs in the sandbox namespace, and nothing else: no Secrets, no pod
    creation or deletion, no claims written, nothing in its own namespace, no other node
    subresource."""
    sandbox = resumable.sandbox_ns
    for verb in ("list", "patch"):
        assert _agent_can(resumable, verb, "pods", sandbox), verb
    assert _agent_can(resumable, "list", "persistentvolumeclaims", sandbox)
    assert _agent_can(resumable, "create", "nodes", None, "checkpoint", name="node-a")
    for verb, resource, namespace, sub in (
        ("get", "secrets", sandbox, None),
        ("list", "secrets", sandbox, None),
        ("get", "pods", sandbox, None),
        ("watch", "pods", sandbox, None),
        ("get", "persistentvolumeclaims", sandbox, None),
        ("create", "pods", sandbox, None),
        ("delete", "pods", sandbox, None),
        ("update", "pods", sandbox, None),
        ("create", "pods", sandbox, "exec"),
        ("patch", "pods", sandbox, "ephemeralcontainers"),
        ("patch", "persistentvolumeclaims", sandbox, None),
        ("delete", "persistentvolumeclaims", sandbox, None),
        ("list", "pods", resumable.release_ns, None),
        ("list", "pods", None, None),
        ("get", "nodes", None, None),
        ("patch", "nodes", None, None),
        ("create", "nodes", None, "proxy"),
        ("get", "nodes", None, "checkpoint"),
    ):
        assert not _agent_can(resumable, verb, resource, namespace, sub), (verb, resource, namespace, sub)


def test_with_a_template_that_checkpoints_the_worker_may_patch_pods_and_claims(resumable: _Resumable) -> None:
    """L2: the worker's live Role is the usual one plus exactly patch on pods (the request) and
    on PVCs (the record); nothing binds its ServiceAccount cluster-wide (the ClusterRole is the
    agent's)."""
    rbac_api = client.RbacAuthorizationV1Api(resumable.admin)
    role = rbac_api.read_namespaced_role(resumable.role_name, resumable.sandbox_ns)
    assert _grants(role) == EXPECTED_GRANTS | {("", "pods", "patch"), ("", "persistentvolumeclaims", "patch")}
    subject = (resumable.sa_name, resumable.release_ns)
    for binding in rbac_api.list_cluster_role_binding().items:
        assert subject not in [(s.name, s.namespace) for s in binding.subjects or []], binding.metadata.name


def test_the_request_the_answer_and_the_record_are_written_with_the_charts_tokens(resumable: _Resumable) -> None:
    """The protocol's writes, for real, each with the token that makes it: the worker's request
    on a running pod and its record on the claim, the agent's answer on the pod (pod updates
    that the sandbox pod policy checks and admits); then the restored pod, created by the
    worker, and a request on it."""
    worker = client.CoreV1Api(resumable.api)
    agent = client.CoreV1Api(resumable.agent_api)
    ns = resumable.sandbox_ns
    pod = worker.create_namespaced_pod(ns, make_pod(_spec(), 1, PERSISTENT, resumable.pod_settings()))
    name, uid = pod.metadata.name, pod.metadata.uid
    claim = next(v for v in pod.spec.volumes if v.name == "workspace").persistent_volume_claim.claim_name
    worker.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    try:
        image = checkpoints.image_ref(ns, claim, uid)
        worker.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {checkpoints.CHECKPOINT_REQUEST: "n1"}}})
        answer = checkpoints.Answer(request="n1", image=image, size_bytes=5_400_000, seconds=2.1).encode()
        agent.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {checkpoints.CHECKPOINT_ANSWER: answer}}})
        [listed] = agent.list_namespaced_pod(ns, field_selector=f"metadata.name={name}").items
        annotations = listed.metadata.annotations
        assert (found := checkpoints.answer_of(annotations, "n1")) is not None and found.ok and found.image == image
        record = checkpoints.Record(
            image=image, node="node-a", environment_id="env_1", suspended_at=2.0, lineage_started_at=1.0
        )
        body = {"metadata": {"annotations": {checkpoints.CHECKPOINT_RECORD: record.encode()}}}
        worker.patch_namespaced_persistent_volume_claim(claim, ns, body)
        [listed_claim] = agent.list_namespaced_persistent_volume_claim(
            ns, field_selector=f"metadata.name={claim}"
        ).items
        assert listed_claim.metadata.annotations[checkpoints.CHECKPOINT_RECORD] == record.encode()
        with pytest.raises(ApiException) as refused:  # the agent only reads the records
            agent.patch_namespaced_persistent_volume_claim(claim, ns, body)
        assert refused.value.status == 403
        worker.delete_namespaced_pod(name, ns)

        created = worker.create_namespaced_pod(ns, resumable.restored_pod(claim))
        assert created.spec.node_name == "node-a" and checkpoints.image_claim(created.spec.containers[0].image) == claim
        again = {"metadata": {"annotations": {checkpoints.CHECKPOINT_REQUEST: "n2"}}}
        worker.patch_namespaced_pod(created.metadata.name, ns, again)
        worker.delete_namespaced_pod(created.metadata.name, ns)
    finally:
        worker.delete_namespaced_persistent_volume_claim(claim, ns)


# -- the sandbox pod policy, its CEL run by the API server -------------------------------------------


def test_a_pod_restored_from_its_own_sessions_checkpoint_is_admitted(
    resumable: _Resumable, resumable_restricted: _Resumable
) -> None:
    """L2: the pod the runner restores (its image the checkpoint image of the claim it mounts,
    ``imagePullPolicy: Never``, ``nodeName`` set) is admitted with the worker's token, where
    the policy stands alone and where Pod Security "restricted" is enforced too."""
    for world in (resumable, resumable_restricted):
        pod = world.restored_pod()
        created = world.create_as_controller(pod)
        assert created["spec"]["nodeName"] == "node-a"
        assert created["spec"]["containers"][0]["image"].startswith(f"{checkpoints.IMAGE_REPOSITORY}/")


def _other_sessions_image(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["image"] = checkpoints.image_ref(
        pod["metadata"]["namespace"], names.pvc_name("sess_other"), "0b6021622c1f"
    )


def _another_namespaces_image(pod: dict[str, Any]) -> None:
    """The image of the same claim name, of another sandbox namespace (another release's)."""
    [workspace] = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
    claim = workspace["persistentVolumeClaim"]["claimName"]
    pod["spec"]["containers"][0]["image"] = checkpoints.image_ref("other-sandboxes", claim, "0b6021622c1f")


def _pulled_always(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"


def _pulled_if_not_present(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"


def _no_claim(pod: dict[str, Any]) -> None:
    """The same image in a pod whose workspace is an emptyDir (no claim, so no session's image)."""
    pod["spec"]["volumes"] = [
        {"name": "workspace", "emptyDir": {}} if v["name"] == "workspace" else v for v in pod["spec"]["volumes"]
    ]


def _claim_in_another_volume(pod: dict[str, Any]) -> None:
    """The image's claim mounted, but not as the workspace: the workspace is another claim."""
    image_claim = checkpoints.image_claim(pod["spec"]["containers"][0]["image"])
    pod["spec"]["volumes"] = [
        {"name": "workspace", "persistentVolumeClaim": {"claimName": names.pvc_name("sess_other")}}
        if v["name"] == "workspace"
        else v
        for v in pod["spec"]["volumes"]
    ] + [{"name": "extra", "persistentVolumeClaim": {"claimName": image_claim}}]


def _a_longer_repository(pod: dict[str, Any]) -> None:
    """The own claim as a prefix of another repository's name."""
    container = pod["spec"]["containers"][0]
    repository, _, tag = container["image"].partition(":")
    container["image"] = f"{repository}-x:{tag}"


def _a_digest(pod: dict[str, Any]) -> None:
    container = pod["spec"]["containers"][0]
    container["image"] = container["image"].split(":")[0] + "@sha256:" + "0" * 64


def _a_foreign_registry(pod: dict[str, Any]) -> None:
    """The checkpoint repository's path under another host: not a node-local checkpoint image."""
    container = pod["spec"]["containers"][0]
    container["image"] = "registry.example.com/" + container["image"]


@pytest.mark.parametrize(
    "change",
    [
        _other_sessions_image,
        _another_namespaces_image,
        _pulled_always,
        _pulled_if_not_present,
        _no_claim,
        _claim_in_another_volume,
        _a_longer_repository,
        _a_digest,
        _a_foreign_registry,
    ],
    ids=lambda change: change.__name__.strip("_"),
)
def test_a_checkpoint_image_is_refused_anywhere_but_in_its_own_sessions_pod(
    resumable: _Resumable, change: Callable[[dict[str, Any]], None]
) -> None:
    """L2: a checkpoint image holds a session's memory (its environment key among it): the
    policy refuses, with the worker's token, another session's checkpoint image (or another
    sandbox namespace's of the same claim name), one that could
    be pulled (Always, IfNotPresent), one in a pod without a workspace claim or whose workspace
    is another claim (the image's claim mounted elsewhere), and names that only resemble the
    format (a longer repository, a digest, another registry)."""
    pod = resumable.restored_pod()
    resumable.create_as_controller(pod)  # the unchanged pod is admitted: only the change differs
    change(pod)
    message = resumable.refusal(pod)
    assert f"ValidatingAdmissionPolicy '{resumable.policy_name}'" in message, message
    assert "run only the runner images" in message and "checkpoint image of the workspace claim" in message


def test_without_the_agent_no_checkpoint_image_is_admitted(unguarded: _Rbac) -> None:
    """L2: with sandbox.checkpoints off (the default), even a pod's own checkpoint image is refused."""
    pod = make_pod(_spec(), 2, PERSISTENT, unguarded.pod_settings())
    [workspace] = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
    pod["spec"]["containers"][0]["image"] = checkpoints.image_ref(
        pod["metadata"]["namespace"], workspace["persistentVolumeClaim"]["claimName"], "1"
    )
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    message = unguarded.refusal(pod)
    assert "run only the runner images" in message and "checkpoint" not in message, message


def test_an_ephemeral_container_may_not_run_the_pods_checkpoint_image(resumable: _Resumable) -> None:
    """L2: only the pod's own container is restored: an ephemeral container (``kubectl debug``)
    naming the session's checkpoint image, even as the cluster admin, is refused."""
    core = client.CoreV1Api(resumable.admin)
    pod = core.create_namespaced_pod(resumable.sandbox_ns, resumable.restored_pod())
    try:
        image = pod.spec.containers[0].image
        debug = {
            "name": "debug",
            "image": image,
            "imagePullPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        with pytest.raises(ApiException) as refused:
            core.patch_namespaced_pod_ephemeralcontainers(
                pod.metadata.name, resumable.sandbox_ns, {"spec": {"ephemeralContainers": [debug]}}, dry_run="All"
            )
        assert refused.value.status == 403 and "run only the runner images" in (refused.value.body or "")
        debug["image"] = RUNNER_IMAGE  # the refusal is the image's: a runner image is admitted
        core.patch_namespaced_pod_ephemeralcontainers(
            pod.metadata.name, resumable.sandbox_ns, {"spec": {"ephemeralContainers": [debug]}}, dry_run="All"
        )
    finally:
        core.delete_namespaced_pod(pod.metadata.name, resumable.sandbox_ns)
