"""Checkpoint and restore of a pod on a real node (issue 40, path (a)) against a fresh pod start.

Needs root (it starts the real-node tier's node: containerd 2.3 + runc 1.4 + the real kubelet
v1.37 in a network namespace, with CRIU 4.2 from scripts/criu.sh on containerd's PATH and
restore from checkpoint images on: tests/node). The pod is tests/node/test_checkpoint.py's: a
background Python process (under a shell, pid 1) that draws a token, holds a file open on the
workspace claim and prints a beat every 0.5 s; "+ 100 MiB" also holds 100 MiB of random bytes.
Each round, for each case:

* fresh: pod created → Running, and → its first beat in the log;
* checkpoint: the kubelet's ``POST /checkpoint/{namespace}/{pod}/{container}`` (the call's
  time; the container runs on) and the archive's size;
* image: the archive written as a checkpoint image and imported with ``ctr image import``;
* restore: after the first pod is gone, a pod naming the checkpoint image created → Running
  (containerd's restore done), and → the first beat of the restored process past the
  checkpoint (an upper bound: the beats are 0.5 s apart, and the archive's copy of the log runs
  past the dump, see ``last_beat_in``), checked to carry the first pod's token.

    sudo .venv/bin/python bench/node_checkpoint.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.node.checkpoints import (
    beats,
    checkpoint,
    checkpoint_image,
    checkpoint_space,
    delete_pod,
    first_beat,
    last_beat_in,
    manifest,
    run_pod,
)
from tests.node.conftest import NODE_DNS_NAMES
from tests.node.node import RealNode, load_images, real_node, say
from tests.support.criu import criu_binary
from tests.support.processes import wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "node_checkpoint.json"
CASES = (("idle", 0), ("+ 100 MiB", 100))


def one(node: RealNode, core: Any, namespace: str, uid: int, image: str, tag: str, mib: int) -> dict[str, float]:
    row: dict[str, float] = {}
    name = f"fresh-{tag}"
    started = time.monotonic()
    run_pod(core, namespace, manifest(name, image, uid, ballast_mib=mib))
    row["fresh_running_s"] = time.monotonic() - started
    token, _ = first_beat(core, namespace, name)
    row["fresh_first_beat_s"] = time.monotonic() - started
    time.sleep(2)
    started = time.monotonic()
    archive = checkpoint(node, namespace, name)
    row["checkpoint_s"] = time.monotonic() - started
    row["archive_mb"] = archive.stat().st_size / 1e6
    checkpointed = last_beat_in(archive)
    delete_pod(core, namespace, name)
    started = time.monotonic()
    with checkpoint_image(node, archive) as ref:
        row["image_s"] = time.monotonic() - started
        restored = f"restored-{tag}"
        started = time.monotonic()
        run_pod(core, namespace, manifest(restored, ref, uid, ballast_mib=mib))
        row["restore_running_s"] = time.monotonic() - started

        def counted_on() -> list[tuple[str, int]]:
            return [beat for beat in beats(core, namespace, restored) if beat[1] > checkpointed]

        later = wait_for(counted_on, 60, "the restored process to count on", interval=0.05)
        row["restore_first_beat_s"] = time.monotonic() - started
        if {beat[0] for beat in later} != {token}:
            raise SystemExit(f"the restored process printed another token: {later} (was {token})")
        delete_pod(core, namespace, restored)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/node_checkpoint.py needs root (it runs a real node; see tests/node)", file=sys.stderr)
        return 2
    criu = criu_binary()
    load = os.getloadavg()
    images = load_images()
    image = next(i.ref for i in images if i.name == "sandbox-controller")
    rows: dict[str, list[dict[str, float]]] = {case: [] for case, _ in CASES}
    with real_node(images, dns_names=NODE_DNS_NAMES, criu=criu) as node, checkpoint_space(node) as space:
        core, namespace, uid = space
        say(f"pods as uid {uid}")
        for round_ in range(args.rounds):
            for i, (case, mib) in enumerate(CASES):
                rows[case].append(one(node, core, namespace, uid, image, f"{round_}-{i}", mib))
                say(f"{case}: {json.dumps({k: round(v, 2) for k, v in rows[case][-1].items()})}")
    columns = ["fresh_running_s", "fresh_first_beat_s", "checkpoint_s", "archive_mb", "image_s"]
    columns += ["restore_running_s", "restore_first_beat_s"]
    print(f"\nload average at start {load[0]:.1f}; medians of {args.rounds} rounds; pods as uid {uid}")
    print("| case | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for case, found in rows.items():
        medians = [statistics.median(r[c] for r in found) for c in columns]
        print(f"| {case} | " + " | ".join(f"{m:.2f}" for m in medians) + " |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"load": load, "uid": uid, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
