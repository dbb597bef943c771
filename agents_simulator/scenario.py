"""The scripted scenario ``sandbox-controller dev --simulate`` plays against the simulator.

A few sessions with input (each asks for an environment connection), the action-required
webhook of one delivered again three times at once (duplicates, concurrently), and one
session forced to fail (its sandbox must be released). It then waits until every healthy
session's turn has run to ``idle``, sends one session a turn that runs a command in its
sandbox (``sh -c 'echo hello > notes.txt; cat notes.txt'``), and prints what came back. On
the stand-in executor (no codex installed) the command is skipped, and said to be; a command
that fails makes the scenario fail.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from agents_simulator.waiting import TimedOut, wait_for


class Reporter(Protocol):
    def say(self, source: str, what: str, subject: str = "", detail: str = "") -> None: ...


COMMAND = ["sh", "-c", "echo hello > notes.txt; cat notes.txt"]


def run_scenario(
    view: Reporter,
    base_url: str,
    api_key: str,
    sessions: int = 3,
    timeout: float = 120.0,
    runs_commands: bool = True,
) -> bool:
    """Play the scenario; whether all went well (every command it ran included).
    ``runs_commands`` False: the executor is a stand-in, which runs no commands, so the command
    is skipped (and reported so) rather than sent to fail."""
    headers = {"Authorization": f"Bearer {api_key}", "OpenAI-Beta": "agents=v1"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=10) as api:
        created = [_create(api, f"scenario input {n}") for n in range(sessions)]
        for session in created:
            view.say("scenario", "session created", session["id"], session["environment"]["id"])
        doomed = _create(api, "this one will fail")
        view.say("scenario", "session created", doomed["id"], "(will be failed)")

        first = created[0]["id"]
        event_id = _wait_for_event(api, first, "agent.session.action_required")
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(lambda _: api.post(f"/admin/webhooks/resend/{event_id}"), range(3)))
        view.say("scenario", "resent webhook 3x at once", first, "same webhook-id: expect duplicates")

        _wait(lambda: _registered(api, doomed["environment"]["id"]), timeout, "the doomed session's executor")
        api.post(f"/admin/sessions/{doomed['id']}/fail").raise_for_status()
        view.say("scenario", "forced session failure", doomed["id"])

        ids = [s["id"] for s in created]
        ok = _wait(
            lambda: all(api.get(f"/v1/agents/sessions/{sid}").json()["status"] == "idle" for sid in ids),
            timeout,
            "every healthy session to be idle",
        )
        registrations = api.get("/admin/registrations").json()["data"]
        per_env: dict[str, int] = {}
        for registration in registrations:
            if registration["status_code"] == 200:
                per_env[registration["environment_id"]] = per_env.get(registration["environment_id"], 0) + 1
        counts = [per_env.get(s["environment"]["id"], 0) for s in created]
        if runs_commands:
            command_ok, command = _run_command(api, view, first, timeout), "command ran"
        else:
            view.say("scenario", "command skipped", first, "the STAND-IN executor runs no commands: install codex")
            command_ok, command = True, "command skipped"
        verdict = "ok" if ok and command_ok and all(c == 1 for c in counts) else "PROBLEM"
        if not command_ok:
            command = "command FAILED"
        view.say(
            "scenario",
            f"scenario {verdict}",
            "",
            f"{sum(1 for s in ids if ok)}/{len(ids)} idle; registrations per session: {counts}; {command}",
        )
        return verdict == "ok"


def _run_command(api: httpx.Client, view: Reporter, session_id: str, timeout: float) -> bool:
    """A turn that runs ``COMMAND`` in the session's sandbox; whether its output came back."""
    response = api.post(f"/admin/sessions/{session_id}/turns", json={"commands": [COMMAND]})
    response.raise_for_status()
    turn_id = response.json()["id"]
    view.say("scenario", "turn with a command", session_id, " ".join(COMMAND))
    finished: list[dict[str, Any]] = []

    def done() -> bool:
        for turn in api.get(f"/admin/sessions/{session_id}/turns").json()["data"]:
            if turn["id"] == turn_id and turn["status"] == "finished":
                finished.append(turn)
                return True
        return False

    if not _wait(done, timeout, "the command's turn to finish"):
        view.say("scenario", "command never finished", session_id)
        return False
    [command] = finished[0]["commands"]
    if command["status"] != "completed":
        view.say("scenario", "command failed", session_id, str(command["error"]))
        return False
    stdout = command["stdout"].strip().replace("\n", " | ")
    seconds = command["duration_seconds"]
    view.say("scenario", "command output", session_id, f"{stdout!r} (exit {command['exit_code']}, {seconds:.2f}s)")
    view.say("scenario", "ran in", session_id, str(command["cwd"]))
    return bool(command["exit_code"] == 0 and command["stdout"] == "hello\n")


def _create(api: httpx.Client, text: str) -> dict[str, Any]:
    response = api.post(
        "/v1/agents/sessions",
        json={
            "agent": {"model": "gpt-dev"},
            "environment": {"type": "self_hosted", "workspace_directory": "/workspace"},
            "input": text,
            "metadata": {"source": "sandbox-controller dev"},
        },
    )
    response.raise_for_status()
    return dict(response.json())


def _wait_for_event(api: httpx.Client, session_id: str, event_type: str) -> str:
    found: list[str] = []

    def look() -> bool:
        for event in api.get("/admin/events").json()["data"]:
            if event["type"] == event_type and event["data"].get("id") == session_id:
                found.append(event["id"])
                return True
        return False

    wait_for(look, 30, f"a {event_type} event for {session_id}")
    return found[0]


def _registered(api: httpx.Client, environment_id: str) -> bool:
    data = api.get("/admin/registrations", params={"environment_id": environment_id}).json()["data"]
    return any(r["status_code"] == 200 for r in data)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> bool:
    """Whether ``check`` came true within ``timeout`` (the scenario reports, rather than raises)."""
    try:
        return wait_for(check, timeout, what, interval=0.3)
    except TimedOut:
        return False
