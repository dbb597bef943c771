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


# A warm pod's container log as the runtime keeps it (read with timestamps=True): its binding
# seen 14.2 s after the claim (the kubelet's rewrite of its downward-API files missed), then one
# failed registration retried.
SLOW_BINDING_LOG = """\
2026-12-02T03:01:05.002166739Z runner-entrypoint: warm: waiting for a session to claim this sandbox
2026-12-02T03:01:53.813630308Z runner-entrypoint: claimed: starting the executor for environment env_1
2026-12-02T03:01:53.825023953Z WARNING: proceeding, even though we could not create PATH aliases
2026-12-02T03:01:54.900000000Z Error: environment registry request failed (503 Service Unavailable)
2026-12-02T03:01:54.900100000Z runner-entrypoint: executor exited with status 1 (registration failed); retry 1 in 0.612s
"""


def test_a_warm_pods_log_says_when_its_binding_was_seen_and_how_often_codex_was_retried() -> None:
    """The entrypoint's ``claimed:`` line, at the runtime's nanosecond stamp (UTC, this machine's
    clock, as the simulator's and the workers' stamps), is when the pod was bound; its ``retry``
    lines count the executor's failed registrations. A cold pod's log has no ``claimed:`` line; an
    unreadable log (the pod already gone) gives nothing."""
    stamps = bursty_day.entrypoint_stamps(SLOW_BINDING_LOG)
    assert stamps["bound"] == pytest.approx(1796180513.813630308, abs=1e-6)  # 03:01:53.813630308 UTC
    assert stamps["retries"] == 1
    cold = "2026-12-02T03:01:05.100000000Z Error: environment registry request failed\n"
    assert bursty_day.entrypoint_stamps(cold) == {"retries": 0}
    assert bursty_day.entrypoint_stamps("") == {}


def test_a_warm_sessions_placed_to_registered_is_split_at_its_binding() -> None:
    """Placed → registered, split where the entrypoint saw its binding: placed → bound (the
    kubelet) and bound → registered (codex); without the entrypoint's stamp (a cold pod) it stays
    whole. The summary names both stages and the sessions whose executor was retried."""
    bound = bursty_day.entrypoint_stamps(SLOW_BINDING_LOG)["bound"]
    placed = bound - 14.2
    stamps = {"taken": placed - 0.5, "looked": placed - 0.3, "placed": placed, "bound": bound}
    stages = bursty_day.stage_seconds(placed - 0.52, stamps, bound + 1.3)
    assert stages["placed_to_registered_s"] == pytest.approx(15.5)
    assert stages["placed_to_bound_s"] == pytest.approx(14.2)
    assert stages["bound_to_registered_s"] == pytest.approx(1.3)
    cold = bursty_day.stage_seconds(placed - 0.52, {k: v for k, v in stamps.items() if k != "bound"}, bound + 1.3)
    assert "placed_to_bound_s" not in cold and cold["placed_to_registered_s"] == pytest.approx(15.5)
    row = {"warm": True, "delivered_to_registered_s": 16.0, "executor_retries": 1, **stages}
    line = bursty_day.summary([row])
    assert "placed_to_bound_s p50 14.20 / max 14.20" in line
    assert "bound_to_registered_s p50 1.30 / max 1.30" in line
    assert "1 retried an executor" in line
