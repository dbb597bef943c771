"""A handful of named Prometheus metrics, behind a tiny ``inc(name, **labels)`` interface.

Callers count through the ``Counters`` protocol, so tests can pass any object with ``inc``.
``Metrics`` is the real one: it owns its own ``CollectorRegistry`` (two apps in one test
process never collide; the standard process/platform/gc collectors are added) and renders
it for ``GET /metrics``. One registry per process: with several processes serving one role, scrape
each process or switch to prometheus_client's multiprocess mode.

    controller_webhooks_total{outcome, reason}
        outcome: enqueued | duplicate | ignored | rejected | unavailable | error
        reason:  a fixed word (``events.Disposition.reason``, ``signature``, ``payload``,
                 ``too_large``, ``inbox``, ``bug``); never a header or body value
    controller_receiver_refused_total{reason}
        what the receiver's HTTP server refused or cut short before (or instead of) the app
        (``controller/endpoint/server.py``): ``bad_request`` (400) | ``header_too_large`` (431) |
        ``trailers_too_large`` (431) | ``header_timeout`` (a head not complete in time: closed) |
        ``body_timeout`` (408) | ``over_capacity`` (503 with ``Retry-After``: every connection
        busy answering) | ``shed`` (the connection that waited longest for its client, closed to
        make room for a new one) | ``answers_unread`` (pipelined requests whose answers the
        client did not read by the header deadline: reset) | ``app_error`` (500: a bug)
    controller_webhook_secrets_refused_total{reason}
        the receiver's secrets file changed but could not be used, so the last good secrets
        stay in use (``signing.FileVerifier``); reason: ``not_a_file`` | ``unreadable`` |
        ``empty`` | ``invalid`` (garbled, or a key shorter than 24 bytes)
    controller_sessions_refused_total{reason}
        sessions a worker refused to start (L2, ``controller/trust.py``);
        reason: ``remote_url`` | ``environment_id`` | ``session_id``

    controller_decisions_total{verdict}
        verdict: start | replace | keep | stop | release | discard | ignore (``decide.Verdict``),
                 one per decision a worker makes (``Deps.on_decision``); each worker serves the
                 sum of its pool processes (multiprocess mode, below)

    controller_sandboxes_stopped_total{reason}
        sandboxes a worker stopped, released or replaced (``Deps.on_stop``);
        reason: idle | lifetime | failed | deleted | replaced (``decide.Cause``)
    controller_deletions_held_total
        deletions a worker held because most sessions read to confirm them answered 404 (a wrong
        API key, project or base URL: ``decide.Missing``); each also a "deletions held" error
    controller_sandbox_crash_loops_total
        crash-loop back-offs begun: a sandbox's executor exited again (the second time in a row or
        later, ``decide.crash_backoff``) and its replacement waits; each also a "crash loop
        back-off" warning line
    controller_sandboxes_cannot_start_total{reason}
        sandboxes first found unable to start, kept and reported rather than replaced
        (``decide._unstartable``); reason: ``no_node_with_profile`` (no node has the seccomp profile
        the template names) | ``profile_missing_on_node`` (the pod's node lacks the file)
        (``runners/kubernetes/seccomp.py``); each also a "sandbox cannot start" warning line and a
        Warning Event on the pod
    controller_prestarts_skipped_total
        session creations that started no sandbox because the pre-start budget was used up
        (``CONTROLLER_PRESTART_MAX_SANDBOXES``); each also a "pre-start skipped" log line
    controller_sandboxes_running
        gauge: sandboxes the runner manages, as the active scheduler last counted them
    controller_delivery_to_sandbox_start_seconds (histogram)
        from the receiver taking a delivery (the job carries that time) to the worker having
        started and recorded its sandbox; observed for jobs that came from a delivery. Worker
        and receiver clocks are compared: keep their nodes in time sync.
    controller_delivery_to_executor_connected_seconds (histogram)
        from the same delivery to the Agents API reporting the environment connected: after a
        start, a watch job asks after 0.5 s and then less often (√2 times later each time, at
        most every 5 s) for up to five minutes (L15's window); late by at most a third of itself
    controller_start_stage_seconds{stage, source, template} (histogram)
        each stage of every start a worker made (``start_stages``): ``queue_wait`` (delivery →
        a worker took the job; jobs from a delivery only), ``placing`` (→ pod created or warm
        pod claimed, and recorded), ``scheduled`` (pod created → PodScheduled) and
        ``container_started`` (→ the container running; both cold pods on Kubernetes only,
        stamped by the API to the second), ``executor_registered`` (the container started, or
        placed for a warm pod → the executor registered: the watch job's first read that finds
        the environment connected, as the API reports no registration time), ``connected``
        (placed → the Agents API reports the executor connected; with metrics served, as the
        watch job sees it). source:
        ``warm`` | ``cold``; template: the sandbox template (``local`` for the local runner)
    controller_lease_busy_total
        jobs a worker put back because another worker held the session's lease
    controller_agents_api_requests_total{operation, status}
        operation: retrieve_session | retrieve_environment; status: the HTTP status code, or
        ``timeout`` | ``transport_error``
    controller_queue_depth, controller_work_pending, controller_timers_pending (gauges, read at
        scrape by the scheduler): jobs waiting in the queue; sessions whose wanted work is not
        done yet; durable timers armed
    controller_sandbox_placements_total{template, source}
        pods the Kubernetes runner placed for sessions, by template; source: ``warm`` (a
        claimed warm pod) | ``cold`` (a pod created for the session). Cold placements of a
        template with a warm pool mean the pool ran dry: make it bigger.
    controller_sandbox_resumes_total{outcome}
        local runner with ``CONTROLLER_IDLE_SUSPEND=checkpoint``, Kubernetes templates with
        ``suspend: checkpoint``: starts of a session that had a checkpoint; outcome: ``restored``
        (its processes and memory came back; on Kubernetes: its pod was created from the
        checkpoint image) | ``fresh_start`` (the restore was impossible, or on Kubernetes its
        restored pod failed: a new executor on the same workspace)
    controller_checkpoints_refused_total{reason}
        local runner with ``CONTROLLER_IDLE_SUSPEND=checkpoint``: suspensions whose image did not
        fit, so the sandbox was stopped instead (its workspace kept); reason: ``cap`` (every image
        together would pass ``CONTROLLER_CHECKPOINT_MAX_PERCENT`` of the state volume) |
        ``reserve`` (less than ``CONTROLLER_CHECKPOINT_RESERVE_PERCENT`` of it would stay free)
    controller_checkpoint_bytes (gauge, the scheduler, read at scrape)
        local runner with ``CONTROLLER_IDLE_SUSPEND=checkpoint``: bytes of every checkpoint's
        images on the state volume
    controller_cold_starts_total{template, reason}
        the cold ones among them, by why: ``pool_empty`` (the template's pool had no pod to
        claim) | ``no_pool`` (the template has none) | ``workspace_directory`` (the session
        names another working directory than warm pods mount)
    controller_warm_pods{template, state}, controller_warm_pool_target{template} (gauges, the
        scheduler's leader, as its last tending found each pool, every few seconds)
        state: ``ready`` (running, waiting for a claim) | ``starting``; the target is the
        template's ``warmPool.size``, or for a pool sized by demand the size it aims at now
    controller_warm_pod_seconds_total{template} (counter, the scheduler's leader)
        seconds warm pods spent waiting unclaimed (ready or starting), summed over pods: each
        tending adds the pods it found times the seconds since the previous one

Who serves what: the receiver its own ``GET /metrics``; the scheduler and each worker
``GET /metrics`` on ``CONTROLLER_METRICS_PORT`` (``serve_metrics``). A worker's pool
processes count in prometheus_client's multiprocess mode (``use_multiprocess``: one
directory per worker, emptied at start) and its main process serves their sum.

Labels are low-cardinality by construction: never ids, never values from a request.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.errors import ConfigError
from controller.model import PoolState

WEBHOOKS_TOTAL = "controller_webhooks_total"
RECEIVER_REFUSED_TOTAL = "controller_receiver_refused_total"
SESSIONS_REFUSED_TOTAL = "controller_sessions_refused_total"
SECRETS_REFUSED_TOTAL = "controller_webhook_secrets_refused_total"
DECISIONS_TOTAL = "controller_decisions_total"
SANDBOXES_STOPPED_TOTAL = "controller_sandboxes_stopped_total"
SANDBOXES_RUNNING = "controller_sandboxes_running"
DELIVERY_TO_START_SECONDS = "controller_delivery_to_sandbox_start_seconds"
DELIVERY_TO_CONNECTED_SECONDS = "controller_delivery_to_executor_connected_seconds"
START_STAGE_SECONDS = "controller_start_stage_seconds"
LEASE_BUSY_TOTAL = "controller_lease_busy_total"
DELETIONS_HELD_TOTAL = "controller_deletions_held_total"
PRESTARTS_SKIPPED_TOTAL = "controller_prestarts_skipped_total"
START_FAILURES_TOTAL = "controller_sandbox_start_failures_total"
CRASH_LOOPS_TOTAL = "controller_sandbox_crash_loops_total"
CANNOT_START_TOTAL = "controller_sandboxes_cannot_start_total"
API_REQUESTS_TOTAL = "controller_agents_api_requests_total"
QUEUE_DEPTH = "controller_queue_depth"
WORK_PENDING = "controller_work_pending"
TIMERS_PENDING = "controller_timers_pending"
PLACEMENTS_TOTAL = "controller_sandbox_placements_total"
RESUMES_TOTAL = "controller_sandbox_resumes_total"
CHECKPOINTS_REFUSED_TOTAL = "controller_checkpoints_refused_total"
CHECKPOINT_BYTES = "controller_checkpoint_bytes"
WARM_PODS = "controller_warm_pods"
WARM_POOL_TARGET = "controller_warm_pool_target"
WARM_POD_SECONDS_TOTAL = "controller_warm_pod_seconds_total"
COLD_STARTS_TOTAL = "controller_cold_starts_total"
START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class Counters(Protocol):
    def inc(self, name: str, **labels: str) -> None: ...


class Metrics:
    """The controller's Prometheus metrics in one registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry(auto_describe=True)
            for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                registry.register(standard)  # process_*, python_info, python_gc_*
        self.registry = registry
        self._histograms: dict[str, Histogram] = {
            DELIVERY_TO_START_SECONDS: Histogram(
                DELIVERY_TO_START_SECONDS,
                "Seconds from the receiver taking a delivery to its sandbox being started.",
                buckets=START_BUCKETS,
                registry=self.registry,
            ),
            DELIVERY_TO_CONNECTED_SECONDS: Histogram(
                DELIVERY_TO_CONNECTED_SECONDS,
                "Seconds from the receiver taking a delivery to the Agents API reporting its executor connected.",
                buckets=START_BUCKETS,
                registry=self.registry,
            ),
            START_STAGE_SECONDS: Histogram(
                START_STAGE_SECONDS,
                "Seconds each stage of a sandbox start took, by stage, source (warm or cold) and template.",
                ("stage", "source", "template"),
                buckets=START_BUCKETS,
                registry=self.registry,
            ),
        }
        self._counters: dict[str, Counter] = {
            **_operations_counters(self.registry),
            WEBHOOKS_TOTAL: Counter(
                WEBHOOKS_TOTAL,
                "Webhook deliveries by outcome and reason.",
                ("outcome", "reason"),
                registry=self.registry,
            ),
            RECEIVER_REFUSED_TOTAL: Counter(
                RECEIVER_REFUSED_TOTAL,
                "Requests and connections the receiver's HTTP server refused or closed for a limit, by reason.",
                ("reason",),
                registry=self.registry,
            ),
            SECRETS_REFUSED_TOTAL: Counter(
                SECRETS_REFUSED_TOTAL,
                "Changes of the webhook secrets file that were refused (the last good secrets stay), by reason.",
                ("reason",),
                registry=self.registry,
            ),
            SESSIONS_REFUSED_TOTAL: Counter(
                SESSIONS_REFUSED_TOTAL,
                "Sessions refused a sandbox (untrusted remote_url or malformed id), by reason.",
                ("reason",),
                registry=self.registry,
            ),
            DECISIONS_TOTAL: Counter(
                DECISIONS_TOTAL,
                "Lifecycle decisions by verdict.",
                ("verdict",),
                registry=self.registry,
            ),
            SANDBOXES_STOPPED_TOTAL: Counter(
                SANDBOXES_STOPPED_TOTAL,
                "Sandboxes stopped, released or replaced, by reason.",
                ("reason",),
                registry=self.registry,
            ),
            DELETIONS_HELD_TOTAL: Counter(
                DELETIONS_HELD_TOTAL,
                "Deletions held because the sessions read to confirm them answered 404 too (or none could be).",
                registry=self.registry,
            ),
            PRESTARTS_SKIPPED_TOTAL: Counter(
                PRESTARTS_SKIPPED_TOTAL,
                "Session creations that started no sandbox: the pre-start budget was used up.",
                registry=self.registry,
            ),
            RESUMES_TOTAL: Counter(
                RESUMES_TOTAL,
                "Starts of a session that had a checkpoint, by outcome (restored, or fresh_start if it could not be).",
                ("outcome",),
                registry=self.registry,
            ),
            CHECKPOINTS_REFUSED_TOTAL: Counter(
                CHECKPOINTS_REFUSED_TOTAL,
                "Suspensions whose checkpoint image did not fit on the state volume (so the sandbox was "
                "stopped), by reason: cap or reserve.",
                ("reason",),
                registry=self.registry,
            ),
            CRASH_LOOPS_TOTAL: Counter(
                CRASH_LOOPS_TOTAL,
                "Crash-loop back-offs begun: an executor exited again in a row and its replacement waits.",
                registry=self.registry,
            ),
            CANNOT_START_TOTAL: Counter(
                CANNOT_START_TOTAL,
                "Sandboxes found unable to start (kept and reported, not replaced), by reason: "
                "no_node_with_profile or profile_missing_on_node (its seccomp profile).",
                ("reason",),
                registry=self.registry,
            ),
            START_FAILURES_TOTAL: Counter(
                START_FAILURES_TOTAL,
                "Sandbox starts that failed, by kind: transient (retried while the session asks) or "
                "permanent (the spec is unsafe: dropped).",
                ("kind",),
                registry=self.registry,
            ),
            PLACEMENTS_TOTAL: Counter(
                PLACEMENTS_TOTAL,
                "Pods placed for sessions, by template and source (a claimed warm pod, or a cold one).",
                ("template", "source"),
                registry=self.registry,
            ),
            COLD_STARTS_TOTAL: Counter(
                COLD_STARTS_TOTAL,
                "Cold pods placed for sessions, by template and reason (pool_empty, no_pool, workspace_directory).",
                ("template", "reason"),
                registry=self.registry,
            ),
        }
        self._gauges: dict[str, Gauge] = {}
        self._children: dict[tuple[object, ...], Counter] = {}

    def set(self, name: str, value: float) -> None:
        """Set a named gauge; an unknown name is a bug (KeyError). Gauges are registered on first
        use, so processes that never set one (workers, whose pool processes would each report a
        zero of their own in multiprocess mode) do not expose it."""
        if name not in self._gauges:
            self._gauges[name] = Gauge(name, GAUGE_HELP[name], registry=self.registry)
        self._gauges[name].set(value)

    def inc(self, name: str, **labels: str) -> None:
        """Add one to a named counter; an unknown name or label set is a bug (ValueError/KeyError)."""
        key = (name, *labels.items())
        child = self._children.get(key)
        if child is None:  # the labelled child, found once (the receiver counts every delivery)
            counter = self._counters[name]
            child = self._children[key] = counter.labels(**labels) if labels else counter  # no labels: no .labels()
        child.inc()

    def value(self, name: str, **labels: str) -> float:
        """The current count (0 when never incremented), for tests and checks."""
        sample = name if name.endswith("_total") or name in self._gauges else name + "_total"
        return self.registry.get_sample_value(sample, labels) or 0.0

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one observation in a named histogram; an unknown name is a bug (KeyError)."""
        histogram = self._histograms[name]
        (histogram.labels(**labels) if labels else histogram).observe(value)


GAUGE_HELP = {
    SANDBOXES_RUNNING: "Sandboxes the runner manages, as the active scheduler last counted them.",
    CHECKPOINT_BYTES: "Bytes of every checkpoint's images on the local runner's state volume.",
}


def _operations_counters(registry: CollectorRegistry) -> dict[str, Counter]:
    return {
        LEASE_BUSY_TOTAL: Counter(
            LEASE_BUSY_TOTAL, "Jobs put back because another worker held the session's lease.", registry=registry
        ),
        API_REQUESTS_TOTAL: Counter(
            API_REQUESTS_TOTAL,
            "Agents API requests by operation and HTTP status (or timeout / transport_error).",
            ("operation", "status"),
            registry=registry,
        ),
    }


class QueueCollector(Collector):
    """``controller_queue_depth``, ``controller_work_pending`` and ``controller_timers_pending``,
    read when scraped; a gauge whose source cannot be read (Redis away) is left out of that scrape."""

    def __init__(
        self, depth: Callable[[], int], pending: Callable[[], int], timers: Callable[[], int] | None = None
    ) -> None:
        self._depth, self._pending, self._timers = depth, pending, timers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        readers = [
            (QUEUE_DEPTH, "Webhook jobs waiting in the queue (not the maintenance queue).", self._depth),
            (WORK_PENDING, "Sessions whose wanted work is not done yet.", self._pending),
        ]
        if self._timers is not None:
            readers.append((TIMERS_PENDING, "Durable timers armed (one per session at most).", self._timers))
        for name, help_text, read in readers:
            try:
                value = read()
            except Exception:
                continue
            yield GaugeMetricFamily(name, help_text, value=value)


class ReadGauge(Collector):
    """One gauge read when scraped (left out of a scrape whose read fails)."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self._name, self._help, self._read = name, help_text, read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            value = self._read()
        except Exception:
            return
        yield GaugeMetricFamily(self._name, self._help, value=value)


class WarmPoolCollector(Collector):
    """``controller_warm_pods{template, state}`` and ``controller_warm_pool_target{template}``:
    each pool as the scheduler's last tending found it (``update``); nothing before the first,
    and nothing from a scheduler that stands by (it tends no pool; one that loses the lead is
    told of no pool, so its figures never go stale). ``controller_warm_pod_seconds_total``:
    each tending adds the unclaimed pods it found times the seconds since the previous one
    (none accrue while this scheduler stands by)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._pools: tuple[PoolState, ...] = ()
        self._clock = clock
        self._last: float | None = None
        self._pod_seconds: dict[str, float] = {}

    def update(self, pools: Sequence[PoolState]) -> None:
        now = self._clock()
        if self._last is not None:
            for pool in pools:
                waited = (pool.ready + pool.starting) * (now - self._last)
                self._pod_seconds[pool.template] = self._pod_seconds.get(pool.template, 0.0) + waited
        self._pools, self._last = tuple(pools), (now if pools else None)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        pools = self._pools
        if not pools:
            return
        pods = GaugeMetricFamily(
            WARM_PODS, "Unclaimed usable warm pods, by template and state.", labels=("template", "state")
        )
        target = GaugeMetricFamily(
            WARM_POOL_TARGET,
            "Warm pods each pool aims to keep waiting (its size, or its target from demand).",
            labels=("template",),
        )
        waited = CounterMetricFamily(
            WARM_POD_SECONDS_TOTAL.removesuffix("_total"),
            "Seconds warm pods spent waiting unclaimed, summed over pods.",
            labels=("template",),
        )
        for pool in pools:
            pods.add_metric((pool.template, "ready"), pool.ready)
            pods.add_metric((pool.template, "starting"), pool.starting)
            target.add_metric((pool.template,), pool.size)
            waited.add_metric((pool.template,), self._pod_seconds.get(pool.template, 0.0))
        yield pods
        yield target
        yield waited


def use_multiprocess(directory: Path) -> None:
    """Count in prometheus_client's multiprocess mode under ``directory`` (emptied first: counts
    of a previous run must not add up with this one's). Call before any metric is created in
    this process tree (the worker calls it before building its Celery app)."""
    if directory.exists():
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    # The library picks its value class when first imported; pick again now that the
    # directory is set (metrics created from here on write to per-process files).
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def process_exited(pid: int) -> None:
    """A pool process is gone: drop its live-gauge files (its counters stay summed)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def multiprocess_registry() -> CollectorRegistry:
    """A registry that sums every process's files in the multiprocess directory."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> None:
    """``GET /metrics`` for ``registry`` on ``host:port``, from a daemon thread of this process;
    a port that cannot be bound is a configuration problem (exit 2), reported once."""
    try:
        start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError([f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"]) from exc
