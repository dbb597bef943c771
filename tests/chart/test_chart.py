"""The Helm chart (``helm/sandbox-controller``) rendered and linted by the real Helm engine.

The engine is Helm 4's own library, bundled by the ``helm-python-sdk`` wheel (``helm_python``):
no ``helm`` binary, no Go toolchain. Without it these tests skip loudly (fail under ``CI=true``).
Kubernetes-schema validation and a server-side dry run against the test API server live with
the envtest tier.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import BOUNDS, KEYS
from controller.runners.kubernetes import seccomp
from controller.runners.kubernetes.manifests import SandboxTemplate

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sandbox-controller"
CI_DIR = CHART / "ci"
CI_VALUES = sorted(CI_DIR.glob("*.yaml"))
RELEASE, NAMESPACE = "demo", "ctl"

# Settings of the Kubernetes runner (controller/config/ gains them with the runner).
KUBERNETES_KEYS = frozenset(
    {
        "CONTROLLER_KUBERNETES_NAMESPACE",
        "CONTROLLER_KUBERNETES_IMAGE",
        "CONTROLLER_KUBERNETES_EXECUTOR_KEY_SECRET",
        "CONTROLLER_KUBERNETES_TEMPLATES_FILE",
        "CONTROLLER_KUBERNETES_RUNTIME_CLASS",
    }
)

# Settings of suspend with memory on Kubernetes (issue 40), which the chart sets ahead of
# controller/config/ (it gains them with the runner's checkpoint suspend and the node agent):
# the worker's wait for an answer, and what the node agent (sandbox.checkpoints) is told. A name
# the config already reads is checked as any other; the rest are taken as known until it does.
CHECKPOINT_KEYS = frozenset(
    {
        "CONTROLLER_KUBERNETES_CHECKPOINT_TIMEOUT_SECONDS",
        "CONTROLLER_NODE_AGENT_NODE_NAME",
        "CONTROLLER_NODE_AGENT_KUBELET_URL",
        "CONTROLLER_NODE_AGENT_KUBELET_CA_FILE",
        "CONTROLLER_NODE_AGENT_CHECKPOINT_DIRECTORY",
        "CONTROLLER_NODE_AGENT_CONTAINERD_ADDRESS",
        "CONTROLLER_NODE_AGENT_CTR",
        "CONTROLLER_NODE_AGENT_KUBELET_TOKEN_FILE",
        "CONTROLLER_NODE_AGENT_POLL_SECONDS",
        "CONTROLLER_NODE_AGENT_IMAGE_GRACE_SECONDS",
    }
)
NOT_YET_READ = CHECKPOINT_KEYS - KEYS

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
        message = (
            f"helm-python-sdk (Helm 4's engine) is not installed: `scripts/venv` installs it from the lock ({exc})"
        )
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
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
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
    """The release's full name: its controller's ServiceAccount's (components' own have a component label)."""
    accounts = of_kind(objects, "ServiceAccount")
    [sa] = [a for a in accounts if "app.kubernetes.io/component" not in a["metadata"]["labels"]]
    name: str = sa["metadata"]["name"]
    return name


def every_values_file() -> list[tuple[str, dict[str, Any]]]:
    cases = [("defaults+credentials", CREDENTIALS)]
    cases += [(f"ci/{p.name}", load_values(p)) for p in CI_VALUES]
    return cases


CASES = every_values_file()
CASE_IDS = [name for name, _ in CASES]
# The node agent of suspend with memory, which no ci/ file turns on (its pods are the node's
# root, as the seccomp installer's): the settings tests render it too.
CHECKPOINTS: dict[str, Any] = merge(
    CREDENTIALS,
    {
        "sandbox": {
            "checkpoints": {"enabled": True},
            "templates": {"resumable": {"suspend": "checkpoint", "workspacePersistence": {"size": "1Gi"}}},
        }
    },
)
SETTINGS_CASES = [*CASES, ("checkpoints", CHECKPOINTS)]


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


def test_the_schema_bounds_every_number_as_the_controller_does() -> None:
    """Each numeric setting the ConfigMap sets from a value has that value's minimum and
    maximum in values.schema.json equal to the range controller.config enforces (``BOUNDS``):
    helm refuses at install what the controller would refuse at start. (A bounded setting the
    chart leaves unset on purpose, ``NOT_SET_BY_THE_CHART``, has no value to bound.)"""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_map = (CHART / "templates" / "configmap.yaml").read_text()
    mapped = dict(re.findall(r"^\s*(CONTROLLER_[A-Z0-9_]+): \{\{ \.Values\.([\w.]+)", config_map, flags=re.MULTILINE))
    # The node agent's own settings are env entries of its DaemonSet (sandbox.checkpoints).
    agent = (CHART / "templates" / "sandbox-checkpoint-agent.yaml").read_text()
    mapped |= dict(re.findall(r"- name: (CONTROLLER_[A-Z0-9_]+)\n\s+value: \{\{ \.Values\.([\w.]+)", agent))
    bounded = {name: bounds for name, bounds in BOUNDS.items() if name not in NOT_SET_BY_THE_CHART}
    assert set(bounded) <= set(mapped), sorted(set(bounded) - set(mapped))
    for name, (minimum, maximum) in bounded.items():
        node = schema
        for part in mapped[name].split("."):
            node = node["properties"][part]
        assert (node.get("minimum"), node.get("maximum")) == (minimum, maximum), name


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
        # The `helm test` pod of the sandbox NetworkPolicy wears the sandbox pods' labels (the
        # policy must select it); everything else is Helm's.
        sandbox_like = name.endswith("-test-network-policy")
        assert labels["app.kubernetes.io/managed-by"] == ("sandbox-controller" if sandbox_like else "Helm")


def test_notes_say_how_to_register_the_webhook(chart: Any) -> None:
    """NOTES.txt gives the webhook URL and the registration call."""
    values = load_values(CI_DIR / "production-values.yaml")
    notes = chart.render(values, name=RELEASE, namespace=NAMESPACE)["sandbox-controller/templates/NOTES.txt"]
    assert "https://hooks.example.com/webhooks" in notes
    assert "sandbox-controller webhook register --url https://<your host>/webhooks" in notes
    assert f"--kube-secret {NAMESPACE}/" in notes


# -- guards -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "no signing secret"),
        (merge(CREDENTIALS, {"apiKey": {"value": ""}}), "apiKey"),
        (merge(CREDENTIALS, {"sandbox": {"executorKey": {"value": ""}}}), "sandbox.executorKey"),
        (merge(CREDENTIALS, {"redis": {"enabled": False}}), "set redis.url or redis.existingSecret"),
        (merge(CREDENTIALS, {"redis": {"url": REDIS_URL}}), "not both"),
        (
            merge(CREDENTIALS, {"redis": {"enabled": False, "url": REDIS_URL, "auth": {"existingSecret": "r"}}}),
            "redis.auth.existingSecret is for the bundled Redis",
        ),
        (
            merge(CREDENTIALS, {"redis": {"sentinel": {"addresses": ["sentinel:26379"]}}}),
            "redis.sentinel and redis.tls are for an external Redis",
        ),
        (
            merge(CREDENTIALS, {"redis": {"tls": {"caSecret": "redis-ca"}}}),
            "redis.sentinel and redis.tls are for an external Redis",
        ),
        (
            merge(CREDENTIALS, {"redis": {"enabled": False, "url": REDIS_URL, "sentinel": {"masterName": "m"}}}),
            "need redis.sentinel.addresses",
        ),
        (
            merge(CREDENTIALS, {"redis": {"enabled": False, "url": REDIS_URL, "tls": {"caSecret": "redis-ca"}}}),
            "redis.url must be a rediss:// URL",
        ),
        (merge(CREDENTIALS, {"sandbox": {"executorKey": {"value": API_KEY}}}), "separate, restricted key"),
        (merge(CREDENTIALS, {"sandbox": {"namespace": {"name": NAMESPACE}}}), "must differ"),
        (
            merge(
                CREDENTIALS,
                {"sandbox": {"networkPolicy": {"egress": {"allow": [{"cidr": "0.0.0.0/0", "ports": [{"port": 80}]}]}}}},
            ),
            "would reopen every address",
        ),
        (merge(CREDENTIALS, {"sandbox": {"networkPolicy": {"dns": {"to": []}}}}), "networkPolicy/dns/to"),
        (
            merge(CREDENTIALS, {"sandbox": {"networkPolicy": {"dns": {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}}}}),
            "not to every address",
        ),
    ],
    ids=[
        "nothing",
        "no-api-key",
        "no-executor-key",
        "no-redis",
        "two-redis",
        "external-redis-auth",
        "sentinel-bundled",
        "tls-bundled",
        "sentinel-master-alone",
        "ca-without-tls",
        "same-key",
        "same-ns",
        "allow-anywhere",
        "dns-empty",
        "dns-anywhere",
    ],
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
    """L2: the receiver gets the webhook secrets only, the worker the API key only, the
    scheduler (Redis and the runner) neither."""
    objects = render(chart, CREDENTIALS)
    full = _full(objects)
    wanted = {
        "receiver": ({"CONTROLLER_WEBHOOK_SECRETS_FILE"}, False),
        "worker": ({"CONTROLLER_API_KEY_FILE"}, True),
        "scheduler": (set(), True),
    }
    for component, (files, token) in wanted.items():
        spec = one(objects, "Deployment", f"{full}-{component}")["spec"]["template"]["spec"]
        env = {e["name"] for e in spec["containers"][0]["env"]}
        assert {n for n in env if n.endswith("_FILE")} == files, component
        assert spec["automountServiceAccountToken"] is token, component
        secrets = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
        assert len(secrets) == len(files), component


def test_the_receiver_mounts_its_secrets_so_a_rotation_reaches_the_running_pod(chart: Any) -> None:
    """The webhook secrets are a whole-directory Secret volume (no ``subPath``, which the kubelet
    never updates), and CONTROLLER_WEBHOOK_SECRETS_FILE names the file in it: a rotation
    written into the Secret reaches the running receiver, which reads the file again."""
    objects = render(chart, CREDENTIALS)
    spec = one(objects, "Deployment", f"{_full(objects)}-receiver")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    [path] = [e["value"] for e in container["env"] if e["name"] == "CONTROLLER_WEBHOOK_SECRETS_FILE"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "webhook-secrets"]
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert path.rsplit("/", 1) == [mount["mountPath"].rstrip("/"), path.rsplit("/", 1)[1]]
    [volume] = [v for v in spec["volumes"] if v["name"] == "webhook-secrets"]
    assert [item["path"] for item in volume["secret"]["items"]] == [path.rsplit("/", 1)[1]]


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_the_scheduler_gets_no_api_key(chart: Any, case: str, values: dict[str, Any]) -> None:
    """L2: the scheduler only sweeps (Redis and the runner): nothing in its pod names the API
    key's Secret, its key or its file, and controller.config does not ask it for one."""
    from controller.config import Settings

    objects = render(chart, values)
    full = _full(objects)
    api_key_secret = "sandbox-controller-api-key" if values["apiKey"].get("existingSecret") else f"{full}-api-key"
    worker = json.dumps(one(objects, "Deployment", f"{full}-worker")["spec"]["template"]["spec"])
    assert api_key_secret in worker  # the name is right: the worker does mount it
    scheduler = json.dumps(one(objects, "Deployment", f"{full}-scheduler")["spec"]["template"]["spec"])
    for needle in (api_key_secret, "CONTROLLER_API_KEY", "api-key", "/var/run/secrets/sandbox-controller/api"):
        assert needle not in scheduler, needle
    # The controller agrees: `scheduler` starts without an API key (Kubernetes runner).
    Settings.from_env({"CONTROLLER_REDIS_URL": "redis://r:6379/0", "CONTROLLER_RUNNER": "kubernetes"}).require(
        "scheduler"
    )


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


@pytest.mark.parametrize(
    ("pool", "pooled"),
    [({"size": 1}, True), ({"min": 0, "max": 3}, True), ({"size": 0}, False), ({"maxAgeSeconds": 600}, False)],
    ids=["fixed", "sized by demand", "size 0", "no size"],
)
def test_a_warm_pool_of_either_kind_grants_the_claim_and_the_placement_record(
    chart: Any, pool: dict[str, Any], pooled: bool
) -> None:
    """A template with a pool (a fixed size above 0, or a max) adds exactly ``patch`` on pods
    (the claim) and ``create``/``get`` on leases (the placement record); without one, neither."""
    objects = render(chart, merge(CREDENTIALS, {"sandbox": {"templates": {"fast": {"warmPool": pool}}}}))
    [role] = of_kind(objects, "Role")
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    warm = {
        ("", "pods", "patch"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get"),
    }
    assert (warm & grants) == (warm if pooled else set())


@pytest.mark.parametrize(
    "pool",
    [{"size": 2, "max": 4}, {"min": 1}, {"max": 0}, {"max": 4, "headroomPercent": 5000}, {"max": 4, "window": 60}],
    ids=["size and max", "min without max", "max 0", "headroom above 1000", "unknown key"],
)
def test_the_schema_refuses_a_broken_warm_pool(helm: Any, chart: Any, pool: dict[str, Any]) -> None:
    """What the templates file would refuse at start, helm refuses at install."""
    values = merge(CREDENTIALS, {"sandbox": {"templates": {"fast": {"warmPool": pool}}}})
    with pytest.raises(helm.errors.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def test_user_namespaces_reach_every_template_that_does_not_say_otherwise(helm: Any, chart: Any) -> None:
    """sandbox.userNamespaces (off by default) sets CONTROLLER_KUBERNETES_USER_NAMESPACES, which
    the controller turns into the default template's ``hostUsers: false`` (inherited by every
    template); a template's own ``hostUsers`` overrides it, and the schema refuses a non-flag."""
    from controller.config import Settings
    from controller.runners.kubernetes.templates import parse

    def parsed(values: dict[str, Any]) -> dict[str, bool]:
        objects = render(chart, values)
        data = one(objects, "ConfigMap", _full(objects))["data"]
        settings = Settings.from_env({"CONTROLLER_RUNNER": "kubernetes", **{
            k: v for k, v in data.items() if k == "CONTROLLER_KUBERNETES_USER_NAMESPACES"
        }})  # fmt: skip
        [raw] = one(objects, "ConfigMap", f"{_full(objects)}-sandbox-templates")["data"].values()
        base = SandboxTemplate(host_users=not settings.kubernetes.user_namespaces)
        return {name: t.host_users for name, t in parse(json.loads(raw), base).by_name.items()}

    templates = {"sandbox": {"templates": {"plain": {}, "shared": {"hostUsers": True}}}}
    assert parsed(merge(CREDENTIALS, templates)) == {"default": True, "plain": True, "shared": True}
    on = merge(CREDENTIALS, templates, {"sandbox": {"userNamespaces": True}})
    assert parsed(on) == {"default": False, "plain": False, "shared": True}
    with pytest.raises(helm.errors.HelmValuesError):
        chart.render(
            merge(CREDENTIALS, {"sandbox": {"templates": {"t": {"hostUsers": "false"}}}}),
            name=RELEASE,
            namespace=NAMESPACE,
            is_install=True,
        )


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


PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"]
CLUSTER_DNS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
}


def _port_53_rules(egress: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for rule in egress if any(p.get("port") == 53 for p in rule.get("ports", []))]


def test_sandbox_network_policy_defaults(chart: Any) -> None:
    """L8: nothing dials into a sandbox; it reaches the cluster DNS pods on 53 and public
    addresses on TCP 443, never a private, shared or link-local range (pods, services, nodes,
    the API server, cloud metadata). These are the exact rules: nothing else is open. They hold
    for every pod of the sandbox namespace, whatever its labels (no pod can leave them by
    leaving out a label)."""
    objects = render(chart, CREDENTIALS)
    policy = _sandbox_policy(objects)
    assert policy["metadata"]["namespace"] == f"{NAMESPACE}-sandboxes"
    spec = policy["spec"]
    assert spec["podSelector"] == {}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == []
    assert spec["egress"] == [
        CLUSTER_DNS,
        {
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": PRIVATE_RANGES}}],
            "ports": [{"port": 443, "protocol": "TCP"}],
        },
    ]
    # Every rule names its destinations and ports: no rule opens "anywhere" or "any port".
    for rule in spec["egress"]:
        assert rule["to"] and rule["ports"], rule
    # Port 53 only to the DNS pods (a peer with both selectors), never to an ipBlock.
    [dns] = _port_53_rules(spec["egress"])
    assert all("ipBlock" not in peer and peer["podSelector"] for peer in dns["to"])


def test_sandbox_egress_exceptions_and_extra_destinations_come_from_values(chart: Any) -> None:
    """Values change where DNS goes, add CIDRs to the exceptions (the private ranges stay),
    add destinations with their own ports, and append raw rules; port 53 still goes nowhere else."""
    spec = _sandbox_policy(render(chart, load_values(CI_DIR / "production-values.yaml")))["spec"]
    dns, https, proxy, lan, extra = spec["egress"]
    assert dns == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "coredns"}},
            },
            {"ipBlock": {"cidr": "169.254.20.10/32"}},  # NodeLocal DNSCache
        ],
        "ports": CLUSTER_DNS["ports"],
    }
    # User CIDRs are added after the private ranges, a duplicate (10.0.0.0/8) only once.
    assert https == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [*PRIVATE_RANGES, "198.51.100.7/32"]}}],
        "ports": [{"port": 443, "protocol": "TCP"}],
    }
    assert proxy == {"to": [{"ipBlock": {"cidr": "10.20.30.40/32"}}], "ports": [{"port": 3128, "protocol": "TCP"}]}
    assert lan == {
        "to": [{"ipBlock": {"cidr": "192.168.50.0/24", "except": ["192.168.50.1/32"]}}],
        "ports": [{"port": 8000, "protocol": "TCP", "endPort": 8100}],
    }
    assert extra == {
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "ports": [{"port": 8443, "protocol": "TCP"}],
    }
    assert _port_53_rules(spec["egress"]) == [dns]


def test_sandbox_public_egress_can_be_closed(chart: Any) -> None:
    """With no public ports, sandboxes reach only DNS and the listed destinations."""
    values = merge(
        CREDENTIALS,
        {
            "sandbox": {
                "networkPolicy": {
                    "egress": {"ports": [], "allow": [{"cidr": "203.0.113.9/32", "ports": [{"port": 443}]}]}
                }
            }
        },
    )
    egress = _sandbox_policy(render(chart, values))["spec"]["egress"]
    assert egress == [
        CLUSTER_DNS,
        {"to": [{"ipBlock": {"cidr": "203.0.113.9/32"}}], "ports": [{"port": 443, "protocol": "TCP"}]},
    ]


def _pod_policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    [policy] = of_kind(objects, "ValidatingAdmissionPolicy")
    [binding] = of_kind(objects, "ValidatingAdmissionPolicyBinding")
    return policy, binding


def _cel_variables(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy's constant variables (JSON literals are CEL literals)."""
    out = {}
    for variable in policy["spec"]["variables"]:
        try:
            out[variable["name"]] = json.loads(variable["expression"])
        except ValueError:
            continue  # an expression over the pod, not a constant
    return out


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_sandbox_pod_policy_is_bound_to_the_sandbox_namespace(chart: Any, case: str, values: dict[str, Any]) -> None:
    """L2: a ValidatingAdmissionPolicy (denying, failing closed) checks every pod created or
    updated in the sandbox namespace, and every change through a subresource that adds or
    changes containers (ephemeral containers, resize), and only there; it allows the runner
    image(s) and names the executor key Secret the controller's pods reference."""
    objects = render(chart, values)
    policy, binding = _pod_policy(objects)
    config = one(objects, "ConfigMap", _full(objects))["data"]
    # Cluster-scoped objects: the name carries the release namespace (two releases "demo" differ).
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == f"{_full(objects)}-{NAMESPACE}-sandbox-pods"
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods", "pods/ephemeralcontainers", "pods/resize"],
        }
    ]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
        "matchResources": {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": config["CONTROLLER_KUBERNETES_NAMESPACE"]}
            }
        },
    }
    constants = _cel_variables(policy)
    assert constants["executorKeySecret"] == config["CONTROLLER_KUBERNETES_EXECUTOR_KEY_SECRET"]
    assert config["CONTROLLER_KUBERNETES_IMAGE"] in constants["allowedImages"]
    assert constants["allowCodexSandbox"] is False
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])


def test_sandbox_pod_policy_allows_template_and_extra_images(chart: Any) -> None:
    """Every image a template names is allowed, plus sandbox.podPolicy.extraImages; nothing else."""
    values = merge(
        CREDENTIALS,
        {
            "sandbox": {
                "templates": {
                    "large": {"image": "registry.example.com/runner:big"},
                    "small": {"resources": {}},  # inherits sandbox.image
                    "again": {"image": "registry.example.com/runner:big"},
                },
                "podPolicy": {"extraImages": ["registry.example.com/runner:next"], "allowCodexSandbox": True},
            }
        },
    )
    constants = _cel_variables(_pod_policy(render(chart, values))[0])
    assert constants["allowedImages"] == [
        "sandbox-controller/sandbox-runner:0.171.0",
        "registry.example.com/runner:big",
        "registry.example.com/runner:next",
    ]
    assert constants["allowCodexSandbox"] is True
    off = render(chart, merge(CREDENTIALS, {"sandbox": {"podPolicy": {"enabled": False}}}))
    assert not [o for o in off if o["kind"].startswith("ValidatingAdmissionPolicy")]


# -- the image pre-puller ----------------------------------------------------------------------


def _image_puller(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [found] = of_kind(objects, "DaemonSet")
    return found


def test_the_image_pre_puller_is_off_by_default(chart: Any) -> None:
    assert of_kind(render(chart, CREDENTIALS), "DaemonSet") == []


def test_the_image_pre_puller_pulls_every_runner_image_and_then_only_sleeps(chart: Any) -> None:
    """sandbox.prePuller: a DaemonSet in the release namespace (the sandbox namespace admits only
    runner-shaped pods) whose pod pulls sandbox.image and each template's image, once each, in an
    init container that runs the given command and exits, then sleeps in a pause container;
    locked down like the controller's pods, with no service-account token; placed and allowed to
    pull as the values say; rolled on every node at once when an image changes."""
    values = merge(
        CREDENTIALS,
        {
            "imagePullSecrets": ["regcred"],
            "sandbox": {
                "templates": {
                    "large": {"image": "registry.example.com/runner:big"},
                    "small": {"resources": {}},  # sandbox.image
                    "again": {"image": "registry.example.com/runner:big"},
                },
                "podPolicy": {"extraImages": ["registry.example.com/debug:1"]},  # not a runner: not pulled
                "prePuller": {
                    "enabled": True,
                    "imagePullSecrets": ["runner-regcred", "regcred"],
                    "nodeSelector": {"node-pool": "sandboxes"},
                    "tolerations": [{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "low",
                },
            },
        },
    )
    objects = render(chart, values)
    puller = _image_puller(objects)
    assert puller["metadata"]["namespace"] == NAMESPACE
    assert puller["metadata"]["name"] == f"{_full(objects)}-image-puller"
    assert puller["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}}
    labels = puller["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "image-puller"
    assert puller["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = puller["spec"]["template"]["spec"]
    pulls = spec["initContainers"]
    runner_images = ["sandbox-controller/sandbox-runner:0.171.0", "registry.example.com/runner:big"]
    assert [c["image"] for c in pulls] == runner_images
    assert [c["name"] for c in pulls] == ["pull-0", "pull-1"]
    [pause] = spec["containers"]
    assert pause["image"] == "registry.k8s.io/pause:3.10"
    for container in [*pulls, pause]:
        assert container["imagePullPolicy"] == "IfNotPresent"
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
        assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["runAsNonRoot"] is True
        assert container["resources"]["limits"]["memory"] == "32Mi"
        assert not container.get("env") and not container.get("volumeMounts")
    assert all(c["command"] == ["/bin/sh", "-c", "exit 0"] for c in pulls)
    assert "command" not in pause  # the pause image's own entrypoint: it sleeps
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "runner-regcred"}]
    assert spec["nodeSelector"] == {"node-pool": "sandboxes"}
    assert spec["tolerations"] == [{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "low"
    assert not spec.get("volumes")
    # Another command (for template images without /bin/sh), and another pause image.
    other = render(
        chart,
        merge(
            CREDENTIALS,
            {
                "sandbox": {
                    "prePuller": {
                        "enabled": True,
                        "command": ["/usr/local/bin/codex", "--version"],
                        "pause": {"repository": "mirror.example.com/pause", "tag": "3.10"},
                    }
                }
            },
        ),
    )
    other_spec = _image_puller(other)["spec"]["template"]["spec"]
    assert [c["command"] for c in other_spec["initContainers"]] == [["/usr/local/bin/codex", "--version"]]
    assert other_spec["containers"][0]["image"] == "mirror.example.com/pause:3.10"
    assert "imagePullSecrets" not in other_spec


@pytest.mark.parametrize(
    "pre_puller",
    [{"command": []}, {"pause": {"repository": ""}}, {"imagePullSecrets": [""]}, {"nodes": "all"}],
    ids=["no command", "no pause image", "empty secret name", "unknown key"],
)
def test_the_schema_refuses_a_broken_pre_puller(helm: Any, chart: Any, pre_puller: dict[str, Any]) -> None:
    values = merge(CREDENTIALS, {"sandbox": {"prePuller": {"enabled": True, **pre_puller}}})
    with pytest.raises(helm.errors.HelmValuesError):
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


# -- settings the chart sets --------------------------------------------------------------------


def test_env_names_are_settings_the_controller_reads(chart: Any) -> None:
    """Every CONTROLLER_* name the chart sets is in ci/expected-env.txt, which names only known settings."""
    expected = {
        line.strip()
        for line in (CI_DIR / "expected-env.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    known = KEYS | KUBERNETES_KEYS | NOT_YET_READ
    assert expected <= known, sorted(expected - known)
    seen: set[str] = set()
    for _, values in SETTINGS_CASES:
        names = env_names(render(chart, values))
        assert names <= expected, sorted(names - expected)
        seen |= names
    assert seen == expected, sorted(expected - seen)


# Settings the controller reads that the chart leaves unset on purpose, each with its reason.
NOT_SET_BY_THE_CHART = {
    "CONTROLLER_API_KEY": "the chart mounts the key as a file: CONTROLLER_API_KEY_FILE",
    "CONTROLLER_WEBHOOK_SECRETS": "the chart mounts the secrets as a file: CONTROLLER_WEBHOOK_SECRETS_FILE",
    "CONTROLLER_EXECUTOR_KEY": "the Kubernetes runner hands the key to pods through a Secret (L2)",
    "CONTROLLER_EXECUTOR_KEY_FILE": "the Kubernetes runner hands the key to pods through a Secret (L2)",
    "CONTROLLER_REDIS_SENTINEL_PASSWORD": "the chart mounts it as a file: CONTROLLER_REDIS_SENTINEL_PASSWORD_FILE",
    "CONTROLLER_EXECUTOR_COMMAND": "local runner only (pods run the image's entrypoint)",
    "CONTROLLER_LOCAL_STATE_DIRECTORY": "local runner only",
    "CONTROLLER_LOCAL_EXECUTOR_USER": "local runner only",
    "CONTROLLER_LOCAL_EXECUTOR_SAME_USER": "local runner only",
    "CONTROLLER_LOCAL_EXECUTOR_UIDS": "local runner only",
    "CONTROLLER_LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD": "local runner only",
    "CONTROLLER_IDLE_SUSPEND": "local runner only (checkpoint is refused with the Kubernetes runner)",
    "CONTROLLER_CRIU": "local runner only (the CRIU binary for CONTROLLER_IDLE_SUSPEND=checkpoint)",
    "CONTROLLER_CHECKPOINT_MAX_PERCENT": "local runner only (the checkpoint images' share of the state volume)",
    "CONTROLLER_CHECKPOINT_RESERVE_PERCENT": "local runner only (room kept free on the state volume at a dump)",
}


def test_chart_sets_exactly_the_settings_the_config_reads(chart: Any) -> None:
    """The chart's environment names (over every values file in ci/, and the node agent of
    suspend with memory) equal the settings controller.config reads (``KEYS``, taken from the
    parser), except the listed ones."""
    assert set(NOT_SET_BY_THE_CHART) <= KEYS, sorted(set(NOT_SET_BY_THE_CHART) - KEYS)
    seen: set[str] = set()
    for _, values in SETTINGS_CASES:
        seen |= env_names(render(chart, values))
    read = KEYS | NOT_YET_READ
    assert seen == read - set(NOT_SET_BY_THE_CHART), (
        sorted(read - set(NOT_SET_BY_THE_CHART) - seen),
        sorted(seen - read),
    )


def test_lifecycle_values_reach_the_settings(chart: Any) -> None:
    """L11/L16/L17: idle timeout, workspace retention, maximum lifetime and the scheduler's
    intervals are chart values, with the config's defaults."""
    from controller.config import KubernetesSettings, LifecycleSettings, QueueSettings

    objects = render(chart, CREDENTIALS)
    data = one(objects, "ConfigMap", _full(objects))["data"]
    assert float(data["CONTROLLER_IDLE_TIMEOUT_SECONDS"]) == LifecycleSettings.idle_timeout_seconds == 1800
    assert float(data["CONTROLLER_WORKSPACE_RETENTION_SECONDS"]) == LifecycleSettings.workspace_retention_seconds
    assert float(data["CONTROLLER_MAX_LIFETIME_SECONDS"]) == LifecycleSettings.max_lifetime_seconds
    assert float(data["CONTROLLER_RECONCILE_INTERVAL_SECONDS"]) == LifecycleSettings.reconcile_interval_seconds
    assert float(data["CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS"]) == LifecycleSettings.full_sweep_interval_seconds
    assert data["CONTROLLER_KUBERNETES_WATCH_PODS"] == "true" and KubernetesSettings.watch_pods is True
    assert float(data["CONTROLLER_RECOVERY_INTERVAL_SECONDS"]) == QueueSettings.recovery_interval_seconds
    assert float(data["CONTROLLER_RECOVERY_AFTER_SECONDS"]) == QueueSettings.recovery_after_seconds
    assert float(data["CONTROLLER_LEASE_TTL_SECONDS"]) == QueueSettings.lease_ttl_seconds


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
    env = {k: v for k, v in data.items() if k not in KUBERNETES_KEYS | NOT_YET_READ}
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
    assert (settings.receiver.max_connections, settings.receiver.max_header_bytes) == (400, 16384)
    assert settings.webhook.max_in_flight == 100
    assert settings.receiver.header_timeout_seconds == settings.webhook.body_timeout_seconds == 10.0
    assert settings.runner.remote_url_allowlist == ("*.openai.com", "*.openai.org")  # the config's default too


def test_an_external_redis_behind_sentinel_with_tls_reaches_every_component(chart: Any, tmp_path: Path) -> None:
    """An external Redis run for failover (ci/ha-redis-values.yaml): the sentinels and the
    master's name in the ConfigMap; the sentinels' password and the TLS CA mounted from their
    existing Secrets as files into every controller pod, named by their ``_FILE`` settings; no
    bundled Redis. With those files in place the controller accepts the settings."""
    from controller.config import Settings

    objects = render(chart, load_values(CI_DIR / "ha-redis-values.yaml"))
    assert of_kind(objects, "StatefulSet") == []
    full = _full(objects)
    data = one(objects, "ConfigMap", full)["data"]
    assert data["CONTROLLER_REDIS_SENTINELS"] == ",".join(
        f"redis-ha-sentinel-{n}.redis-ha.data.svc:26379" for n in range(3)
    )
    assert data["CONTROLLER_REDIS_SENTINEL_MASTER"] == "mymaster"
    files: dict[str, str] = {}
    for component in ("receiver", "worker", "scheduler"):
        spec = one(objects, "Deployment", f"{full}-{component}")["spec"]["template"]["spec"]
        [container] = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        for setting, volume, secret, key in (
            (
                "CONTROLLER_REDIS_SENTINEL_PASSWORD_FILE",
                "redis-sentinel-password",
                "redis-ha-sentinel",
                "sentinel-password",
            ),
            ("CONTROLLER_REDIS_CA_FILE", "redis-ca", "redis-ha-ca", "ca.crt"),
        ):
            path = env[setting]
            assert mounts[volume] == str(Path(path).parent), component
            assert volumes[volume]["secretName"] == secret, component
            assert volumes[volume]["items"] == [{"key": key, "path": Path(path).name}], component
            files[setting] = path
    env = {k: v for k, v in data.items() if k not in KUBERNETES_KEYS | NOT_YET_READ}
    for setting, content in (
        ("CONTROLLER_REDIS_SENTINEL_PASSWORD_FILE", "sentinel-password-0123"),
        ("CONTROLLER_REDIS_CA_FILE", "-----BEGIN CERTIFICATE-----"),
    ):
        local = tmp_path / Path(files[setting]).name
        local.write_text(content)
        env[setting] = str(local)
    env.update(CONTROLLER_REDIS_URL="rediss://:redis-pass@mymaster/0")
    queue = Settings.from_env(env).queue
    assert [host for host, _ in queue.redis_sentinels] == [f"redis-ha-sentinel-{n}.redis-ha.data.svc" for n in range(3)]
    assert queue.redis_sentinel_master == "mymaster"
    assert (
        queue.redis_sentinel_password is not None and queue.redis_sentinel_password.reveal() == "sentinel-password-0123"
    )
    assert queue.redis_ca_file == env["CONTROLLER_REDIS_CA_FILE"]


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


def _redis_script(redis: dict[str, Any]) -> str:
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c"]
    [script] = container["args"]
    assert isinstance(script, str)
    return script


def _redis_config(script: str) -> dict[str, str]:
    """The redis.conf lines the bundled Redis's script feeds to ``redis-server -``."""
    body = script.split("<<EOF\n", 1)[1].split("\nEOF", 1)[0]
    return dict(line.split(" ", 1) for line in body.splitlines())


def test_bundled_redis_is_persistent_with_aof(chart: Any) -> None:
    """The bundled Redis keeps its data: a volume claim and the append-only file."""
    objects = render(chart, CREDENTIALS)
    [redis] = of_kind(objects, "StatefulSet")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    config = _redis_config(_redis_script(redis))
    assert config["appendonly"] == "yes" and config["dir"] == "/data"
    assert {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/data"] == "data"
    assert ":" in container["image"] and not container["image"].endswith(":latest")
    [claim] = redis["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"


def test_bundled_redis_has_a_generated_password_and_protected_mode(chart: Any) -> None:
    """L2: the bundled Redis requires a password the chart generates (kept in one Secret with
    the URL the controller uses), protected mode is on, and the password appears in no argument
    list, ConfigMap or annotation: Redis gets it from the Secret through its environment."""
    objects = render(chart, CREDENTIALS)
    full = _full(objects)
    [redis] = of_kind(objects, "StatefulSet")
    [auth] = [s for s in of_kind(objects, "Secret") if "redis-password" in s.get("data", {})]
    assert auth["metadata"]["name"] == f"{full}-redis-auth"
    password = _decoded(auth)["redis-password"]
    assert len(password) == 32 and password.isalnum()
    url = _decoded(auth)["redis-url"]
    assert url == f"redis://:{password}@{redis['metadata']['name']}.{NAMESPACE}.svc:6379/0"
    # Redis: requirepass from its environment, which comes from the Secret; protected mode on.
    container = redis["spec"]["template"]["spec"]["containers"][0]
    config = _redis_config(_redis_script(redis))
    assert config["requirepass"] == '"$REDISCLI_AUTH"' and config["protected-mode"] == "yes"
    assert container["env"] == [
        {
            "name": "REDISCLI_AUTH",
            "valueFrom": {"secretKeyRef": {"name": auth["metadata"]["name"], "key": "redis-password"}},
        }
    ]
    # The controller: the URL with the password, from the same Secret.
    for _, spec in pod_specs(objects):
        for c in spec["containers"]:
            for env in c.get("env", []):
                if env["name"] == "CONTROLLER_REDIS_URL":
                    assert env["valueFrom"]["secretKeyRef"] == {"name": auth["metadata"]["name"], "key": "redis-url"}
    # Nowhere outside its Secret.
    for o in objects:
        if o["kind"] != "Secret":
            text = json.dumps(o)
            assert password not in text and base64.b64encode(password.encode()).decode() not in text, o["kind"]
    # Generated per install, not a constant of the chart.
    again = [s for s in of_kind(render(chart, CREDENTIALS), "Secret") if "redis-password" in s.get("data", {})]
    assert _decoded(again[0])["redis-password"] != password
    # Not part of the config checksum: a fresh password does not roll the controller's pods.
    sums = {o["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for o in of_kind(objects, "Deployment")}
    assert sums == {
        o["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for o in of_kind(render(chart, CREDENTIALS), "Deployment")
    }


def test_bundled_redis_can_take_an_existing_secret(chart: Any) -> None:
    """With redis.auth.existingSecret the chart makes no Redis Secret; Redis reads the password
    and the controller the URL from that Secret. An external Redis refuses the setting."""
    objects = render(chart, merge(CREDENTIALS, {"redis": {"auth": {"existingSecret": "my-redis"}}}))
    assert not [s for s in of_kind(objects, "Secret") if "redis-password" in s.get("data", {})]
    [redis] = of_kind(objects, "StatefulSet")
    [env] = redis["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "redis-password"}
    worker = one(objects, "Deployment", f"{_full(objects)}-worker")["spec"]["template"]["spec"]
    [url] = [e for e in worker["containers"][0]["env"] if e["name"] == "CONTROLLER_REDIS_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "my-redis", "key": "redis-url"}


def test_the_rendered_redis_command_runs_a_redis_that_wants_the_password(chart: Any, tmp_path: Path) -> None:
    """L2: the bundled Redis's own rendered start command, run with a real redis-server (on
    loopback: the test adds `bind 127.0.0.1` and its own port and directory): a client without
    the password is refused, the controller's URL from the chart's Secret works, protected mode
    and AOF are on, and the password is not on redis-server's command line."""
    import redis as redis_client

    from tests.support.processes import Managed, free_port, wait_for
    from tests.support.redis_server import redis_server_binary

    objects = render(chart, CREDENTIALS)
    [statefulset] = of_kind(objects, "StatefulSet")
    [auth] = [s for s in of_kind(objects, "Secret") if "redis-password" in s.get("data", {})]
    password, url = _decoded(auth)["redis-password"], _decoded(auth)["redis-url"]
    port = free_port()
    script = _redis_script(statefulset)
    for rendered, local in (("port 6379", f"port {port}\nbind 127.0.0.1"), ("dir /data", f"dir {tmp_path}")):
        assert rendered in script
        script = script.replace(rendered, local)
    script = script.replace("exec redis-server", f"exec {redis_server_binary()}")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "REDISCLI_AUTH": password}
    server = Managed("redis", ["sh", "-c", script], env, tmp_path / "redis.log").start()
    try:
        anonymous = redis_client.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        wait_for(lambda: _refuses_without_password(anonymous), 15, "the rendered redis-server to answer")
        local_url = url.replace(url.split("@", 1)[1].split("/", 1)[0], f"127.0.0.1:{port}")
        controller = redis_client.Redis.from_url(local_url, socket_timeout=2, decode_responses=True)
        assert controller.ping() is True
        assert controller.config_get("protected-mode") == {"protected-mode": "yes"}
        assert controller.config_get("appendonly") == {"appendonly": "yes"}
        assert controller.config_get("bind") == {"bind": "127.0.0.1"}
        with pytest.raises(redis_client.AuthenticationError):
            redis_client.Redis(host="127.0.0.1", port=port, password="wrong", socket_timeout=2).ping()
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"redis-server" in cmdline and password.encode() not in cmdline
        anonymous.close()
        controller.close()
    finally:
        server.stop()
    assert not server.alive()


def _refuses_without_password(client: Any) -> bool:
    import redis as redis_client

    try:
        client.ping()
    except redis_client.AuthenticationError:
        return True
    except redis_client.ConnectionError:
        return False
    raise AssertionError("the bundled Redis answered a client without the password")


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
    rotated = merge(
        CREDENTIALS,
        {
            "webhook": {
                "signingSecrets": [WEBHOOK_SECRET, "whsec_" + base64.b64encode(b"chart-test-signing-secret-2").decode()]
            }
        },
    )
    assert checksums(rotated) != base
    assert checksums(merge(CREDENTIALS, {"receiver": {"replicas": 5}})) == base


def test_helm_test_hook_checks_readyz(chart: Any) -> None:
    """`helm test` runs a pod that fetches the receiver Service's /readyz."""
    objects = render(chart, CREDENTIALS)
    pod = one(objects, "Pod", f"{_full(objects)}-test-readyz")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = " ".join(pod["spec"]["containers"][0]["command"])
    assert f"http://{_full(objects)}-receiver:80/readyz" in command
    assert pod["spec"]["restartPolicy"] == "Never"


def test_helm_test_of_codex_sandbox_is_opt_in_and_tries_the_profile(chart: Any) -> None:
    """`helm test` checks Codex's own sandbox only when asked (it fails until the profile is on
    the nodes): a test pod in the release namespace runs the node-by-node check, whose probe pod
    is in the sandbox namespace with the sandbox image and security context and the Localhost
    profile named by tests.codexSandbox.seccompProfile (empty: RuntimeDefault)."""
    name = "test-codex-sandbox"
    assert not [o for o in render(chart, CREDENTIALS) if o["metadata"]["name"].endswith(name)]
    objects = render(chart, merge(CREDENTIALS, {"tests": {"codexSandbox": {"enabled": True}}}))
    pod = one(objects, "Pod", f"{_full(objects)}-{name}")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == NAMESPACE
    probe = probe_pod(objects)
    assert probe["metadata"]["namespace"].endswith("-sandboxes")
    [container] = probe["spec"]["containers"]
    security = container["securityContext"]
    assert security["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "sandbox-controller/codex-sandbox.json",
    }
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert "codex sandbox -c 'sandbox_mode=\"workspace-write\"'" in container["args"][0]
    plain = render(chart, merge(CREDENTIALS, {"tests": {"codexSandbox": {"enabled": True, "seccompProfile": ""}}}))
    [container] = probe_pod(plain)["spec"]["containers"]
    assert "seccompProfile" not in container["securityContext"]
    assert "seccomp: RuntimeDefault" in container["args"][0]


def probe_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The probe pod the `helm test` of Codex's sandbox starts on each node (from its ConfigMap)."""
    config = one(objects, "ConfigMap", f"{_full(objects)}-test-codex-sandbox")
    pod: dict[str, Any] = yaml.safe_load(config["data"]["probe-pod.yaml"])
    return pod


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


# -- the CA bundle sandbox pods trust, and `helm test` of the sandbox NetworkPolicy -----------------

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"


def test_a_ca_bundle_reaches_the_sandbox_namespace_the_controller_and_the_pod_policy(chart: Any) -> None:
    """sandbox.caBundle.pem: a ConfigMap in the sandbox namespace (key ca-bundle.crt), its name
    in CONTROLLER_KUBERNETES_CA_BUNDLE_CONFIGMAP (the controller mounts it into every sandbox pod),
    and the admission policy admits that ConfigMap as a volume (and no other). existingConfigMap
    names one made beforehand; by default there is none."""
    objects = render(chart, merge(CREDENTIALS, {"sandbox": {"caBundle": {"pem": CA_PEM}}}))
    name = f"{_full(objects)}-ca-bundle"
    bundle = one(objects, "ConfigMap", name)
    assert bundle["metadata"]["namespace"] == f"{NAMESPACE}-sandboxes"
    assert bundle["data"] == {"ca-bundle.crt": CA_PEM}
    assert one(objects, "ConfigMap", _full(objects))["data"]["CONTROLLER_KUBERNETES_CA_BUNDLE_CONFIGMAP"] == name
    policy, _ = _pod_policy(objects)
    assert _cel_variables(policy)["caBundleConfigMap"] == name
    [volumes] = [v for v in policy["spec"]["validations"] if "has(v.configMap)" in v["expression"]]
    assert "v.configMap.?name.orValue('') == variables.caBundleConfigMap" in volumes["expression"]
    assert "variables.caBundleConfigMap != ''" in volumes["expression"]  # unset: no ConfigMap at all

    existing = render(chart, merge(CREDENTIALS, {"sandbox": {"caBundle": {"existingConfigMap": "corp-ca"}}}))
    assert not [o for o in existing if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-ca-bundle")]
    assert one(existing, "ConfigMap", _full(existing))["data"]["CONTROLLER_KUBERNETES_CA_BUNDLE_CONFIGMAP"] == "corp-ca"
    assert _cel_variables(_pod_policy(existing)[0])["caBundleConfigMap"] == "corp-ca"

    default = render(chart, CREDENTIALS)
    assert "CONTROLLER_KUBERNETES_CA_BUNDLE_CONFIGMAP" not in one(default, "ConfigMap", _full(default))["data"]
    assert _cel_variables(_pod_policy(default)[0])["caBundleConfigMap"] == ""


@pytest.mark.parametrize(
    ("ca_bundle", "message"),
    [
        ({"pem": CA_PEM, "existingConfigMap": "corp-ca"}, "not both"),
        ({"pem": "not a certificate"}, "caBundle"),
        ({"existingConfigMap": "Corp_CA"}, "caBundle"),
    ],
    ids=["both", "not-pem", "bad-name"],
)
def test_a_bad_ca_bundle_fails_the_render(chart: Any, helm: Any, ca_bundle: dict[str, str], message: str) -> None:
    with pytest.raises(helm.errors.HelmError) as raised:
        render(chart, merge(CREDENTIALS, {"sandbox": {"caBundle": ca_bundle}}))
    assert message in str(raised.value)


def _network_policy_test(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Pod", f"{_full(objects)}-test-network-policy")


def test_helm_test_checks_the_sandbox_network_policy_from_a_pod_it_selects(chart: Any) -> None:
    """`helm test` also runs a pod in the sandbox namespace, which the sandbox NetworkPolicy
    selects as it selects every pod there (it also carries the sandbox pods' labels), with the
    sandbox image (what the admission policy admits there) under the "restricted" security
    context, no token; it tries Redis, the API server and the receiver by their cluster names and
    fails, saying the network plugin does not enforce NetworkPolicy, if any answers."""
    objects = render(chart, CREDENTIALS)
    pod = _network_policy_test(objects)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == f"{NAMESPACE}-sandboxes"
    assert _sandbox_policy(objects)["spec"]["podSelector"] == {}  # every pod of the namespace
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = spec["containers"]
    assert container["image"] == "sandbox-controller/sandbox-runner:0.171.0"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not spec.get("volumes") and not spec.get("initContainers")
    probe = container["args"][0]
    full = _full(objects)
    assert f'probe "the bundled Redis" "{full}-redis.{NAMESPACE}.svc" "6379"' in probe
    assert 'probe "the Kubernetes API server" "kubernetes.default.svc" "443"' in probe
    assert f'probe "the receiver (a controller pod)" "{full}-receiver.{NAMESPACE}.svc" "80"' in probe
    assert "does not enforce NetworkPolicy" in probe and "timeout=5" in probe
    notes = chart.render(CREDENTIALS, name=RELEASE, namespace=NAMESPACE)["sandbox-controller/templates/NOTES.txt"]
    assert f"kubectl -n {NAMESPACE}-sandboxes logs {full}-test-network-policy" in notes


def test_helm_test_of_the_network_policy_follows_the_values(chart: Any) -> None:
    """No Redis probe with an external Redis (it may live anywhere); none of it when the sandbox
    NetworkPolicy or this test is turned off."""
    external = render(chart, merge(CREDENTIALS, {"redis": {"enabled": False, "url": REDIS_URL}}))
    assert "Redis" not in _network_policy_test(external)["spec"]["containers"][0]["args"][0]
    for off in ({"sandbox": {"networkPolicy": {"enabled": False}}}, {"tests": {"networkPolicy": {"enabled": False}}}):
        objects = render(chart, merge(CREDENTIALS, off))
        assert [o["metadata"]["name"] for o in of_kind(objects, "Pod")] == [f"{_full(objects)}-test-readyz"]


def test_the_ingress_takes_a_rate_limit_per_source_and_the_senders_addresses_as_one_setting_each(chart: Any) -> None:
    """What must sit in front of the receiver against floods (README: "Slow or hostile clients"):
    ``ingress.rateLimitPerSource`` and ``ingress.sourceRanges`` become ingress-nginx's
    annotations, beside any others given; unset, neither is there."""
    values = load_values(CI_DIR / "production-values.yaml")
    limited = merge(
        values,
        {
            "ingress": {
                "annotations": {"example.com/kept": "yes"},
                "rateLimitPerSource": 20,
                "sourceRanges": ["192.0.2.0/24", "2001:db8::/32"],
            }
        },
    )
    [ingress] = of_kind(render(chart, limited), "Ingress")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/limit-rps"] == "20"
    assert annotations["nginx.ingress.kubernetes.io/whitelist-source-range"] == "192.0.2.0/24,2001:db8::/32"
    assert annotations["example.com/kept"] == "yes"
    [plain] = of_kind(render(chart, values), "Ingress")
    assert not any(key.startswith("nginx.ingress.kubernetes.io/") for key in plain["metadata"].get("annotations", {}))


def test_the_seccomp_installer_puts_the_profile_on_the_nodes_and_steers_its_templates_there(chart: Any) -> None:
    """sandbox.seccompInstaller (off by default): a DaemonSet in the release namespace writes
    files/codex-sandbox-seccomp.json into the kubelet's seccomp directory (its only host path) and
    labels its node with the file's digest; templates naming that profile, and the helm test of
    Codex's sandbox, select the labelled nodes. Its ServiceAccount may only get and patch nodes."""
    profile = (CHART / "files" / "codex-sandbox-seccomp.json").read_bytes()
    digest = hashlib.sha256(profile).hexdigest()[:16]
    label = seccomp.PROFILE_LABEL  # the label the controller reads when such a pod cannot be scheduled
    assert label == "sandbox-controller/codex-sandbox-seccomp"
    templates = {
        "codex": {"seccompProfile": "sandbox-controller/codex-sandbox.json", "nodeSelector": {"pool": "a"}},
        "other": {"seccompProfile": "other/profile.json"},
        "plain": {},
    }
    values = {"sandbox": {"templates": templates}, "tests": {"codexSandbox": {"enabled": True}}}
    off = render(chart, merge(CREDENTIALS, values))
    assert not [d for d in of_kind(off, "DaemonSet") if "seccomp" in d["metadata"]["name"]]
    assert not [r for r in of_kind(off, "ClusterRole") if "seccomp-installer" in r["metadata"]["name"]]
    [raw] = one(off, "ConfigMap", f"{_full(off)}-sandbox-templates")["data"].values()
    assert json.loads(raw) == templates

    on = render(
        chart, merge(CREDENTIALS, values, {"sandbox": {"seccompInstaller": {"enabled": True, "kubeletRootDir": "/k/"}}})
    )
    full = _full(off)
    name = f"{full}-seccomp-installer"
    daemon = one(on, "DaemonSet", name)
    assert daemon["metadata"]["namespace"] == NAMESPACE
    spec = daemon["spec"]["template"]["spec"]
    [host] = [v for v in spec["volumes"] if "hostPath" in v]
    assert host["hostPath"] == {"path": "/k/seccomp/sandbox-controller", "type": "DirectoryOrCreate"}
    [install] = spec["initContainers"]
    assert {e["name"]: e.get("value") for e in install["env"]}["PROFILE_DIGEST"] == digest
    security = install["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    [mount] = [m for m in install["volumeMounts"] if m["name"] == host["name"]]
    assert mount["mountPath"] == "/host-seccomp"
    assert one(on, "ConfigMap", name)["data"]["codex-sandbox.json"].encode() == profile
    [role] = [r for r in of_kind(on, "ClusterRole") if r["metadata"]["name"].endswith(name)]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    [binding] = [b for b in of_kind(on, "ClusterRoleBinding") if b["metadata"]["name"].endswith(name)]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]
    assert spec["serviceAccountName"] == name

    [raw] = one(on, "ConfigMap", f"{full}-sandbox-templates")["data"].values()
    steered = json.loads(raw)
    assert steered["codex"]["nodeSelector"] == {"pool": "a", label: digest}
    assert steered["other"] == templates["other"] and steered["plain"] == {}
    assert probe_pod(on)["spec"]["nodeSelector"] == {label: digest}
