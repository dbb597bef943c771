"""The lifecycle under its own faults (issue 37, items 1–3), with real parts on loopback:
receivers, Celery worker processes, the scheduler, redis-server, the simulator and the real codex.

1. Rounds that read a session fine but fail (its replacement's start fails) forget its 404s:
   a later single 404 is not a deletion (L7, L17).
2. An executor that exits at start (the API refuses its registration) is restarted with a
   growing back-off, counted, and shown by ``status``; once the API accepts it, it connects (L14,
   L15).
3. A wedged executor is replaced while the API fails a read of its environment every few
   seconds (L14, L15).

The deterministic guards of these rules are the unit tests over the fakes
(tests/unit/test_idle.py, tests/unit/test_everyday_faults.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.codex import codex_binary
from tests.support.local_runner import live
from tests.support.processes import python_module, wait_for
from tests.system.loop import Loop, connected_session, looked_up, started, workspace_of

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

REFUSED_SECONDS = 20.0
"""How long the API refuses every executor's registration (503)."""


def test_an_executor_that_exits_at_start_is_restarted_with_a_back_off(tmp_path: Path) -> None:
    """L14/L15 (issue 37, item 2): for 20 s the API answers every registration 503, and codex
    exits at each refusal. The session's executor is restarted after 2 s, 4 s, 8 s … (the first
    exit at once), not every look: a handful of starts in those 20 s where a restart at each look
    made one every second and a half. Each back-off is a warning line and counts in
    ``controller_sandbox_crash_loops_total``; ``status`` shows the loop. Once registrations are
    accepted again, the next start connects and the session's turn runs."""
    with started(tmp_path, receivers=1) as loop:
        httpx.post(
            f"{loop.simulator_url}/admin/faults",
            json={"target": "register", "status": 503, "seconds": REFUSED_SECONDS},
            timeout=10,
        ).raise_for_status()
        refused_until = time.monotonic() + REFUSED_SECONDS
        window_end = time.time() + REFUSED_SECONDS - 0.5  # the simulator's clock is the wall clock
        with loop.api() as client:
            session = loop.create_session(client)
        sid, environment_id = session["id"], session["environment"]["id"]
        wait_for(lambda: loop.worker_lines("crash loop back-off", sid), 30, "a crash loop back-off")
        status = subprocess.run(
            python_module("controller", "status"), env=loop.controller_env(), capture_output=True, text=True, timeout=60
        )
        assert "CrashLoopBackOff" in status.stdout, status.stdout + status.stderr
        time.sleep(max(0.0, refused_until - time.monotonic()))
        refused_starts = len(loop.worker_lines("executor process started", sid))
        refused = [
            r
            for r in loop.registrations()
            if r["environment_id"] == environment_id and r["received_at"] < window_end  # the last may be after it
        ]
        assert refused and all(r["status_code"] == 503 for r in refused), refused
        # 0, ~1, ~4, ~9, ~18 s with the back-off (a look per second or two finds each exit);
        # a restart at each look made 13 or more.
        assert 3 <= refused_starts <= 7, refused_starts
        assert loop.worker_metric("controller_sandbox_crash_loops_total") >= 2
        wait_for(lambda: loop.session(sid)["status"] == "idle", 120, "the turn to run once registrations are accepted")
        assert loop.environment_status(environment_id) == "connected"
        assert loop.live_executors()[sid] == 1


CONFIRM = 6.0
"""``CONTROLLER_DELETION_CONFIRM_SECONDS`` here: its reads come at the first 404, 3 s and 7 s later."""


def one_404(loop: Loop, session_id: str) -> None:
    """The simulator answers the next read of ``session_id`` (only) with 404."""
    fault: dict[str, Any] = {"target": "retrieve_session", "status": 404, "object_id": session_id, "count": 1}
    httpx.post(f"{loop.simulator_url}/admin/faults", json=fault, timeout=10).raise_for_status()


def not_found(loop: Loop, session_id: str) -> list[dict[str, Any]]:
    return [x for x in looked_up(loop, session_id) if x["status"] == "not found"]


def test_rounds_that_find_a_session_and_fail_forget_its_404s(tmp_path: Path) -> None:
    """L7/L17 (issue 37, item 1): sessions S and T connected (T answers, for the comparison). S's
    reads answer 404 twice — the first 404 and the read half-way through the confirmation period,
    two of its three spread reads — then S reads fine (its executor gone, new input asks for a
    connection), but every round wants a replacement whose start fails: the executor binary is
    being replaced. One more one-shot 404 after the period is one 404, not a deletion: S's
    workspace stays, nothing is released, and once the binary is back S's turn runs."""
    codex = tmp_path / "bin" / "codex"
    codex.parent.mkdir()
    codex.symlink_to(codex_binary())
    # Sweeps (every 3 s in these worlds, and full with the local runner) would read S too, and
    # take the one-shot 404s meant for its timer's reads: one sweep at the start, then none.
    settings = {"CONTROLLER_DELETION_CONFIRM_SECONDS": str(CONFIRM), "CONTROLLER_RECONCILE_INTERVAL_SECONDS": "300"}
    with started(tmp_path, codex=str(codex), receivers=1, extra_env=settings) as loop:
        s, _ = connected_session(loop)
        connected_session(loop)
        workspace = workspace_of(loop, s)
        one_404(loop, s)
        headers, body = loop.delivery(s, event_type="agent.session.idle")
        assert loop.post(loop.receiver_ports[0], headers, body).status_code == 200
        [first] = wait_for(lambda: not_found(loop, s), 30, "the first 404")
        one_404(loop, s)  # the read half-way through the period (its timer) answers 404 too
        second = wait_for(lambda: not_found(loop, s)[1:], 30, "the second 404")[0]
        assert second["reason"].startswith("session not found") and "(2 of 3 spread reads)" in second["reason"]
        codex.unlink()  # the executor binary is being replaced
        [handle] = [h for h in live(loop.runner()) if h.session_id == s]
        loop.runner().release(handle)  # its executor went (an OOM kill, a crash)
        loop.submit(s, "are you there?")  # the API asks for a connection: S reads fine
        wait_for(lambda: len(loop.worker_lines("sandbox start failed", s)) >= 2, 60, "rounds that fail")
        time.sleep(max(0.0, first["time"] + CONFIRM + 0.5 - time.time()))
        one_404(loop, s)  # one more 404, a period after the first
        wait_for(lambda: len(not_found(loop, s)) == 3, 60, "the third 404")
        time.sleep(2)
        assert loop.worker_lines("sandbox released", s) == [] and loop.worker_lines("sandbox stopped", s) == []
        assert workspace.is_dir()
        codex.symlink_to(codex_binary())  # the binary is back
        wait_for(lambda: loop.session(s)["status"] == "idle", 120, "S's turn once the binary is back")
        assert workspace.is_dir() and loop.live_executors()[s] == 1


GRACE = 20
"""``CONTROLLER_EXECUTOR_GRACE_SECONDS`` here, as in the issue."""


def test_a_wedged_executor_is_replaced_while_the_api_fails_a_read_every_few_seconds(tmp_path: Path) -> None:
    """L14/L15 (issue 37, item 3): grace 20 s; a session's executor connects, its turn runs, and
    then its link goes down for good as far as this test lasts (WebSockets closed, upgrades
    refused: the executor is alive but wedged), while the API fails three reads of the
    environment (503: the attempts of one look, every other look) every 10 s. (The issue's
    three failures every 8 s; here the looks' cadence, one every quarter of the grace, and the
    client's three attempts make every 10 s the pattern that leaves looks that read the link
    down between the blind spots.) Each failed look is a blind spot that
    restarts the grace clock, which then never reached the grace; blind spots extend it at most
    once, so the executor is replaced (within two graces and a look of the first look that saw
    it down, or that met the API's request for a connection and could not read the link: the
    faults, armed by count, can meet every look), long before the API's five minutes are over."""
    settings = {"CONTROLLER_EXECUTOR_GRACE_SECONDS": str(GRACE), "CONTROLLER_RECONCILE_INTERVAL_SECONDS": "300"}
    with started(tmp_path, receivers=1, extra_env=settings) as loop:
        with loop.api() as client:
            session = loop.create_session(client, input_text=None)
        sid, environment_id = session["id"], session["environment"]["id"]
        httpx.post(
            f"{loop.simulator_url}/admin/sessions/{sid}/turns",
            json={"commands": [["sh", "-c", "sleep 200; echo first"]]},
            timeout=10,
        ).raise_for_status()
        wait_for(lambda: loop.session(sid)["status"] == "in_progress", 60, "the turn to run")
        client = loop.redis.client()
        wait_for(lambda: client.hget(f"sc:rec:{sid}", "seen_connected") == "1", 60, "a look to see it connected")
        looks_before = len(looked_up(loop, sid))
        stop = threading.Event()

        def fail_reads() -> None:  # three failed environment reads every 10 s
            while not stop.is_set():
                fault = {"target": "retrieve_environment", "status": 503, "object_id": environment_id, "count": 3}
                httpx.post(f"{loop.simulator_url}/admin/faults", json=fault, timeout=10).raise_for_status()
                stop.wait(10)

        failing = threading.Thread(target=fail_reads, daemon=True)
        failing.start()
        try:
            httpx.post(
                f"{loop.simulator_url}/admin/environments/{environment_id}/drop", json={"seconds": 300}, timeout=10
            ).raise_for_status()
            replaced = wait_for(
                lambda: [x for x in looked_up(loop, sid)[looks_before:] if x["verdict"] == "replace"],
                4 * GRACE,
                "the wedged executor's replacement",
            )
        finally:
            stop.set()
            failing.join(10)
        assert "could not read its link" in replaced[0]["reason"], replaced[0]
        assert loop.worker_lines("grace clock blind spot", sid) or any(
            x["reason"] == "executor link state unknown; looking again later" for x in looked_up(loop, sid)
        )
        wait_for(lambda: len(loop.worker_lines("executor process started", sid)) == 2, 30, "the replacement")
