"""The metrics the worker, the scheduler and the Agents API client add, and how they are served."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller import wiring
from controller.errors import ApiUnavailable, ConfigError, StoreUnavailable
from controller.metrics import (
    API_REQUESTS_TOTAL,
    COLD_STARTS_TOTAL,
    DELIVERY_TO_START_SECONDS,
    LEASE_BUSY_TOTAL,
    PLACEMENTS_TOTAL,
    QUEUE_DEPTH,
    SANDBOXES_RUNNING,
    TIMERS_PENDING,
    WARM_POD_SECONDS_TOTAL,
    WARM_PODS,
    WARM_POOL_TARGET,
    WORK_PENDING,
    Metrics,
    QueueCollector,
    WarmPoolCollector,
    serve_metrics,
    use_multiprocess,
)
from controller.model import PoolState
from controller.runners.kubernetes.manifests import SandboxTemplate
from controller.runners.kubernetes.pool import SETTLE_LONGEST_SECONDS
from controller.runners.kubernetes.templates import parse
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
    each pool's ready and starting pods and its target, by template; the next tending replaces
    them. The workers' runner counts each placement by template and source, and each cold one
    by its reason."""
    metrics, pools = Metrics(), WarmPoolCollector()
    metrics.registry.register(pools)
    assert not [name for name in samples(metrics) if name.startswith(WARM_PODS)]
    parts = wiring.SchedulerParts(None, None, None, None, metrics, pools=pools)  # type: ignore[arg-type]
    parts.on_pools([PoolState("fast", size=3, ready=1, starting=2), PoolState("gpu", size=1, ready=1, starting=0)])
    found = samples(metrics)
    assert found[WARM_PODS + "[('state', 'ready'), ('template', 'fast')]"] == 1
    assert found[WARM_PODS + "[('state', 'starting'), ('template', 'fast')]"] == 2
    assert found[WARM_POOL_TARGET + "[('template', 'gpu')]"] == 1
    parts.on_pools([PoolState("fast", size=3, ready=3, starting=0)])
    found = samples(metrics)
    assert found[WARM_PODS + "[('state', 'ready'), ('template', 'fast')]"] == 3
    assert WARM_POOL_TARGET + "[('template', 'gpu')]" not in found  # a template no longer pooled goes

    placed = wiring.placements(parse({"fast": {"warmPool": {"size": 2}}}, SandboxTemplate()), metrics, None)
    placed("fast", "warm", "")
    placed("fast", "warm", "")
    placed("fast", "cold", "pool_empty")
    placed("default", "cold", "no_pool")
    assert metrics.value(PLACEMENTS_TOTAL, template="fast", source="warm") == 2
    assert metrics.value(PLACEMENTS_TOTAL, template="fast", source="cold") == 1
    assert metrics.value(COLD_STARTS_TOTAL, template="fast", reason="pool_empty") == 1
    assert metrics.value(COLD_STARTS_TOTAL, template="default", reason="no_pool") == 1
    assert metrics.value(COLD_STARTS_TOTAL, template="fast", reason="no_pool") == 0


def test_warm_pod_seconds_add_the_pods_each_tending_found_times_the_time_since_the_last() -> None:
    """Pod-seconds spent waiting: 3 pods found after 10 s, then 1 after 5 s: 35; none accrue
    while the scheduler stands by (told of no pool), and the count carries on after."""
    now = [100.0]
    metrics, pools = Metrics(), WarmPoolCollector(clock=lambda: now[0])
    metrics.registry.register(pools)
    key = WARM_POD_SECONDS_TOTAL + "[('template', 'fast')]"
    pools.update([PoolState("fast", size=3, ready=1, starting=2)])
    assert samples(metrics)[key] == 0
    now[0] = 110.0
    pools.update([PoolState("fast", size=3, ready=2, starting=1)])  # starting pods wait too
    now[0] = 115.0
    pools.update([PoolState("fast", size=1, ready=1, starting=0)])
    assert samples(metrics)[key] == 35
    pools.update([])  # stood by
    now[0] = 1000.0
    pools.update([PoolState("fast", size=1, ready=1, starting=0)])  # leading again: counts from here
    now[0] = 1002.0
    pools.update([PoolState("fast", size=1, ready=2, starting=0)])
    assert samples(metrics)[key] == 39


def test_placements_of_a_pool_sized_by_demand_are_noted_and_a_failed_note_never_fails_the_start() -> None:
    """The placements (warm and cold) of a template with a pool are noted: a pool sized by
    demand's kept for its window, a fixed pool's as long as they can hold its refills
    (``pool.settling``); a template without a pool notes none; a note Redis refuses is logged
    and the placement still counts."""

    class Log:
        def __init__(self) -> None:
            self.noted: list[tuple[str, float]] = []
            self.down = False

        def note(self, template: str, keep_seconds: float) -> None:
            if self.down:
                raise StoreUnavailable("redis unavailable during note a placement")
            self.noted.append((template, keep_seconds))

        def recent(self, template: str) -> tuple[float, list[float]]:
            return 0.0, []

    demand, metrics = Log(), Metrics()
    templates = parse(
        {"burst": {"warmPool": {"max": 5, "windowSeconds": 90}}, "fixed": {"warmPool": {"size": 1}}}, SandboxTemplate()
    )
    placed = wiring.placements(templates, metrics, demand)
    placed("burst", "cold", "pool_empty")
    placed("burst", "warm", "")
    placed("fixed", "warm", "")
    placed("default", "cold", "no_pool")
    assert demand.noted == [("burst", 90), ("burst", 90), ("fixed", SETTLE_LONGEST_SECONDS)]
    demand.down = True
    placed("burst", "warm", "")
    assert metrics.value(PLACEMENTS_TOTAL, template="burst", source="warm") == 2


def test_multiprocess_directory_is_emptied_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of a previous run never add up with this one's. The process is left as it was:
    ``use_multiprocess`` sets ``PROMETHEUS_MULTIPROC_DIR`` in this process's environment, and a
    later test's worker processes would inherit it and count into this directory together."""
    from prometheus_client import values

    directory = tmp_path / "metrics"
    (directory / "old").mkdir(parents=True)
    (directory / "counter_123.db").write_bytes(b"stale")
    before = values.ValueClass
    monkeypatch.setattr(values, "ValueClass", before)  # restored after: this process stays single-process
    # setenv first, so that undo puts the variable back as it was, absent included (a delenv of an
    # absent variable records nothing to undo).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    use_multiprocess(directory)
    assert list(directory.iterdir()) == []
    assert values.ValueClass is not before


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
