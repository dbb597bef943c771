"""A handful of named Prometheus metrics, behind a tiny ``inc(name, **labels)`` interface.

Callers count through the ``Counters`` protocol, so tests can pass any object with ``inc``.
``Metrics`` is the real one: it owns its own ``CollectorRegistry`` (two apps in one test
process never collide; the standard process/platform/gc collectors are added) and renders
it for ``GET /metrics``. One registry per process: with several uvicorn workers, scrape
each worker or switch to prometheus_client's multiprocess mode.

    controller_webhooks_total{outcome, reason}
        outcome: enqueued | duplicate | ignored | rejected | unavailable | error
        reason:  a fixed word (``events.Disposition.reason``, ``signature``, ``payload``,
                 ``too_large``, ``inbox``, ``bug``); never a header or body value
    controller_sessions_refused_total{reason}
        sessions a worker refused to start (L2, ``controller/trust.py``);
        reason: ``remote_url`` | ``environment_id`` | ``session_id``

    controller_decisions_total{verdict}
        verdict: start | replace | keep | release | ignore (``lifecycle.Verdict``), one per
                 decision a worker makes (``Deps.on_decision``). Counted in each worker
                 process's own registry: workers serve no HTTP, so it is not scraped yet
                 (that needs prometheus_client's multiprocess mode and a port per worker).

    controller_sandboxes_stopped_total{reason}
        sandboxes a worker stopped, released or replaced (``Deps.on_stop``);
        reason: idle | lifetime | failed | deleted | replaced (``lifecycle.Cause``)
    controller_sandboxes_running
        gauge: sandboxes the runner manages, as the active scheduler last counted them

Labels are low-cardinality by construction: never ids, never values from a request.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

WEBHOOKS_TOTAL = "controller_webhooks_total"
SESSIONS_REFUSED_TOTAL = "controller_sessions_refused_total"
DECISIONS_TOTAL = "controller_decisions_total"
SANDBOXES_STOPPED_TOTAL = "controller_sandboxes_stopped_total"
SANDBOXES_RUNNING = "controller_sandboxes_running"


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
        self._counters: dict[str, Counter] = {
            WEBHOOKS_TOTAL: Counter(
                WEBHOOKS_TOTAL,
                "Webhook deliveries by outcome and reason.",
                ("outcome", "reason"),
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
        }
        self._gauges: dict[str, Gauge] = {
            SANDBOXES_RUNNING: Gauge(SANDBOXES_RUNNING, "Sandboxes the runner manages.", registry=self.registry),
        }

    def set(self, name: str, value: float) -> None:
        """Set a named gauge; an unknown name is a bug (KeyError)."""
        self._gauges[name].set(value)

    def inc(self, name: str, **labels: str) -> None:
        """Add one to a named counter; an unknown name or label set is a bug (ValueError/KeyError)."""
        counter = self._counters[name]
        counter.labels(**labels).inc()

    def value(self, name: str, **labels: str) -> float:
        """The current count (0 when never incremented), for tests and checks."""
        sample = name if name.endswith("_total") or name in self._gauges else name + "_total"
        return self.registry.get_sample_value(sample, labels) or 0.0

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)
