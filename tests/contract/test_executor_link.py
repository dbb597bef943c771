"""The simulator as the harness on the real ``codex exec-server`` 0.171.0's link: the hybrid
Noise handshake, harness-key validation, JSON-RPC commands, many streams, large output,
and turns that carry commands (with the failure behaviour the API describes)."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.support.codex import codex_binary, start_exec_server
from tests.support.processes import end_group, wait_for
from tests.support.simulator import InProcessSimulator, SimulatorProcess, StartSimulator

pytestmark = pytest.mark.timeout(120)

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}
NOTES = ["sh", "-c", "echo hello > notes.txt; cat notes.txt"]


@pytest.fixture
def executor(start_simulator: StartSimulator, tmp_path: Path) -> Iterator[Callable[..., tuple[SimulatorProcess, str]]]:
    """Start a simulator, a session and a real codex connected to it (its cwd: a workspace)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(**simulator_args: Any) -> tuple[SimulatorProcess, str]:
        binary = codex_binary()
        sim = start_simulator(**simulator_args)
        with sim.http() as client:
            session = client.post("/v1/agents/sessions", json={"environment": SELF_HOSTED}).json()
        env_id = session["environment"]["id"]
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        started.append(start_exec_server(binary, sim.base_url, env_id, sim.environment_key, tmp_path, cwd=workspace))
        wait_for(lambda: sim.environment_status(env_id) == "connected", 20, "codex to connect")
        return sim, session["id"]

    yield start
    for process in started:
        end_group(process)


def _env_id(sim: SimulatorProcess, session_id: str) -> str:
    return str(sim.session(session_id)["environment"]["id"])


def _exec(sim: SimulatorProcess, env_id: str, timeout: float = 60, **command: Any) -> dict[str, Any]:
    response = httpx.post(f"{sim.base_url}/admin/environments/{env_id}/exec", json=command, timeout=timeout)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def _link(sim: SimulatorProcess, env_id: str) -> dict[str, Any]:
    [link] = sim.admin("GET", f"/admin/links?environment_id={env_id}")["data"]
    return dict(link)


def test_handshake_and_a_command_round_trip(
    executor: Callable[..., tuple[SimulatorProcess, str]], tmp_path: Path
) -> None:
    """The hybrid Noise handshake completes against 0.171.0 (the executor validated the harness
    key with /validate, for its own registration); a command runs in the executor's working
    directory, its stdout, stderr and exit code come back."""
    sim, session_id = executor()
    env_id = _env_id(sim, session_id)
    result = _exec(sim, env_id, argv=NOTES)
    assert result["status"] == "completed", result
    assert (result["stdout"], result["exit_code"]) == ("hello\n", 0)
    workspace = tmp_path / "workspace"
    assert result["cwd"] == str(workspace)
    assert (workspace / "notes.txt").read_text() == "hello\n"
    assert result["duration_seconds"] >= 0
    assert result["sandbox_type"] == "none"  # codex's own sandboxed mode is not imitated

    [registration] = sim.registrations(env_id)
    [validation] = sim.admin("GET", "/admin/validations")["data"]
    assert validation == {**validation, "valid": True, "reason": "ok"}
    assert validation["executor_registration_id"] == registration["id"]

    failing = _exec(sim, env_id, argv=["sh", "-c", "echo oops >&2; exit 3"])
    assert (failing["status"], failing["exit_code"], failing["stderr"]) == ("completed", 3, "oops\n")
    elsewhere = _exec(sim, env_id, argv=["pwd"], cwd="/tmp")
    assert elsewhere["stdout"] == "/tmp\n"
    missing = _exec(sim, env_id, argv=["/nonexistent/tool"])
    assert missing["status"] == "failed" and missing["error"].startswith("tool execution failed"), missing
    link = _link(sim, env_id)
    assert link["streams_opened"] == 1  # the commands share the link's stream


def test_a_wrong_harness_key_is_refused(executor: Callable[..., tuple[SimulatorProcess, str]]) -> None:
    """A handshake presenting a harness key the API never published: /validate says no, the
    executor resets the stream, the command fails; the next, honest handshake works."""
    sim, session_id = executor()
    env_id = _env_id(sim, session_id)
    sim.admin("POST", "/admin/harness/impostor", {"count": 1})
    refused = _exec(sim, env_id, argv=NOTES)
    assert refused["status"] == "failed"
    assert "refused the handshake" in refused["error"], refused
    [validation] = sim.admin("GET", "/admin/validations")["data"]
    assert validation["valid"] is False
    assert validation["reason"] == "the harness public key is not the one this API uses"
    assert sim.environment_status(env_id) == "connected"  # one stream refused, the link stays

    accepted = _exec(sim, env_id, argv=NOTES)
    assert (accepted["status"], accepted["stdout"]) == ("completed", "hello\n")
    assert [v["valid"] for v in sim.admin("GET", "/admin/validations")["data"]] == [False, True]

    # An authorization the API never issued is refused too (what a forged msg1 payload would show).
    [registration] = sim.registrations(env_id)
    forged = httpx.post(
        f"{sim.base_url}/cloud/environment/{env_id}/validate",
        headers={"authorization": f"Bearer {sim.environment_key}"},
        json={"executor_registration_id": registration["id"], "harness_key_authorization": "hka_forged"},
    )
    assert forged.json() == {"valid": False}


def test_many_streams_on_one_websocket(executor: Callable[..., tuple[SimulatorProcess, str]]) -> None:
    """Eight streams opened at once on the one WebSocket, each with its own handshake and
    command; every answer comes back on its own stream."""
    sim, session_id = executor()
    env_id = _env_id(sim, session_id)
    count = 8

    def run(n: int) -> dict[str, Any]:
        return _exec(sim, env_id, argv=["sh", "-c", f"sleep 0.3; echo stream-{n}"], new_stream=True)

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(run, range(count)))
    assert [r["stdout"] for r in results] == [f"stream-{n}\n" for n in range(count)]
    link = _link(sim, env_id)
    assert link["streams_opened"] == count
    assert len(sim.registrations(env_id)) == 1
    assert sum(v["valid"] for v in sim.admin("GET", "/admin/validations")["data"]) == count


def test_large_output_and_large_requests_span_several_records(
    executor: Callable[..., tuple[SimulatorProcess, str]],
) -> None:
    """300 000 bytes of output come back whole and in order; 210 KiB of arguments go out in
    several ≤ 60 KiB records and arrives intact."""
    sim, session_id = executor()
    env_id = _env_id(sim, session_id)
    big = _exec(sim, env_id, argv=["sh", "-c", "i=0; while [ $i -lt 30000 ]; do printf '%09d\\n' $i; i=$((i+1)); done"])
    assert big["status"] == "completed" and big["stdout_bytes"] == 300_000
    expected = "".join(f"{i:09d}\n" for i in range(30_000))
    assert base64.b64decode(big["stdout_base64"]).decode() == expected

    arguments = ["x" * (70 * 1024)] * 3  # one argument may hold at most 128 KiB on Linux
    before = _link(sim, env_id)["records_out"]
    echoed = _exec(sim, env_id, argv=["sh", "-c", 'printf %s "$@" | wc -c', "sh", *arguments])
    assert echoed["stdout"].strip() == str(3 * 70 * 1024), echoed
    assert _link(sim, env_id)["records_out"] - before >= 4  # one process/start message in ≥ 4 records


def test_a_turn_runs_its_commands_and_records_them(executor: Callable[..., tuple[SimulatorProcess, str]]) -> None:
    """Input whose turn carries commands: they run in order in the sandbox's workspace, the
    session goes in_progress → idle, and the turn records stdout, exit code and timing."""
    sim, session_id = executor(args=["--turn-seconds", "0.2"])
    turn = sim.admin(
        "POST", f"/admin/sessions/{session_id}/turns", {"commands": [NOTES, ["sh", "-c", "wc -c notes.txt"]]}
    )
    assert [c["status"] for c in turn["commands"]] == ["pending", "pending"]
    sim.wait_for_status(session_id, "idle", timeout=30)
    [done] = sim.admin("GET", f"/admin/sessions/{session_id}/turns")["data"]
    first, second = done["commands"]
    assert (first["status"], first["stdout"], first["exit_code"]) == ("completed", "hello\n", 0)
    assert second["stdout"] == "6 notes.txt\n"
    assert first["finished_at"] <= second["started_at"]


def test_a_link_dropping_mid_command_does_not_run_it_again(
    executor: Callable[..., tuple[SimulatorProcess, str]], tmp_path: Path
) -> None:
    """The link closes while a command runs: that command is marked interrupted and never
    started again; the session asks for a connection, codex reconnects by itself, and the
    turn goes on with the commands not yet started."""
    sim, session_id = executor(args=["--turn-seconds", "0.2"])
    env_id = _env_id(sim, session_id)
    slow = ["sh", "-c", "echo started >> runs.txt; sleep 3"]
    sim.admin("POST", f"/admin/sessions/{session_id}/turns", {"commands": [slow, ["cat", "runs.txt"]]})
    wait_for(lambda: (tmp_path / "workspace" / "runs.txt").exists(), 20, "the slow command to start")
    assert sim.admin("POST", f"/admin/environments/{env_id}/disconnect")["closed"] == 1

    def finished() -> dict[str, Any] | None:
        [turn] = sim.admin("GET", f"/admin/sessions/{session_id}/turns")["data"]
        return turn if turn["status"] == "finished" else None

    turn = wait_for(finished, 45, "the turn to finish after codex reconnected")
    assert isinstance(turn, dict)
    interrupted, reader = turn["commands"]
    assert interrupted["status"] == "interrupted" and "not run again" in interrupted["error"]
    assert reader["status"] == "completed"
    assert reader["stdout"] == "started\n"  # one line: the slow command ran once
    sim.wait_for_status(session_id, "idle", timeout=30)
    assert len(sim.registrations(env_id)) == 1  # it reconnected to the same URL


def test_a_command_without_a_working_link_fails_and_the_turn_completes() -> None:
    """An executor that is connected but does not speak the harness protocol (a key it cannot
    use, as the stand-in registers): the command's tool call fails, the turn still completes."""
    with InProcessSimulator.on_free_port(turn_seconds=0.1) as sim:
        with sim.http() as client:
            session = client.post("/v1/agents/sessions", json={"environment": SELF_HOSTED}).json()
        env_id = session["environment"]["id"]
        registered = httpx.post(
            f"{sim.base_url}/cloud/environment/{env_id}/register",
            headers={"authorization": f"Bearer {sim.config.environment_key}"},
            json={"security_profile": "noise_hybrid_ik_v1", "executor_public_key": {"suite": "none"}},
        ).json()
        with connect(registered["url"], open_timeout=10):
            wait_for(lambda: sim.environment_status(env_id) == "connected", 10, "the link")
            sim.admin("POST", f"/admin/sessions/{session['id']}/turns", {"commands": [NOTES]})
            sim.wait_for_status(session["id"], "idle", timeout=20)
            [turn] = sim.admin("GET", f"/admin/sessions/{session['id']}/turns")["data"]
        [command] = turn["commands"]
        assert command["status"] == "failed"
        assert command["error"].startswith("tool execution failed")
        assert command["exit_code"] is None


def test_commands_of_a_turn_whose_sandbox_never_connects_fail_with_the_session() -> None:
    """No executor connects within the connect timeout: the session fails, and the turn's
    commands fail with it (never left pending, never run later)."""
    with InProcessSimulator.on_free_port(connect_timeout_seconds=0.5) as sim:
        with sim.http() as client:
            session = client.post("/v1/agents/sessions", json={"environment": SELF_HOSTED}).json()
        sim.admin("POST", f"/admin/sessions/{session['id']}/turns", {"commands": [NOTES]})
        assert sim.session(session["id"])["status"] == "requires_action"
        failed = sim.wait_for_status(session["id"], "failed", timeout=10)
        [turn] = sim.admin("GET", f"/admin/sessions/{session['id']}/turns")["data"]
        [command] = turn["commands"]
        assert command["status"] == "failed"
        assert command["error"] == f"tool execution failed: the session failed: {failed['error']}"
