"""``Settings.from_env``: typed, all problems at once, secrets masked, ``_FILE`` variants."""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path

import pytest

from controller.config import BOUNDS, KEYS, PREFIX, ReceiverSettings, Secret, Settings, read_by
from controller.credentials import mask_credentials
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
        f"{PREFIX}FULL_SWEEP_INTERVAL_SECONDS must be at least 1, got '0.5'",
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
    s = Settings.from_env(env(WEBHOOK_SECRETS=f"{WHSEC},a-plain-secret-of-24-bytes,,"))
    assert s.webhook.secrets == (Secret(WHSEC), Secret("a-plain-secret-of-24-bytes"))
    problems = problems_of(env(WEBHOOK_SECRETS=f"{WHSEC},whsec_%%%,whsec_abc"))
    assert problems == [
        f"{PREFIX}WEBHOOK_SECRETS: secret #2 starts with whsec_ but is not base64",
        f"{PREFIX}WEBHOOK_SECRETS: secret #3 starts with whsec_ but is not base64",
    ]


@pytest.mark.parametrize(
    "short", ["whsec_", "wh", "whsec_" + base64.b64encode(b"a sixteen-byte k").decode(), "a-plain-secret-23-bytes"]
)
def test_a_short_webhook_secret_is_refused_naming_the_setting(tmp_path: Path, short: str) -> None:
    """L3: a webhook secret with fewer than 24 bytes of key material (``whsec_`` alone is an
    empty HMAC key: forged deliveries would pass) is refused, directly or from a file; the
    problem names the setting and the position, never the value."""
    [problem] = problems_of(env(WEBHOOK_SECRETS=f"{WHSEC},{short}"))
    assert problem.startswith(f"{PREFIX}WEBHOOK_SECRETS: secret #2 has fewer than 24 bytes of key material")
    assert len(short) <= 6 or short.removeprefix("whsec_") not in problem
    path = tmp_path / "secrets"
    path.write_text(short + "\n")
    [problem] = problems_of(env(WEBHOOK_SECRETS_FILE=str(path)))
    assert problem.startswith(f"{PREFIX}WEBHOOK_SECRETS_FILE: secret #1 has fewer than 24 bytes")


def test_a_secret_file_that_is_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    """L3: a FIFO at a ``…_FILE`` path would block the reader until something writes to it:
    it is refused at once, as is a directory, each named."""
    fifo, directory = tmp_path / "fifo", tmp_path / "directory"
    os.mkfifo(fifo)
    directory.mkdir()
    found: list[list[str]] = []
    reader = threading.Thread(
        target=lambda: found.append(problems_of(env(WEBHOOK_SECRETS_FILE=str(fifo), API_KEY_FILE=str(directory)))),
        daemon=True,
    )
    reader.start()
    reader.join(5)
    assert found, "reading the settings blocked on the FIFO"
    assert sorted(found[0]) == [
        f"{PREFIX}API_KEY_FILE: cannot read {directory}: is a directory, not a regular file",
        f"{PREFIX}WEBHOOK_SECRETS_FILE: cannot read {fifo}: is a FIFO, not a regular file",
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
        ("redis://:p?w/d@host", "redis://:***@host"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://token@host", "redis://***@host"),  # a lone userinfo may be a token
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("unix:///run/redis.sock?db=0&password=pw", "unix:///run/redis.sock?db=0&password=***"),
        ("redis://host/0?socket_timeout=5&Password=pw", "redis://host/0?socket_timeout=5&Password=***"),
        ("https://user:pw@api.example.com/v1", "https://user:***@api.example.com/v1"),
        ("https://api.example.com/v1?api_key=k&x=1", "https://api.example.com/v1?api_key=***&x=1"),
        ("not a url", "not a url"),
        ("team=a", "team=a"),
    ],
)
def test_mask_credentials(url: str, masked: str) -> None:
    """Every credential form a URL setting can carry is masked: userinfo (password, or a lone
    token), and query parameters named like a credential (redis-py's ``?password=``)."""
    assert mask_credentials(url) == masked


def test_check_config_output_masks_every_credential_form_of_every_setting() -> None:
    """L2: a Redis password given as ``?password=`` (redis-py's form for unix sockets) and
    userinfo in CONTROLLER_API_BASE_URL are masked in ``describe`` (what `check-config` prints),
    in ``repr`` and handed to the log formatter to redact."""
    environ = {
        **full_env(),
        **env(
            REDIS_URL=f"unix:///run/redis/redis.sock?db=0&password={REDIS_PASSWORD}",
            API_BASE_URL="https://operator:basic-auth-pass-77@api.internal.example",
        ),
    }
    s = Settings.from_env(environ)
    shown = json.dumps(s.describe()) + repr(s) + str(s)
    assert REDIS_PASSWORD not in shown and "basic-auth-pass-77" not in shown
    assert s.describe()["queue"]["redis_url"] == "unix:///run/redis/redis.sock?db=0&password=***"
    assert s.describe()["api"]["base_url"] == "https://operator:***@api.internal.example"
    assert {REDIS_PASSWORD, "basic-auth-pass-77", API_KEY, EXECUTOR_KEY, WHSEC} <= set(s.secret_values())


def test_every_number_has_a_maximum() -> None:
    """A number past its documented maximum is refused (``1e20`` seconds passed before and broke
    every delivery with 503); every numeric setting has one, and its default lies within."""
    assert len(BOUNDS) >= 20
    for name, (minimum, maximum) in BOUNDS.items():
        assert minimum < maximum < 1e9, name
    problems = problems_of(
        env(
            WEBHOOK_DEDUP_TTL_SECONDS="100000000000000000000",
            IDLE_TIMEOUT_SECONDS="1e20",
            METRICS_PORT="70000",
            LEASE_TTL_SECONDS="86400",
        )
    )
    assert problems == [
        f"{PREFIX}WEBHOOK_DEDUP_TTL_SECONDS must be at most 2592000, got '100000000000000000000'",
        f"{PREFIX}LEASE_TTL_SECONDS must be at most 3600, got '86400'",
        f"{PREFIX}IDLE_TIMEOUT_SECONDS must be at most 2592000, got '1e20'",
        f"{PREFIX}METRICS_PORT must be at most 65535, got '70000'",
    ]
    at_the_bounds = {name: str(maximum) for name, (_, maximum) in BOUNDS.items()}
    Settings.from_env(at_the_bounds)  # the maximum itself is allowed


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
        assert read_by(environ) == KEYS
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


def test_executor_uid_ranges_are_parsed_and_checked() -> None:
    """L2: CONTROLLER_LOCAL_EXECUTOR_UIDS is FIRST-LAST, never uid 0 nor (uid_t)-1, and is one
    way of naming the executors' identity: not together with a user or the same-user opt-in."""
    assert Settings.from_env({}).runner.local_executor_uids is None
    assert Settings.from_env(env(LOCAL_EXECUTOR_UIDS=" 200000-299999 ")).runner.local_executor_uids == (200000, 299999)
    assert Settings.from_env(env(LOCAL_EXECUTOR_UIDS="7-7")).runner.local_executor_uids == (7, 7)
    for raw in ("200000", "a-b", "-5", "10-"):
        assert problems_of(env(LOCAL_EXECUTOR_UIDS=raw)) == [
            f"{PREFIX}LOCAL_EXECUTOR_UIDS must look like FIRST-LAST (e.g. 200000-299999), got {raw!r}"
        ]
    for raw in ("0-10", "10-5", "1-4294967295"):
        assert problems_of(env(LOCAL_EXECUTOR_UIDS=raw)) == [
            f"{PREFIX}LOCAL_EXECUTOR_UIDS must satisfy 1 <= FIRST <= LAST <= 4294967294, got {raw!r}"
        ]
    assert problems_of(env(LOCAL_EXECUTOR_UIDS="200000-200009", LOCAL_EXECUTOR_SAME_USER="true")) == [
        f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_SAME_USER=true, not both"
    ]
    assert problems_of(env(LOCAL_EXECUTOR_UIDS="200000-200009", LOCAL_EXECUTOR_USER="sandbox")) == [
        f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_USER, not both"
    ]


def test_the_executor_command_must_split_as_a_command_line() -> None:
    """CONTROLLER_EXECUTOR_COMMAND is split as the runner splits it: a line that does not split
    is a problem at start, not a traceback in every task."""
    assert Settings.from_env(env(EXECUTOR_COMMAND="/opt/codex/bin/codex --flag")).runner.executor_command == (
        "/opt/codex/bin/codex --flag"
    )
    assert problems_of(env(EXECUTOR_COMMAND="'x")) == [
        f"{PREFIX}EXECUTOR_COMMAND is not a command line (No closing quotation)"
    ]
    assert problems_of(env(EXECUTOR_COMMAND="''")) == [
        f"{PREFIX}EXECUTOR_COMMAND is not a command line (it names no program)"
    ]


def test_a_redis_password_is_found_in_either_form() -> None:
    """L2: the local runner's check that Redis takes a password reads both of its URL forms."""
    for url, has in (
        ("redis://:pw@h:6379/0", True),
        ("redis://user:pw@h/0", True),
        ("unix:///run/redis.sock?password=pw", True),
        ("redis://user@h/0", False),
        ("redis://h:6379/0", False),
        ("unix:///run/redis.sock?db=0", False),
        ("redis://:@h/0", False),
    ):
        assert Settings.from_env(env(REDIS_URL=url)).queue.redis_password_set is has, url


SENTINEL_PASSWORD = "sentinel-pass-77abc"


def test_redis_sentinel_settings_are_parsed() -> None:
    """With sentinels the URL gives password and database and its host names the master."""
    s = Settings.from_env(
        {
            **full_env(),
            **env(
                REDIS_URL=f"redis://:{REDIS_PASSWORD}@MyMaster/2",
                REDIS_SENTINELS="10.0.0.1:26379, sentinel-b.internal:26380,[fd00::3]:26381",
                REDIS_SENTINEL_PASSWORD=SENTINEL_PASSWORD,
            ),
        }
    )
    q = s.queue
    assert q.redis_sentinels == (("10.0.0.1", 26379), ("sentinel-b.internal", 26380), ("fd00::3", 26381))
    assert q.redis_sentinel_master == "MyMaster"  # as written: Sentinel's names are case-sensitive
    assert q.redis_sentinel_password == Secret(SENTINEL_PASSWORD)
    named = Settings.from_env({**full_env(), **env(REDIS_SENTINELS="s:26379", REDIS_SENTINEL_MASTER="redis.internal")})
    assert named.queue.redis_sentinel_master == "redis.internal"  # the same name the URL gives


def test_the_sentinel_password_comes_from_a_file_and_is_masked(tmp_path: Path) -> None:
    (tmp_path / "sentinel").write_text(SENTINEL_PASSWORD + "\n")
    s = Settings.from_env(
        {
            **full_env(),
            **env(REDIS_SENTINELS="s:26379", REDIS_SENTINEL_PASSWORD_FILE=str(tmp_path / "sentinel")),
        }
    )
    assert s.queue.redis_sentinel_password == Secret(SENTINEL_PASSWORD)
    shown = json.dumps(s.describe()) + repr(s)
    assert SENTINEL_PASSWORD not in shown and REDIS_PASSWORD not in shown
    assert s.describe()["queue"]["redis_sentinel_password"] == "Secret('**********')"


def test_redis_tls_ca_file_is_parsed(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = Settings.from_env({**full_env(), **env(REDIS_URL="rediss://:pw@redis.internal:6380/0", REDIS_CA_FILE=str(ca))})
    assert s.queue.redis_ca_file == str(ca)


def test_redis_connection_problems_are_reported_together(tmp_path: Path) -> None:
    problems = problems_of(
        {
            **full_env(),
            **env(
                REDIS_URL="redis://:pw@mymaster/0",
                REDIS_SENTINELS="good:26379, no-port, bad:port, far:70000",
                REDIS_SENTINEL_MASTER="othermaster",
                REDIS_CA_FILE=str(tmp_path / "missing.pem"),
            ),
        }
    )
    assert problems == [
        f"{PREFIX}REDIS_SENTINELS: 'no-port' is not host:port",
        f"{PREFIX}REDIS_SENTINELS: 'bad:port' is not host:port",
        f"{PREFIX}REDIS_SENTINELS: 'far:70000' is not host:port",
        f"{PREFIX}REDIS_SENTINEL_MASTER is 'othermaster' but {PREFIX}REDIS_URL names 'mymaster': with sentinels "
        "the URL's host is the master's name (they must agree)",
        f"{PREFIX}REDIS_CA_FILE is for TLS: {PREFIX}REDIS_URL must be a rediss:// URL",
        f"{PREFIX}REDIS_CA_FILE: cannot read {tmp_path / 'missing.pem'}: No such file or directory",
    ]
    assert problems_of({**full_env(), **env(REDIS_SENTINEL_MASTER="m", REDIS_SENTINEL_PASSWORD="p")}) == [
        f"{PREFIX}REDIS_SENTINEL_MASTER and {PREFIX}REDIS_SENTINEL_PASSWORD need {PREFIX}REDIS_SENTINELS"
    ]
    assert problems_of({**full_env(), **env(REDIS_URL="unix:///run/redis.sock", REDIS_SENTINELS="s:26379")}) == [
        f"{PREFIX}REDIS_SENTINELS needs a redis:// or rediss:// {PREFIX}REDIS_URL"
    ]
