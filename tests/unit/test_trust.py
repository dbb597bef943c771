"""Only trusted destinations get the executor key (controller/trust.py), and where it is checked:
``decide``/``work`` (lifecycle), ``classify`` (receiver), ``checked`` (runners), the settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller import trust
from controller.config import PREFIX, Settings
from controller.decide import Decision, Verdict, decide
from controller.errors import ConfigError, RunnerRejected
from controller.events import MALFORMED_SESSION_ID, classify, parse
from controller.lifecycle import Routing
from controller.model import Handle, Health, Record, SandboxSpec, Session, SessionStatus
from controller.runners.base import checked
from controller.runners.local import LocalRunner
from controller.trust import DEFAULT_POLICY, Policy, pattern_problem, remote_url_problem, spec_problem, untrusted
from tests.support.deliveries import envelope
from tests.support.fakes import World, make_session

LOOPBACK = Policy(("127.0.0.1", "localhost", "::1"))
HOST_NOT_ALLOWED = "remote_url host is not allowed"
PLAIN_HTTP = "remote_url uses plain http to a host that is not loopback"
USERINFO = "remote_url carries userinfo"
T0 = 1_700_000_000.0

# --- remote_url ------------------------------------------------------------------------------

ALLOWED_BY_DEFAULT = [
    "https://api.openai.com",
    "https://api.openai.com/",
    "https://api.openai.com/v1/agents/env",
    "https://API.OpenAI.com/v1",  # host names compare case-insensitively
    "https://api.openai.com:443/v1",
    "https://a.b.openai.org",
    "HTTPS://api.openai.com",
]

REFUSED_BY_DEFAULT = [
    ("http://api.openai.com", PLAIN_HTTP),
    ("http://api.openai.com:443/v1", PLAIN_HTTP),
    ("https://evil.example", HOST_NOT_ALLOWED),
    ("https://api.openai.com.evil.example", HOST_NOT_ALLOWED),
    ("https://evilopenai.com", HOST_NOT_ALLOWED),
    ("https://openai.com", HOST_NOT_ALLOWED),  # `*.openai.com` is below openai.com, not openai.com
    ("https://openai.com.", "remote_url host is not a valid host name or IP address"),
    ("https://api.openai.com.", "remote_url host is not a valid host name or IP address"),
    ("https://api.openai.com@evil.example", USERINFO),
    ("https://api.openai.com:443@evil.example/", USERINFO),
    ("https://user:pw@api.openai.com/", USERINFO),
    ("https://evil.example\\@api.openai.com", "remote_url holds a backslash or a percent-escape"),
    ("https://evil.example%2f@api.openai.com", "remote_url holds a backslash or a percent-escape"),
    ("https://api.openai.com/v1?x=1", "remote_url has a query or a fragment"),
    ("https://api.openai.com/v1#frag", "remote_url has a query or a fragment"),
    ("https://evil.example#.openai.com", "remote_url has a query or a fragment"),
    ("https://evil.example?.openai.com", "remote_url has a query or a fragment"),
    ("https://", "remote_url has no host"),
    ("https:///v1", "remote_url has no host"),
    ("https://:443/v1", "remote_url has no host"),
    ("https://api.openai.com:/v1", "remote_url has an empty port"),
    ("https://api.openai.com:0/v1", "remote_url has an invalid port"),
    ("https://api.openai.com:99999/v1", "remote_url has an invalid port"),
    ("https://api.openai.com:x/v1", "remote_url has an invalid port"),
    ("https://[::1/v1", "remote_url is not a valid URL"),
    ("https://api.openai.com/../v1", "remote_url path holds characters or segments that are not allowed"),
    ("https://api.openai.com/v1/./x", "remote_url path holds characters or segments that are not allowed"),
    ("https://api.openai.com/v1;x", "remote_url path holds characters or segments that are not allowed"),
    ("ftp://api.openai.com", "remote_url scheme is not https or http"),
    ("wss://api.openai.com", "remote_url scheme is not https or http"),
    ("file:///etc/passwd", "remote_url scheme is not https or http"),
    ("javascript:alert(1)", "remote_url scheme is not https or http"),
    ("//api.openai.com", "remote_url scheme is not https or http"),
    ("api.openai.com", "remote_url scheme is not https or http"),
    ("--remote-transport=direct", "remote_url scheme is not https or http"),
    ("https://api.openai.com/v1 --flag", "remote_url holds whitespace, control or non-ASCII characters"),
    ("https://api.openai.com\n/v1", "remote_url holds whitespace, control or non-ASCII characters"),
    ("https://api.openаi.com", "remote_url holds whitespace, control or non-ASCII characters"),  # Cyrillic а
    ("https://xn--pi-api.openai.com_", "remote_url host is not a valid host name or IP address"),
    ("https://" + "a" * 2100 + ".openai.com", "remote_url is too long"),
    ("", "remote_url is empty"),
    (None, "remote_url is empty"),
    ("http://127.0.0.1:8090", HOST_NOT_ALLOWED),  # loopback is allowed only when listed
]


@pytest.mark.parametrize("url", ALLOWED_BY_DEFAULT)
def test_the_default_allowlist_trusts_openai_hosts_over_https(url: str) -> None:
    """L2: the default allow-list is the hosts the executor itself trusts with its key."""
    assert remote_url_problem(url, DEFAULT_POLICY) is None


@pytest.mark.parametrize(("url", "reason"), REFUSED_BY_DEFAULT)
def test_the_default_allowlist_refuses_everything_else_with_a_reason(url: str | None, reason: str) -> None:
    """L2: plain http, other hosts, look-alike hosts, userinfo tricks, escapes, queries,
    fragments, odd schemes and malformed URLs never receive the executor key."""
    assert remote_url_problem(url, DEFAULT_POLICY) == reason


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8090", None),
        ("http://127.0.0.1:8090/", None),
        ("https://127.0.0.1:8090", None),
        ("http://localhost:8090", None),
        ("http://LOCALHOST:8090", None),
        ("http://[::1]:8090", None),
        ("http://127.0.0.2:8090", HOST_NOT_ALLOWED),  # loopback, but not listed
        ("http://127.1:8090", "remote_url host is not a valid host name or IP address"),
        ("http://[::ffff:127.0.0.1]:8090", PLAIN_HTTP),
        ("http://0.0.0.0:8090", PLAIN_HTTP),
        ("http://10.0.0.1:8090", PLAIN_HTTP),
        ("http://localhost.evil.example:8090", PLAIN_HTTP),
        ("http://127.0.0.1.evil.example:8090", PLAIN_HTTP),
        ("http://127.0.0.1:8090@evil.example", USERINFO),
        ("https://api.openai.com", HOST_NOT_ALLOWED),  # the list replaces the default
    ],
)
def test_plain_http_only_to_listed_loopback_hosts(url: str, reason: str | None) -> None:
    """L2: http is allowed to a loopback host (localhost, 127/8, ::1) only, and only when listed."""
    assert remote_url_problem(url, LOOPBACK) == reason


def test_a_loopback_pattern_lets_in_every_port_of_that_host() -> None:
    """L2: patterns name hosts, never ports (documented in trust.py)."""
    policy = Policy(("127.0.0.1",))
    assert remote_url_problem("http://127.0.0.1:1", policy) is None
    assert remote_url_problem("http://127.0.0.1:65535/x", policy) is None
    assert remote_url_problem("http://localhost:8090", policy) == HOST_NOT_ALLOWED


def test_exact_and_ip_patterns() -> None:
    """L2: a pattern without ``*.`` matches one host exactly; IPv6 with or without brackets."""
    policy = Policy(("api.example.com", "[::1]", "10.1.2.3"))
    assert remote_url_problem("https://api.example.com/v1", policy) is None
    assert remote_url_problem("https://x.api.example.com/v1", policy) == HOST_NOT_ALLOWED
    assert remote_url_problem("https://example.com/v1", policy) == HOST_NOT_ALLOWED
    assert remote_url_problem("http://[::1]:80", policy) is None
    assert remote_url_problem("https://10.1.2.3", policy) is None
    assert remote_url_problem("http://10.1.2.3", policy) == PLAIN_HTTP
    assert remote_url_problem("https://10.1.2.4", policy) == HOST_NOT_ALLOWED


@pytest.mark.parametrize(
    ("pattern", "valid"),
    [
        ("*.openai.com", True),
        ("api.openai.com", True),
        ("localhost", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("*.OpenAI.com", True),
        ("", False),
        ("*", False),
        ("*.com", False),
        ("*openai.com", False),
        ("api.*.com", False),
        ("*.*.openai.com", False),
        ("https://api.openai.com", False),
        ("api.openai.com:443", False),
        ("api.openai.com/v1", False),
        ("api.openai.com.", False),
        ("-bad.example.com", False),
        ("127.1", False),
        ("exa mple.com", False),
    ],
)
def test_patterns_are_validated(pattern: str, valid: bool) -> None:
    assert (pattern_problem(pattern) is None) is valid, pattern_problem(pattern)


# --- ids -------------------------------------------------------------------------------------

GOOD_IDS = ["sess_6f1c0a9b8e7d6c5b4a39281f", "env_6f1c0a9b8e7d6c5b4a39281f", "sess_1", "a", "A-b_c-1", "x" * 128]
BAD_IDS = [
    "",
    "../env_1",
    "env_1/../../admin",
    "env/1",
    "--remote-transport=direct",
    "-e",
    "_leading_underscore",
    "env 1",
    "env_1\n",
    "env\t1",
    "env_é",
    "env_١",  # Arabic-Indic digit: str.isdigit would say yes
    "sess_\ud800",  # a lone surrogate
    "env.1",
    "env:1",
    "x" * 129,
    None,
    17,
]


@pytest.mark.parametrize("value", GOOD_IDS)
def test_ids_of_the_apis_shape_are_valid(value: str) -> None:
    assert trust.valid_id(value)


@pytest.mark.parametrize("value", BAD_IDS)
def test_ids_that_could_be_a_path_an_option_or_anything_else_are_not(value: object) -> None:
    """L2: ``../`` would rewrite the registration path, ``--`` would be read as an option."""
    assert not trust.valid_id(value)


def test_printable_escapes_and_cuts_any_value() -> None:
    text = trust.printable("sess_\ud800\n" + "x" * 500)
    assert text.isascii() and text.isprintable() and len(text) <= 80
    assert trust.printable("sess_1") == "'sess_1'"


# --- untrusted(session) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_kwargs", "kind"),
    [
        ({"session_id": "../sess_1"}, trust.SESSION_ID),
        ({"env_id": "../../admin"}, trust.ENVIRONMENT_ID),
        ({"env_id": "--remote-transport=direct"}, trust.ENVIRONMENT_ID),
        ({"env_id": "env 1"}, trust.ENVIRONMENT_ID),
        ({"remote_url": "https://evil.example"}, trust.REMOTE_URL),
        ({"remote_url": "http://api.openai.com/v1"}, trust.REMOTE_URL),
    ],
)
def test_untrusted_names_what_is_wrong(session_kwargs: dict[str, str], kind: str) -> None:
    refusal = untrusted(make_session(**session_kwargs), DEFAULT_POLICY)
    assert refusal is not None and refusal.kind == kind


def test_a_session_of_the_api_shape_is_trusted() -> None:
    assert untrusted(make_session(), DEFAULT_POLICY) is None


# --- decide ----------------------------------------------------------------------------------


def _decide(
    session: Session | None = None,
    rec: Record | None = None,
    health: Health | None = None,
    policy: Policy = DEFAULT_POLICY,
) -> Decision:
    return decide(session or make_session(), rec, health, None, T0, 60.0, Routing(), None, policy)


def _record(environment_id: str = "env_1") -> Record:
    handle = Handle(session_id="sess_1", name="sandbox-g1", generation=1, uid="u1", environment_id=environment_id)
    return Record(session_id="sess_1", environment_id=environment_id, handle=handle, started_at=T0)


def test_decide_refuses_a_foreign_remote_url() -> None:
    """L2: a session asking for a connection whose remote_url is not allowed is never started."""
    decision = _decide(make_session(remote_url="https://evil.example/v1"))
    assert decision == Decision(Verdict.IGNORE, f"refused: {HOST_NOT_ALLOWED}", refused=trust.REMOTE_URL)


def test_decide_refuses_plain_http_to_an_allowed_host() -> None:
    """L2: the key never travels over plain http to a host that is not loopback."""
    decision = _decide(make_session(remote_url="http://api.openai.com/v1"))
    assert decision == Decision(Verdict.IGNORE, f"refused: {PLAIN_HTTP}", refused=trust.REMOTE_URL)


@pytest.mark.parametrize("env_id", ["../env_1", "--remote-transport=direct", "env 1", "env_é"])
def test_decide_refuses_a_malformed_environment_id(env_id: str) -> None:
    """L2: an environment id that could rewrite the registration path or pass as an option."""
    decision = _decide(make_session(env_id=env_id))
    assert decision.verdict is Verdict.IGNORE and decision.refused == trust.ENVIRONMENT_ID


def test_decide_refuses_before_replacing_a_sandbox() -> None:
    """L2: a refusal comes before REPLACE, so a changed environment id cannot start anything."""
    decision = _decide(make_session(env_id="../x"), _record(), Health.GONE)
    assert decision.verdict is Verdict.IGNORE and decision.refused == trust.ENVIRONMENT_ID


def test_decide_starts_a_session_whose_remote_url_is_listed() -> None:
    """L2/L8: a listed loopback remote_url (the simulator) is started as usual."""
    session = make_session(remote_url="http://127.0.0.1:8090")
    assert _decide(session).refused == trust.REMOTE_URL  # not listed by default
    decision = _decide(session, policy=LOOPBACK)
    assert (decision.verdict, decision.reason) == (Verdict.START, "connection requested; no sandbox")


def test_refusal_does_not_count_sessions_that_are_not_ours() -> None:
    """L6 before L2: another handler's session is left alone as not ours, not refused."""
    decision = _decide(make_session(remote_url="https://evil.example", workspace="/elsewhere"))
    assert decision.verdict is Verdict.IGNORE and decision.refused is None


def test_a_failed_session_with_compute_is_still_released() -> None:
    """L2 does not keep compute alive: failed sessions release whatever their remote_url."""
    session = make_session(status=SessionStatus.FAILED, actions=(), remote_url="https://evil.example")
    assert _decide(session, _record(), Health.RUNNING).verdict is Verdict.RELEASE


# --- work: acted on, logged, counted ---------------------------------------------------------


def test_work_never_starts_a_session_with_a_foreign_remote_url(caplog: pytest.LogCaptureFixture) -> None:
    """L2: refused → no runner call at all, one "session refused" line, counted by reason."""
    world = World()
    world.sessions.put(make_session(remote_url="http://127.0.0.1:9999"))
    [decision] = world.deliver()
    assert decision.verdict is Verdict.IGNORE and decision.refused == trust.REMOTE_URL
    assert [c for c in world.runner.calls if c[0] == "ensure"] == []
    assert world.store.record("sess_1") is None
    assert world.refusals[trust.REMOTE_URL] == 1
    lines = [r for r in caplog.records if r.getMessage() == "session refused"]
    assert len(lines) == 1 and lines[0].refused == trust.REMOTE_URL
    assert world.store.counters("sess_1") == (1, 1)  # the work was done (by refusing), not left owed


@pytest.mark.parametrize("session_id", ["../sess_1", "--help", "sess 1", "sess_\ud800", "x" * 200])
def test_work_refuses_a_malformed_session_id_before_any_lookup(session_id: str) -> None:
    """L2: a malformed session id never reaches the API's URL, the runner's paths or labels."""
    world = World()
    [decision] = world.deliver(session_id)
    assert decision.refused == trust.SESSION_ID
    assert world.sessions.gets == 0 and world.runner.calls == []
    assert world.refusals[trust.SESSION_ID] == 1


def test_work_starts_a_listed_loopback_session() -> None:
    """L2/L8: with the simulator's host listed, the same session starts."""
    world = World(trust_policy=LOOPBACK)
    world.sessions.put(make_session(remote_url="http://127.0.0.1:9999"))
    assert [d.verdict for d in world.deliver()] == [Verdict.START]
    assert world.refusals[trust.REMOTE_URL] == 0


# --- the receiver drops a malformed session id -----------------------------------------------


@pytest.mark.parametrize("session_id", ["../sess_1", "--flag", "sess 1", "sess_é", "x" * 129])
def test_classify_drops_a_malformed_session_id(session_id: str) -> None:
    """L2: acknowledged and dropped (never a Redis key, a path or an argument)."""
    body = envelope(
        "agent.session.action_required", {"id": session_id, "required_action": {"type": "environment_connection"}}
    )
    assert classify(parse(json.dumps(body).encode())) == MALFORMED_SESSION_ID
    failed = envelope("agent.session.failed", {"id": session_id})
    assert classify(parse(json.dumps(failed).encode())) == MALFORMED_SESSION_ID


# --- runners: the last line of defence -------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        SandboxSpec("sess_1", "../env_1", "https://api.openai.com/v1"),
        SandboxSpec("sess_1", "--remote-transport=direct", "https://api.openai.com/v1"),
        SandboxSpec("../sess_1", "env_1", "https://api.openai.com/v1"),
        SandboxSpec("sess_1", "env_1", "--help"),
        SandboxSpec("sess_1", "env_1", "https://api.openai.com@evil.example"),
        SandboxSpec("sess_1", "env_1", "http://evil.example"),
    ],
)
def test_runners_reject_an_unsafe_spec(spec: SandboxSpec, tmp_path: Path) -> None:
    """L2: an unsafe id or URL never reaches the executor's argument list or a manifest."""
    assert spec_problem(spec) is not None
    with pytest.raises(RunnerRejected):
        checked(spec)
    runner = LocalRunner(tmp_path, ["/bin/false"], "ek-test-key-123456")
    with pytest.raises(RunnerRejected):
        runner.ensure(spec, 1)
    assert not list((tmp_path / "sessions").iterdir())  # not even a session directory was made


def test_runners_accept_a_spec_of_the_api_shape() -> None:
    spec = SandboxSpec("sess_1", "env_1", "https://api.openai.com/v1/agents/env")
    assert checked(spec) is spec
    assert checked(SandboxSpec("sess_1", "env_1", "http://127.0.0.1:8090")) is not None


# --- settings --------------------------------------------------------------------------------


def test_the_allowlist_defaults_to_the_executors_own_trusted_hosts() -> None:
    assert Settings.from_env({}).runner.remote_url_allowlist == ("*.openai.com", "*.openai.org")


def test_the_allowlist_is_parsed_lower_cased() -> None:
    settings = Settings.from_env({PREFIX + "REMOTE_URL_ALLOWLIST": " 127.0.0.1, LocalHost,,*.Example.com "})
    assert settings.runner.remote_url_allowlist == ("127.0.0.1", "localhost", "*.example.com")


def test_bad_patterns_are_reported_at_start_up() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({PREFIX + "REMOTE_URL_ALLOWLIST": "*, https://api.openai.com, *.com,ok.example.com"})
    problems = raised.value.problems
    assert len(problems) == 3 and all("REMOTE_URL_ALLOWLIST" in p for p in problems), problems


def test_an_allowlist_of_only_commas_is_a_problem() -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({PREFIX + "REMOTE_URL_ALLOWLIST": " , ,"})
