"""No work destroyed or dropped on partial evidence (issue 25), with real parts on loopback:
receivers, Celery worker processes, the scheduler, redis-server, the simulator and the
real codex.

1. Two one-shot 404s with the session readable between them do not delete it (L7, L17).
2. A start that fails because the executor binary is missing for a while is retried until it
   starts; the acknowledged request is not dropped (L7, L15).
3. Two link drops in one turn, each shorter than the grace, keep the live executor (L14).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.runners.local import session_key
from tests.support.codex import codex_binary
from tests.support.processes import python_module, wait_for
from tests.system.loop import Loop, connected_session, looked_up, started

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def one_404(loop: Loop, session_id: str, seconds: float | None = None) -> None:
    """The simulator answers the next read of ``session_id`` (only) with 404, or every read of it
    for ``seconds``."""
    fault: dict[str, Any] = {"target": "retrieve_session", "status": 404, "object_id": session_id}
    fault.update({"count": 1} if seconds is None else {"seconds": seconds})
    httpx.post(f"{loop.simulator_url}/admin/faults", json=fault, timeout=10).raise_for_status()


CONFIRM = 3.0
"""The loop's ``CONTROLLER_DELETION_CONFIRM_SECONDS``."""


def test_a_session_readable_between_two_one_shot_404s_keeps_its_sandbox(tmp_path: Path) -> None:
    """L7/L17 (issue 25, item 1): sessions S and T connected; S's read answers 404 once (the look
    a delivery causes); S reads fine after that; a second one-shot 404 is armed 2.5 s after the
    first, to land on the read that used to be the single re-check (confirmation 3 s). (A 404
    window of 1.2 s instead of one read raced the half-way re-check, which came 1.17 s after
    the first 404 on a loaded machine: three reads answered 404 and S was rightly released.)
    Not 404s for the whole period: S's executor, workspace and files stay, and S is not
    released. (The deterministic guard of the two-sample confirmation is the unit test in
    tests/unit/test_everyday_faults.py.)"""
    with started(tmp_path, receivers=1) as loop:
        s, _ = connected_session(loop)
        t, _ = connected_session(loop)
        workspace = loop.state_directory / "sessions" / session_key(s) / "workspace"
        one_404(loop, s)
        headers, body = loop.delivery(s, event_type="agent.session.idle")
        assert loop.post(loop.receiver_ports[0], headers, body).status_code == 200
        found = wait_for(lambda: [x for x in looked_up(loop, s) if x["status"] == "not found"], 30, "the 404")
        first = min(found, key=lambda x: float(x["time"]))
        time.sleep(max(0.0, first["time"] + 2.5 - time.time()))
        one_404(loop, s)
        time.sleep(4 * CONFIRM + 3)
        looks = sorted(looked_up(loop, s), key=lambda x: float(x["time"]))
        statuses = [x["status"] for x in looks if x["time"] >= first["time"]]
        assert "idle" in statuses, statuses  # a read between the 404s found it
        assert loop.worker_lines("sandbox stopped", s) == [] and loop.worker_lines("sandbox released", s) == []
        assert loop.live_executors()[s] == 1 and loop.live_executors()[t] == 1 and workspace.is_dir()


def test_a_start_that_fails_while_the_executor_binary_is_missing_is_retried(tmp_path: Path) -> None:
    """L7/L15 (issue 25, item 3): the executor binary is missing when a session asks for a
    connection (a node image update, an unmounted volume): the start fails, is logged and
    counted, ``explain`` says the last start failed and why, and the work stays owed; once the
    binary is back, a retry starts the executor and the session's turn runs."""
    missing = tmp_path / "bin" / "codex"
    with started(tmp_path, codex=str(missing), receivers=1) as loop:
        with loop.api() as client:
            session = loop.create_session(client)
        sid, environment_id = session["id"], session["environment"]["id"]
        failed = wait_for(lambda: loop.worker_lines("sandbox start failed", sid), 60, "a start to fail")
        assert failed[0]["kind"] == "transient" and "No such file" in failed[0]["reason"]
        explained = subprocess.run(
            python_module("controller", "explain", sid),
            env=loop.controller_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "last decision by a worker: start failed" in explained.stdout, explained.stdout + explained.stderr
        wait_for(lambda: len(loop.worker_lines("sandbox start failed", sid)) >= 2, 60, "a second attempt")
        assert loop.worker_lines("giving up on session", sid) == []
        missing.parent.mkdir()
        missing.symlink_to(codex_binary())  # the binary is back
        wait_for(lambda: loop.session(sid)["status"] == "idle", 180, "the turn to run once the binary is back")
        assert loop.environment_status(environment_id) == "connected"
        assert loop.worker_metric("controller_sandbox_start_failures_total") >= 2
        assert loop.live_executors()[sid] == 1


GRACE = 20
SECOND_DROP_AFTER = 16.0
SECOND_DROP_SECONDS = 6.0


def test_two_short_drops_in_one_turn_keep_the_live_executor(tmp_path: Path) -> None:
    """L14 (issue 25, item 4): a long turn; the link drops for 2 s and comes back; 16 s after the
    first drop it drops again for 6 s, over the moment a grace clock run from the first drop
    would end. No outage reaches the grace (the API asks for a connection at each drop; nothing
    reports the link coming back, and the sweep runs at its default interval, so no sweep looks
    in between): the executor is kept, one registration and one process for the whole turn.

    The issue's grace was 10 s with the second drop 8 s after the first; here both are doubled
    (grace 20 s), because codex's reconnect after a drop comes by its own backoff (about 1, 2,
    4 s… between attempts): after a drop of 5–6 s it may come 8 s or more after the drop ended,
    which with a 10-s grace makes an outage the API rightly reports as longer than the grace."""
    settings = {"CONTROLLER_EXECUTOR_GRACE_SECONDS": str(GRACE), "CONTROLLER_RECONCILE_INTERVAL_SECONDS": "300"}
    with started(tmp_path, receivers=1, extra_env=settings) as loop:
        with loop.api() as client:
            session = loop.create_session(client, input_text=None)
        sid, environment_id = session["id"], session["environment"]["id"]
        turn = httpx.post(
            f"{loop.simulator_url}/admin/sessions/{sid}/turns",
            json={
                "commands": [
                    ["sh", "-c", "sleep 45; echo first"],
                    ["sh", "-c", "sleep 45; echo second"],
                    ["sh", "-c", "sleep 45; echo third"],
                ]
            },
            timeout=10,
        )
        turn.raise_for_status()
        wait_for(lambda: loop.environment_status(environment_id) == "connected", 60, "the executor to connect")
        connected_at = time.monotonic()
        wait_for(lambda: loop.session(sid)["status"] == "in_progress", 30, "the turn to run")
        time.sleep(max(0.0, connected_at + GRACE + 2 - time.monotonic()))

        def drop(seconds: float) -> None:
            httpx.post(
                f"{loop.simulator_url}/admin/environments/{environment_id}/drop", json={"seconds": seconds}, timeout=10
            ).raise_for_status()

        first = time.monotonic()
        drop(2.0)
        time.sleep(max(0.0, first + SECOND_DROP_AFTER - time.monotonic()))
        drop(SECOND_DROP_SECONDS)
        time.sleep(GRACE + 5)
        assert all(line["verdict"] != "replace" for line in looked_up(loop, sid)), looked_up(loop, sid)
        assert (
            len([r for r in loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200])
            == 1
        )
        assert len(loop.worker_lines("executor process started", sid)) == 1
        assert loop.worker_lines("sandbox stopped", sid) == []
        assert loop.live_executors()[sid] == 1
