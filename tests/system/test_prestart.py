"""Pre-start (L9's eager mode) with real parts on loopback: the simulator's signed
``agent.session.created`` → a receiver (``sandbox-controller serve``) → Redis → a Celery worker → the local runner
with the real codex, for sessions of the one agent configured to pre-start. The idle timeout is
a few seconds, so an unused pre-started sandbox is seen to stop.

Tests run in file order and share one world. FIGURE lines are printed for BENCHMARKS.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.codex import codex_binary
from tests.support.processes import wait_for
from tests.system.loop import Loop

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

AGENT = "agent_prestart"
TIMEOUT = 3  # CONTROLLER_IDLE_TIMEOUT_SECONDS in this world


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    world = Loop(
        tmp_path_factory.mktemp("prestart"),
        codex_binary(),
        receivers=1,
        workers=1,
        extra_env={"CONTROLLER_PRESTART_AGENT_IDS": AGENT, "CONTROLLER_IDLE_TIMEOUT_SECONDS": str(TIMEOUT)},
    )
    try:
        world.start()
        yield world
    finally:
        world.stop()


def _create(loop: Loop, agent_id: str) -> dict[str, Any]:
    """A session of ``agent_id`` with no input yet: nothing asks for a connection."""
    with loop.api() as client:
        return loop.create_session(client, input_text=None, agent=None, agent_id=agent_id)


def _registered(loop: Loop, environment_id: str) -> list[dict[str, Any]]:
    return [r for r in loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200]


def _looked_up(loop: Loop, session_id: str) -> list[dict[str, Any]]:
    return loop.worker_lines("session looked up", session_id)


def _stops(loop: Loop, session_id: str) -> list[dict[str, Any]]:
    return loop.worker_lines("sandbox stopped", session_id)


def _types(loop: Loop, session_id: str) -> list[str]:
    return [str(e["type"]) for e in loop.events_sent(session_id)]


def test_a_prestart_agents_session_is_connected_before_its_first_input(loop: Loop) -> None:
    """L9, L8: the creation's webhook starts the session's executor before anything asks for
    it; it registers with the session's environment id and the key, so the first input's turn
    starts at once: the API never has to send an environment_connection action."""
    started = time.monotonic()
    session = _create(loop, AGENT)
    sid, environment_id = session["id"], session["environment"]["id"]
    [registered] = wait_for(lambda: _registered(loop, environment_id), 60, "the pre-started executor to register")
    elapsed = time.monotonic() - started
    assert registered["key_matched"] is True
    wait_for(lambda: loop.environment_status(environment_id) == "connected", 30, "the environment to connect")
    [first] = _looked_up(loop, sid)[:1]
    assert first["verdict"] == "start" and first["reason"].startswith("pre-start")

    loop.submit(sid, "hello")
    wait_for(lambda: loop.session(sid)["status"] == "idle", 60, "the turn to finish")
    assert "agent.session.in_progress" in _types(loop, sid)
    assert "agent.session.action_required" not in _types(loop, sid)  # connected before it was needed
    assert len(_registered(loop, environment_id)) == 1
    print(f"\nFIGURE pre-start: session created → executor registered in {elapsed:.2f}s, before any input")


def test_an_unused_prestarted_sandbox_is_stopped_after_the_idle_timeout(loop: Loop) -> None:
    """L9, L11: a pre-started sandbox nobody uses is stopped once its session has been idle for
    the idle timeout, like any other; its session gets no second sandbox by itself."""
    session = _create(loop, AGENT)
    sid, environment_id = session["id"], session["environment"]["id"]
    wait_for(lambda: _registered(loop, environment_id), 60, "the pre-started executor to register")
    wait_for(lambda: loop.live_executors()[sid] == 0, 60, "the unused executor to be stopped")
    [stop] = wait_for(lambda: _stops(loop, sid), 30, "the stop to be logged")  # logged after the executor went
    assert stop["cause"] == "idle"
    time.sleep(2 * TIMEOUT)  # another look, if anything were to start it again
    assert loop.live_executors()[sid] == 0 and len(_registered(loop, environment_id)) == 1
    assert len(_stops(loop, sid)) == 1


def test_other_agents_sessions_wait_for_a_connection_request(loop: Loop) -> None:
    """L9, L4: the creation of another agent's session is worked and starts nothing; its
    executor starts only when its first input asks for a connection."""
    session = _create(loop, "agent_other")
    sid, environment_id = session["id"], session["environment"]["id"]
    looked = wait_for(lambda: _looked_up(loop, sid), 60, "the creation's job to be worked")
    assert [line["verdict"] for line in looked] == ["ignore"]
    assert loop.live_executors()[sid] == 0 and _registered(loop, environment_id) == []

    loop.submit(sid, "hello")
    wait_for(lambda: _registered(loop, environment_id), 60, "the executor to register on request")
    assert "agent.session.action_required" in _types(loop, sid)
