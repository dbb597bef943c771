"""Delivery → executor registered on a real node: a warm pool against cold pods, side by side.

Needs root (it starts the real-node tier's node: containerd + runc + the real kubelet v1.37 in
a network namespace, tests/node). Installs the chart with the tier's values, whose ``warm``
template keeps a pool of two pods, then creates sessions one at a time, alternating a session
of the warm template with one of the default (cold) template and swapping which goes first
every pair. Each session is timed from its ``action_required`` webhook accepted by the
receiver (2xx) to the real codex's registration arriving at the simulator (both timestamps
taken by the simulator), then failed, and its pod is gone before the next one starts. Before
each warm session the pool is back at its size (the steady state of a pool sized for the
arrival rate).

One pair (a warm and a cold session) runs first and is not counted: the first executor to
start on a fresh node reads the 300 MB codex binary from disk, whichever kind it is.

Also printed: for warm pods, claim → entrypoint sees its binding (the kubelet's refresh of the
downward-API volume plus the entrypoint's 0.1 s poll); how many sessions had a failed first
registration (the entrypoint's retries, read from its log). The node is the tier's: NetworkPolicy
enforced, codex dialling https://api.openai.com over TLS by name (tests/node/conftest.py).

    sudo .venv/bin/python bench/warm_pool.py [--sessions 20] [--kubelet-defaults]

``--kubelet-defaults`` runs the node's kubelet with its own periods (``syncFrequency`` and
``fileCheckFrequency`` 1 minute) instead of the tier's 10 s, as users' nodes run it: the binding
still arrives with the pod update the claim makes (the kubelet syncs a pod when its annotations
change, and each sync rewrites its downward-API volumes), not at a periodic resync (claims one
at a time; in bursts of claims a kubelet race can make a pod miss it: BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile
from tests.node.conftest import NODE_DNS_NAMES, SANDBOX_NAMESPACE, WARM_POOL_SIZE, WARM_TEMPLATE, install
from tests.node.node import load_images, real_node, say
from tests.node.test_real_node import _one_session, _pods, bound_after, warm_ready
from tests.support.processes import wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "warm_pool.json"
RETRY_WAIT = re.compile(r"registration failed\); retry \d+ in ([0-9.]+)s")


def one(world: Any, warm: bool) -> dict[str, Any]:
    if warm:
        wait_for(lambda: len(warm_ready(world)) >= WARM_POOL_SIZE, 300, "the pool to be at its size", interval=0.2)
    timeline = _one_session(world, timeout=300, template=WARM_TEMPLATE if warm else None)
    pod = world.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    timeline["kind"] = "warm" if warm else "cold"
    timeline["delivery_to_registered_s"] = timeline["registered_at"] - timeline["delivered_at"]
    timeline["from_pool"] = pod.metadata.name.startswith("warm-")
    if warm:
        timeline["claim_to_bound_s"] = wait_for(lambda: bound_after(world, pod), 60, "the claimed line", 0.5)
    log = world.core.read_namespaced_pod_log(pod.metadata.name, SANDBOX_NAMESPACE, container="executor")
    waits = [float(w) for w in RETRY_WAIT.findall(log)]
    timeline["registration_retries"] = len(waits)
    timeline["retry_wait_s"] = sum(waits)
    timeline["delivery_to_running_s"] = timeline["running_at"] - timeline["delivered_at"]
    session_id = timeline["session_id"]
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "bench"}, timeout=10)
    wait_for(lambda: not _pods(world, session_id), 180, "the session's pod to be deleted", interval=0.5)
    return timeline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20, help="sessions of each kind")
    parser.add_argument("--warmup", type=int, default=1, help="uncounted pairs first")
    parser.add_argument(
        "--kubelet-defaults",
        action="store_true",
        help="the kubelet with its own periods (syncFrequency 1m) instead of the tier's 10 s",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/warm_pool.py needs root (it runs a real node; see tests/node)", file=sys.stderr)
        return 2
    load = os.getloadavg()
    images = load_images()
    results: list[dict[str, Any]] = []
    node_up = real_node(images, dns_names=NODE_DNS_NAMES, kubelet_defaults=args.kubelet_defaults)
    with node_up as node, install(node, images) as world:
        wait_for(lambda: len(warm_ready(world)) >= WARM_POOL_SIZE, 300, "the warm pool to be ready", interval=0.5)
        for _ in range(args.warmup):
            for warm in (True, False):
                result = one(world, warm)
                say(f"warm-up {result['kind']}: delivery → registered {result['delivery_to_registered_s']:.2f}s")
        for i in range(args.sessions):
            for warm in (True, False) if i % 2 == 0 else (False, True):
                result = one(world, warm)
                results.append(result)
                say(
                    f"{result['kind']} {len(results):2d}: delivery → registered "
                    f"{result['delivery_to_registered_s']:.2f}s (pod {result['pod']})"
                )
    kubelet = (
        "kubelet defaults (syncFrequency 1m)" if args.kubelet_defaults else "the tier's kubelet (syncFrequency 10s)"
    )
    print(f"\n{kubelet}")
    print_table(results, load)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    out = RESULTS.with_name("warm_pool_kubelet_defaults.json") if args.kubelet_defaults else RESULTS
    out.write_text(json.dumps({"load_average": load, "kubelet": kubelet, "sessions": results}, indent=2) + "\n")
    return 0


def print_table(results: list[dict[str, Any]], load: tuple[float, float, float]) -> None:
    by_kind = {kind: [r for r in results if r["kind"] == kind] for kind in ("warm", "cold")}
    figures = {kind: [r["delivery_to_registered_s"] for r in rows] for kind, rows in by_kind.items()}
    print(f"\nload average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| pods | sessions | delivery → executor registered p50 | p99 | max |")
    print("| --- | --- | --- | --- | --- |")
    for kind, values in figures.items():
        print(
            f"| {kind} | {len(values)} | {statistics.median(values):.2f} s | "
            f"{percentile(values, 0.99):.2f} s | {max(values):.2f} s |"
        )
    warm, cold = figures["warm"], figures["cold"]
    print(
        f"| warm / cold | | {statistics.median(warm) / statistics.median(cold):.2f} | "
        f"{percentile(warm, 0.99) / percentile(cold, 0.99):.2f} | |"
    )
    bound = [r["claim_to_bound_s"] for r in by_kind["warm"]]
    print(
        f"\nwarm: claim → entrypoint sees its binding p50 {statistics.median(bound):.2f} s, "
        f"p99 {percentile(bound, 0.99):.2f} s, max {max(bound):.2f} s; "
        f"from the pool: {sum(r['from_pool'] for r in by_kind['warm'])}/{len(bound)}"
    )
    for kind, rows in by_kind.items():
        retried = sum(1 for r in rows if r["registration_retries"])
        print(f"{kind}: {retried}/{len(rows)} retried a registration")
    running = [r["delivery_to_running_s"] for r in by_kind["cold"]]
    print(f"cold: delivery → pod seen Running (polled every 0.2 s) p50 {statistics.median(running):.2f} s")
    under = sum(1 for v in warm if v < 2.0)
    print(f"warm sessions registered within 2 s of delivery: {under}/{len(warm)}")


if __name__ == "__main__":
    sys.exit(main())
