"""The Helm chart (``helm/sandbox-controller``) rendered and linted by the real Helm engine.

The engine is Helm 4's own library, bundled by the ``helm-python-sdk`` wheel (``helm_python``):
no ``helm`` binary, no Go toolchain. Without it these tests skip loudly (fail under ``CI=true``).
Kubernetes-schema validation and a server-side dry run against the test API server live with
the envtest tier.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import KEYS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sandbox-controller"
CI_DIR = CHART / "ci"
CI_VALUES = sorted(CI_DIR.glob("*.yaml"))
RELEASE, NAMESPACE = "demo", "ctl"

# Settings of the Kubernetes runner (controller/config.py gains them with the runner).
KUBERNETES_KEYS = frozenset(
    {
        "CONTROLLER_KUBERNETES_NAMESPACE",
        "CONTROLLER_KUBERNETES_IMAGE",
        "CONTROLLER_KUBERNETES_EXECUTOR_KEY_SECRET",
        "CONTROLLER_KUBERNETES_TEMPLATES_FILE",
        "CONTROLLER_KUBERNETES_RUNTIME_CLASS",
    }
)

WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"chart-test-signing-secret-1").decode()
API_KEY = "sk-chart-test-api-key-0123456789"
EXECUTOR_KEY = "envkey-chart-test-executor-0123456789"
REDIS_URL = "redis://:redis-pass-0123456789@redis.example.com:6379/0"
CREDENTIALS: dict[str, Any] = {
    "webhook": {"signingSecrets": [WEBHOOK_SECRET]},
    "apiKey": {"value": API_KEY},
    "sandbox": {"executorKey": {"value": EXECUTOR_KEY}},
}


def _helm() -> Any:
    try:
        import helm_python
    except ImportError as exc:
        message = f"helm-python-sdk (Helm 4's engine) is not installed: `.venv/bin/pip install helm-python-sdk` ({exc})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return helm_python


@pytest.fixture(scope="module")
def helm() -> Any:
    return _helm()


@pytest.fixture(scope="module")
def chart(helm: Any) -> Iterator[Any]:
    with helm.Chart.load(str(CHART)) as loaded:
        yield loaded


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
    return out


def load_values(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return loaded


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders (NOTES.txt aside), in file order."""
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for name, text in sorted(manifests.items()):
        if name.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__file__"] = name
                objects.append(doc)
    return objects


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        elif o["kind"] == "Pod":
            yield o["metadata"]["name"], o["spec"]


def env_names(objects: list[dict[str, Any]]) -> set[str]:
    """Names the chart sets on the controller's containers: its ConfigMap's keys plus env entries."""
    names = set(one(objects, "ConfigMap", _full(objects))["data"])
    for _, spec in pod_specs(objects):
        for container in spec["containers"]:
            names.update(e["name"] for e in container.get("env", []))
    return {n for n in names if n.startswith("CONTROLLER_")}


def _full(objects: list[dict[str, Any]]) -> str:
    [sa] = of_kind(objects, "ServiceAccount")
    name: str = sa["metadata"]["name"]
    return name


def every_values_file() -> list[tuple[str, dict[str, Any]]]:
    cases = [("defaults+credentials", CREDENTIALS)]
    cases += [(f"ci/{p.name}", load_values(p)) for p in CI_VALUES]
    return cases


CASES = every_values_file()
CASE_IDS = [name for name, _ in CASES]


# -- engine, schema, lint ---------------------------------------------------------------------


def test_engine_is_helm_4(helm: Any) -> None:
    """The templates are rendered by Helm's own Go library, not a re-implementation."""
    assert helm.helm_sdk_version().startswith("v4.")


def test_values_validate_against_the_schema() -> None:
    """values.yaml and every ci/*.yaml (over the defaults) validate against values.schema.json."""
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    defaults = load_values(CHART / "values.yaml")
    validator = jsonschema.Draft7Validator(schema)
    assert list(validator.iter_errors(defaults)) == []
    for path in CI_VALUES:
        errors = [e.message for e in validator.iter_errors(merge(defaults, load_values(path)))]
        assert errors == [], path.name
    assert not validator.is_valid(merge(defaults, {"receiver": {"replica": 3}}))  # a typo
    assert not validator.is_valid(merge(defaults, {"logLevel": "LOUD"}))
    assert not validator.is_valid(merge(defaults, {"redis": {"url": "http://not-redis"}}))


def test_helm_applies_the_schema(chart: Any, helm: Any) -> None:
    """Helm itself refuses values the schema rejects (as `helm install` would)."""
    chart.validate_schema(CREDENTIALS)
    with pytest.raises(helm.errors.HelmValuesError):
        chart.validate_schema(merge(CREDENTIALS, {"worker": {"replicas": "many"}}))


def test_every_value_is_documented() -> None:
    """Every leaf of values.yaml sits under a `# --` comment (helm-docs style)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        key, _, rest = stripped.partition(":")
        indent = len(line) - len(line.lstrip())
        following = next((n for n in lines[index + 1 :] if n.strip() and not n.strip().startswith("#")), "")
        is_parent = rest.strip() == "" and (len(following) - len(following.lstrip())) > indent
        if is_parent and not following.strip().startswith("-"):
            continue  # a mapping of further values; its leaves carry the comments
        previous = lines[index - 1].strip() if index else ""
        in_list_of_parent = indent > 0 and not previous.startswith("#") and _inside_documented_block(lines, index)
        if not previous.startswith("# --") and not in_list_of_parent:
            undocumented.append(key)
    assert undocumented == []


def _inside_documented_block(lines: list[str], index: int) -> bool:
    """True for keys inside a documented value's own block (e.g. podSecurityContext's fields)."""
    indent = len(lines[index]) - len(lines[index].lstrip())
    for back in range(index - 1, -1, -1):
        line = lines[back]
        if not line.strip() or line.strip().startswith("#"):
            continue
        line_indent = len(line) - len(line.lstrip())
        if line_indent < indent and not line.strip().startswith("-"):
            above = lines[back - 1].strip() if back else ""
            if above.startswith("# --"):
                return True
            indent = line_indent
    return False


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_lint_is_clean(helm: Any, case: str, values: dict[str, Any]) -> None:
    """`helm lint --strict` finds no warning or error (the icon hint is information only)."""
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v1.37.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_renders_well_formed_objects(chart: Any, case: str, values: dict[str, Any]) -> None:
    """Each values file renders; every object has a kind, a DNS-1123 name and the standard labels."""
    objects = render(chart, values)
    assert {o["kind"] for o in objects} >= {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "Pod",
    }
    for o in objects:
        name = o["metadata"]["name"]
        assert len(name) <= 63 and name.replace("-", "a").isalnum() and name == name.lower(), name
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_notes_say_how_to_register_the_webhook(chart: Any) -> None:
    """NOTES.txt gives the webhook URL and the registration call."""
    values = load_values(CI_DIR / "production-values.yaml")
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["sandbox-controller/templates/NOTES.txt"]
    assert "https://hooks.example.com/webhooks" in notes
    assert "/v1/webhook_endpoints" in notes and "signing_secret" in notes


# -- guards -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "no signing secret"),
        (merge(CREDENTIALS, {"apiKey": {"value": ""}}), "apiKey"),
        (merge(CREDENTIALS, {"sandbox": {"executorKey": {"value": ""}}}), "sandbox.executorKey"),
        (merge(CREDENTIALS, {"redis": {"enabled": False}}), "set redis.url or redis.existingSecret"),
        (merge(CREDENTIALS, {"redis": {"url": REDIS_URL}}), "not both"),
        (merge(CREDENTIALS, {"sandbox": {"executorKey": {"value": API_KEY}}}), "separate, restricted key"),
        (merge(CREDENTIALS, {"sandbox": {"namespace": {"name": NAMESPACE}}}), "must differ"),
        (
            merge(CREDENTIALS, {"sandbox": {"networkPolicy": {"egress": {"to": [{"cidr": "0.0.0.0/0"}]}}}}),
            "169.254.169.254/32",
        ),
    ],
    ids=["nothing", "no-api-key", "no-executor-key", "no-redis", "two-redis", "same-key", "same-ns", "metadata"],
)
def test_impossible_combinations_fail(chart: Any, helm: Any, values: dict[str, Any], message: str) -> None:
    """L2: impossible or unsafe combinations stop the render with a message saying what to set."""
    with pytest.raises(helm.errors.HelmError) as raised:
        render(chart, values)
    assert message in str(raised.value)


# -- credentials (L2) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [{}, {"redis": {"enabled": False, "url": REDIS_URL}}],
    ids=["bundled-redis", "external-redis-url"],
)
def test_no_secret_value_outside_its_secret(chart: Any, extra: dict[str, Any]) -> None:
    """L2: credentials appear only inside Secret objects, never in a pod spec, ConfigMap or annotation."""
    objects = render(chart, merge(CREDENTIALS, extra))
    secrets = {WEBHOOK_SECRET, API_KEY, EXECUTOR_KEY, REDIS_URL}
    encoded = {base64.b64encode(s.encode()).decode() for s in secrets}
    for o in objects:
        if o["kind"] == "Secret":
            continue
        text = json.dumps(o)
        assert not [s for s in secrets | encoded if s in text], (o["kind"], o["metadata"]["name"])
    for name, spec in pod_specs(objects):
        for container in spec["containers"]:
            for env in container.get("env", []):
                if "value" in env:
                    assert not [s for s in secrets if s in str(env["value"])], (name, env["name"])
    redis_env = [
        e
        for _, spec in pod_specs(objects)
        for c in spec["containers"]
        for e in c.get("env", [])
        if e["name"] == "CONTROLLER_REDIS_URL"
    ]
    assert redis_env and all("secretKeyRef" in e["valueFrom"] for e in redis_env)


def test_executor_key_lives_only_in_the_sandbox_namespace(chart: Any) -> None:
    """L2: the executor key's Secret is in the sandbox namespace; no controller pod mounts or reads it."""
    objects = render(chart, CREDENTIALS)
    sandbox_ns = f"{NAMESPACE}-sandboxes"
    holders = [s for s in of_kind(objects, "Secret") if EXECUTOR_KEY in _decoded(s).values()]
    assert len(holders) == 1
    [holder] = holders
    assert holder["metadata"]["namespace"] == sandbox_ns
    assert set(holder["data"]) == {"executor-key"}
    config = one(objects, "ConfigMap", _full(objects))["data"]
    assert config["CONTROLLER_KUBERNETES_EXECUTOR_KEY_SECRET"] == holder["metadata"]["name"]
    for name, spec in pod_specs(objects):
        assert holder["metadata"]["name"] not in json.dumps(spec), name
    # The controller's own credentials never leave its namespace.
    for secret in of_kind(objects, "Secret"):
        values = _decoded(secret).values()
        if API_KEY in values or WEBHOOK_SECRET in ",".join(values):
            assert secret["metadata"]["namespace"] == NAMESPACE


def test_existing_secrets_are_referenced_not_created(chart: Any) -> None:
    """With existingSecret everywhere the chart creates no Secret and points at the given names."""
    objects = render(chart, load_values(CI_DIR / "production-values.yaml"))
    assert of_kind(objects, "Secret") == []
    config = one(objects, "ConfigMap", "sc")["data"]
    assert config["CONTROLLER_KUBERNETES_EXECUTOR_KEY_SECRET"] == "codex-executor-key"
    worker = one(objects, "Deployment", "sc-worker")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in worker["volumes"]}
    assert volumes["api-key"]["secret"] == {
        "secretName": "sandbox-controller-api-key",
        "defaultMode": 0o440,
        "items": [{"key": "key", "path": "key"}],
    }
    [redis_env] = [e for e in worker["containers"][0]["env"] if e["name"] == "CONTROLLER_REDIS_URL"]
    assert redis_env["valueFrom"]["secretKeyRef"] == {"name": "sandbox-controller-redis", "key": "redis-url"}
    assert of_kind(objects, "StatefulSet") == []  # no bundled Redis


def test_each_component_gets_only_the_credentials_it_needs(chart: Any) -> None:
    """L2: the receiver gets the webhook secrets only; worker and scheduler the API key only."""
    objects = render(chart, CREDENTIALS)
    full = _full(objects)
    wanted = {
        "receiver": ({"CONTROLLER_WEBHOOK_SECRETS_FILE"}, False),
        "worker": ({"CONTROLLER_API_KEY_FILE"}, True),
        "scheduler": ({"CONTROLLER_API_KEY_FILE"}, True),
    }
    for component, (files, token) in wanted.items():
        spec = one(objects, "Deployment", f"{full}-{component}")["spec"]["template"]["spec"]
        env = {e["name"] for e in spec["containers"][0]["env"]}
        assert {n for n in env if n.endswith("_FILE")} == files, component
        assert spec["automountServiceAccountToken"] is token, component
        secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        assert len(secrets) == 1, component


# -- RBAC, namespace, network policy ------------------------------------------------------------


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_role_grants_exactly_what_the_runner_uses(chart: Any, case: str, values: dict[str, Any]) -> None:
    """L2: a namespaced Role in the sandbox namespace; pods/PVCs and events only; no Secrets, no exec."""
    objects = render(chart, values)
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    [role] = of_kind(objects, "Role")
    [binding] = of_kind(objects, "RoleBinding")
    sandbox_ns = one(objects, "ConfigMap", _full(objects))["data"]["CONTROLLER_KUBERNETES_NAMESPACE"]
    assert role["metadata"]["namespace"] == sandbox_ns != NAMESPACE
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    expected = {
        ("", resource, verb)
        for resource in ("pods", "persistentvolumeclaims")
        for verb in ("create", "get", "list", "watch", "delete")
    } | {("", "events", "create")}
    assert grants == expected
    assert not any(r.get("resourceNames") or r.get("nonResourceURLs") for r in role["rules"])
    assert binding["metadata"]["namespace"] == sandbox_ns
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": _full(objects), "namespace": NAMESPACE}]


def test_sandbox_namespace_enforces_restricted(chart: Any) -> None:
    """The sandbox namespace enforces (and audits, warns) Pod Security "restricted"."""
    objects = render(chart, CREDENTIALS)
    [namespace] = of_kind(objects, "Namespace")
    assert namespace["metadata"]["name"] == f"{NAMESPACE}-sandboxes"
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
    # Not created when it exists already.
    assert of_kind(render(chart, load_values(CI_DIR / "production-values.yaml")), "Namespace") == []


def _sandbox_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [policy] = [p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"].endswith("-sandboxes")]
    return policy


def test_sandbox_network_policy_defaults(chart: Any) -> None:
    """L8: nothing dials into a sandbox; it reaches only DNS and TCP 443, never cloud metadata."""
    objects = render(chart, CREDENTIALS)
    policy = _sandbox_policy(objects)
    assert policy["metadata"]["namespace"] == f"{NAMESPACE}-sandboxes"
    spec = policy["spec"]
    assert spec["podSelector"] == {
        "matchLabels": {
            "app.kubernetes.io/managed-by": "sandbox-controller",
            "app.kubernetes.io/component": "sandbox",
        }
    }
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == []
    assert spec["egress"] == [
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        {
            "ports": [{"port": 443, "protocol": "TCP"}],
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32"]}}],
        },
    ]


def test_sandbox_egress_can_be_narrowed_and_extended(chart: Any) -> None:
    """Egress narrows (DNS to kube-system, more exceptions) and takes extra rules from values."""
    spec = _sandbox_policy(render(chart, load_values(CI_DIR / "production-values.yaml")))["spec"]
    dns, https, extra = spec["egress"]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    assert https["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.169.254/32", "10.0.0.0/8"]}}]
    assert extra == {
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "ports": [{"port": 8443, "protocol": "TCP"}],
    }


# -- settings the chart sets --------------------------------------------------------------------


def test_env_names_are_settings_the_controller_reads(chart: Any) -> None:
    """Every CONTROLLER_* name the chart sets is in ci/expected-env.txt, which names only known settings."""
    expected = {
        line.strip()
        for line in (CI_DIR / "expected-env.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert expected <= (KEYS | KUBERNETES_KEYS), sorted(expected - (KEYS | KUBERNETES_KEYS))
    seen: set[str] = set()
    for _, values in CASES:
        names = env_names(render(chart, values))
        assert names <= expected, sorted(names - expected)
        seen |= names
    assert seen == expected, sorted(expected - seen)


def test_config_map_values(chart: Any) -> None:
    """The ConfigMap carries the runner's settings, with units as the controller parses them."""
    objects = render(chart, load_values(CI_DIR / "production-values.yaml"))
    data = one(objects, "ConfigMap", "sc")["data"]
    assert data["CONTROLLER_RUNNER"] == "kubernetes"
    assert data["CONTROLLER_KUBERNETES_NAMESPACE"] == "agent-sandboxes"
    assert data["CONTROLLER_KUBERNETES_IMAGE"] == "registry.example.com/sandbox-runner:0.171.0-1"
    assert data["CONTROLLER_KUBERNETES_RUNTIME_CLASS"] == "gvisor"
    assert data["CONTROLLER_AGENT_IDS"] == "agent_a,agent_b"
    assert data["CONTROLLER_ROUTE_METADATA"] == "team=platform"
    assert data["CONTROLLER_WEBHOOK_DEDUP_TTL_SECONDS"] == "262800"
    templates = one(objects, "ConfigMap", "sc-sandbox-templates")["data"]
    path = data["CONTROLLER_KUBERNETES_TEMPLATES_FILE"]
    assert json.loads(templates[Path(path).name])["large"]["workspacePersistence"]["size"] == "20Gi"
    worker = one(objects, "Deployment", "sc-worker")["spec"]["template"]["spec"]
    [mount] = [m for m in worker["containers"][0]["volumeMounts"] if m["name"] == "sandbox-templates"]
    assert mount["mountPath"] == str(Path(path).parent)


def test_settings_parse_in_the_controller(chart: Any, tmp_path: Path) -> None:
    """The rendered env, with mounted files, is accepted by controller.config (Kubernetes names aside)."""
    from controller.config import Settings

    objects = render(chart, merge(CREDENTIALS, {"routing": {"metadata": "team=a"}}))
    data = one(objects, "ConfigMap", _full(objects))["data"]
    env = {k: v for k, v in data.items() if k not in KUBERNETES_KEYS}
    secrets_file, key_file = tmp_path / "secrets", tmp_path / "key"
    secrets_file.write_text(WEBHOOK_SECRET)
    key_file.write_text(API_KEY)
    env.update(
        CONTROLLER_REDIS_URL="redis://redis:6379/0",
        CONTROLLER_WEBHOOK_SECRETS_FILE=str(secrets_file),
        CONTROLLER_API_KEY_FILE=str(key_file),
    )
    settings = Settings.from_env(env)
    assert settings.runner.kind == "kubernetes"
    assert settings.routing.metadata_key == "team"
    assert settings.webhook.dedup_ttl_seconds == 262800
    assert settings.runner.remote_url_allowlist == ("*.openai.com", "*.openai.org")  # the config's default too


# -- workloads ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_controller_pods_are_locked_down(chart: Any, case: str, values: dict[str, Any]) -> None:
    """The controller's own pods: non-root, read-only root, no capabilities, RuntimeDefault seccomp."""
    for name, spec in pod_specs(render(chart, values)):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["runAsUser"] != 0, name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert ctx.get("privileged") is not True, name
            assert "limits" in container["resources"] and "requests" in container["resources"], name


def test_components_commands_probes_and_strategy(chart: Any) -> None:
    """Receiver serves with /healthz and /readyz probes; one scheduler with Recreate; workers scale."""
    objects = render(chart, CREDENTIALS)
    full = _full(objects)
    receiver = one(objects, "Deployment", f"{full}-receiver")
    container = receiver["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] + container["args"] == [
        "sandbox-controller",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = one(objects, "Service", f"{full}-receiver")
    assert service["spec"]["selector"] == receiver["spec"]["selector"]["matchLabels"]

    scheduler = one(objects, "Deployment", f"{full}-scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["args"] == ["scheduler"]

    worker = one(objects, "Deployment", f"{full}-worker")
    assert worker["spec"]["template"]["spec"]["containers"][0]["args"] == ["worker", "--concurrency", "2"]
    budgets = {p["metadata"]["name"]: p["spec"] for p in of_kind(objects, "PodDisruptionBudget")}
    assert set(budgets) == {f"{full}-receiver", f"{full}-worker"}
    assert budgets[f"{full}-worker"]["selector"] == worker["spec"]["selector"]


def test_bundled_redis_is_persistent_with_aof(chart: Any) -> None:
    """The bundled Redis keeps its data: a volume claim and the append-only file."""
    objects = render(chart, CREDENTIALS)
    [redis] = of_kind(objects, "StatefulSet")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["redis-server", "--appendonly", "yes"]
    assert ":" in container["image"] and not container["image"].endswith(":latest")
    [claim] = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    url_secret = [s for s in of_kind(objects, "Secret") if "redis-url" in s.get("data", {})]
    assert _decoded(url_secret[0])["redis-url"] == f"redis://{redis['metadata']['name']}.{NAMESPACE}.svc:6379/0"


def test_config_changes_roll_the_pods(chart: Any) -> None:
    """A change to settings or chart-made secrets changes every pod template's checksum annotation."""

    def checksums(values: dict[str, Any]) -> set[str]:
        return {
            o["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for o in of_kind(render(chart, values), "Deployment")
        }

    base = checksums(CREDENTIALS)
    assert len(base) == 1  # receiver, worker and scheduler roll together
    assert checksums(merge(CREDENTIALS, {"logLevel": "DEBUG"})) != base
    rotated = merge(CREDENTIALS, {"webhook": {"signingSecrets": [WEBHOOK_SECRET, "whsec_bmV3LXNlY3JldA=="]}})
    assert checksums(rotated) != base
    assert checksums(merge(CREDENTIALS, {"receiver": {"replicas": 5}})) == base


def test_helm_test_hook_checks_readyz(chart: Any) -> None:
    """`helm test` runs a pod that fetches the receiver Service's /readyz."""
    objects = render(chart, CREDENTIALS)
    [pod] = of_kind(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = " ".join(pod["spec"]["containers"][0]["command"])
    assert f"http://{_full(objects)}-receiver:80/readyz" in command
    assert pod["spec"]["restartPolicy"] == "Never"


def test_ingress_routes_webhooks_to_the_receiver(chart: Any) -> None:
    objects = render(chart, load_values(CI_DIR / "production-values.yaml"))
    [ingress] = of_kind(objects, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    [rule] = ingress["spec"]["rules"]
    [path] = rule["http"]["paths"]
    assert rule["host"] == "hooks.example.com" and path["path"] == "/webhooks"
    assert path["backend"]["service"] == {"name": "sc-receiver", "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["hooks.example.com"], "secretName": "hooks-tls"}]


def _decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
