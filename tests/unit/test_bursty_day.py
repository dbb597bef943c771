"""bench/bursty_day.py's one invocation: the three pools in order, the fixed pool sized from the
same run's demand pool, and the comparison against the baselines of that run (pure; the real
node's days are replaced by child processes that write made-up runs)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import bursty_day


def _run(label: str, warm: list[int], pod_seconds: float, latency: float, size: int | None = None) -> dict[str, Any]:
    """A made-up day: per phase of ``bursty_day.DAY`` with sessions, ``warm[i]`` of them warm."""
    phases = []
    busy = [p for p in bursty_day.DAY if p[1]]
    for (name, count, _, _), warm_count in zip(busy, warm, strict=True):
        rows = [{"warm": i < warm_count, "delivered_to_registered_s": latency + i / 100} for i in range(count)]
        phases.append({"phase": name, "sessions": rows})
    return {
        "pool": label,
        "warm_pool": {"size": size} if size else None,
        "phases": [{"phase": "quiet", "sessions": []}, *phases],
        "warm_pod_seconds": pod_seconds,
        "day_seconds": 500.0,
        "mean_waiting_pods": pod_seconds / 500.0,
    }


def test_the_comparison_says_the_goal_is_met_only_for_more_warm_and_fewer_pod_seconds() -> None:
    """Demand against fixed: more sessions warm for fewer pod-seconds is the goal; as many warm,
    or more warm for as many pod-seconds, is not. Ratios are demand's over fixed's, and each
    phase's p50/p99 over no pool's."""
    fixed = _run("fixed", [7, 7, 6], 3500.0, 1.0, size=7)
    none = _run("none", [0, 0, 0], 0.0, 2.0)
    met = bursty_day.compare(_run("demand", [0, 15, 6], 3000.0, 1.0), fixed, none)
    assert met["goal_met"] is True
    assert met["demand_vs_fixed"]["warm"] == pytest.approx(21 / 20)
    assert met["demand_vs_fixed"]["pod_seconds"] == pytest.approx(3000 / 3500)
    assert met["demand_vs_fixed"]["warm_per_pod_second"] == pytest.approx((21 / 3000) / (20 / 3500))
    assert met["totals"]["none"]["warm_per_1000_pod_seconds"] is None  # no pod-seconds: no ratio, no error
    burst = next(p for p in met["phases"] if p["phase"] == "burst of 10" and p["pool"] == "fixed")
    assert burst["p50_vs_none"] == pytest.approx((1.0 + 0.045) / (2.0 + 0.045))
    assert any("more sessions warm for fewer pod-seconds: yes" in line for line in met["lines"])

    as_many_warm = bursty_day.compare(_run("demand", [0, 14, 6], 3000.0, 1.0), fixed, none)
    more_seconds = bursty_day.compare(_run("demand", [0, 15, 6], 3500.0, 1.0), fixed, none)
    assert as_many_warm["goal_met"] is False and more_seconds["goal_met"] is False
    assert any("fewer pod-seconds: no" in line for line in as_many_warm["lines"])


def test_one_invocation_runs_demand_then_fixed_of_its_mean_then_none_and_keeps_the_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pool's day in a child process of its own, in the order demand, fixed, none; the
    fixed child is told the demand child's mean waiting pods rounded up (6.2 -> 7), not a size
    from an earlier run in the results; the comparison of exactly these three runs is kept."""
    results = tmp_path / "bursty_day.json"
    earlier = _run("demand", [0, 0, 0], 9999.0, 1.0)  # an earlier run of the pool: never used
    results.write_text(json.dumps({"runs": {"demand": earlier}}))
    monkeypatch.setattr(bursty_day, "RESULTS", results)
    children: list[list[str]] = []
    made = {
        "demand": _run("demand", [0, 13, 6], 3100.0, 1.0),
        "fixed": _run("fixed", [7, 7, 6], 3500.0, 1.0, size=7),
        "none": _run("none", [0, 0, 0], 0.0, 2.0),
    }

    def child(argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        children.append(argv)
        pool, label = argv[argv.index("--pools") + 1], argv[argv.index("--label") + 1]
        written = json.loads(results.read_text())
        written["runs"][label] = made[pool]
        results.write_text(json.dumps(written))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(bursty_day.subprocess, "run", child)
    assert bursty_day.same_run("today", fixed=0, worker_replicas=0) == 0

    assert [argv[argv.index("--pools") + 1] for argv in children] == ["demand", "fixed", "none"]
    assert children[1][children[1].index("--fixed-size") + 1] == "7"  # ceil(3100 / 500)
    assert "--fixed-size" not in children[0] and "--fixed-size" not in children[2]
    kept = json.loads(results.read_text())
    comparison = kept["comparisons"]["today"]
    assert comparison["totals"]["demand"]["warm"] == 19 and comparison["totals"]["fixed"]["warm"] == 20
    assert comparison["goal_met"] is False
    assert kept["runs"]["demand"] == earlier  # the earlier run stays beside this one's
