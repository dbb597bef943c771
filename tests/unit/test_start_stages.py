"""A start's timeline stage by stage (``controller/start_stages.py``, pure), and the worker's
tasks observing it: ``sync_session`` the queue wait and the placing on its own clock, the
watch job the pod's stages (from the runner) and the connection (Celery on kombu's in-memory
broker, the jobs' bodies run directly, as tests/unit/test_watch_connection.py does)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from controller import queue, start_stages, worker
from controller.decide import Decision, Verdict
from controller.metrics import START_STAGE_SECONDS, Metrics
from controller.model import Handle, Link, Record

COLD = {
    "delivered": 100.0,
    "taken": 100.2,
    "placed": 100.7,
    "pod_created": 100.0,  # the API server's second
    "scheduled": 101.0,
    "container_started": 102.0,
    "registered_after": 104.2,  # the watch's last read that found it not yet
    "registered": 104.7,  # its first read that found it connected
    "connected": 104.7,
}


def test_each_stage_is_between_two_stamps_of_one_clock() -> None:
    assert start_stages.stages(COLD) == [
        ("queue_wait", pytest.approx(0.2)),
        ("placing", 0.5),
        ("scheduled", 1.0),
        ("container_started", 1.0),
        ("executor_registered", pytest.approx(2.7)),  # from the container started
        ("connected", 4.0),
    ]


def test_a_warm_start_has_no_pod_stages_and_unknown_stamps_make_no_stage() -> None:
    warm = {"delivered": 100.0, "taken": 100.1, "placed": 100.3, "registered": 100.6, "connected": 100.6}
    assert start_stages.stages(warm)[2:] == [  # registered: from its claim (placed), no pod stage before
        ("executor_registered", pytest.approx(0.3)),
        ("connected", pytest.approx(0.3)),
    ]
    assert [name for name, _ in start_stages.stages(warm)][:2] == ["queue_wait", "placing"]
    assert start_stages.stages({"taken": 5.0, "placed": 6.0}) == [("placing", 1.0)]  # no delivery: a timer's job
    assert start_stages.stages({}) == []


def test_a_clock_behind_never_makes_a_stage_negative() -> None:
    assert start_stages.stages({"delivered": 10.0, "taken": 9.9}) == [("queue_wait", 0.0)]


def test_explain_prints_the_stamps_then_the_stages() -> None:
    lines = start_stages.render(COLD, "cold", "fast")
    assert lines[0] == "last start: cold (template fast)"
    assert lines[1].split() == ["delivered", "00:01:40.000", "UTC"]
    assert [line.split()[0] for line in lines[1:10]] == list(start_stages.STAMPS)
    # The registration's resolution: between the watch's last read that found it not yet and
    # its first that found it connected (the API reports no registration time).
    assert lines[10].split()[:7] == ["registered", "between", "00:01:44.200", "and", "00:01:44.700", "UTC", "(0.500"]
    assert lines[-2].split()[:3] == ["executor_registered", "2.700", "s"]
    assert lines[-1].split()[:3] == ["connected", "4.000", "s"]
    warm = {"placed": 100.3, "registered": 100.6, "connected": 100.6}  # found at the watch's first read
    assert "registered between 00:01:40.300 and 00:01:40.600 UTC (0.300 s" in "\n".join(
        start_stages.render(warm, "", "")
    )
    assert start_stages.render({}, "", "") == []


class Runner:
    """The Kubernetes runner's ``Starts`` side: how it placed a session, and its pod's stamps."""

    def __init__(self) -> None:
        self.asked: list[Handle] = []

    def placement(self, session_id: str) -> tuple[str, str] | None:
        return ("fast", "cold")

    def start_stamps(self, handle: Handle) -> dict[str, float]:
        self.asked.append(handle)
        now = time.time()
        return {"pod_created": now - 3, "scheduled": now - 2, "container_started": now - 1}


class Store:
    def __init__(self, record: Record) -> None:
        self._record = record
        self.starts: dict[str, tuple[str, dict[str, str]]] = {}

    def record(self, session_id: str) -> Record:
        return self._record

    def begin_start(self, session_id: str, sandbox: str, fields: dict[str, str]) -> None:
        self.starts[session_id] = (sandbox, dict(fields))

    def add_to_start(self, session_id: str, sandbox: str, fields: dict[str, str]) -> bool:
        if self.starts[session_id][0] != sandbox:
            return False
        self.starts[session_id][1].update(fields)
        return True

    def last_start(self, session_id: str) -> dict[str, str]:
        return self.starts[session_id][1]


def test_a_start_is_observed_stage_by_stage_by_the_job_and_its_watch(monkeypatch: Any) -> None:
    """``sync_session`` that started a sandbox observes the queue wait and the placing, notes
    the timeline and queues a watch job carrying the start; the watch job, once connected,
    observes the pod's stages (the runner's stamps of the recorded sandbox), the registration
    (its first read that found the environment connected, after one that found it not yet:
    that read's time opens the registration's window) and the connection, and adds them to the
    timeline."""
    handle = Handle("sess_1", "sbx-1", 1, uid="u1", environment_id="env_1")
    store, runner, metrics = Store(Record("sess_1", "env_1", handle, time.time())), Runner(), Metrics()
    links = [Link.NOT_YET, Link.UP]
    deps = SimpleNamespace(
        store=store, runner=runner, sessions=SimpleNamespace(environment_link=lambda e: links.pop(0))
    )
    monkeypatch.setattr(worker.lifecycle, "work", lambda session_id, d: [Decision(Verdict.START, "connection")])
    app = Celery("stages-test", broker="memory://")
    try:
        worker.register(app, 3, lambda: deps, metrics, watch_connections=True)  # type: ignore[arg-type,return-value]
        received = time.time() - 0.5
        app.tasks[queue.TASK_SYNC_SESSION].run("sess_1", "wh_1", "session.created", received)

        def count(stage: str) -> float:
            labels = {"stage": stage, "source": "cold", "template": "fast"}
            return metrics.registry.get_sample_value(START_STAGE_SECONDS + "_count", labels) or 0.0

        assert (count("queue_wait"), count("placing"), count("connected"), count("scheduled")) == (1, 1, 0, 0)
        sandbox, fields = store.starts["sess_1"]
        assert sandbox == "sbx-1/u1" and (fields["source"], fields["template"]) == ("cold", "fast")
        assert float(fields["delivered"]) == received and "connected" not in fields

        def next_watch() -> tuple[Any, Any]:
            with app.connection() as conn:
                inbox = conn.SimpleQueue(queue.QUEUE)
                message = inbox.get(block=False)
                args, kwargs, _ = message.payload
                message.ack()
                inbox.close()
            return args, kwargs

        args, kwargs = next_watch()
        assert kwargs["start"]["sandbox"] == "sbx-1/u1" and "registered_after" not in kwargs["start"]
        before = time.time()
        app.tasks[queue.TASK_WATCH_CONNECTION].run(*args, **kwargs)  # not yet: asks again
        assert count("executor_registered") == 0
        args, kwargs = next_watch()
        not_yet = kwargs["start"]["registered_after"]
        assert before <= not_yet <= time.time()
        app.tasks[queue.TASK_WATCH_CONNECTION].run(*args, **kwargs)
        stages = ("scheduled", "container_started", "executor_registered", "connected")
        assert [count(s) for s in stages] == [1, 1, 1, 1]
        noted = store.starts["sess_1"][1]
        assert float(noted["registered_after"]) == not_yet < float(noted["registered"]) == float(noted["connected"])
        assert count("queue_wait") == 1  # observed once, by the job
        assert runner.asked == [handle]
        assert {"pod_created", "scheduled", "container_started", "connected"} <= set(store.starts["sess_1"][1])
    finally:
        app.close()
