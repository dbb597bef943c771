"""bench/pool_sizing.py's model of the warm pool's sizing: it decides with the product's own
functions, so on the real node's day it must give what the node measured (BENCHMARKS.md, "A
bursty day": demand 0/10, 13/20, 6/6 warm; the fixed pool of its mean, 7, 7/10, 7/20, 6/6)."""

from __future__ import annotations

import random

from bench import pool_sizing
from bench.bursty_day import DEMAND_POOL


def _node_sizing(headroom: int = DEMAND_POOL["headroomPercent"]) -> pool_sizing.Sizing:
    return pool_sizing.Sizing(
        minimum=DEMAND_POOL["min"],
        maximum=DEMAND_POOL["max"],
        window=DEMAND_POOL["windowSeconds"],
        interval=DEMAND_POOL["intervalSeconds"],
        headroom=headroom,
    )


def test_the_model_gives_the_real_nodes_day() -> None:
    arrivals, seconds = pool_sizing.node_day()
    demand, fixed, size = pool_sizing.against_fixed(arrivals, seconds, _node_sizing(), start_seconds=4.0)
    assert demand.warm_by_phase == {"burst of 10": 0, "burst of 20": 13, "trickle": 6}
    assert (size, fixed.warm_by_phase) == (7, {"burst of 10": 7, "burst of 20": 7, "trickle": 6})
    # the node: mean 6.34 waiting pods, 3339 pod-seconds over a day a little longer than the model's
    assert 6.0 < demand.mean < 7.0
    assert demand.pod_seconds < fixed.pod_seconds


def test_a_pool_sized_by_demand_drains_to_min_and_a_fixed_one_waits_all_day() -> None:
    """After the last session a pool sized by demand holds its peak for the window, then
    nothing (``min`` 0): a night costs it no pod-second; the fixed pool pays for every one."""
    arrivals = [(10.0, "burst")] * 5
    demand = pool_sizing.replay(arrivals, _node_sizing(), seconds=1000.0, start_seconds=4.0)
    fixed = pool_sizing.replay(arrivals, pool_sizing.Sizing(size=5), seconds=1000.0, start_seconds=4.0)
    assert demand.warm == 0 and fixed.warm == 5  # the first burst of a day finds an empty pool sized by demand
    # 7 pods (5 + 25%) from the burst's settling to the window's end (about 120 s), none after
    assert 7 * 100 < demand.pod_seconds < 7 * 130
    assert fixed.pod_seconds > 5 * 990


def test_an_office_day_is_quiet_outside_its_working_hours() -> None:
    arrivals, seconds = pool_sizing.office_day(random.Random(3))
    assert seconds == 24 * 3600
    busy = [at for at, _ in arrivals if 9 * 3600 <= at < 17 * 3600 + 3600]
    assert len(busy) > 0.8 * len(arrivals)
    for seed in range(20):  # the night ends at 09:00: the first event of the working hours within 10 minutes
        arrivals, _ = pool_sizing.office_day(random.Random(seed))
        assert min(at for at, _ in arrivals if at >= 9 * 3600) <= 9 * 3600 + 600
