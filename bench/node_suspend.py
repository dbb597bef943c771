"""Suspend with memory on a real node (issue 40), through the controller, against a fresh start
after a plain idle stop of the same shape, side by side in one run.

Needs root (it starts the real-node tier's node and installs the chart with the tier's values,
tests/node: its ``checkpointed`` template has ``suspend: checkpoint`` and the node agent, its
``persistent-workspace`` template a plain idle stop). Each round starts three sessions at once:

* ``checkpoint idle``: a session of the checkpoint template whose first turn starts a shell
  background process holding a token in memory;
* ``checkpoint + 100 MiB``: the same, the background process also holding 100 MiB (random
  bytes, base64 in a shell variable);
* ``fresh (plain stop)``: a session of the persistent-workspace template with the same first turn.

Each session goes idle and is stopped at the tier's idle timeout (30 s); then a turn is posted
and timed to the executor's link up again (the simulator's own stamps: a restored executor
reconnects, a fresh one registers and connects) and to the turn's end. For the checkpoint
sessions, also the agent's checkpoint (the kubelet's call, the image, the import: its answer's
``seconds``), the image's size, and whether the background process came back (its token).

    sudo .venv/bin/python bench/node_suspend.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.node.checkpoints import KEEPER, READ, link_stretches, turn_beats
from tests.node.conftest import CHECKPOINT_TEMPLATE, NODE_DNS_NAMES, PERSISTENT_TEMPLATE, _criu, install
from tests.node.node import load_images, real_node, say
from tests.node.test_real_node import _one_session, _pods, _status, _stops, _worker_log_lines
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

RESULTS = Path(__file__).resolve().parent / "results" / "node_suspend.json"
BALLAST = "ballast=$(head -c 78643200 /dev/urandom | base64 -w0); "  # 75 MiB of bytes, 100 MiB of text
FIRST_READ = ["sh", "-c", "until [ -f beat ]; do sleep 0.2; done; " + READ[2]]
"""``READ`` once the background process wrote its first beat (the ballast takes seconds to draw)."""
CASES = (
    ("checkpoint idle", CHECKPOINT_TEMPLATE, KEEPER),
    ("checkpoint + 100 MiB", CHECKPOINT_TEMPLATE, KEEPER.replace("sh -c '", "sh -c '" + BALLAST, 1)),
    ("fresh (plain stop)", PERSISTENT_TEMPLATE, KEEPER),
)


def one(world: Any, kind: str, template: str, keeper: str) -> dict[str, Any]:
    timeline = _one_session(world, timeout=300, template=template)
    session_id, environment_id = timeline["session_id"], timeline["environment_id"]
    started = run_turn(world.simulator_url, session_id, [["sh", "-c", keeper], FIRST_READ], timeout=300)
    token, _ = turn_beats({"commands": started["commands"][1:]})[-1]
    wait_for(lambda: _status(world, session_id) == "idle", 120, "the turn to end idle", interval=0.5)
    wait_for(lambda: not _pods(world, session_id), 300, "the idle stop", interval=0.5)
    wait_for(lambda: _stops(world, session_id), 60, "the worker to log the stop", interval=1)
    row: dict[str, Any] = {"kind": kind, "session_id": session_id}
    if template == CHECKPOINT_TEMPLATE:
        taken = [
            x
            for x in _worker_log_lines(world)
            if x.get("event") == "checkpoint taken" and x.get("session_id") == session_id
        ]
        row["checkpointed"] = bool(taken)
        if taken:
            row["agent_s"], row["image_mb"] = taken[0]["seconds"], taken[0]["size_bytes"] / 1e6
    asked_at = time.time()
    resumed = run_turn(world.simulator_url, session_id, [READ], timeout=600)
    row["turn_s"] = time.time() - asked_at
    links = link_stretches(world.simulator_url, environment_id)
    row["turn_to_connected_s"] = next(s for s, _ in links if s is not None and s > asked_at) - asked_at
    beats = turn_beats(resumed)  # the same token, counting on: the process came back (a stale file stands still)
    row["memory_kept"] = {t for t, _ in beats} == {token} and beats[-1][1] > beats[0][1]
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "bench"}, timeout=10)
    wait_for(lambda: not _pods(world, session_id), 180, "the session's pod to be deleted", interval=0.5)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/node_suspend.py needs root (it runs a real node; see tests/node)", file=sys.stderr)
        return 2
    load = os.getloadavg()
    images = load_images()
    rows: list[dict[str, Any]] = []
    with real_node(images, dns_names=NODE_DNS_NAMES, criu=_criu()) as node, install(node, images) as world:
        for round_ in range(args.rounds):
            found: dict[str, dict[str, Any]] = {}

            def run(kind: str, template: str, keeper: str, found: dict[str, dict[str, Any]] = found) -> None:
                found[kind] = one(world, kind, template, keeper)

            threads = [threading.Thread(target=run, args=case) for case in CASES]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for kind, _, _ in CASES:
                if kind not in found:
                    raise SystemExit(f"round {round_ + 1}: {kind} did not finish (see above)")
                rows.append({**found[kind], "round": round_ + 1})
                say(f"round {round_ + 1} {kind}: {json.dumps(found[kind])}")
    print(f"\nload average at start {load[0]:.2f}; {args.rounds} rounds; medians")
    print("| case | agent's checkpoint | image | turn posted → connected | turn posted → done | memory kept |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, template, _ in CASES:
        mine = [r for r in rows if r["kind"] == kind]

        def median(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in mine)

        checkpoint = (
            f"{median('agent_s'):.2f} s | {median('image_mb'):.1f} MB"
            if template == CHECKPOINT_TEMPLATE and all(r.get("checkpointed") for r in mine)
            else "— | —"
        )
        kept = sum(r["memory_kept"] for r in mine)
        print(
            f"| {kind} | {checkpoint} | {median('turn_to_connected_s'):.2f} s | {median('turn_s'):.2f} s | "
            f"{kept}/{len(mine)} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"load_average": load, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
