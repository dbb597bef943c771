"""The watch job (``controller.worker``'s ``watch_connection``, pure: Celery on kombu's in-memory
broker, the job's body run directly): "not yet" queues the next ask itself, through one producer
the process keeps, with the delay ``watch_delay`` gives; "connected" and "past the window" queue
nothing. That a real worker runs the jobs and observes delivery → connected is
tests/system/test_metrics.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from controller import queue, worker
from controller.model import Link


class World:
    def __init__(self, answers: list[bool]) -> None:
        self.app = Celery("watch-test", broker="memory://")
        self.answers = answers
        self.asked_api: list[str] = []
        sessions = SimpleNamespace(environment_link=self._link)
        deps = SimpleNamespace(sessions=sessions)
        worker.register(self.app, 3, lambda: deps)  # type: ignore[arg-type,return-value]
        self.task = self.app.tasks[queue.TASK_WATCH_CONNECTION]
        self.acquired = 0
        acquire = self.app.producer_pool.acquire

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.acquired += 1
            return acquire(*args, **kwargs)

        self.app.producer_pool.acquire = counted

    def _link(self, environment_id: str) -> Link:
        self.asked_api.append(environment_id)
        return Link.UP if self.answers.pop(0) else Link.NOT_YET

    def queued(self) -> list[tuple[dict[str, Any], list[Any], dict[str, Any]]]:
        """Every message on the session queue now: (headers, args, kwargs)."""
        found = []
        with self.app.connection() as conn:
            inbox = conn.SimpleQueue(queue.QUEUE)
            try:
                while True:
                    try:
                        message = inbox.get(block=False)
                    except inbox.Empty:
                        break
                    args, kwargs, _ = message.payload
                    found.append((message.headers, args, kwargs))
                    message.ack()
            finally:
                inbox.close()
        return found


@pytest.fixture
def world() -> Iterator[World]:
    made = World([])
    yield made
    made.app.close()


def _eta(headers: dict[str, Any]) -> float:
    return datetime.fromisoformat(headers["eta"]).timestamp()


def test_not_yet_queues_the_next_ask_with_its_count_and_delay(world: World) -> None:
    world.answers[:] = [False]
    received = time.time()
    before = time.time()
    world.task.run("env_1", received, received + 300, asked=2)
    after = time.time()
    [(headers, args, kwargs)] = world.queued()
    assert headers["task"] == queue.TASK_WATCH_CONNECTION
    assert args == ["env_1", received, received + 300]
    assert kwargs == {"asked": 3}
    assert before + worker.watch_delay(3) <= _eta(headers) <= after + worker.watch_delay(3)
    assert world.asked_api == ["env_1"]


def test_a_job_without_asked_is_the_first_ask(world: World) -> None:
    world.answers[:] = [False]
    received = time.time()
    world.task.run("env_1", received, received + 300)  # no ``asked``: counts from 0
    [(_, _, kwargs)] = world.queued()
    assert kwargs == {"asked": 1}


def test_connected_queues_nothing(world: World) -> None:
    world.answers[:] = [True]
    received = time.time()
    world.task.run("env_1", received, received + 300, asked=4)
    assert world.queued() == []
    assert world.asked_api == ["env_1"]


def test_past_the_window_queues_nothing(world: World) -> None:
    """The next ask would come after the deadline: the watch ends (one observation lost)."""
    world.answers[:] = [False]
    received = time.time() - 299
    world.task.run("env_1", received, received + 300, asked=1)  # 1 s left; the next ask is later
    assert world.queued() == []


def test_every_ask_of_a_process_goes_through_one_kept_producer(world: World) -> None:
    world.answers[:] = [False, False, False]
    received = time.time()
    for asked in range(3):
        world.task.run(f"env_{asked}", received, received + 300, asked=asked)
    assert [kwargs["asked"] for _, _, kwargs in world.queued()] == [1, 2, 3]
    assert world.acquired == 1
