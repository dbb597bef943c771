"""The metrics the worker, the scheduler and the Agents API client add, and how they are served."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller import wiring
from controller.errors import ApiUnavailable, ConfigError
from controller.metrics import (
    API_REQUESTS_TOTAL,
    DELIVERY_TO_START_SECONDS,
    LEASE_BUSY_TOTAL,
    PLACEMENTS_TOTAL,
    QUEUE_DEPTH,
    SANDBOXES_RUNNING,
    TIMERS_PENDING,
    WARM_PODS,
    WARM_POOL_SIZE,
    WORK_PENDING,
    Metrics,
    QueueCollector,
    WarmPoolCollector,
    serve_metrics,
    use_multiprocess,
)
from controller.model import PoolState
from controller.sessions import HttpSessions


def samples(metrics: Metrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def test_agents_api_requests_are_counted_by_operation_and_status() -> None:
    answers: list[httpx.Response | Exception] = [
        httpx.Response(503),
        httpx.Response(404),
        httpx.ConnectTimeout("slow"),
        httpx.ConnectTimeout("slow"),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    metrics = Metrics()
    client = HttpSessions(
        "https://api.example.test",
        "sk-test",
        max_attempts=2,
        transport=httpx.MockTransport(handler),
        backoff_initial_seconds=0.001,
        backoff_cap_seconds=0.001,
        on_response=wiring.count_api_requests(metrics),
    )
    try:
        assert client.get("sess_1") is None  # 503, then 404
        with pytest.raises(ApiUnavailable):
            client.get("sess_2")  # a timeout, twice
    finally:
        client.close()
    assert answers == []
    assert metrics.value(API_REQUESTS_TOTAL, operation="retrieve_session", status="503") == 1
    assert metrics.value(API_REQUESTS_TOTAL, operation="retrieve_session", status="404") == 1
    assert metrics.value(API_REQUESTS_TOTAL, operation="retrieve_session", status="timeout") == 2


def test_delivery_to_start_is_a_histogram_in_seconds() -> None:
    metrics = Metrics()
    metrics.observe(DELIVERY_TO_START_SECONDS, 0.3)
    metrics.observe(DELIVERY_TO_START_SECONDS, 42.0)
    found = samples(metrics)
    assert found[DELIVERY_TO_START_SECONDS + "_count[]"] == 2
    assert found[DELIVERY_TO_START_SECONDS + "_bucket[('le', '0.5')]"] == 1
    assert found[DELIVERY_TO_START_SECONDS + "_bucket[('le', '60.0')]"] == 2


def test_queue_gauges_are_read_when_scraped_and_left_out_when_unreadable() -> None:
    depth = [3]

    def broken() -> int:
        raise ConnectionError("redis is away")

    metrics = Metrics()
    metrics.registry.register(QueueCollector(lambda: depth[0], broken, lambda: 7))
    assert samples(metrics)[QUEUE_DEPTH + "[]"] == 3
    depth[0] = 0
    found = samples(metrics)
    assert found[QUEUE_DEPTH + "[]"] == 0
    assert found[TIMERS_PENDING + "[]"] == 7
    assert WORK_PENDING + "[]" not in found


def test_the_running_gauge_exists_only_where_it_is_set() -> None:
    """Workers never set it (so their pool processes expose no zero of their own); the
    scheduler's sweep does."""
    metrics = Metrics()
    assert SANDBOXES_RUNNING + "[]" not in samples(metrics)
    metrics.set(SANDBOXES_RUNNING, 4)
    assert samples(metrics)[SANDBOXES_RUNNING + "[]"] == 4


def test_warm_pool_gauges_follow_the_last_tending_and_placements_are_counted_by_source() -> None:
    """Before any tending (and on a standby scheduler) no warm-pool gauge is exposed; after one,
    each pool's ready and starting pods and its size, by template; the next tending replaces
    them. The workers' runner counts each placement by template and source."""
    metrics, pools = Metrics(), WarmPoolCollector()
    metrics.registry.register(pools)
    assert not [name for name in samples(metrics) if name.startswith(WARM_PODS)]
    parts = wiring.SchedulerParts(None, None, None, None, metrics, pools=pools)  # type: ignore[arg-type]
    parts.on_pools([PoolState("fast", size=3, ready=1, starting=2), PoolState("gpu", size=1, ready=1, starting=0)])
    found = samples(metrics)
    assert found[WARM_PODS + "[('state', 'ready'), ('template', 'fast')]"] == 1
    assert found[WARM_PODS + "[('state', 'starting'), ('template', 'fast')]"] == 2
    assert found[WARM_POOL_SIZE + "[('template', 'gpu')]"] == 1
    parts.on_pools([PoolState("fast", size=3, ready=3, starting=0)])
    found = samples(metrics)
    assert found[WARM_PODS + "[('state', 'ready'), ('template', 'fast')]"] == 3
    assert WARM_POOL_SIZE + "[('template', 'gpu')]" not in found  # a template no longer pooled goes

    placed = wiring.count_placements(metrics)
    placed("fast", "warm")
    placed("fast", "warm")
    placed("fast", "cold")
    assert metrics.value(PLACEMENTS_TOTAL, template="fast", source="warm") == 2
    assert metrics.value(PLACEMENTS_TOTAL, template="fast", source="cold") == 1


def test_multiprocess_directory_is_emptied_at_start(tmp_path: Path) -> None:
    """Counts of a previous run never add up with this one's."""
    directory = tmp_path / "metrics"
    (directory / "old").mkdir(parents=True)
    (directory / "counter_123.db").write_bytes(b"stale")
    monkeypatch = pytest.MonkeyPatch()
    try:
        from prometheus_client import values

        before = values.ValueClass
        monkeypatch.setattr(values, "ValueClass", before)  # restored after: this process stays single-process
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
        use_multiprocess(directory)
        assert list(directory.iterdir()) == []
        assert values.ValueClass is not before
    finally:
        monkeypatch.undo()


def test_a_metrics_port_in_use_is_a_configuration_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            serve_metrics(Metrics().registry, "127.0.0.1", port)


def test_a_counter_without_labels_counts() -> None:
    """controller_lease_busy_total has no labels: counting it must not raise (a worker's task
    did, each time it found a session busy)."""
    metrics = Metrics()
    metrics.inc(LEASE_BUSY_TOTAL)
    metrics.inc(LEASE_BUSY_TOTAL)
    assert metrics.value(LEASE_BUSY_TOTAL) == 2
