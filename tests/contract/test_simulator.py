"""The Agents API simulator against the real things: the official ``openai`` client, a real
HTTP webhook receiver, and the real ``codex exec-server`` binary, all on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.beta.agent_session import AgentSession

from controller.signing import Verifier
from tests.support.codex import codex_binary, start_exec_server
from tests.support.processes import free_port, port_open, wait_for
from tests.support.signing import verify
from tests.support.simulator import InProcessSimulator, StartSimulator, WebhookReceiver
from tests.support.tls import TestCA

pytestmark = pytest.mark.timeout(90)

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}
FAST_RETRIES = ["--webhook-retry-initial-seconds", "0.2", "--webhook-retry-max-seconds", "5"]
MESSAGE = {
    "type": "agent.session.input.message",
    "input": [{"role": "user", "type": "message", "content": [{"type": "input_text", "text": "hi"}]}],
}

_CODEX_PROCESSES: list[subprocess.Popen[bytes]] = []


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture(autouse=True)
def no_leftover_codex() -> Iterator[None]:
    """Whatever a test did, no codex process it started outlives it (the npm wrapper's child included)."""
    yield
    for process in list(_CODEX_PROCESSES):
        _CODEX_PROCESSES.remove(process)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a grandchild left in the group


def test_official_client_creates_retrieves_lists_and_deletes(start_simulator: StartSimulator) -> None:
    """The official client parses every answer into its typed objects, and a deleted session 404s."""
    sim = start_simulator()
    client = sim.openai()
    created = client.beta.agents.sessions.create(
        environment=SELF_HOSTED, agent={"model": "gpt-5.5"}, input="hello", metadata={"template": "python"}
    )
    assert isinstance(created, AgentSession)
    assert created.id.startswith("sess_")

    session = client.beta.agents.sessions.retrieve(created.id)
    assert isinstance(session, AgentSession)
    assert session.status == "requires_action"
    assert session.environment.type == "self_hosted"
    assert session.environment.id.startswith("env_")
    assert session.environment.remote_url == sim.base_url
    assert session.environment.workspace_directory == "/workspace"
    [action] = session.required_actions
    assert action.type == "environment_connection"
    assert action.environment_id == session.environment.id
    assert session.metadata == {"template": "python"}
    assert session.agent.model == "gpt-5.5"
    assert session.error is None
    assert session.last_active_at >= session.created_at

    other = client.beta.agents.sessions.create(environment={"type": "none"})
    listed = [s.id for s in client.beta.agents.sessions.list(limit=1)]  # auto-pages one by one
    assert listed == [other.id, created.id]
    assert [s.id for s in client.beta.agents.sessions.list(metadata={"template": "python"})] == [created.id]

    assert client.beta.agents.sessions.events.create(created.id, events=[MESSAGE], idempotency_key="k1") is None

    deleted = client.beta.agents.sessions.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.beta.agents.sessions.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.beta.agents.environments.retrieve(session.environment.id)


def test_api_key_is_required_and_never_echoed(start_simulator: StartSimulator) -> None:
    """Without a bearer token, or with the wrong one when --api-key is set: 401 in OpenAI's error shape."""
    sim = start_simulator(api_key="sk-exact-key-123", exact_api_key=True)
    bare = httpx.get(sim.api_url + "/agents/sessions")
    assert bare.status_code == 401
    assert set(bare.json()["error"]) == {"message", "type", "param", "code"}
    wrong = httpx.get(sim.api_url + "/agents/sessions", headers={"authorization": "Bearer sk-wrong-key-456"})
    assert wrong.status_code == 401
    assert "sk-wrong-key-456" not in wrong.text and "sk-exact-key-123" not in wrong.text
    with pytest.raises(openai.AuthenticationError):
        sim.openai(api_key="sk-other").beta.agents.sessions.list().data  # noqa: B018
    assert sim.openai().beta.agents.sessions.list().data == []


def test_webhooks_are_signed_standard_webhooks(start_simulator: StartSimulator, receiver: WebhookReceiver) -> None:
    """Created and action_required deliveries carry the envelope and verify against the secret."""
    sim = start_simulator(webhook_urls=[receiver.url])
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")

    created = receiver.wait_for_type("agent.session.created", session.id)
    action = receiver.wait_for_type("agent.session.action_required", session.id)
    verifier = Verifier([sim.webhook_secret])
    for delivery in (created, action):
        verified = verify(verifier, delivery.headers, delivery.body, time.time())
        assert verified.webhook_id == delivery.event["id"]
        assert delivery.event["id"].startswith("evt_")
        assert delivery.event["object"] == "event"
        assert isinstance(delivery.event["created_at"], int)
    assert created.event["data"] == {
        "id": session.id,
        "environment_type": "self_hosted",
        "environment_id": session.environment.id,
        "connect": {"remote_url": sim.base_url},
    }
    assert action.event["data"] == {"id": session.id, "required_action": {"type": "environment_connection"}}
    with pytest.raises(Exception, match="no webhook-signature entry matches"):
        verify(Verifier(["whsec_" + "A" * 32]), created.headers, created.body, time.time())


def test_failed_deliveries_are_retried_with_the_same_webhook_id(start_simulator: StartSimulator) -> None:
    """A receiver answering 500 twice then 200 gets one webhook-id three times; a resend duplicates it."""
    with WebhookReceiver(script=[500, 500]) as receiver:
        sim = start_simulator(webhook_urls=[receiver.url], args=FAST_RETRIES)
        session = sim.openai().beta.agents.sessions.create(environment={"type": "none"})
        wait_for(lambda: len(receiver.of_type("agent.session.created")) == 3, 10, "three attempts")
        attempts = receiver.of_type("agent.session.created", session.id)
        assert [a.answered for a in attempts] == [500, 500, 200]
        assert len({a.headers["webhook-id"] for a in attempts}) == 1
        for attempt in attempts:
            verify(Verifier([sim.webhook_secret]), attempt.headers, attempt.body, time.time())

        [delivery] = sim.admin("GET", "/admin/deliveries?type=agent.session.created")["data"]
        assert delivery["state"] == "delivered"
        assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]

        event_id = attempts[0].headers["webhook-id"]
        sim.admin("POST", f"/admin/webhooks/resend/{event_id}")
        wait_for(lambda: len(receiver.of_type("agent.session.created")) == 4, 10, "the re-sent delivery")
        assert receiver.of_type("agent.session.created")[-1].headers["webhook-id"] == event_id


def test_one_failing_event_does_not_hold_up_others(start_simulator: StartSimulator) -> None:
    """Deliveries are independent: while one event keeps failing, later events still arrive."""
    with WebhookReceiver(respond=lambda e: 503 if e["type"] == "agent.session.created" else None) as receiver:
        sim = start_simulator(webhook_urls=[receiver.url], args=FAST_RETRIES)
        session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
        action = receiver.wait_for_type("agent.session.action_required", session.id)
        assert action.answered == 200
        assert all(r.answered == 503 for r in receiver.of_type("agent.session.created"))


def test_redirects_and_unreachable_receivers_count_as_failures(start_simulator: StartSimulator) -> None:
    """A 3xx answer is not followed and is retried; so is a refused connection; both are recorded."""
    with WebhookReceiver(script=[307]) as receiver:
        sim = start_simulator(
            webhook_urls=[receiver.url, "http://127.0.0.1:9/nowhere"],
            args=[*FAST_RETRIES, "--webhook-max-attempts", "2"],
        )
        sim.openai().beta.agents.sessions.create(environment={"type": "none"})

        def finished() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] = sim.admin("GET", "/admin/deliveries")["data"]
            return found if all(d["state"] != "pending" for d in found) else None

        settled = wait_for(finished, 10, "deliveries to settle")
        assert isinstance(settled, list)
        deliveries = {d["url"]: d for d in settled}
        assert [a["status_code"] for a in deliveries[receiver.url]["attempts"]] == [307, 200]
        unreachable = deliveries["http://127.0.0.1:9/nowhere"]
        assert unreachable["state"] == "failed"
        assert [a["error"] for a in unreachable["attempts"]] == ["ConnectError", "ConnectError"]


def test_no_executor_within_the_connect_timeout_fails_the_session(
    start_simulator: StartSimulator, receiver: WebhookReceiver
) -> None:
    """Nobody registers within --connect-timeout-seconds: the session fails with an error and a webhook."""
    sim = start_simulator(webhook_urls=[receiver.url], args=["--connect-timeout-seconds", "1"])
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    failed = sim.wait_for_status(session.id, "failed", timeout=10)
    assert failed["required_actions"] == []
    assert "No executor connected" in failed["error"]
    event = receiver.wait_for_type("agent.session.failed", session.id).event
    assert event["data"] == {
        "id": session.id,
        "environment_type": "self_hosted",
        "environment_id": session.environment.id,
    }
    with pytest.raises(openai.ConflictError):
        sim.openai().beta.agents.sessions.events.create(session.id, events=[MESSAGE])


def test_injected_faults(start_simulator: StartSimulator, receiver: WebhookReceiver) -> None:
    """Admin faults: 429 with Retry-After on retrieve, a failing registration, a forced failure."""
    sim = start_simulator(webhook_urls=[receiver.url])
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED)
    sim.admin("POST", "/admin/faults", {"target": "retrieve_session", "status": 429, "count": 2, "retry_after": 3})
    with sim.http() as client:
        answers = [client.get(f"/v1/agents/sessions/{session.id}") for _ in range(3)]
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].headers["retry-after"] == "3"
    assert answers[0].json()["error"]["code"] == "rate_limit_exceeded"

    sim.admin("POST", "/admin/faults", {"target": "register", "status": 503, "count": 1})
    register = f"{sim.base_url}/cloud/environment/{session.environment.id}/register"
    auth = {"authorization": f"Bearer {sim.environment_key}"}
    assert httpx.post(register, headers=auth, json={}).status_code == 503
    assert httpx.post(register, headers=auth, json={}).status_code == 200
    assert [r["status_code"] for r in sim.registrations()] == [503, 200]

    forced = sim.admin("POST", f"/admin/sessions/{session.id}/fail", {"error": "disk on fire"})
    assert forced["status"] == "failed" and forced["error"] == "disk on fire"
    receiver.wait_for_type("agent.session.failed", session.id)


def test_registration_checks_key_and_environment(start_simulator: StartSimulator) -> None:
    """Register: 401 for a wrong key, 404 for an unknown environment; both recorded, never the key."""
    sim = start_simulator()
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED)
    env_id = session.environment.id
    wrong = httpx.post(
        f"{sim.base_url}/cloud/environment/{env_id}/register",
        headers={"authorization": "Bearer not-the-key"},
        json={},
    )
    assert wrong.status_code == 401
    unknown = httpx.post(
        f"{sim.base_url}/cloud/environment/env_missing/register",
        headers={"authorization": f"Bearer {sim.environment_key}"},
        json={},
    )
    assert unknown.status_code == 404
    ok = httpx.post(
        f"{sim.base_url}/cloud/environment/{env_id}/register",
        headers={"authorization": f"Bearer {sim.environment_key}"},
        json={"security_profile": "noise_hybrid_ik_v1"},
    ).json()
    assert ok["environment_id"] == env_id
    assert ok["url"].startswith(f"ws://127.0.0.1:{sim.port}/cloud/environment/{env_id}/connect?token=")
    assert ok["security_profile"] == "noise_hybrid_ik_v1" and ok["executor_registration_id"]
    records = sim.registrations()
    assert [(r["key_matched"], r["environment_known"], r["status_code"]) for r in records] == [
        (False, True, 401),
        (True, False, 404),
        (True, True, 200),
    ]
    assert sim.environment_key not in str(records)
    # /validate says yes only to a handshake that shows what the harness issued (see test_executor_link.py).
    validate_url = f"{sim.base_url}/cloud/environment/{env_id}/validate"
    assert httpx.post(validate_url).status_code == 401
    unissued = httpx.post(validate_url, headers={"authorization": f"Bearer {sim.environment_key}"}, json={})
    assert unissued.json() == {"valid": False}


def test_real_codex_registers_connects_and_drives_the_session(
    start_simulator: StartSimulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    """codex exec-server registers, holds its WebSocket (connected), the turn runs; SIGTERM → exit 0."""
    binary = codex_binary()
    sim = start_simulator(webhook_urls=[receiver.url], args=["--turn-seconds", "0.5"])
    client = sim.openai()
    session = client.beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    env_id = session.environment.id
    assert client.beta.agents.sessions.retrieve(session.id).status == "requires_action"
    assert sim.environment_status(env_id) == "pending"

    codex = _start_codex(binary, session.environment.remote_url, env_id, sim.environment_key, tmp_path)
    try:
        wait_for(lambda: sim.registrations(env_id), 15, "codex to register")
        [registration] = sim.registrations(env_id)
        assert registration["key_matched"] is True and registration["status_code"] == 200
        assert registration["security_profile"] == "noise_hybrid_ik_v1"
        assert registration["executor_public_key_present"] is True
        wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")
        receiver.wait_for_type("agent.session.in_progress", session.id)
        idle = receiver.wait_for_type("agent.session.idle", session.id)
        assert idle.event["data"] == {
            "id": session.id,
            "environment_type": "self_hosted",
            "environment_id": env_id,
        }
        done = client.beta.agents.sessions.retrieve(session.id)
        assert done.status == "idle" and done.required_actions == []

        # Input while the executor is connected runs the turn directly.
        client.beta.agents.sessions.events.create(session.id, events=[MESSAGE])
        wait_for(lambda: len(receiver.of_type("agent.session.idle", session.id)) == 2, 10, "a second turn")
        assert len(receiver.of_type("agent.session.action_required", session.id)) == 1
        assert codex.poll() is None
    finally:
        codex.send_signal(signal.SIGTERM)
        exit_code = codex.wait(timeout=20)
    assert exit_code == 0
    wait_for(lambda: sim.environment_status(env_id) == "disconnected", 10, "the environment to be disconnected")

    # The next input asks for a connection again.
    client.beta.agents.sessions.events.create(session.id, events=[MESSAGE])
    assert client.beta.agents.sessions.retrieve(session.id).status == "requires_action"
    wait_for(lambda: len(receiver.of_type("agent.session.action_required", session.id)) == 2, 10, "a second ask")

    output = sim.process.output()
    assert sim.environment_key not in output and sim.webhook_secret not in output
    assert "token=wstok_" not in output


def test_real_codex_with_a_wrong_key_exits_1(start_simulator: StartSimulator, tmp_path: Path) -> None:
    """A wrong CODEX_API_KEY gets 401 from register, and codex exits with status 1 without retrying."""
    binary = codex_binary()
    sim = start_simulator()
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    codex = _start_codex(binary, sim.base_url, session.environment.id, "envkey-wrong", tmp_path)
    try:
        exit_code = codex.wait(timeout=20)
    finally:
        if codex.poll() is None:
            codex.kill()
            codex.wait()
    assert exit_code == 1
    [registration] = sim.registrations(session.environment.id)
    assert registration["key_matched"] is False and registration["status_code"] == 401
    assert sim.environment_status(session.environment.id) == "pending"


def test_deleting_a_session_disconnects_its_codex_which_exits(start_simulator: StartSimulator, tmp_path: Path) -> None:
    """After DELETE the WebSocket is closed; codex reconnects (403), re-registers (404) and exits 1."""
    binary = codex_binary()
    sim = start_simulator()
    client = sim.openai()
    session = client.beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    codex = _start_codex(binary, sim.base_url, session.environment.id, sim.environment_key, tmp_path)
    try:
        wait_for(lambda: sim.environment_status(session.environment.id) == "connected", 15, "codex to connect")
        client.beta.agents.sessions.delete(session.id)
        exit_code = codex.wait(timeout=45)
    finally:
        if codex.poll() is None:
            codex.send_signal(signal.SIGTERM)
            codex.wait(timeout=20)
    assert exit_code == 1
    assert [r["status_code"] for r in sim.registrations(session.environment.id)] == [200, 404]


def test_executor_dropping_mid_turn_asks_for_a_connection_again(
    start_simulator: StartSimulator, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    """A link closed mid-turn: action_required again; codex reconnects by itself and the turn completes."""
    binary = codex_binary()
    sim = start_simulator(webhook_urls=[receiver.url], args=["--turn-seconds", "3"])
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    env_id = session.environment.id
    codex = _start_codex(binary, sim.base_url, env_id, sim.environment_key, tmp_path)
    try:
        receiver.wait_for_type("agent.session.in_progress", session.id, timeout=15)
        assert sim.admin("POST", f"/admin/environments/{env_id}/disconnect")["closed"] == 1
        wait_for(lambda: len(receiver.of_type("agent.session.action_required", session.id)) == 2, 10, "a re-ask")
        wait_for(lambda: len(receiver.of_type("agent.session.in_progress", session.id)) == 2, 15, "a reconnect")
        receiver.wait_for_type("agent.session.idle", session.id, timeout=10)
        assert sim.environment_status(env_id) == "connected"
        assert len(sim.registrations(env_id)) == 1  # reconnected to the same URL, no new registration
    finally:
        codex.send_signal(signal.SIGTERM)
        assert codex.wait(timeout=20) == 0


def test_in_process_simulator_runs_turns_and_cancels() -> None:
    """The in-process variant: a session without an environment runs turns; cancel ends one early."""
    with InProcessSimulator.on_free_port(turn_seconds=0.3) as sim:
        client = sim.openai()
        session = client.beta.agents.sessions.create(environment={"type": "none"}, input="hi")
        assert session.status == "in_progress"
        sim.wait_for_status(session.id, "idle", timeout=5)
        client.beta.agents.sessions.events.create(session.id, events=[MESSAGE])
        assert client.beta.agents.sessions.retrieve(session.id).status == "in_progress"
        client.beta.agents.sessions.events.create(session.id, events=[{"type": "agent.session.input.cancel"}])
        assert client.beta.agents.sessions.retrieve(session.id).status == "idle"
        assert [e["type"] for e in sim.admin("GET", "/admin/events")["data"]] == [
            "agent.session.created",
            "agent.session.in_progress",
            "agent.session.idle",
            "agent.session.in_progress",
            "agent.session.idle",
        ]


def _start_codex(binary: str, remote_url: str, env_id: str, key: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """codex exec-server with the key only in its environment; output to a file under tmp_path."""
    process = start_exec_server(binary, remote_url, env_id, key, tmp_path)
    _CODEX_PROCESSES.append(process)
    return process


def test_admin_points_a_session_at_another_remote_url(start_simulator: StartSimulator) -> None:
    """For L2 tests: the admin API makes a session name another remote_url; the official client reads it."""
    sim = start_simulator()
    client = sim.openai()
    session = client.beta.agents.sessions.create(environment=SELF_HOSTED)
    assert session.environment.remote_url == sim.base_url
    foreign = "http://localhost:9/elsewhere"
    answered = sim.admin("POST", f"/admin/sessions/{session.id}/remote_url", {"remote_url": foreign})
    assert answered["environment"]["remote_url"] == foreign
    assert client.beta.agents.sessions.retrieve(session.id).environment.remote_url == foreign
    with pytest.raises(httpx.HTTPStatusError) as refused:
        sim.admin("POST", f"/admin/sessions/{session.id}/remote_url", {"remote_url": ""})
    assert refused.value.response.status_code == 400


def test_over_tls_the_real_codex_trusts_the_ca_named_by_ssl_cert_file(
    start_simulator: StartSimulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator's second listener serves the same API over TLS, and sessions name it as
    their remote_url (--public-url). The real codex registers and connects (``wss://``) there
    when SSL_CERT_FILE names the CA that issued the certificate, and refuses the server
    otherwise (what ``sandbox.caBundle`` gives sandbox pods; the real-node tier does the same
    under the name ``api.openai.com``)."""
    binary = codex_binary()
    ca = TestCA()
    ca_file = ca.write(tmp_path / "ca.pem")
    certificate = ca.issue(tmp_path / "tls", [], ["127.0.0.1"])
    port = free_port()
    public = f"https://127.0.0.1:{port}"
    sim = start_simulator(
        args=["--public-url", public, "--tls-listen", f"127.0.0.1:{port}",
              "--tls-cert", str(certificate.certfile), "--tls-key", str(certificate.keyfile)]
    )  # fmt: skip
    wait_for(lambda: port_open(port), 10, "the TLS listener")
    assert httpx.get(public + "/healthz", verify=ssl.create_default_context(cafile=str(ca_file))).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(public + "/healthz")  # the system's CAs do not know the test CA
    trusting = ssl.create_default_context(cafile=str(ca_file))
    assert httpx.get(public + "/admin/events", verify=trusting).status_code == 404  # admin: main listener only
    assert httpx.get(sim.base_url + "/admin/events").status_code == 200
    client = sim.openai()

    refused = client.beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    assert refused.environment.remote_url == public
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    codex = _start_codex(binary, public, refused.environment.id, sim.environment_key, tmp_path)
    assert codex.wait(timeout=30) == 1
    assert sim.registrations(refused.environment.id) == []  # nothing reached the API

    session = client.beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    codex = _start_codex(binary, public, session.environment.id, sim.environment_key, tmp_path)
    try:
        wait_for(lambda: sim.environment_status(session.environment.id) == "connected", 20, "codex to connect over TLS")
        [registration] = sim.registrations(session.environment.id)
        assert registration["key_matched"] is True and registration["status_code"] == 200
        assert registration["scheme"] == "https"
    finally:
        codex.send_signal(signal.SIGTERM)
        codex.wait(timeout=20)
