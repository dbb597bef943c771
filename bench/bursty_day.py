"""A bursty day on a real node: a warm pool sized by demand, a fixed pool and no pool, each
replaying the same day of sessions.

Needs root (it starts the real-node tier's node: containerd + runc + the real kubelet v1.37 in a
network namespace, NetworkPolicy enforced, codex dialling https://api.openai.com over TLS by
name; tests/node). For each pool it starts a node, installs the chart with the tier's values and
a template ``day`` of the tier's sandbox resources (a pool sized by demand: ``warmPool: {min: 0,
max: 20}`` with a 120 s window, a compressed day's; a fixed pool: ``warmPool: {size: N}``, N the
demand pool's average number of waiting pods over its day, rounded up; no pool), runs one
uncounted session (the node's first sandbox reads the 300 MB codex binary from disk), then
replays the day (``DAY``): quiet, a burst of 10 sessions at once, quiet, a burst of 20, quiet,
a slow trickle, then a quiet spell longer than the demand pool's window (it drains to ``min``
0 within it, and stays there: the night a pool sized by demand does not pay for). Each
session is timed from its webhook accepted by the receiver to the real codex's registration
arriving at the simulator (both stamped by the simulator); it is failed once registered (its
pod deleted). A session is warm when its pod was a claimed warm
pod. Pod-seconds: the unclaimed warm pods (ready or starting) counted every 0.5 s over the
whole day, as the bench sees them on the API server (each change of that count is kept,
``waiting``: where the pool drained to zero).

    sudo .venv/bin/python bench/bursty_day.py   # demand, then fixed (demand's mean), then none

One invocation replays the day against the three pools, one after another, and prints the
comparison (``compare``): sessions warm, warm pod-seconds and warm sessions per 1,000
pod-seconds of each pool against the others, and p50/p99 per phase against no pool -- the
baselines measured in the same run. Each pool runs in a child process of its own (one node per
process: Helm's library stays in the first node's network namespace); ``fixed`` takes its size
from the ``demand`` child's mean number of waiting pods, rounded up. Each pool's run is added
to bench/results/bursty_day.json under ``LABEL POOL`` (``--label``, default ``same-run``), and
the comparison under ``comparisons``.

``--pools demand`` (or ``fixed``, ``none``) runs one pool in this process, for debugging: it
adds its pool to the results under its name, and ``fixed`` alone takes its size from the
results' ``demand`` run (or ``--fixed-size N``; ``--label`` keeps such a run beside the others,
e.g. ``--pools fixed --fixed-size 10 --label ready-10``: ten at once from a ready pool of ten;
``--worker-replicas 5``: ten worker processes, one job each; ``--phases 2``: only the day's
first two phases, the quiet 30 s and the burst of ten, its pod-seconds no day's). Each
session's placing is split at the worker's ``session looked up`` line: looking up (the lease,
the session read, its record and live sandbox looked for) and claiming (to the pod placed);
a warm session's placed → registered at its entrypoint's ``claimed:`` line, read from the pod's
log (with the runtime's timestamps) before the session is failed: placed → bound (the kubelet's
rewrite of the binding files) and bound → registered (codex; ``executor_retries``: how many
times the entrypoint restarted it after a failed registration).
Real-node runs are serialized with the other users of the machine: ``flock /tmp/node-tier.lock sudo .venv/bin/python
bench/bursty_day.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile

RESULTS = Path(__file__).resolve().parent / "results" / "bursty_day.json"
TEMPLATE = "day"
DAY: list[tuple[str, int, float, float]] = [
    # (phase, sessions, seconds between them (0: all at once), quiet seconds after it)
    ("quiet", 0, 0.0, 30.0),
    ("burst of 10", 10, 0.0, 60.0),
    ("burst of 20", 20, 0.0, 60.0),
    ("trickle", 6, 10.0, 300.0),  # one every 10 s; then longer than the window: the drain, and the night
]
DEMAND_POOL = {"min": 0, "max": 20, "windowSeconds": 120, "intervalSeconds": 10, "headroomPercent": 25}


POOLS = ("demand", "fixed", "none")
"""The same run's pools, in this order: ``fixed`` is sized from ``demand``'s mean."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", default=",".join(POOLS), help="demand,fixed,none (default), or one pool")
    parser.add_argument("--fixed-size", type=int, default=0, help="the fixed pool's size (default: demand's mean)")
    parser.add_argument("--label", default="", help="keep the run under this name (default: the pool's)")
    parser.add_argument("--worker-replicas", type=int, default=0, help="worker pods (default: the chart's, 2 of 2)")
    parser.add_argument(
        "--phases", type=int, default=0, help="replay only the day's first N phases, one pool (2: quiet, burst of 10)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/bursty_day.py needs root (it runs a real node; see tests/node)", file=sys.stderr)
        return 2
    pools = args.pools.split(",")
    if args.phases and len(pools) > 1:
        print("--phases runs one pool (its pod-seconds are not a day's: no comparison)", file=sys.stderr)
        return 2
    if len(pools) > 1:
        if pools != list(POOLS):
            print(f"several pools run as {','.join(POOLS)} (fixed is sized from demand)", file=sys.stderr)
            return 2
        return same_run(args.label or "same-run", args.fixed_size, args.worker_replicas)
    [pool] = pools
    return one_pool(pool, args.label or pool, args.fixed_size, args.worker_replicas, args.phases)


def one_pool(pool: str, label: str, fixed: int, worker_replicas: int, phases: int = 0) -> int:
    """One pool's day, in this process, added to the results under ``label``."""
    from tests.node.node import load_images

    images = load_images()
    runs = _results().get("runs", {})
    if pool == "fixed" and not fixed:
        demand = runs.get("demand")
        fixed = fixed_size(demand) if demand else 3
    warm_pool = {"demand": DEMAND_POOL, "fixed": {"size": fixed}, "none": None}[pool]
    began, load_before = _now(), os.getloadavg()
    runs[label] = day(images, warm_pool, worker_replicas, phases)
    runs[label].update(pool=label, began=began, ended=_now(), load_average_before=load_before)
    runs[label]["load_average_after"] = os.getloadavg()
    print_run(runs[label])
    results = _results()  # what another process added meanwhile stays
    results.setdefault("runs", {})[label] = runs[label]
    _write(results)
    print_table(list(results["runs"].values()))
    return 0


def same_run(label: str, fixed: int, worker_replicas: int) -> int:
    """The three pools one after another, each in a child process (one node per process), then
    their comparison, printed and kept."""
    runs: dict[str, dict[str, Any]] = {}
    for pool in POOLS:
        size = (fixed or fixed_size(runs["demand"])) if pool == "fixed" else 0
        argv = [sys.executable, __file__, "--pools", pool, "--label", f"{label} {pool}"]
        argv += ["--fixed-size", str(size)] if size else []
        argv += ["--worker-replicas", str(worker_replicas)] if worker_replicas else []
        print(f"\n== {label}: {pool} ({' '.join(argv[1:])})", flush=True)
        if subprocess.run(argv, check=False).returncode:
            print(f"{pool}'s day failed; the comparison is not made", file=sys.stderr)
            return 1
        runs[pool] = _results()["runs"][f"{label} {pool}"]
    comparison = compare(runs["demand"], runs["fixed"], runs["none"])
    print()
    print("\n".join(comparison["lines"]))
    results = _results()
    results.setdefault("comparisons", {})[label] = comparison
    _write(results)
    return 0


def fixed_size(demand: dict[str, Any]) -> int:
    """The fixed pool of the same mean as the pool sized by demand: its mean number of waiting
    pods over its day, rounded up (at least 1)."""
    return max(1, math.ceil(demand["mean_waiting_pods"]))


def _results() -> dict[str, Any]:
    return dict(json.loads(RESULTS.read_text())) if RESULTS.exists() else {}


def _write(results: dict[str, Any]) -> None:
    results.update(day=DAY, load_average=os.getloadavg())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def compare(demand: dict[str, Any], fixed: dict[str, Any], none: dict[str, Any]) -> dict[str, Any]:
    """The same run's pools side by side: per pool, sessions warm, warm pod-seconds and warm
    sessions per 1,000 pod-seconds, with demand's ratios to fixed; per phase, p50 and p99 of
    delivery -> registered and their ratios to no pool's. ``lines``: the same, printed."""
    pools = {"demand": demand, "fixed": fixed, "none": none}
    totals = {name: _totals(run) for name, run in pools.items()}
    lines = ["| pool | sessions warm | warm pod-seconds | warm per 1,000 pod-s |", "| --- | --- | --- | --- |"]
    for name, t in totals.items():
        per = f"{t['warm_per_1000_pod_seconds']:.1f}" if t["warm_per_1000_pod_seconds"] is not None else "-"
        lines.append(f"| {_name(name, pools[name])} | {t['warm']}/{t['sessions']} | {t['pod_seconds']:.0f} | {per} |")
    d, f = totals["demand"], totals["fixed"]
    ratios = {
        "warm": _ratio(d["warm"], f["warm"]),
        "pod_seconds": _ratio(d["pod_seconds"], f["pod_seconds"]),
        "warm_per_pod_second": _ratio(d["warm_per_1000_pod_seconds"], f["warm_per_1000_pod_seconds"]),
    }
    met = d["warm"] > f["warm"] and d["pod_seconds"] < f["pod_seconds"]
    lines.append(
        f"demand / {_name('fixed', fixed)}: sessions warm {_times(ratios['warm'])}, warm pod-seconds "
        f"{_times(ratios['pod_seconds'])}, warm per pod-second {_times(ratios['warm_per_pod_second'])}; "
        f"more sessions warm for fewer pod-seconds: {'yes' if met else 'no'}"
    )
    lines += ["", "| phase | pool | warm | p50 | p99 | p50 / none's | p99 / none's |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    phases: list[dict[str, Any]] = []
    baseline = {p["phase"]: p["sessions"] for p in none["phases"] if p["sessions"]}
    for phase, base_rows in baseline.items():
        base = _latencies(base_rows)
        for name, run in pools.items():
            rows = next((p["sessions"] for p in run["phases"] if p["phase"] == phase), [])
            if not rows:
                continue
            mine = _latencies(rows)
            row = {
                "phase": phase,
                "pool": name,
                "warm": sum(r["warm"] for r in rows),
                "sessions": len(rows),
                **mine,
                "p50_vs_none": _ratio(mine["p50"], base["p50"]),
                "p99_vs_none": _ratio(mine["p99"], base["p99"]),
            }
            phases.append(row)
            lines.append(
                f"| {phase} | {_name(name, run)} | {row['warm']}/{row['sessions']} | {mine['p50']:.2f} s | "
                f"{mine['p99']:.2f} s | {_times(row['p50_vs_none'])} | {_times(row['p99_vs_none'])} |"
            )
    return {"totals": totals, "demand_vs_fixed": ratios, "goal_met": met, "phases": phases, "lines": lines}


def _totals(run: dict[str, Any]) -> dict[str, Any]:
    rows = [r for phase in run["phases"] for r in phase["sessions"]]
    warm, pod_seconds = sum(r["warm"] for r in rows), float(run["warm_pod_seconds"])
    per = 1000 * warm / pod_seconds if pod_seconds else None
    return {"warm": warm, "sessions": len(rows), "pod_seconds": pod_seconds, "warm_per_1000_pod_seconds": per}


def _latencies(rows: list[dict[str, Any]]) -> dict[str, float]:
    values = [r["delivered_to_registered_s"] for r in rows]
    return {"p50": statistics.median(values), "p99": percentile(values, 0.99)}


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def _times(ratio: float | None) -> str:
    return f"x{ratio:.2f}" if ratio is not None else "-"


def _name(pool: str, run: dict[str, Any]) -> str:
    size = (run.get("warm_pool") or {}).get("size")
    return f"{pool} ({size})" if size else pool


def day(images: Any, warm_pool: dict[str, Any] | None, worker_replicas: int = 0, first: int = 0) -> dict[str, Any]:
    """The day (``DAY``) against one pool; ``first``: only its first N phases, the last one's
    quiet spell cut short (a shortened day: its pod-seconds are not a day's)."""
    from tests.node.conftest import NODE_DNS_NAMES, SANDBOX_RESOURCES, WARM_TEMPLATE, install
    from tests.node.node import real_node, say

    template: dict[str, Any] = {"resources": SANDBOX_RESOURCES}
    if warm_pool is not None:
        template["warmPool"] = warm_pool
    overrides: dict[str, Any] = {"sandbox": {"templates": {WARM_TEMPLATE: None, TEMPLATE: template}}}
    if worker_replicas:  # each a Celery worker of the chart's concurrency (2)
        overrides["worker"] = {"replicas": worker_replicas}
    with real_node(images, dns_names=NODE_DNS_NAMES) as node, install(node, images, overrides) as world:
        sim = httpx.Client(
            base_url=world.simulator_url,
            timeout=10,
            headers={"authorization": f"Bearer {world.api_key}", "openai-beta": "agents=v1"},
        )
        try:
            say(f"pool {warm_pool}: the node's first sandbox (not counted; the default template, so no demand)")
            sessions(world, sim, 1, template="default")
            if warm_pool is not None and "size" in warm_pool:
                settle(world, warm_pool["size"])
            waiting = Waiting(world)
            phases = []
            start = time.monotonic()
            replayed = DAY[:first] if first else DAY
            for at, (name, count, spacing, quiet) in enumerate(replayed):
                rows = arrivals(world, sim, count, spacing) if count else []
                phases.append({"phase": name, "sessions": rows})
                if rows:
                    say(f"{name}: {summary(rows)}")
                if not first or at < len(replayed) - 1:
                    time.sleep(quiet)
            seconds = time.monotonic() - start
            pod_seconds = waiting.stop()
            changes = [(round(at - start, 1), count) for at, count in waiting.changes]
        finally:
            sim.close()
    return {
        "warm_pool": warm_pool,
        "worker_replicas": worker_replicas or "chart default (2)",
        **({"phases_replayed": first} if first else {}),
        "phases": phases,
        "day_seconds": round(seconds, 1),
        "warm_pod_seconds": round(pod_seconds, 1),
        "mean_waiting_pods": pod_seconds / seconds,
        "waiting": changes,
    }


def settle(world: Any, size: int) -> None:
    """A fixed pool is at its size before the day starts (its steady state)."""
    from tests.support.processes import wait_for

    wait_for(lambda: len(unclaimed(world, running=True)) >= size, 300, "the fixed pool to be ready", interval=0.5)


def unclaimed(world: Any, running: bool = False) -> list[Any]:
    from controller.runners.kubernetes import names
    from tests.node.conftest import SANDBOX_NAMESPACE

    pods = world.core.list_namespaced_pod(SANDBOX_NAMESPACE, label_selector=names.pool_selector(TEMPLATE)).items
    alive = [p for p in pods if not p.metadata.deletion_timestamp and p.status.phase in ("Pending", "Running")]
    return [p for p in alive if p.status.phase == "Running"] if running else alive


class Waiting:
    """Unclaimed warm pods counted every 0.5 s on a thread: their pod-seconds."""

    def __init__(self, world: Any) -> None:
        self._world = world
        self._done = threading.Event()
        self.pod_seconds = 0.0
        self.changes: list[tuple[float, int]] = []
        """(monotonic time, unclaimed pods) at each change of the count."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._done.wait(0.5):
            try:
                count = len(unclaimed(self._world))
            except Exception:
                continue
            now = time.monotonic()
            if not self.changes or self.changes[-1][1] != count:
                self.changes.append((now, count))
            self.pod_seconds += count * (now - last)
            last = now

    def stop(self) -> float:
        self._done.set()
        self._thread.join(timeout=10)
        return self.pod_seconds


def arrivals(world: Any, sim: httpx.Client, count: int, spacing: float) -> list[dict[str, Any]]:
    """``count`` sessions at once (``spacing`` 0), or one every ``spacing`` seconds (each one's
    wait for its registration within the spacing; a slower one delays the next)."""
    if not spacing:
        return sessions(world, sim, count)
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        began = time.monotonic()
        rows += sessions(world, sim, 1)
        time.sleep(max(0.0, spacing - (time.monotonic() - began)))
    return rows


def sessions(world: Any, sim: httpx.Client, count: int, template: str = TEMPLATE) -> list[dict[str, Any]]:
    """``count`` sessions of ``template`` at once, each timed from its delivery to its
    executor's registration, then failed and its pod gone."""
    from tests.node.test_real_node import _pods
    from tests.support.processes import wait_for

    body = {
        "agent": {"model": "node-test"},
        "environment": {"type": "self_hosted"},
        "input": "hi",
        "metadata": {"sandbox_template": template},
    }
    created: list[dict[str, Any]] = []

    def create() -> None:
        response = sim.post("/v1/agents/sessions", json=body)
        response.raise_for_status()
        created.append(response.json())

    threads = [threading.Thread(target=create) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(created) == count, f"{len(created)} of {count} sessions created"
    environments = {s["environment"]["id"]: s["id"] for s in created}

    pod_of: dict[str, str] = {}

    def registered() -> dict[str, float] | None:
        """Every executor registered; each session's pod noted as soon as it registered (an
        idle session's sandbox stops after the tier's 30 s, before a slow burst is over)."""
        found: dict[str, float] = {}
        for r in sim.get("/admin/registrations").json()["data"]:
            sid = environments.get(r["environment_id"])
            if sid and r["status_code"] == 200:
                found[sid] = min(found.get(sid, r["received_at"]), r["received_at"])
        for sid in found.keys() - pod_of.keys():
            live = [p for p in _pods(world, sid) if not p.metadata.deletion_timestamp]
            if live:
                pod_of[sid] = live[0].metadata.name
        return found if len(found) == count and len(pod_of) == count else None

    registered_at: dict[str, float] = wait_for(registered, 600, "every executor to register", interval=0.5)
    delivered = delivered_at(sim)
    placing = worker_stamps(world)
    rows = []
    for session in created:
        sid = session["id"]
        name = pod_of[sid]
        stamps = {**placing.get(sid, {}), **entrypoint_stamps(pod_log(world, name))}  # before the pod goes
        rows.append(
            {
                "session_id": sid,
                "pod": name,
                "warm": name.startswith("warm-"),
                "delivered_to_registered_s": registered_at[sid] - delivered[sid],
                **stage_seconds(delivered[sid], stamps, registered_at[sid]),
                **({"executor_retries": int(stamps["retries"])} if "retries" in stamps else {}),
            }
        )
    for session in created:
        sim.post(f"/admin/sessions/{session['id']}/fail", json={"error": "bench"})
    for session in created:
        wait_for(lambda s=session["id"]: not _pods(world, s), 300, "the session's pod to be deleted", interval=0.5)
    return rows


def worker_stamps(world: Any) -> dict[str, dict[str, float]]:
    """Per session, from the workers' logs (their clock; this machine's, as the simulator's): the
    job taken (its first ``task started``), the session looked up (``session looked up``: the
    lease taken, the session read from the Agents API, its record and its live sandbox looked
    for, the decision made) and the pod placed (``warm pod claimed`` or ``pod created``)."""
    from bench.cold_burst import worker_log
    from tests.node.conftest import NAMESPACE

    found: dict[str, dict[str, float]] = {}
    events = {
        "task started": "taken",
        "session looked up": "looked",
        "warm pod claimed": "placed",
        "pod created": "placed",
    }
    for line in worker_log(world, NAMESPACE):
        stamp, sid = events.get(str(line.get("event"))), line.get("session_id")
        if stamp and sid:
            mine = found.setdefault(str(sid), {})
            mine[stamp] = min(mine.get(stamp, line["time"]), line["time"])
    return found


def stage_seconds(delivered: float, stamps: dict[str, float], registered: float) -> dict[str, float]:
    """Where one session's time went: queued (delivery → job taken), placing (→ pod claimed or
    created) and placed → its executor registered (a warm pod: the binding, codex's start and
    its registration; a cold one: the pod's whole start besides). A warm pod's placed →
    registered is split at its entrypoint's ``claimed:`` line (``entrypoint_stamps``): placed →
    bound (the kubelet's rewrite of the pod's downward-API files, and the entrypoint's poll)
    and bound → registered (codex's start, its registration, and any retry of it)."""
    taken, placed = stamps.get("taken"), stamps.get("placed")
    if taken is None or placed is None:
        return {}
    found = {"queued_s": taken - delivered, "placing_s": placed - taken, "placed_to_registered_s": registered - placed}
    looked = stamps.get("looked")
    if looked is not None and taken <= looked <= placed:  # placing, split: looking up, then claiming
        found.update(looking_s=looked - taken, claiming_s=placed - looked)
    bound = stamps.get("bound")
    if bound is not None:
        found.update(placed_to_bound_s=bound - placed, bound_to_registered_s=registered - bound)
    return found


CLAIMED_LINE = "runner-entrypoint: claimed:"
RETRY_LINE = "runner-entrypoint: executor exited with status 1 (registration failed); retry"


def entrypoint_stamps(log: str) -> dict[str, float]:
    """From a sandbox's container log read with the runtime's timestamps (``timestamps=True``:
    each line prefixed with its RFC 3339 time, this machine's clock): ``bound``, when a warm
    pod's entrypoint saw its binding (its ``claimed:`` line; none for a cold pod), and
    ``retries``, how many times it restarted an executor whose registration failed."""
    found: dict[str, float] = {}
    retries = 0
    for line in log.splitlines():
        stamp, _, text = line.partition(" ")
        if text.startswith(CLAIMED_LINE) and "bound" not in found:
            found["bound"] = _log_time(stamp)
        elif text.startswith(RETRY_LINE):
            retries += 1
    if log:
        found["retries"] = retries
    return found


def _log_time(stamp: str) -> float:
    """``2026-12-02T03:01:53.813630308Z`` (nanoseconds, UTC) as a Unix time."""
    whole, _, fraction = stamp.removesuffix("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def pod_log(world: Any, name: str) -> str:
    """The sandbox pod's container log with the runtime's timestamps ("" if it cannot be read:
    the pod already stopped)."""
    from tests.node.conftest import SANDBOX_NAMESPACE

    try:
        return str(world.core.read_namespaced_pod_log(name, SANDBOX_NAMESPACE, timestamps=True))
    except Exception:
        return ""


def delivered_at(sim: httpx.Client) -> dict[str, float]:
    """Each session's first action_required delivery the receiver answered 2xx (its end), as
    bench/cold_burst.py reads it."""
    from bench.cold_burst import delivered_at as first_accepted

    return first_accepted(sim)


def summary(rows: list[dict[str, Any]]) -> str:
    values = [r["delivered_to_registered_s"] for r in rows]
    line = (
        f"{sum(r['warm'] for r in rows)}/{len(rows)} warm, delivery → registered p50 "
        f"{statistics.median(values):.2f} s, p99 {percentile(values, 0.99):.2f} s"
    )
    for kind in (True, False):
        staged = [r for r in rows if r["warm"] is kind and "queued_s" in r]
        if staged:
            parts = ", ".join(
                f"{stage} p50 {statistics.median(values):.2f} / max {max(values):.2f}"
                for stage in (
                    "queued_s",
                    "placing_s",
                    "looking_s",
                    "claiming_s",
                    "placed_to_registered_s",
                    "placed_to_bound_s",
                    "bound_to_registered_s",
                )
                for values in [[r[stage] for r in staged if stage in r]]
                if values
            )
            retried = sum(1 for r in staged if r.get("executor_retries"))
            line += f"; {'warm' if kind else 'cold'}: {parts}" + (f", {retried} retried an executor" if retried else "")
    return line


def print_run(run: dict[str, Any]) -> None:
    pod_seconds, seconds = run["warm_pod_seconds"], run["day_seconds"]
    print(f"\n{run['pool']} ({run['warm_pool']}): {pod_seconds:.0f} warm pod-seconds in {seconds:.0f} s")
    print(f"  unclaimed pods at each change (s into the day, pods): {run.get('waiting', [])}")
    for phase in run["phases"]:
        if phase["sessions"]:
            print(f"  {phase['phase']}: {summary(phase['sessions'])}")


def print_table(runs: list[dict[str, Any]]) -> None:
    print("\n| pool | phase | sessions | warm | delivery → registered p50 | p99 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in runs:
        for phase in run["phases"]:
            rows = phase["sessions"]
            if not rows:
                continue
            values = [r["delivered_to_registered_s"] for r in rows]
            print(
                f"| {run['pool']} | {phase['phase']} | {len(rows)} | {sum(r['warm'] for r in rows)} | "
                f"{statistics.median(values):.2f} s | {percentile(values, 0.99):.2f} s |"
            )
    print("\n| pool | sessions warm | warm pod-seconds | day |")
    print("| --- | --- | --- | --- |")
    for run in runs:
        rows = [r for phase in run["phases"] for r in phase["sessions"]]
        print(
            f"| {run['pool']} | {sum(r['warm'] for r in rows)}/{len(rows)} | {run['warm_pod_seconds']:.0f} | "
            f"{run['day_seconds']:.0f} s |"
        )


if __name__ == "__main__":
    sys.exit(main())
