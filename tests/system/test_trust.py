"""L2 on loopback with real parts: the executor key goes only to an allowed ``remote_url``.

One receiver, one Celery worker process, Redis, the simulator and the real codex, with the
allow-list the system tests use (``127.0.0.1``, the simulator's host). A second HTTP listener
on 127.0.0.1 records every request it gets; a session is pointed at it as ``localhost`` (a
host not in the allow-list). The worker must refuse the session and start nothing, so the
listener sees nothing. A control run of codex itself, pointed at the same URL with a dummy
key, shows that the listener would have seen the key if an executor had been started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.codex import codex_binary
from tests.support.processes import Managed, wait_for
from tests.system.loop import EXECUTOR_KEY, Loop, assert_no_secret

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

PROBE_KEY = "probe-key-not-the-executor-key"


class Listener:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and records each request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        recorded = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(min(length, 65536))
                recorded.append(
                    {"method": self.command, "path": self.path, "authorization": self.headers.get("authorization")}
                )
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    world = Loop(tmp_path_factory.mktemp("trust"), codex_binary(), receivers=1, workers=1)
    try:
        world.start()
        yield world
    finally:
        world.stop()


def _refusals(loop: Loop, session_id: str) -> list[dict[str, object]]:
    return loop.worker_lines("session refused", session_id)


def _point_and_ask(loop: Loop, remote_url: str) -> dict[str, Any]:
    """A session (no input yet) whose remote_url names ``remote_url``; then input asks for a connection."""
    with loop.api() as client:
        session = loop.create_session(client, input_text=None)
        admin = f"{loop.simulator_url}/admin/sessions/{session['id']}/remote_url"
        httpx.post(admin, json={"remote_url": remote_url}, timeout=10).raise_for_status()
        viewed = client.get(f"/v1/agents/sessions/{session['id']}").json()
        assert viewed["environment"]["remote_url"] == remote_url
        client.post(
            f"/v1/agents/sessions/{session['id']}/events",
            json={"events": [{"type": "agent.session.input.message", "input": "hello"}]},
        ).raise_for_status()
    return session


def test_a_foreign_remote_url_never_gets_the_executor_key(loop: Loop, tmp_path: Path) -> None:
    """L2: a session whose remote_url names a host outside the allow-list (another listener on
    loopback) is refused by the worker: no executor starts, the listener receives nothing,
    and the refusal is logged with its reason. A control shows the listener would have heard
    an executor pointed there."""
    with Listener() as listener:
        foreign = f"http://localhost:{listener.port}"
        session = _point_and_ask(loop, foreign)
        sid, environment_id = session["id"], session["environment"]["id"]

        [refusal] = wait_for(lambda: _refusals(loop, sid), 60, "the worker to refuse the session")  # type: ignore[misc]
        assert refusal["refused"] == "remote_url"
        assert refusal["reason"] == "refused: remote_url host is not allowed"
        assert refusal["environment_id"] == environment_id
        looked_up = [
            line
            for line in loop.workers[0].log_lines()
            if line.get("event") == "session looked up" and line.get("session_id") == sid
        ]
        assert [line["verdict"] for line in looked_up] == ["ignore"]

        # The refusal was the worker's whole answer: nothing was started, nothing was sent.
        assert listener.requests == []
        assert loop.live_executors()[sid] == 0
        assert loop.runner().find(sid) is None
        assert [line for line in loop.started_log_lines() if line.get("session_id") == sid] == []
        assert [r for r in loop.registrations() if r["environment_id"] == environment_id] == []

        # Control: codex itself, pointed at the same URL, does reach the listener with its key.
        probe = _codex_probe(loop.codex, foreign, environment_id, tmp_path)
        try:
            wait_for(lambda: listener.requests, 60, "the control executor to reach the listener")
            wait_for(lambda: not probe.alive(), 30, "the control executor to exit after a 404")
        finally:
            probe.stop()
        seen = listener.requests[0]
        assert seen["method"] == "POST" and seen["path"] == f"/cloud/environment/{environment_id}/register"
        assert seen["authorization"] == f"Bearer {PROBE_KEY}"
        assert all(EXECUTOR_KEY not in str(r["authorization"]) for r in listener.requests)
    _assert_gone(probe)
    assert_no_secret(loop.all_output())


def _codex_probe(codex: str, remote_url: str, environment_id: str, tmp_path: Path) -> Managed:
    home = tmp_path / "probe-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "SSL_CERT_FILE")}
    env.update(HOME=str(home), CODEX_HOME=str(home), CODEX_API_KEY=PROBE_KEY)
    argv = [codex, "exec-server", "--remote", remote_url, "--environment-id", environment_id]
    return Managed("codex-probe", argv, env, tmp_path / "probe.log").start()


def _assert_gone(process: Managed) -> None:
    """No live process of the probe's group is left (codex's npm launcher starts a native child)."""
    wait_for(lambda: not _live_members(process.pid), 10, "the control executor's process group to end")


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
