"""``Settings.from_env``: typed, all problems at once, secrets masked, ``_FILE`` variants."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from controller.config import KEYS, PREFIX, ReceiverSettings, Secret, Settings, _Parser, mask_url
from controller.errors import ConfigError

WHSEC = "whsec_" + base64.b64encode(b"a webhook signing secret, 32 by").decode()
WHSEC_NEXT = "whsec_" + base64.b64encode(b"the next signing secret, 32 byt").decode()
API_KEY = "sk-controller-0123456789abcdef"
EXECUTOR_KEY = "envkey-restricted-fedcba9876543210"
REDIS_PASSWORD = "redis-pass-42xyz"


def env(**values: str) -> dict[str, str]:
    return {PREFIX + k: v for k, v in values.items()}


def full_env() -> dict[str, str]:
    return env(
        REDIS_URL=f"redis://:{REDIS_PASSWORD}@redis.internal:6379/0",
        WEBHOOK_SECRETS=f"{WHSEC}, {WHSEC_NEXT}",
        API_KEY=API_KEY,
        EXECUTOR_KEY=EXECUTOR_KEY,
    )


def problems_of(environ: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(environ)
    return raised.value.problems


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.api.api_key is None and settings.webhook.secrets == ()
    assert settings.routing.workspace_directory == "/workspace"


def test_a_full_environment_is_parsed_and_typed() -> None:
    environ = {
        **full_env(),
        **env(
            WEBHOOK_TOLERANCE_SECONDS="120",
            API_BASE_URL="http://sim.local:8080/",
            API_TIMEOUT_SECONDS="2.5",
            AGENT_IDS="agent_1, agent_2,,",
            ROUTE_METADATA="team = a=b",
            WORKSPACE_DIRECTORY="/srv/ws",
            RUNNER="Kubernetes",
            LOG_LEVEL="debug",
            LEASE_TTL_SECONDS="5",
            IDLE_TIMEOUT_SECONDS="0",
            PRESTART_AGENT_IDS="agent_2, *",
        ),
        "OTHER_VARIABLE": "ignored",
    }
    s = Settings.from_env(environ)
    assert s.webhook.secrets == (Secret(WHSEC), Secret(WHSEC_NEXT))
    assert s.webhook.tolerance_seconds == 120
    assert s.api.base_url == "http://sim.local:8080"
    assert s.api.api_key == Secret(API_KEY) and s.api.timeout_seconds == 2.5
    assert s.runner.executor_key is not None and s.runner.executor_key.reveal() == EXECUTOR_KEY
    assert s.routing.agent_ids == ("agent_1", "agent_2")
    assert (s.routing.metadata_key, s.routing.metadata_value) == ("team", "a=b")
    assert s.routing.workspace_directory == "/srv/ws"
    assert s.runner.kind == "kubernetes" and s.log_level == "DEBUG"
    assert s.queue.lease_ttl_seconds == 5.0 and s.lifecycle.idle_timeout_seconds == 0.0
    assert s.lifecycle.prestart_agent_ids == ("agent_2", "*") and s.lifecycle.prestarts


def test_the_full_sweep_interval_and_the_pod_watch_are_parsed() -> None:
    """L17: the full sweep's cadence (hourly by default) and the pod watch (on by default)."""
    defaults = Settings.from_env({})
    assert defaults.lifecycle.full_sweep_interval_seconds == 3600.0 and defaults.kubernetes.watch_pods is True
    s = Settings.from_env(env(FULL_SWEEP_INTERVAL_SECONDS="600", KUBERNETES_WATCH_PODS="false"))
    assert s.lifecycle.full_sweep_interval_seconds == 600.0 and s.kubernetes.watch_pods is False
    problems = problems_of(env(FULL_SWEEP_INTERVAL_SECONDS="0.5", KUBERNETES_WATCH_PODS="sometimes"))
    assert problems == [
        f"{PREFIX}KUBERNETES_WATCH_PODS must be true or false, got 'sometimes'",
        f"{PREFIX}FULL_SWEEP_INTERVAL_SECONDS must be at least 1.0, got '0.5'",
    ]


def test_the_ca_bundle_configmap_is_an_object_name() -> None:
    """Unset by default (the image's own CAs); a ConfigMap name when given; one problem for a
    name Kubernetes would refuse (said at start-up, not at the first pod)."""
    assert Settings.from_env({}).kubernetes.ca_bundle_configmap is None
    s = Settings.from_env(env(KUBERNETES_CA_BUNDLE_CONFIGMAP="proxy-ca.v2"))
    assert s.kubernetes.ca_bundle_configmap == "proxy-ca.v2"
    assert problems_of(env(KUBERNETES_CA_BUNDLE_CONFIGMAP="Proxy_CA")) == [
        f"{PREFIX}KUBERNETES_CA_BUNDLE_CONFIGMAP must be a Kubernetes object name "
        "(lower-case letters, digits, '-', '.'), got 'Proxy_CA'"
    ]


def test_receiver_limits_are_parsed() -> None:
    """The receiver's limits: defaults, values, and a problem for each nonsense value."""
    assert Settings.from_env({}).receiver == ReceiverSettings(
        max_connections=400, max_header_bytes=16384, header_timeout_seconds=10.0
    )
    assert Settings.from_env({}).webhook.body_timeout_seconds == 10.0
    assert Settings.from_env({}).webhook.max_in_flight == 100
    s = Settings.from_env(
        env(
            RECEIVER_MAX_CONNECTIONS="50",
            RECEIVER_MAX_HEADER_BYTES="8192",
            RECEIVER_HEADER_TIMEOUT_SECONDS="2.5",
            WEBHOOK_BODY_TIMEOUT_SECONDS="4",
            WEBHOOK_MAX_IN_FLIGHT="20",
        )
    )
    assert s.receiver == ReceiverSettings(max_connections=50, max_header_bytes=8192, header_timeout_seconds=2.5)
    assert s.webhook.body_timeout_seconds == 4.0
    assert s.webhook.max_in_flight == 20
    problems = problems_of(
        env(
            RECEIVER_MAX_CONNECTIONS="0",
            RECEIVER_MAX_HEADER_BYTES="100",
            RECEIVER_HEADER_TIMEOUT_SECONDS="never",
            WEBHOOK_BODY_TIMEOUT_SECONDS="inf",
            WEBHOOK_MAX_IN_FLIGHT="0",
        )
    )
    assert problems == [
        f"{PREFIX}WEBHOOK_BODY_TIMEOUT_SECONDS must be a number, got 'inf'",
        f"{PREFIX}WEBHOOK_MAX_IN_FLIGHT must be at least 1, got '0'",
        f"{PREFIX}RECEIVER_MAX_CONNECTIONS must be at least 1, got '0'",
        f"{PREFIX}RECEIVER_MAX_HEADER_BYTES must be at least 1024, got '100'",
        f"{PREFIX}RECEIVER_HEADER_TIMEOUT_SECONDS must be a number, got 'never'",
    ]


def test_every_problem_is_reported_together() -> None:
    problems = problems_of(
        env(
            REDIS_URL="http://not-redis",
            WEBHOOK_TOLERANCE_SECONDS="soon",
            API_TIMEOUT_SECONDS="0",
            API_MAX_ATTEMPTS="1.5",
            API_BASE_URL="ftp://x",
            WORKSPACE_DIRECTORY="relative/dir",
            RUNNER="docker",
            LOG_LEVEL="chatty",
            ROUTE_METADATA="no-equals-sign",
            LEASE_TTL_SECONDS="0.1",
            WEBHOOK_SECRETS="whsec_***not-base64***",
            IDEL_TIMEOUT_SECONDS="5",
        )
    )
    text = "\n".join(problems)
    for name in (
        "REDIS_URL",
        "WEBHOOK_TOLERANCE_SECONDS",
        "API_TIMEOUT_SECONDS",
        "API_MAX_ATTEMPTS",
        "API_BASE_URL",
        "WORKSPACE_DIRECTORY",
        "RUNNER",
        "LOG_LEVEL",
        "ROUTE_METADATA",
        "LEASE_TTL_SECONDS",
        "WEBHOOK_SECRETS",
        "IDEL_TIMEOUT_SECONDS",
    ):
        assert PREFIX + name in text, name
    assert len(problems) == 12
    assert "***not-base64***" not in text  # a bad secret is not echoed


def test_unknown_controller_key_is_rejected() -> None:
    problems = problems_of({**full_env(), PREFIX + "API_KYE": "typo"})
    assert problems == [f"{PREFIX}API_KYE is not a known setting (typo?)"]


def test_secrets_from_files(tmp_path: Path) -> None:
    """L2: secrets may come from mounted files; trailing newlines are stripped."""
    files = {
        "WEBHOOK_SECRETS": f"{WHSEC}\n{WHSEC_NEXT}\n",
        "API_KEY": API_KEY + "\n",
        "EXECUTOR_KEY": EXECUTOR_KEY,
    }
    environ = {}
    for name, content in files.items():
        path = tmp_path / name.lower()
        path.write_text(content)
        environ[f"{PREFIX}{name}_FILE"] = str(path)
    s = Settings.from_env(environ)
    assert s.webhook.secrets == (Secret(WHSEC), Secret(WHSEC_NEXT))
    assert s.api.api_key == Secret(API_KEY)
    assert s.runner.executor_key == Secret(EXECUTOR_KEY)


def test_secret_file_problems(tmp_path: Path) -> None:
    both = tmp_path / "api_key"
    both.write_text(API_KEY)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    environ = env(
        API_KEY=API_KEY,
        API_KEY_FILE=str(both),
        EXECUTOR_KEY_FILE=str(tmp_path / "missing"),
        WEBHOOK_SECRETS_FILE=str(empty),
    )
    problems = problems_of(environ)
    assert f"set {PREFIX}API_KEY or {PREFIX}API_KEY_FILE, not both" in problems
    assert any(p.startswith(f"{PREFIX}EXECUTOR_KEY_FILE: cannot read") for p in problems)
    assert len(problems) == 2  # an empty secrets file is simply "not set"
    assert API_KEY not in "\n".join(problems)


def test_webhook_secret_validation() -> None:
    """L3: whsec_ secrets must be base64; other secrets are used as raw bytes."""
    s = Settings.from_env(env(WEBHOOK_SECRETS=f"{WHSEC},plain-secret,,"))
    assert s.webhook.secrets == (Secret(WHSEC), Secret("plain-secret"))
    problems = problems_of(env(WEBHOOK_SECRETS=f"{WHSEC},whsec_%%%,whsec_abc"))
    assert problems == [
        f"{PREFIX}WEBHOOK_SECRETS: secret #2 starts with whsec_ but is not base64",
        f"{PREFIX}WEBHOOK_SECRETS: secret #3 starts with whsec_ but is not base64",
    ]


def test_executor_key_equal_to_api_key_is_rejected() -> None:
    """L2: the executor's key must be a separate, restricted key, never the controller's own."""
    problems = problems_of(env(API_KEY=API_KEY, EXECUTOR_KEY=API_KEY))
    assert len(problems) == 1 and "(L2)" in problems[0]
    assert API_KEY not in problems[0]


def test_secrets_are_masked_in_describe_and_repr() -> None:
    """L2: printing the settings never shows a secret or the Redis password."""
    s = Settings.from_env(full_env())
    described = json.dumps(s.describe())
    shown = described + repr(s) + str(s)
    for secret in (API_KEY, EXECUTOR_KEY, WHSEC, WHSEC_NEXT, REDIS_PASSWORD):
        assert secret not in shown
    d = s.describe()
    assert d["api"]["api_key"] == "Secret('**********')"
    assert d["webhook"]["secrets"] == ["Secret('**********')"] * 2
    assert d["queue"]["redis_url"] == "redis://:***@redis.internal:6379/0"
    assert repr(Secret(API_KEY)) == str(Secret(API_KEY)) == "Secret('**********')"
    assert f"{Secret(API_KEY)}" == "Secret('**********')"
    assert Secret(API_KEY).reveal() == API_KEY


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:pw@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:pw@host/1", "redis://user:***@host/1"),
        ("rediss://user:p@ss:w@rd@host:6380", "rediss://user:***@host:6380"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host", "redis://user@host"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("not a url", "not a url"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    ("role", "needs"),
    [
        ("serve", {"REDIS_URL", "WEBHOOK_SECRETS"}),
        ("worker", {"REDIS_URL", "API_KEY", "EXECUTOR_KEY"}),
        ("dev", {"WEBHOOK_SECRETS", "API_KEY", "EXECUTOR_KEY"}),
    ],
)
def test_require_lists_every_gap_for_a_role(role: str, needs: set[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({}).require(role)
    problems = raised.value.problems
    assert len(problems) == len(needs)
    for name in needs:
        assert any(p.startswith(PREFIX + name + " ") for p in problems), name
    Settings.from_env(full_env()).require(role)  # everything set: no problem


def test_keys_are_all_prefixed_and_read() -> None:
    """Every known key is accepted (none is reported as unknown)."""
    assert all(k.startswith(PREFIX) for k in KEYS)
    harmless = {k: "" for k in KEYS}
    assert Settings.from_env(harmless) == Settings()


def test_keys_are_the_names_the_parser_reads_whatever_the_environment() -> None:
    """``KEYS`` comes from a parse; a parse of any other environment reads the very same names."""
    for environ in ({}, full_env(), {k: "" for k in KEYS}, env(RUNNER="kubernetes", API_KEY_FILE="/nonexistent")):
        parser = _Parser(environ)
        parser.parse()
        assert parser.read == KEYS
    assert problems_of(env(REDIS_URLL="redis://x")) == [f"{PREFIX}REDIS_URLL is not a known setting (typo?)"]


@pytest.mark.parametrize("raw", ["nan", "inf", "Infinity", "1e999"])
def test_non_finite_numbers_are_rejected(raw: str) -> None:
    """nan/inf would slip past the minimum check and fail later (e.g. the lease TTL in milliseconds)."""
    problems = problems_of(env(LEASE_TTL_SECONDS=raw, API_TIMEOUT_SECONDS=raw))
    assert sorted(problems) == [
        f"{PREFIX}API_TIMEOUT_SECONDS must be a number, got {raw!r}",
        f"{PREFIX}LEASE_TTL_SECONDS must be a number, got {raw!r}",
    ]


def test_local_executor_user_settings() -> None:
    """L2: executors run as `nobody` unless told otherwise; running them as the worker's own
    uid is an explicit opt-in, spelled true/false."""
    runner = Settings.from_env({}).runner
    assert (runner.local_executor_user, runner.local_executor_same_user) == ("nobody", False)
    runner = Settings.from_env(env(LOCAL_EXECUTOR_USER="sandbox", LOCAL_EXECUTOR_SAME_USER="true")).runner
    assert (runner.local_executor_user, runner.local_executor_same_user) == ("sandbox", True)
    assert Settings.from_env(env(LOCAL_EXECUTOR_SAME_USER="no")).runner.local_executor_same_user is False
    assert problems_of(env(LOCAL_EXECUTOR_SAME_USER="maybe")) == [
        f"{PREFIX}LOCAL_EXECUTOR_SAME_USER must be true or false, got 'maybe'"
    ]
