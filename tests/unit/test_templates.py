"""Named sandbox templates: parsing the chart's JSON (``parse``/``load``) and choosing one per session."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controller.errors import ConfigError
from controller.runners.kubernetes.manifests import SandboxTemplate
from controller.runners.kubernetes.templates import METADATA_KEY, Templates, load, parse
from tests.support.fakes import make_session

BASE = SandboxTemplate(image="runner:1", runtime_class_name="gvisor")

# What `helm/sandbox-controller` renders from `.Values.sandbox.templates | toJson`.
CHART_JSON = """
{
  "large": {
    "image": "runner:large",
    "imagePullPolicy": "IfNotPresent",
    "resources": {"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}},
    "runtimeClassName": "kata",
    "nodeSelector": {"pool": "big"},
    "tolerations": [{"key": "big", "operator": "Exists", "effect": "NoSchedule"}],
    "imagePullSecrets": ["regcred"],
    "activeDeadlineSeconds": 86400,
    "workspacePersistence": {"enabled": true, "size": "20Gi", "storageClassName": "fast"},
    "codexSandbox": true,
    "agentIds": ["agent_big", "agent_huge"],
    "httpsProxy": "http://10.20.30.40:3128",
    "noProxy": "internal.example.com,.svc"
  },
  "small": {"resources": {"limits": {"cpu": "500m"}}, "agentIds": ["agent_small", "agent_huge"]},
  "plain": {}
}
"""


def chart_templates() -> Templates:
    return parse(json.loads(CHART_JSON), BASE)


# --- parse ---------------------------------------------------------------------------------


def test_chart_json_camel_case_fields_are_read() -> None:
    """Every chart field (camelCase) lands in the template; quantities become strings."""
    templates = chart_templates()
    assert set(templates.by_name) == {"default", "large", "small", "plain"}
    assert templates.by_name["large"] == SandboxTemplate(
        name="large",
        image="runner:large",
        image_pull_policy="IfNotPresent",
        resources={"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}},
        runtime_class_name="kata",
        node_selector={"pool": "big"},
        tolerations=({"key": "big", "operator": "Exists", "effect": "NoSchedule"},),
        image_pull_secrets=("regcred",),
        active_deadline_seconds=86400,
        persist_workspace=True,
        workspace_size="20Gi",
        storage_class_name="fast",
        codex_sandbox=True,
        https_proxy="http://10.20.30.40:3128",
        no_proxy="internal.example.com,.svc",
    )


def test_unset_fields_inherit_the_base_template() -> None:
    """A template names only what differs; everything else is the default template's."""
    templates = chart_templates()
    assert templates.by_name["plain"] == replace(BASE, name="plain")
    assert templates.by_name["small"] == replace(BASE, name="small", resources={"limits": {"cpu": "500m"}})
    assert templates.by_name["default"] is BASE


def test_agent_ids_map_to_the_first_template_listing_them() -> None:
    templates = chart_templates()
    assert templates.by_agent == {"agent_big": "large", "agent_huge": "large", "agent_small": "small"}


def test_empty_object_is_only_the_default() -> None:
    assert parse({}, BASE) == Templates({"default": BASE}, {})


def test_unknown_fields_and_bad_types_are_reported_together() -> None:
    """Every problem of every template in one ConfigError, not the first one found."""
    raw = {
        "typo": {"imag": "x", "runtimeClass": "gvisor"},
        "not_an_object": ["image", "x"],
        "bad_resources": {"resources": "2 cpus"},
        "bad_persistence": {"workspacePersistence": True},
        "bad_deadline": {"activeDeadlineSeconds": "a day"},
        "fine": {"image": "ok"},
    }
    with pytest.raises(ConfigError) as caught:
        parse(raw, BASE)
    problems = caught.value.problems
    assert len(problems) == 5, problems
    joined = "\n".join(problems)
    assert "'typo' has unknown fields: imag, runtimeClass" in joined
    assert "'not_an_object' must be an object" in joined
    assert "'bad_resources'" in joined and "resources" in joined
    assert "'bad_persistence'" in joined and "workspacePersistence" in joined
    assert "'bad_deadline'" in joined
    assert "'fine'" not in joined


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("codexSandbox", "false"),  # bool("false") is True: would silently unconfine seccomp
        ("imagePullSecrets", "regcred"),  # a string would become one secret per character
        ("agentIds", "agent_1"),  # likewise one agent id per character
        ("agentIds", 5),
        ("tolerations", {"key": "x"}),
        ("nodeSelector", ["pool"]),
        ("image", 5),
        ("workspacePersistence", {"enabled": "no"}),
        ("httpsProxy", ["http://proxy:3128"]),
        ("noProxy", [".svc"]),
    ],
)
def test_wrongly_typed_fields_are_config_errors(field: str, value: Any) -> None:
    """A value of the wrong JSON type is reported (ConfigError), never coerced into something else."""
    with pytest.raises(ConfigError) as caught:
        parse({"t": {field: value}}, BASE)
    assert any("'t'" in p and field in p for p in caught.value.problems), caught.value.problems


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("proxy:3128", "httpsProxy must be http(s)://host[:port]"),
        ("socks5://proxy:1080", "httpsProxy must be http(s)://host[:port]"),
        ("http://proxy:3128/path", "httpsProxy must be http(s)://host[:port]"),
        ("http://user:pass@proxy:3128", "must not carry credentials"),
    ],
)
def test_a_bad_https_proxy_is_a_config_error(url: str, problem: str) -> None:
    """The proxy is a URL codex and curl understand, and never holds a password (pod specs are readable)."""
    with pytest.raises(ConfigError) as caught:
        parse({"t": {"httpsProxy": url}}, BASE)
    assert any(problem in p for p in caught.value.problems), caught.value.problems
    assert all("pass" not in p for p in caught.value.problems)


def test_top_level_must_be_an_object() -> None:
    for raw in ([], "x", None, 3):
        with pytest.raises(ConfigError):
            parse(raw, BASE)


# --- load ----------------------------------------------------------------------------------


def test_load_without_a_file_is_only_the_base() -> None:
    for path in (None, ""):
        templates = load(path, BASE)
        assert templates == Templates({"default": BASE}, {})
        assert templates.get(None) is BASE


def test_load_reads_the_chart_file(tmp_path: Path) -> None:
    path = tmp_path / "templates.json"
    path.write_text(CHART_JSON, encoding="utf-8")
    assert load(str(path), BASE) == chart_templates()


def test_load_of_an_empty_file_is_only_the_base(tmp_path: Path) -> None:
    path = tmp_path / "templates.json"
    path.write_text("", encoding="utf-8")
    assert load(str(path), BASE) == Templates({"default": BASE}, {})


def test_load_of_a_missing_or_broken_file_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    for path in (tmp_path / "absent.json", broken):
        with pytest.raises(ConfigError) as caught:
            load(str(path), BASE)
        (problem,) = caught.value.problems
        assert "CONTROLLER_KUBERNETES_TEMPLATES_FILE" in problem and str(path) in problem


def test_file_may_override_default(tmp_path: Path) -> None:
    """The file's ``default`` replaces the base (on top of it), and is what unmatched sessions get."""
    path = tmp_path / "templates.json"
    path.write_text(json.dumps({"default": {"image": "runner:2", "activeDeadlineSeconds": 3600}}), encoding="utf-8")
    templates = load(str(path), BASE)
    expected = replace(BASE, image="runner:2", active_deadline_seconds=3600)
    assert templates.by_name == {"default": expected}
    assert templates.get(templates.choose(make_session())) == expected
    assert templates.get("nope") == expected


# --- choose / get --------------------------------------------------------------------------


def test_choose_by_metadata_key() -> None:
    """The metadata key ``sandbox_template`` names the template, ahead of the agent id."""
    templates = chart_templates()
    assert METADATA_KEY == "sandbox_template"
    session = make_session(agent_id="agent_big", metadata={"sandbox_template": "small"})
    assert templates.choose(session) == "small"
    assert templates.get(templates.choose(session)).name == "small"


def test_choose_by_agent_id() -> None:
    templates = chart_templates()
    assert templates.choose(make_session(agent_id="agent_big")) == "large"
    assert templates.choose(make_session(agent_id="agent_small")) == "small"
    assert templates.choose(make_session(agent_id="agent_huge")) == "large"


def test_choose_falls_back_to_default() -> None:
    templates = chart_templates()
    assert templates.choose(make_session(agent_id="agent_other")) == "default"
    assert templates.choose(make_session(agent_id=None)) == "default"
    assert templates.choose(make_session(agent_id=None, metadata={"other": "large"})) == "default"


def test_unknown_template_name_falls_back_rather_than_refusing() -> None:
    """An unknown name never blocks a start: the agent's template, else ``default``."""
    templates = chart_templates()
    unknown = make_session(agent_id=None, metadata={"sandbox_template": "does-not-exist"})
    assert templates.choose(unknown) == "default"
    assert templates.get("does-not-exist") is BASE
    assert templates.get(None) is BASE
    assert templates.get("") is BASE
    by_agent = make_session(agent_id="agent_small", metadata={"sandbox_template": "does-not-exist"})
    assert templates.choose(by_agent) == "small"


def test_a_localhost_seccomp_profile_is_read_and_checked() -> None:
    """seccompProfile names a profile under the kubelet's seccomp directory (Codex's own sandbox
    within "restricted"); an absolute path, a `..`, or the combination with codexSandbox (which
    takes seccomp off) is refused."""
    parsed = parse({"codex": {"seccompProfile": "sandbox-controller/codex-sandbox.json"}}, BASE)
    assert parsed.by_name["codex"].seccomp_profile == "sandbox-controller/codex-sandbox.json"
    assert parsed.by_name["default"].seccomp_profile is None
    for bad, problem in (
        ({"seccompProfile": "/etc/x.json"}, "under the kubelet's seccomp directory"),
        ({"seccompProfile": "../x.json"}, "under the kubelet's seccomp directory"),
        ({"seccompProfile": "a.json", "codexSandbox": True}, "cannot be used with codexSandbox"),
        ({"seccompProfile": 5}, "seccompProfile must be a string or null"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse({"t": bad}, BASE)
        assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_host_users_is_inherited_from_the_default_template_and_overridden_per_template() -> None:
    """A cluster with user namespaces (the default template's ``host_users=False``, from
    CONTROLLER_KUBERNETES_USER_NAMESPACES) gives them to every template that does not say
    otherwise; ``hostUsers`` sets a template apart either way; codexSandbox, which needs its own
    user namespace, refuses ``hostUsers: true``; a string is not a flag."""
    raw = {"plain": {}, "shared": {"hostUsers": True}, "own": {"hostUsers": False}, "codex": {"codexSandbox": True}}
    on = parse(raw, replace(BASE, host_users=False)).by_name
    assert {name: t.host_users for name, t in on.items()} == {
        "default": False, "plain": False, "shared": True, "own": False, "codex": False,
    }  # fmt: skip
    off = parse(raw, BASE).by_name
    assert {name: t.host_users for name, t in off.items()} == {
        "default": True, "plain": True, "shared": True, "own": False, "codex": True,
    }  # fmt: skip
    for bad, problem in (
        ({"hostUsers": True, "codexSandbox": True}, "cannot be used with codexSandbox"),
        ({"hostUsers": "false"}, "hostUsers must be true or false, got a string"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse({"t": bad}, BASE)
        assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_the_user_namespaces_setting_reaches_the_default_template() -> None:
    """CONTROLLER_KUBERNETES_USER_NAMESPACES=true: the default template (the base of every other)
    has its own user namespace; unset, it shares the node's."""
    from controller.config import Settings
    from controller.wiring import sandbox_templates

    env = {"CONTROLLER_RUNNER": "kubernetes"}
    assert sandbox_templates(Settings.from_env(env)).get(None).host_users is True
    on = Settings.from_env({**env, "CONTROLLER_KUBERNETES_USER_NAMESPACES": "true"})
    assert on.kubernetes.user_namespaces is True
    assert sandbox_templates(on).get(None).host_users is False


def test_suspend_checkpoint_is_read_and_needs_the_workspace_claim() -> None:
    """Issue 40: ``suspend: checkpoint`` turns suspend with memory on for the template; without
    workspace persistence it is refused (the restored sandbox needs its files, and its checkpoint
    image is bound to the claim); any other word is refused."""
    persistent = {"workspacePersistence": {"enabled": True}}
    templates = parse({"c": {**persistent, "suspend": "checkpoint"}, "s": {**persistent, "suspend": "stop"}}, BASE)
    assert templates.get("c").checkpoint_idle and not templates.get("s").checkpoint_idle
    assert not templates.get("default").checkpoint_idle
    for fields, problem in (
        ({"suspend": "checkpoint"}, "needs workspacePersistence"),
        ({**persistent, "suspend": "freeze"}, "suspend must be checkpoint or stop"),
        ({**persistent, "suspend": True}, "suspend must be a string"),
    ):
        with pytest.raises(ConfigError) as caught:
            parse({"t": fields}, BASE)
        assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_annotations_are_strings_outside_the_controllers_and_kubernetes_domains() -> None:
    assert parse({"t": {"annotations": {"example.com/team": "a", "plain": "b"}}}, BASE).get("t").annotations == {
        "example.com/team": "a",
        "plain": "b",
    }
    for key in (
        "sandbox-controller.dev/session-id",
        "sandbox-controller.dev/checkpoint",
        "kubernetes.io/x",
        "node.kubernetes.io/x",
        "k8s.io/x",
    ):
        with pytest.raises(ConfigError) as caught:
            parse({"t": {"annotations": {key: "v"}}}, BASE)
        assert any("reserved" in p for p in caught.value.problems), (key, caught.value.problems)
    with pytest.raises(ConfigError) as caught:
        parse({"t": {"annotations": {"example.com/n": 1}}}, BASE)
    assert any("must be a string" in p for p in caught.value.problems)
