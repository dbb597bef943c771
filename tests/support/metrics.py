"""The metric names the controller exports, for tests that hold a chart or a doc to them."""

from __future__ import annotations

from controller.metrics import GAUGE_HELP, Metrics, WarmPoolCollector
from controller.model import PoolState


def exported() -> set[str]:
    """Every sample name the controller's registry can produce (counters with _total,
    histograms with _bucket/_sum/_count), plus the scheduler's queue and warm-pool gauges."""
    names = {
        "controller_queue_depth",
        "controller_work_pending",
        "controller_timers_pending",
        *GAUGE_HELP,
    }  # gauges made on first use
    metrics, pools = Metrics(), WarmPoolCollector()
    metrics.registry.register(pools)
    pools.update([PoolState("fast", size=1, ready=1, starting=0)])  # its gauges exist after a tending
    for family in metrics.registry.collect():
        if family.name.startswith("controller_"):
            base = family.name
            names |= {base, base + "_total", base + "_bucket", base + "_sum", base + "_count"}
    return names
