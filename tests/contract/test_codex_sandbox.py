"""Commands that ask for Codex's own sandbox, as the API asks for them (sessions with automatic
review): the simulator's ``process/start`` carries the ``sandbox`` request the real ``codex
exec-server`` 0.171.0 accepts, and reports what the executor said (``sandboxType``,
``sandboxDenied``). The confinement is the real one: bubblewrap namespaces and seccomp."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.codex import codex_binary, start_exec_server
from tests.support.listener import Listener, listener  # noqa: F401  (a fixture)
from tests.support.processes import end_group, wait_for
from tests.support.simulator import SimulatorProcess, StartSimulator, run_turn

pytestmark = pytest.mark.timeout(120)

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}
Start = Callable[..., tuple[SimulatorProcess, str, str]]


@pytest.fixture
def executor(start_simulator: StartSimulator, tmp_path: Path) -> Iterator[Start]:
    """A simulator, a session and a real codex connected to it (its cwd: the workspace);
    ``namespaces_off`` runs codex in a user namespace of the test's own whose
    ``user.max_user_namespaces`` is 0: a host that cannot give Codex its sandbox."""
    started: list[subprocess.Popen[bytes]] = []

    def start(namespaces_off: bool = False) -> tuple[SimulatorProcess, str, str]:
        binary = codex_binary()
        sim = start_simulator()
        with sim.http() as client:
            session = client.post("/v1/agents/sessions", json={"environment": SELF_HOSTED}).json()
        env_id = session["environment"]["id"]
        workspace = tmp_path / "workspace"
        workspace.mkdir(exist_ok=True)
        if namespaces_off:
            script = tmp_path / "codex-without-namespaces"
            script.write_text(
                "#!/bin/sh\n"
                'exec unshare -U -r sh -c \'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" "$@"\' '
                f'{shlex.quote(binary)} "$@"\n'
            )
            script.chmod(0o755)
            binary = str(script)
        started.append(start_exec_server(binary, sim.base_url, env_id, sim.environment_key, tmp_path, cwd=workspace))
        wait_for(lambda: sim.environment_status(env_id) == "connected", 20, "codex to connect")
        return sim, session["id"], env_id

    yield start
    for process in started:
        end_group(process)


def _exec(sim: SimulatorProcess, env_id: str, argv: list[str], sandbox: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"argv": argv}
    if sandbox is not None:
        body["sandbox"] = sandbox
    response = httpx.post(f"{sim.base_url}/admin/environments/{env_id}/exec", json=body, timeout=60)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    assert result["status"] == "completed", result
    return result


def test_workspace_write_writes_the_workspace_and_nothing_else_and_has_no_network(
    executor: Start,
    tmp_path: Path,
    listener: Listener,  # noqa: F811  (the fixture)
) -> None:
    """workspace-write, network off: the command runs inside Codex's sandbox (sandboxType
    linuxSeccomp), writes its workspace, is refused a write to /etc (sandboxDenied) and cannot
    open a socket to a listener on loopback — which the same executor reaches unsandboxed."""
    sim, _, env_id = executor()
    workspace = tmp_path / "workspace"
    wrote = _exec(sim, env_id, ["sh", "-c", "echo inside > notes.txt && cat notes.txt"], "workspace-write")
    assert (wrote["exit_code"], wrote["stdout"]) == (0, "inside\n"), wrote
    assert (wrote["sandbox_type"], wrote["sandbox_denied"]) == ("linuxSeccomp", False)
    assert wrote["sandbox"] == {"mode": "workspace-write", "network": False}
    assert (workspace / "notes.txt").read_text() == "inside\n"

    outside = Path("/etc") / f"sandbox-probe-{uuid.uuid4().hex}"
    try:
        refused = _exec(sim, env_id, ["touch", str(outside)], {"mode": "workspace-write"})
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"], refused
    assert (refused["sandbox_type"], refused["sandbox_denied"]) == ("linuxSeccomp", True)

    offline = _exec(sim, env_id, listener.connect_argv(), "workspace-write")
    assert offline["exit_code"] != 0 and "Operation not permitted" in offline["stderr"], offline
    assert offline["sandbox_denied"] is True and listener.accepted == 0

    unsandboxed = _exec(sim, env_id, listener.connect_argv())
    assert (unsandboxed["exit_code"], unsandboxed["sandbox_type"]) == (0, "none"), unsandboxed
    assert listener.accepted == 1


def test_network_on_reaches_loopback_and_read_only_writes_nothing(
    executor: Start,
    tmp_path: Path,
    listener: Listener,  # noqa: F811  (the fixture)
) -> None:
    """network on: the sandboxed command connects; read-only: not even the workspace is
    writable (sandboxDenied), though it reads it."""
    sim, _, env_id = executor()
    online = _exec(sim, env_id, listener.connect_argv(), {"mode": "workspace-write", "network": True})
    assert (online["exit_code"], online["stdout"], online["sandbox_type"]) == (0, "connected\n", "linuxSeccomp")
    assert listener.accepted == 1

    (tmp_path / "workspace" / "readme").write_text("read me\n")
    read = _exec(sim, env_id, ["cat", "readme"], "read-only")
    assert (read["exit_code"], read["stdout"], read["sandbox_denied"]) == (0, "read me\n", False)
    write = _exec(sim, env_id, ["sh", "-c", "echo no > notes.txt"], {"mode": "read-only", "network": True})
    assert write["exit_code"] != 0 and "Read-only file system" in write["stderr"], write
    assert write["sandbox_denied"] is True and not (tmp_path / "workspace" / "notes.txt").exists()


def test_a_turn_carries_the_sandbox_request(executor: Start, tmp_path: Path) -> None:
    """A scripted turn's command asks for the sandbox like a direct one; the turn's result says
    what was asked and what the executor did; a bad request is refused before anything runs."""
    sim, session_id, _ = executor()
    outside = Path("/etc") / f"sandbox-probe-{uuid.uuid4().hex}"
    try:
        argv = ["sh", "-c", f"echo turn > notes.txt; touch {outside}"]
        turn = run_turn(sim.base_url, session_id, [{"argv": argv, "sandbox": "workspace-write"}])
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    [command] = turn["commands"]
    assert command["status"] == "completed" and command["exit_code"] != 0, command
    assert command["sandbox"] == {"mode": "workspace-write", "network": False}
    assert (command["sandbox_type"], command["sandbox_denied"]) == ("linuxSeccomp", True)
    assert (tmp_path / "workspace" / "notes.txt").read_text() == "turn\n"
    bad = httpx.post(
        f"{sim.base_url}/admin/sessions/{session_id}/turns",
        json={"commands": [{"argv": ["true"], "sandbox": "danger-full-access"}]},
        timeout=10,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "commands.sandbox.mode"


def test_where_namespaces_are_off_the_sandboxed_command_fails_and_says_why(executor: Start) -> None:
    """An executor on a host that cannot give Codex its sandbox (no user namespaces left:
    ``user.max_user_namespaces = 0``, made here in a user namespace of the test's own): the
    unsandboxed command still runs; the sandboxed one does not run at all (exit 1), and
    bubblewrap's reason comes back — with ``sandboxDenied`` false: the executor does not count
    a sandbox it could not build as a denial, so only the message tells."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-U", "-r", "true"]).returncode != 0:
        pytest.skip("unshare -U -r is not available here")
    sim, _, env_id = executor(namespaces_off=True)
    plain = _exec(sim, env_id, ["echo", "plain"])
    assert (plain["exit_code"], plain["stdout"], plain["sandbox_type"]) == (0, "plain\n", "none")
    sandboxed = _exec(sim, env_id, ["echo", "inside"], "workspace-write")
    assert sandboxed["exit_code"] == 1 and sandboxed["stdout"] == "", sandboxed
    assert "bwrap: Creating new namespace failed" in sandboxed["stderr"], sandboxed
    assert sandboxed["sandbox_type"] == "linuxSeccomp" and sandboxed["sandbox_denied"] is False
