"""``sandbox-controller status`` and ``explain`` against real redis-server and the simulator:
the worker's decisions are noted in Redis, ``status`` lists the mapped sessions with them, and
``explain`` answers what ``decide`` says now without changing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from controller import queue, wiring
from controller.decide import Decision, Verdict
from controller.model import Handle, Record
from controller.store.base import Lease
from controller.store.redis import DECISION_TTL_SECONDS, RedisSessionStore
from tests.support.processes import assert_no_process_left
from tests.support.redis_server import RedisServer
from tests.support.simulator import SimulatorProcess, StartSimulator

pytestmark = pytest.mark.timeout(120)

SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}


def cli_env(server: RedisServer, simulator: SimulatorProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The CLI's environment: this process's without any ``CONTROLLER_*``, then Redis, the
    simulator's keys and the local runner under ``tmp_path`` (and ``extra``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(
        CONTROLLER_REDIS_URL=server.url,
        CONTROLLER_API_KEY=simulator.api_key,
        CONTROLLER_API_BASE_URL=simulator.base_url,
        CONTROLLER_EXECUTOR_KEY=simulator.environment_key,
        CONTROLLER_RUNNER="local",
        CONTROLLER_LOCAL_STATE_DIRECTORY=str(tmp_path / "sandboxes"),
        CONTROLLER_LOCAL_EXECUTOR_SAME_USER="true",
        CONTROLLER_REMOTE_URL_ALLOWLIST="127.0.0.1",
        **extra,
    )
    return env


def run(env: dict[str, str], *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "controller", *args, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_decisions_are_noted_and_read_back(server: RedisServer) -> None:
    """The worker's ``on_decision`` keeps the latest decision per session, with a TTL, stamped
    with Redis's clock."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    store = RedisSessionStore(client, lease_ttl_seconds=5)
    note = wiring.remember_decisions(store)
    note("sess_noted", Decision(Verdict.START, "connection requested; no sandbox"))
    note("sess_noted", Decision(Verdict.KEEP, "executor is connected"))
    last = store.last_decision("sess_noted")
    assert last is not None and (last.verdict, last.reason) == ("keep", "executor is connected")
    assert abs(last.at - time.time()) < 60
    assert 0 < client.ttl("sc:decision:sess_noted") <= DECISION_TTL_SECONDS
    assert store.last_decision("sess_unknown") is None
    assert store.record("sess_noted") is None  # a note is not a mapping


def test_a_start_timeline_is_replaced_by_a_new_start_and_never_completed_by_an_older_one(server: RedisServer) -> None:
    """A new start's timeline replaces the last one; stamps a watch job of the older sandbox
    adds later are refused (they would mix two starts), with a TTL as a decision's."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    store = RedisSessionStore(client, lease_ttl_seconds=5)
    store.begin_start("sess_t", "pod-a/1", {"source": "warm", "placed": "10.0"})
    store.begin_start("sess_t", "pod-b/2", {"source": "cold", "placed": "20.0"})
    assert store.add_to_start("sess_t", "pod-a/1", {"connected": "30.0"}) is False
    assert store.add_to_start("sess_t", "pod-b/2", {"connected": "25.0"}) is True
    assert store.last_start("sess_t") == {"sandbox": "pod-b/2", "source": "cold", "placed": "20.0", "connected": "25.0"}
    assert 0 < client.ttl("sc:start:sess_t") <= DECISION_TTL_SECONDS
    assert store.last_start("sess_none") == {}


def test_status_and_explain_read_and_never_act(
    server: RedisServer, start_simulator: StartSimulator, tmp_path: Path
) -> None:
    """L1: explain of a session asking for a connection says start, yet nothing is started,
    wanted or recorded; with a recorded sandbox that is gone, status shows it with the worker's
    last decision and explain says replace, with the last start's timeline stage by stage —
    and still nothing changes."""
    simulator = start_simulator()
    env = cli_env(server, simulator, tmp_path)
    session = simulator.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    simulator.wait_for_status(session.id, "requires_action")
    client = redis.Redis.from_url(server.url, decode_responses=True)
    keys_before = sorted(client.keys("sc:*"))

    explained = run(env, "explain", session.id)
    assert explained["decision"] == {"verdict": "start", "reason": "connection requested; no sandbox"}
    assert explained["observed"]["session"]["wants_connection"] is True
    assert explained["observed"]["sandbox"] is None and explained["last"] is None
    assert sorted(client.keys("sc:*")) == keys_before
    assert run(env, "status") == {
        "sessions": [],
        "totals": {"sessions": 0, "by_health": {}, "by_last_verdict": {}, "deletions_held": 0, "checkpoint_bytes": 0},
        "not_found_since": {},
        "held": [],
    }

    # A worker recorded a sandbox (its process has since gone) and noted its decision.
    store = RedisSessionStore(client, lease_ttl_seconds=5)
    store.want(session.id)
    lease = store.acquire(session.id)
    assert isinstance(lease, Lease)
    environment_id = str(session.environment.id)
    handle = Handle(session.id, "sandbox-gone", 3, uid="999999999", environment_id=environment_id)
    store.save(lease, Record(session.id, environment_id, handle, time.time() - 90))
    store.complete(lease)
    wiring.remember_decisions(store)(session.id, Decision(Verdict.START, "connection requested"))
    t = time.time() - 60
    sandbox = "sandbox-gone/999999999"
    store.begin_start(session.id, sandbox, {"source": "cold", "template": "local", "delivered": repr(t)})
    store.add_to_start(session.id, sandbox, {"taken": repr(t + 0.25), "placed": repr(t + 1.0)})
    store.add_to_start(session.id, sandbox, {"connected": repr(t + 3.5)})
    keys_before = sorted(client.keys("sc:*"))
    record_before = client.hgetall(f"sc:rec:{session.id}")

    status = run(env, "status")
    [row] = status["sessions"]
    assert (row["session_id"], row["runner"], row["sandbox"]) == (session.id, "local", "sandbox-gone")
    assert row["generation"] == 3
    assert row["health"] == "gone" and row["age_seconds"] >= 90
    assert row["last_decision"]["verdict"] == "start"
    assert status["totals"] == {
        "sessions": 1,
        "by_health": {"gone": 1},
        "by_last_verdict": {"start": 1},
        "deletions_held": 0,
        "checkpoint_bytes": 0,
    }

    explained = run(env, "explain", session.id)
    assert explained["decision"] == {"verdict": "replace", "reason": "sandbox is gone"}
    assert explained["last"]["verdict"] == "start"
    last_start = explained["last_start"]
    assert (last_start["source"], last_start["template"]) == ("cold", "local")
    assert last_start["stamps"]["delivered"] == pytest.approx(t)
    assert last_start["stages"] == pytest.approx({"queue_wait": 0.25, "placing": 0.75, "connected": 2.5})
    assert sorted(client.keys("sc:*")) == keys_before
    assert client.hgetall(f"sc:rec:{session.id}") == record_before
    sessions = tmp_path / "sandboxes" / "sessions"  # the local runner's per-session directories
    assert not sessions.exists() or not any(sessions.iterdir())
    assert_no_process_left(tmp_path)


def test_a_held_deletion_shows_in_status_and_only_the_operator_ends_it(
    server: RedisServer, start_simulator: StartSimulator, tmp_path: Path
) -> None:
    """L7/L17: a session whose deletion a worker held is listed by ``status`` with how long it
    has been held and how to check; ``check-config --session`` reads a session with the
    configured key (found, or a 404 that names a wrong key or base URL); ``release`` says in
    one line what it would destroy and changes nothing; with ``--yes`` it notes the release
    and queues a round for the workers; a session not known to answer 404 is refused."""
    simulator = start_simulator()
    env = cli_env(server, simulator, tmp_path, CONTROLLER_DELETION_CONFIRM_SECONDS="60")
    live = simulator.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    client = redis.Redis.from_url(server.url, decode_responses=True)
    store = RedisSessionStore(client, lease_ttl_seconds=5)
    gone = "sess_held_gone"
    store.want(gone)
    lease = store.acquire(gone)
    assert isinstance(lease, Lease)
    since = time.time() - 600
    handle = Handle(gone, "sandbox-held", 2, uid="999999999", environment_id="env_held")
    store.save(lease, Record(gone, "env_held", handle, since - 60))
    store.arm(lease, time.time() + 600, missing_since=since, missing_reads=(3, since + 61))
    store.complete(lease)
    wiring.remember_decisions(store)(gone, Decision(Verdict.KEEP, "deletion held: …", held=True))

    status = run(env, "status")
    [held] = status["held"]
    assert held["session_id"] == gone and held["not_found_since"] == since
    assert 600 - 60 - 5 < held["held_seconds"] < 600 - 60 + 60
    shown = cli(env, "status")
    assert shown.returncode == 0 and f"held: {gone}: answers 404 for" in shown.stdout
    assert f"sandbox-controller release {gone}" in shown.stdout

    checked = cli(env, "check-config", "--role", "worker", "--session", gone)
    assert checked.returncode == 1 and "404 with this CONTROLLER_API_KEY" in checked.stderr
    checked = cli(env, "check-config", "--role", "worker", "--session", live.id)
    assert checked.returncode == 0, checked.stderr
    assert f"session {live.id}: found" in checked.stderr

    keys_before = sorted(client.keys("*"))
    asked = cli(env, "release", gone)
    assert asked.returncode == 0, asked.stderr
    [line] = asked.stdout.splitlines()
    assert line.startswith(f"would release {gone}") and "stop sandbox sandbox-held (generation 2)" in line
    assert "discard its workspace" in line and "--yes" in line
    assert sorted(client.keys("*")) == keys_before  # nothing done

    refused = cli(env, "release", live.id, "--yes")
    assert refused.returncode == 2 and "not known to answer 404" in refused.stderr
    done = cli(env, "release", gone, "--yes")
    assert done.returncode == 0, done.stderr
    assert client.hget("sc:release", gone) is not None
    assert client.llen(queue.QUEUE) == 1 and gone in str(client.lindex(queue.QUEUE, 0))
    assert int(client.get(f"sc:want:{gone}") or 0) > int(client.get(f"sc:done:{gone}") or 0)
    assert_no_process_left(tmp_path)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args], env=env, capture_output=True, text=True, timeout=60
    )
