"""The simulator's faults for the chaos tier (``tests/chaos``), against real clients: faults that
last a while, answers held past a client's timeout, an outage of one executor's link with the
real ``codex exec-server``, late and reordered webhooks, and the state history the chaos
checker reads."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.codex import codex_binary, start_exec_server
from tests.support.processes import end_group, wait_for
from tests.support.simulator import StartSimulator, WebhookReceiver

pytestmark = pytest.mark.timeout(120)

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}


@pytest.fixture
def codex_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """codex processes a test starts: each one's whole group is ended after the test."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        end_group(process)


def _create(client: httpx.Client, **body: object) -> dict[str, object]:
    response = client.post("/v1/agents/sessions", json={"environment": SELF_HOSTED, **body})
    response.raise_for_status()
    return dict(response.json())


def test_a_timed_fault_lasts_its_seconds_and_a_narrowed_one_hits_one_session(start_simulator: StartSimulator) -> None:
    """Reads of every session answer 503 while a 1 s fault lasts, then 200; a 404 narrowed to
    one session leaves the others alone, and wins over a fault on the whole target."""
    sim = start_simulator()
    with sim.http() as client:
        one, other = _create(client), _create(client)
        sim.admin("POST", "/admin/faults", {"target": "retrieve_session", "status": 503, "seconds": 1.0})
        during = [client.get(f"/v1/agents/sessions/{s['id']}").status_code for s in (one, other, one)]
        time.sleep(1.1)
        after = [client.get(f"/v1/agents/sessions/{s['id']}").status_code for s in (one, other)]
        assert (during, after) == ([503, 503, 503], [200, 200])

        sim.admin("POST", "/admin/faults", {"target": "retrieve_session", "status": 503, "seconds": 30})
        sim.admin(
            "POST",
            "/admin/faults",
            {"target": "retrieve_session", "status": 404, "seconds": 30, "object_id": one["id"]},
        )
        assert client.get(f"/v1/agents/sessions/{one['id']}").status_code == 404
        assert client.get(f"/v1/agents/sessions/{other['id']}").status_code == 503
        armed = sim.admin("GET", "/admin/faults")["data"]
        assert sorted((f["status"], f["object_id"]) for f in armed) == [(404, one["id"]), (503, None)]
        sim.admin("DELETE", "/admin/faults")
        assert client.get(f"/v1/agents/sessions/{one['id']}").status_code == 200


def test_a_timeout_fault_holds_the_answer_past_the_clients_timeout(start_simulator: StartSimulator) -> None:
    """``kind: timeout``: a client with a 0.5 s timeout times out; one that waits longer than
    the 1.5 s hold gets the usual answer, late. Executor calls cannot be made to hang."""
    sim = start_simulator()
    with sim.http() as client:
        session = _create(client)
    path = f"/v1/agents/sessions/{session['id']}"
    fault = {"target": "retrieve_session", "kind": "timeout", "hold_seconds": 1.5, "seconds": 30}
    sim.admin("POST", "/admin/faults", fault)
    headers = {"authorization": f"Bearer {sim.api_key}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(sim.base_url + path, headers=headers, timeout=0.5)
    began = time.monotonic()
    late = httpx.get(sim.base_url + path, headers=headers, timeout=10)
    assert late.status_code == 200 and late.json()["id"] == session["id"]
    assert time.monotonic() - began >= 1.4
    refused = httpx.post(sim.base_url + "/admin/faults", json={**fault, "target": "register"}, timeout=10)
    assert refused.status_code == 400 and "timeout" in refused.json()["error"]["message"]


def test_a_held_call_is_listed_with_its_callers_address_until_its_answer_goes_out(
    start_simulator: StartSimulator,
) -> None:
    """``GET /admin/held``: while a ``timeout`` fault holds a session read, the call is listed
    with the caller's own address (its socket's port: the chaos tier finds the process that
    waits for it that way); once the answer has gone out, nothing is listed."""
    sim = start_simulator()
    with sim.http() as client:
        session = _create(client)
    fault = {"target": "retrieve_session", "kind": "timeout", "hold_seconds": 1.5, "count": 1}
    sim.admin("POST", "/admin/faults", {**fault, "object_id": session["id"]})
    host, port = httpx.URL(sim.base_url).host, httpx.URL(sim.base_url).port
    with socket.create_connection((host, port), timeout=10) as caller:
        request = (
            f"GET /v1/agents/sessions/{session['id']} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {sim.api_key}\r\nConnection: close\r\n\r\n"
        )
        caller.sendall(request.encode())
        wait_for(lambda: sim.admin("GET", "/admin/held")["data"], 5, "the read to be held")
        held = sim.admin("GET", "/admin/held")["data"]
        assert [(h["target"], h["object_id"], h["client"]) for h in held] == [
            ("retrieve_session", session["id"], f"127.0.0.1:{caller.getsockname()[1]}")
        ]
        answer = b""
        while chunk := caller.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert sim.admin("GET", "/admin/held")["data"] == []


def test_a_link_outage_refuses_upgrades_with_503_and_codex_comes_back_without_registering(
    start_simulator: StartSimulator, tmp_path: Path, codex_processes: list[subprocess.Popen[bytes]]
) -> None:
    """``drop``: the real codex loses its WebSocket and its upgrades are answered 503 for 4 s;
    it retries the same URL (no second registration) and is connected again after the outage.
    The environment's link history shows the gap, as long as the outage at least."""
    binary = codex_binary()
    sim = start_simulator()
    with sim.http() as client:
        session = _create(client)
    env_id = str(session["environment"]["id"])  # type: ignore[index]
    codex_processes.append(start_exec_server(binary, sim.base_url, env_id, sim.environment_key, tmp_path))
    wait_for(lambda: sim.environment_status(env_id) == "connected", 20, "codex to connect")

    dropped = sim.admin("POST", f"/admin/environments/{env_id}/drop", {"seconds": 4})
    assert dropped["closed"] == 1
    wait_for(lambda: sim.environment_status(env_id) == "disconnected", 5, "the link to be down")

    def environment() -> dict[str, object]:
        [found] = [e for e in sim.admin("GET", "/admin/environments")["data"] if e["id"] == env_id]
        return dict(found)

    wait_for(lambda: int(str(environment()["refused_upgrades"])) >= 1, 10, "an upgrade to be refused")
    assert sim.environment_status(env_id) == "disconnected"
    wait_for(lambda: sim.environment_status(env_id) == "connected", 40, "codex to reconnect after the outage")
    links = environment()["links"]
    assert isinstance(links, list) and len(links) == 2
    (_, first_down), (second_up, second_down) = links
    assert second_down is None and second_up - first_down >= 4.0
    assert [r["status_code"] for r in sim.registrations(env_id)] == [200]  # the same URL, no new registration
    assert codex_processes[0].poll() is None


def test_held_webhooks_go_out_late_and_in_reverse(start_simulator: StartSimulator) -> None:
    """A 1.5 s hold in reverse order: three sessions created during it reach the receiver only
    after the hold, newest first; a delivery started after the hold is not held."""
    with WebhookReceiver() as receiver:
        sim = start_simulator(webhook_urls=[receiver.url])
        began = time.time()
        sim.admin("POST", "/admin/webhooks/hold", {"seconds": 1.5, "order": "reverse"})
        with sim.http() as client:
            created = [_create(client)["id"] for _ in range(3)]
            wait_for(lambda: len(receiver.of_type("agent.session.created")) == 3, 10, "the held deliveries")
            arrived = [r.event["data"]["id"] for r in receiver.of_type("agent.session.created")]
            assert arrived == list(reversed(created))
            assert min(r.at for r in receiver.snapshot()) >= began + 1.4
            later = _create(client)["id"]
        wait_for(lambda: receiver.of_type("agent.session.created", later), 10, "a delivery after the hold")
        deliveries = sim.admin("GET", "/admin/deliveries?type=agent.session.created")["data"]
        assert [d["held"] for d in deliveries] == [True, True, True, False]


def test_a_sessions_history_records_every_change_with_its_time(start_simulator: StartSimulator) -> None:
    """``/admin/sessions`` and ``/admin/sessions/{id}/history``: created idle, input asks for a
    connection, a forced failure ends it; each change with its time, in order."""
    sim = start_simulator()
    with sim.http() as client:
        session_id = str(_create(client, input="hello")["id"])
    sim.admin("POST", f"/admin/sessions/{session_id}/fail", {"error": "chaos"})
    history = sim.admin("GET", f"/admin/sessions/{session_id}/history")["data"]
    assert [(h["status"], h["wants_connection"]) for h in history] == [
        ("idle", False),
        ("requires_action", True),
        ("failed", False),
    ]
    assert [h["at"] for h in history] == sorted(h["at"] for h in history)
    [summary] = sim.admin("GET", "/admin/sessions")["data"]
    assert (summary["id"], summary["status"], summary["since"]) == (session_id, "failed", history[-1]["at"])
