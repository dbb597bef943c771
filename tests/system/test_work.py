"""Sandboxes that work, not only connect: through the whole loop (webhook → receiver →
worker → local runner → the real codex), the simulator's turns run commands in the
session's sandbox and their output comes back; the workspace outlives a replaced executor."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from controller.runners.local import members, session_key
from tests.support.local_runner import live
from tests.support.processes import wait_for
from tests.support.simulator import run_turn
from tests.system.loop import Loop

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

NOTES = ["sh", "-c", "echo hello > notes.txt; cat notes.txt"]


def _status(loop: Loop, session_id: str) -> str:
    with loop.api() as client:
        return str(client.get(f"/v1/agents/sessions/{session_id}").json()["status"])


def _registrations(loop: Loop, environment_id: str) -> list[dict[str, Any]]:
    return [r for r in loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200]


def test_a_command_runs_in_the_sandbox_workspace_and_its_output_comes_back(loop: Loop) -> None:
    """L8: input whose turn carries a command: the webhook starts the sandbox, the executor
    connects, the command runs in that session's workspace, and its stdout, exit code and
    timing come back to the API."""
    with loop.api() as client:
        session = loop.create_session(client, input_text=None)
    turn = run_turn(loop.simulator_url, session["id"], [NOTES, ["pwd"]])
    notes, pwd = turn["commands"]
    workspace = loop.state_directory / "sessions" / session_key(session["id"]) / "workspace"
    assert (notes["status"], notes["stdout"], notes["exit_code"]) == ("completed", "hello\n", 0), notes
    assert notes["cwd"] == str(workspace)
    assert pwd["stdout"] == f"{workspace}\n"
    assert (workspace / "notes.txt").read_text() == "hello\n"
    assert notes["duration_seconds"] is not None and notes["duration_seconds"] >= 0
    wait_for(lambda: _status(loop, session["id"]) == "idle", 30, "the turn to end idle")


def test_a_file_written_in_turn_1_is_read_in_turn_2_by_a_replacement_executor(loop: Loop) -> None:
    """L8, L16: turn 1 writes a file; the executor is then killed (its whole process group);
    turn 2's input asks for a connection, the controller replaces the executor, and turn 2's
    command reads the file from the workspace the local runner kept for the session."""
    with loop.api() as client:
        session = loop.create_session(client, input_text=None)
    environment_id = session["environment"]["id"]
    first = run_turn(loop.simulator_url, session["id"], [NOTES])
    assert first["commands"][0]["stdout"] == "hello\n"
    wait_for(lambda: _status(loop, session["id"]) == "idle", 30, "turn 1 to end idle")

    handle = next(h for h in live(loop.runner()) if h.session_id == session["id"])
    leader, ticks = (int(part) for part in handle.uid.split(":"))
    for process in members(leader, ticks):
        os.kill(process.pid, signal.SIGKILL)
    wait_for(lambda: not members(leader, ticks), 30, "the executor's processes to be gone")
    wait_for(lambda: loop.environment_status(environment_id) == "disconnected", 30, "the link to drop")

    second = run_turn(loop.simulator_url, session["id"], [["cat", "notes.txt"]])
    [read] = second["commands"]
    assert (read["status"], read["stdout"], read["exit_code"]) == ("completed", "hello\n", 0), read
    assert read["cwd"] == first["commands"][0]["cwd"]
    replacement = next(h for h in live(loop.runner()) if h.session_id == session["id"])
    assert replacement.uid != handle.uid
    assert len(_registrations(loop, environment_id)) == 2  # the replacement registered afresh
