"""Metrics from every process, scraped during a run of the whole loop (one receiver, two
Celery workers with two pool processes each, the scheduler, the simulator, real codex), and
checked against what happened: the simulator's record of deliveries, the JSON log lines of
each process, and the executors that registered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.codex import codex_binary
from tests.support.processes import wait_for
from tests.system.loop import Loop, scrape, total

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

SESSIONS = 3
TASK_ENDINGS = frozenset(
    {
        "task done",
        "session busy elsewhere; will look again",
        "will retry",
        "stale decision dropped; looking again",
        "giving up on session",
        "retries exhausted; left to the recovery pass",
    }
)
"""The last line a task logs, whichever way it ends (``controller/worker.py``)."""


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    world = Loop(tmp_path_factory.mktemp("metrics"), codex_binary(), receivers=1, workers=2)
    try:
        yield world.start()
    finally:
        world.stop()


def log_lines(loop: Loop, names: list[str]) -> list[dict[str, Any]]:
    return [line for p in [*loop.receivers, *loop.workers] if p.name in names for line in p.log_lines()]


def deliveries(loop: Loop) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{loop.simulator_url}/admin/deliveries", timeout=10).json()["data"]
    return found


def test_every_process_serves_metrics_that_match_what_happened(loop: Loop) -> None:
    """L1, L4, L5: after sessions start and duplicates arrive, the receiver's, the workers' and
    the scheduler's /metrics agree with the deliveries sent, the log lines and the executors;
    every start is observed stage by stage."""
    with loop.api() as client:
        sessions = [loop.create_session(client) for _ in range(SESSIONS)]
    environment_ids = {s["environment"]["id"] for s in sessions}

    def all_connected() -> bool:
        return all(loop.environment_status(e) == "connected" for e in environment_ids)

    wait_for(all_connected, 120, "every executor to connect", interval=0.5)
    duplicates = loop.copies(sessions[:1], 3)  # one webhook-id, three times: enqueued once
    answers = [loop.post(*d).json()["status"] for d in duplicates]
    assert answers == ["enqueued", "duplicate", "duplicate"]

    workers = [w.name for w in loop.workers]

    def workers_scraped() -> list[dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
        return [scrape(loop.metrics_ports[name]) for name in workers]

    def settled() -> tuple[Any, ...] | None:
        """A consistent snapshot: every turn over and every delivery answered (the simulator
        sends nothing more), the queue empty, every task ended, and the workers' counts the same
        before and after their log lines were read (the scheduler's sweeps keep asking for
        work every few seconds, so the loop is never idle for long)."""
        with loop.api() as client:
            if any(client.get(f"/v1/agents/sessions/{s['id']}").json()["status"] != "idle" for s in sessions):
                return None
        sent = deliveries(loop)
        if any(d["state"] == "pending" for d in sent):
            return None
        receiver = scrape(loop.metrics_ports["receiver0"])
        before = workers_scraped()
        lines = log_lines(loop, workers)
        after = workers_scraped()
        if before != after:
            return None  # a worker did something while its lines were read
        if sum(1 for line in lines if line.get("event") == "executor connected") < SESSIONS:
            return None  # the watch jobs have not all seen their executor connected yet
        started = sum(1 for line in lines if line.get("event") == "task started")
        finished = sum(1 for line in lines if line.get("event") in TASK_ENDINGS)
        scheduler = scrape(loop.metrics_ports["scheduler"])
        if (
            started != finished
            or total(scheduler, "controller_queue_depth")
            or total(scheduler, "controller_work_pending")
        ):
            return None
        return sent, receiver, after, scheduler, lines

    found = wait_for(settled, 120, "the loop to settle", interval=0.5)
    assert isinstance(found, tuple)
    sent, receiver, per_worker, scheduler, worker_lines = found

    # The receiver: one count per POST, by outcome, as the simulator and this test sent them.
    attempts = sum(len(d["attempts"]) for d in sent) + len(duplicates)
    assert total(receiver, "controller_webhooks_total") == attempts
    receiver_outcomes = Counter(str(line["outcome"]) for line in loop.receivers[0].log_lines() if "outcome" in line)
    for outcome, count in receiver_outcomes.items():
        assert total(receiver, "controller_webhooks_total", outcome=outcome) == count, outcome
    assert total(receiver, "controller_webhooks_total", outcome="duplicate") == 2

    # The workers: summed over both workers (and their pool processes), exactly what they logged.
    def summed(name: str, **labels: str) -> float:
        return sum(total(samples, name, **labels) for samples in per_worker)

    looked_up = [line for line in worker_lines if line.get("event") == "session looked up"]
    verdicts = Counter(str(line["verdict"]) for line in looked_up)
    for verdict in ("start", "replace", "keep", "release", "ignore"):
        assert summed("controller_decisions_total", verdict=verdict) == verdicts[verdict], verdict
    assert verdicts["start"] == SESSIONS

    started = [line for line in worker_lines if line.get("event") == "sandbox started"]
    assert len(started) == SESSIONS
    assert summed("controller_delivery_to_sandbox_start_seconds_count") == SESSIONS
    assert summed("controller_delivery_to_sandbox_start_seconds_sum") > 0
    assert summed("controller_delivery_to_sandbox_start_seconds_bucket", le="+Inf") == SESSIONS

    connected = [line for line in worker_lines if line.get("event") == "executor connected"]
    assert len(connected) == SESSIONS
    assert summed("controller_delivery_to_executor_connected_seconds_count") == SESSIONS
    assert summed("controller_delivery_to_executor_connected_seconds_sum") >= summed(
        "controller_delivery_to_sandbox_start_seconds_sum"
    )  # an executor connects after its sandbox started
    # Every start stage by stage (the local runner: the worker's stages only, one of each per start).
    local = {"source": "cold", "template": "local"}
    for stage in ("queue_wait", "placing", "connected"):
        assert summed("controller_start_stage_seconds_count", stage=stage, **local) == SESSIONS, stage
    assert summed("controller_start_stage_seconds_count", stage="scheduled") == 0

    reads = sum(1 for line in looked_up if line["status"] != "deleted")
    assert summed("controller_agents_api_requests_total", operation="retrieve_session", status="200") == reads
    assert summed("controller_agents_api_requests_total", status="500") == 0
    busy = sum(1 for line in worker_lines if line.get("event") == "session busy elsewhere; will look again")
    assert summed("controller_lease_busy_total") == busy

    # The scheduler: nothing left queued or wanted, and its own process metrics.
    assert total(scheduler, "controller_queue_depth") == 0
    assert total(scheduler, "controller_work_pending") == 0
    assert total(scheduler, "process_resident_memory_bytes") > 0

    print(
        f"\nFIGURE metrics scrape: {attempts} deliveries, decisions {dict(verdicts)}, "
        f"delivery→start mean {summed('controller_delivery_to_sandbox_start_seconds_sum') / SESSIONS:.2f}s, "
        f"delivery→connected mean {summed('controller_delivery_to_executor_connected_seconds_sum') / SESSIONS:.2f}s"
    )
