"""The whole loop on loopback with real parts: signed webhooks → 2 receivers →
Redis → 2 Celery worker processes → local runner → the real ``codex exec-server``
registering with the simulator. Tests run in file order and share one world."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from controller.runners.local import members
from tests.support.local_runner import live
from tests.support.processes import wait_for
from tests.system.loop import EXECUTOR_KEY, Loop, assert_no_secret

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def _registered(loop: Loop, environment_id: str) -> list[dict[str, object]]:
    return [r for r in loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200]


def _status(loop: Loop, session_id: str) -> str:
    with loop.api() as client:
        return str(client.get(f"/v1/agents/sessions/{session_id}").json()["status"])


def test_executor_registers_with_the_sessions_environment(loop: Loop) -> None:
    """L8: a signed action-required webhook leads to the real executor dialling out with the
    session's environment id and the environment key; the turn then runs to idle."""
    with loop.api() as client:
        started = time.monotonic()
        session = loop.create_session(client)
    environment_id = session["environment"]["id"]
    registrations = wait_for(lambda: _registered(loop, environment_id), 60, "the executor to register")
    elapsed = time.monotonic() - started
    assert registrations[0]["key_matched"] is True
    assert registrations[0]["environment_known"] is True
    wait_for(lambda: loop.environment_status(environment_id) == "connected", 30, "the environment to connect")
    wait_for(lambda: _status(loop, session["id"]) == "idle", 30, "the turn to finish")
    assert loop.live_executors()[session["id"]] == 1
    print(f"\nFIGURE webhook-to-registration (session create → executor registered): {elapsed:.2f}s")


def test_concurrent_duplicate_deliveries_give_one_executor_per_session(loop: Loop) -> None:
    """L1, L5: 50 sessions × 5 copies of each delivery, sent concurrently to 2 receivers and
    worked by 2 workers → exactly one live executor (and one registration) per session."""
    with loop.api() as client:
        sessions = [loop.create_session(client) for _ in range(50)]
    deliveries = loop.copies(sessions, 5)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda d: loop.post(*d).status_code, deliveries))
    assert set(answers) <= {200}, answers
    environment_ids = {s["id"]: s["environment"]["id"] for s in sessions}

    def all_registered() -> bool:
        envs = {r["environment_id"] for r in loop.registrations() if r["status_code"] == 200}
        return set(environment_ids.values()) <= envs

    wait_for(all_registered, 240, "all 50 executors to register", interval=0.5)
    elapsed = time.monotonic() - started
    time.sleep(3)  # give any duplicate a chance to show itself
    live = loop.live_executors()
    assert all(live[sid] == 1 for sid in environment_ids), {sid: live[sid] for sid in environment_ids if live[sid] != 1}
    per_environment = [len(_registered(loop, env)) for env in environment_ids.values()]
    assert per_environment == [1] * 50
    started_lines = [line for line in loop.started_log_lines() if line["session_id"] in environment_ids]
    assert len(started_lines) == 50, "an executor was started more than once for some session"
    print(f"\nFIGURE 50 sessions x 5 copies: all executors registered {elapsed:.1f}s after the first delivery")


def test_deleted_sessions_and_resolved_actions_are_ignored(loop: Loop) -> None:
    """L7: the worker looks before acting: a deleted session (404) and a session whose
    environment_connection action is no longer pending start nothing."""
    with loop.api() as client:
        deleted = loop.create_session(client)
        resolved = loop.create_session(client, input_text=None)  # idle: nothing required
        client.delete(f"/v1/agents/sessions/{deleted['id']}").raise_for_status()
    for session in (deleted, resolved):
        headers, body = loop.delivery(session["id"])
        assert loop.post(loop.receiver_ports[1], headers, body).status_code == 200
    wait_for(
        lambda: (
            sum(
                1
                for w in loop.workers
                for line in w.log_lines()
                if line.get("event") == "session looked up"
                and line.get("session_id") in (deleted["id"], resolved["id"])
            )
            >= 2
        ),
        60,
        "both sessions to be looked up",
    )
    live = loop.live_executors()
    assert live[deleted["id"]] == 0 and live[resolved["id"]] == 0
    assert not _registered(loop, resolved["environment"]["id"])


def test_failed_session_releases_its_executor(loop: Loop) -> None:
    """L7: a failed session's compute is released when its failed webhook is worked."""
    with loop.api() as client:
        session = loop.create_session(client)
    wait_for(lambda: loop.live_executors()[session["id"]] == 1, 60, "the executor to start")
    httpx.post(f"{loop.simulator_url}/admin/sessions/{session['id']}/fail", timeout=10).raise_for_status()
    wait_for(lambda: loop.live_executors()[session["id"]] == 0, 60, "the executor to be released")
    # The runner stops the executor before the worker forgets the mapping: wait for that too.
    wait_for(lambda: loop.redis.client().hgetall(f"sc:rec:{session['id']}") == {}, 30, "the mapping to go")


def test_worker_killed_mid_task_still_starts_exactly_one_executor(loop: Loop) -> None:
    """L1: a worker process killed with SIGKILL in the middle of a task: the job comes back
    (acks_late + reject on worker loss), and the session gets its executor, once."""
    # The Agents API answers 503 for a while, so the task is mid-flight (retrying) when killed.
    loop.arm_fault("retrieve_session", 503, 4)
    with loop.api() as client:
        session = loop.create_session(client)

    def task_pid() -> int | None:
        for worker in loop.workers:
            for line in worker.log_lines():
                if line.get("event") == "task started" and line.get("session_id") == session["id"]:
                    return int(line["pid"])
        return None

    pid = wait_for(task_pid, 60, "a worker to start the task")
    os.kill(int(pid), signal.SIGKILL)  # the pool process working the task, mid-task
    wait_for(lambda: _registered(loop, session["environment"]["id"]), 120, "the executor to register after the kill")
    time.sleep(3)
    assert loop.live_executors()[session["id"]] == 1
    assert len(_registered(loop, session["environment"]["id"])) == 1


def test_a_storm_of_429s_delays_but_loses_nothing(loop: Loop) -> None:
    """L7: while the Agents API throttles (429 with Retry-After) the workers back off and
    retry; every session still gets exactly one executor."""
    loop.arm_fault("retrieve_session", 429, 25, retry_after=0.2)
    with loop.api() as client:
        sessions = [loop.create_session(client) for _ in range(5)]
    for session in sessions:
        wait_for(lambda s=session: _registered(loop, s["environment"]["id"]), 120, "executors despite the 429s")
    faults = httpx.get(f"{loop.simulator_url}/admin/faults", timeout=10).json()["data"]
    assert all(f["target"] != "retrieve_session" for f in faults), "the storm was not fully consumed"
    live = loop.live_executors()
    assert [live[s["id"]] for s in sessions] == [1] * 5
    assert [len(_registered(loop, s["environment"]["id"])) for s in sessions] == [1] * 5


def test_a_whole_worker_killed_mid_task_loses_nothing(loop: Loop) -> None:
    """L1: SIGKILL to a whole worker (main process and pool) while it works a session: its
    lease is no longer renewed and lapses, the scheduler's recovery pass re-enqueues the
    session (the broker would redeliver the unacknowledged job only after its visibility
    timeout), and another worker starts the executor, once."""
    loop.arm_fault("retrieve_session", 503, 6)
    with loop.api() as client:
        session = loop.create_session(client)

    def holder() -> object:  # the worker whose process logged the task's start
        for worker in loop.workers:
            if worker.alive() and any(
                line.get("event") == "task started" and line.get("session_id") == session["id"]
                for line in worker.log_lines()
            ):
                return worker
        return None

    victim = wait_for(holder, 60, "a worker to start the task")
    victim.kill(signal.SIGKILL)
    loop.start_worker(len(loop.workers))  # keep two workers, as a Deployment would
    started = time.monotonic()
    wait_for(lambda: _registered(loop, session["environment"]["id"]), 180, "the job to be redelivered and worked")
    print(f"\nFIGURE whole-worker SIGKILL: executor registered {time.monotonic() - started:.1f}s after the kill")
    time.sleep(3)
    assert loop.live_executors()[session["id"]] == 1
    assert len(_registered(loop, session["environment"]["id"])) == 1


def test_deleting_a_session_releases_its_executor_on_the_next_sweep(loop: Loop) -> None:
    """L17: deleting a session stops nothing by itself (the simulator sends no webhook for
    it); the scheduler's sweep finds the mapping, the worker sees 404 and, once the session's
    reads have answered 404 for the confirmation period (3 s in this world), releases the
    executor and the mapping — not at the first 404. Another session still answers (with none
    to compare with, a deletion is held: tests/unit/test_everyday_faults.py)."""
    with loop.api() as client:
        other = loop.create_session(client)
        session = loop.create_session(client)
        wait_for(lambda: loop.live_executors()[other["id"]] == 1, 60, "the other executor to start")
        wait_for(lambda: loop.live_executors()[session["id"]] == 1, 60, "the executor to start")
        client.delete(f"/v1/agents/sessions/{session['id']}").raise_for_status()
    wait_for(lambda: loop.live_executors()[session["id"]] == 0, 60, "the sweep to release the executor")
    wait_for(lambda: not loop.redis.client().exists(f"sc:rec:{session['id']}"), 30, "the mapping to go")
    looks = loop.worker_lines("session looked up", session["id"])
    first_404 = min(line["time"] for line in looks if line["status"] == "not found")
    [released] = loop.worker_lines("sandbox released", session["id"])
    assert released["time"] - first_404 >= 3


def test_a_mapping_whose_executor_died_is_marked_stopped_on_the_next_sweep(loop: Loop) -> None:
    """L16/L17: no mapping claims compute that is gone: an executor that died while its session
    was idle leaves a mapping that the sweep marks stopped (its workspace kept for the next
    sandbox, until its retention ends), and starts nothing."""
    with loop.api() as client:
        session = loop.create_session(client)
    wait_for(lambda: _status(loop, session["id"]) == "idle", 60, "the turn to finish")
    handle = next(h for h in live(loop.runner()) if h.session_id == session["id"])
    leader, ticks = (int(part) for part in handle.uid.split(":"))
    os.kill(leader, signal.SIGKILL)  # the npm launcher only: the native codex it started lives on
    wait_for(lambda: loop.redis.client().hget(f"sc:rec:{session['id']}", "stopped_at"), 60, "the sweep to stop it")
    assert loop.live_executors()[session["id"]] == 0
    assert members(leader, ticks) == [], "a process of the dead executor's group was left running"


def test_redis_down_answers_503_and_the_senders_retry_is_processed(loop: Loop) -> None:
    """L5: with Redis down the receiver answers 503 with Retry-After (never a 2xx for a job
    it could not queue); once Redis is back, the sender's retry is processed."""
    loop.redis.stop()
    headers, body = loop.delivery("sess_while_redis_down")
    answer = loop.post(loop.receiver_ports[0], headers, body)
    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) >= 1
    assert httpx.get(f"http://127.0.0.1:{loop.receiver_ports[0]}/readyz", timeout=10).status_code == 503
    with loop.api() as client:
        session = loop.create_session(client)  # the simulator's webhook now fails and is retried
    time.sleep(2)
    loop.redis.start()
    wait_for(lambda: _registered(loop, session["environment"]["id"]), 120, "the retried delivery to be processed")
    assert loop.live_executors()[session["id"]] == 1


def test_no_secret_appears_in_any_output(loop: Loop) -> None:
    """L2: neither the webhook secret, the API key nor the environment key appears in any
    log of receivers, workers, simulator or executors."""
    output = loop.all_output()
    assert "session looked up" in output
    assert_no_secret(output)
    assert EXECUTOR_KEY not in output


def test_no_secret_is_on_any_command_line(loop: Loop) -> None:
    """L2: secrets reach the simulator, receivers, workers and executors through their
    environment, never their argv (which any local user can read with `ps`)."""
    processes = [loop.simulator, *loop.receivers, *loop.workers, loop.scheduler]
    command_lines = [
        Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace")
        for p in processes
        if p is not None and p.alive()
    ]
    command_lines += [
        Path(f"/proc/{h.uid.split(':')[0]}/cmdline").read_bytes().decode(errors="replace") for h in live(loop.runner())
    ]
    assert len(command_lines) >= 5
    assert_no_secret("\n".join(command_lines))
