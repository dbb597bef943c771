"""Concurrent cold starts on a real node, stage by stage: where the seconds go.

Needs root (it starts the real-node tier's node: containerd + runc + the real kubelet v1.37 in a
network namespace, NetworkPolicy enforced, codex dialling https://api.openai.com over TLS by
name; tests/node). Installs the chart with the tier's values and, for each burst size (by
default 1, 10 and 20), creates that many sessions of the default (cold) template at once, as
often as it takes to time ``--samples`` sessions of that size. After each burst every session
is failed and its pod gone before the next one. The chart has no warm pool here. One single
session runs first and is reported apart, not counted in the bursts: the node's first sandbox,
which unpacks the runner image (the node imports it without unpacking; a real node pulls it)
and reads the 300 MB codex binary from disk, unless ``--pre-puller`` installs the chart's image
pre-puller (sandbox.prePuller), whose DaemonSet has done the unpack before (the install waits
for it).

Each session's timeline, every stamp taken on this machine's one clock by the part that did it:

  delivered          the simulator's delivery attempt the receiver answered 2xx (its end)
  job taken          the worker's ``task started`` log line (the first for the session)
  pod created        the worker's ``pod created`` log line (after the API server answered)
  scheduled          the scheduler's ``Scheduled`` Event (events.k8s.io, microsecond eventTime)
  sandbox asked      containerd's log: the kubelet's ``RunPodSandbox`` arrives (the pod admitted,
                     its volumes mounted)
  sandbox ready      containerd's log: ``RunPodSandbox`` returns (network set up by CNI, the
                     pause container started by runc)
  container asked    containerd's log: the kubelet's ``CreateContainer`` arrives
  container started  containerd's log: ``StartContainer`` returns (runc created and started it)
  registered         codex's registration arriving at the simulator (the entrypoint, codex's
                     start, its DNS lookup of api.openai.com and its TLS handshake before it)

Also: delivery → pod seen Running (the tier's old figure: a pod watch; the kubelet reports a
started container at its next relist), the entrypoint's registration retries, how many looks
the workers took at each session before its registration (``session looked up``), the CPU
seconds each part of the node used during the burst (its processes by executable, reaped
children included: runc under the shims, the CNI plugins under containerd; its pods by cgroup)
beside the whole machine's busy time and the same node's CPU in an idle window just before (the
machine is shared), and each runner container's memory once its codex is connected and idle
(the kubelet's summary: working set and RSS; the first burst of each size).

    sudo .venv/bin/python bench/cold_burst.py [--sizes 1,10,20] [--samples 10] [--pre-puller]
    .venv/bin/python bench/cold_burst.py --floor-only [--sizes 1,10,20]

The floor, measured first (``--floor-only``: nothing else): N ``codex exec-server`` started at
once on this machine, no container and no Kubernetes, each from its spawn to its registration at
a simulator on loopback, with the CPU each used by then: what codex's own start costs; and one
idle codex's RSS (the local runner's executor, no container).
Results: bench/results/cold_burst.json (``--pre-puller``: cold_burst_pre_puller.json; ``--floor-only``:
cold_burst_floor.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import percentile
from tests.support.processes import wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "cold_burst.json"
STAGES = (
    ("delivered", "job_taken", "delivery → job taken (queue)"),
    ("job_taken", "pod_created", "job taken → pod created (worker)"),
    ("pod_created", "scheduled", "pod created → scheduled"),
    ("scheduled", "sandbox_asked", "scheduled → sandbox asked (kubelet: admit, volumes)"),
    ("sandbox_asked", "sandbox_ready", "sandbox asked → ready (containerd: CNI, pause)"),
    ("sandbox_ready", "container_asked", "sandbox ready → container asked (kubelet)"),
    ("container_asked", "container_started", "container asked → started (containerd: runc)"),
    ("container_started", "registered", "container started → registered (entrypoint, codex, DNS, TLS)"),
    ("delivered", "registered", "**delivery → executor registered**"),
    ("delivered", "running_seen", "delivery → pod seen Running"),
)
RETRY = re.compile(r"registration failed\); retry \d+ in ([0-9.]+)s")
CONTAINERD_LINE = re.compile(r'^time="([^"]+)" level=\w+ msg="(.*)"')
CLK_TCK = os.sysconf("SC_CLK_TCK")
IDLE_WINDOW_SECONDS = 3.0
"""Before each burst: the node's CPU while nothing starts (its background, for comparison)."""
IDLE_SETTLE_SECONDS = 10.0
"""Memory is read this long after the burst's last executor connected (codex idle by then)."""


# -- codex's own start, outside Kubernetes ------------------------------------------------------


def codex_floor(sizes: list[int], rounds: int = 3) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """N ``codex exec-server`` started at once against a simulator on loopback: spawn →
    registration received, and the CPU each used until then (its page cache warm); and the
    first one's memory once registered and idle (``IDLE_SETTLE_SECONDS`` later: the local
    runner's executor, no container)."""
    from agents_simulator.dev import find_codex
    from agents_simulator.waiting import free_port

    launcher = find_codex()
    if launcher is None:
        raise SystemExit("codex is not installed (scripts/test puts it in the cache)")
    codex = _native(launcher)
    port = free_port()
    key = "envkey-floor-bench"
    work = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    env = {**os.environ, "SANDBOX_CONTROLLER_SIMULATOR_ENVIRONMENT_KEY": key}
    argv = [sys.executable, "-m", "agents_simulator", "--host", "127.0.0.1", "--port", str(port)]
    with open(work / "simulator.log", "wb") as log:
        sim = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    results = []
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers={"authorization": "Bearer bench"}, timeout=10) as api:
            wait_for(lambda: _ok(api, "/healthz"), 30, "the simulator", interval=0.1)
            # Not counted: the binary into the page cache; its codex's idle memory is read.
            idle = _floor_round(api, codex, key, work, 1, settle=IDLE_SETTLE_SECONDS)
            for size in sizes:
                for _ in range(rounds):
                    results.append(_floor_round(api, codex, key, work, size))
    finally:
        _stop_group(sim)
        shutil.rmtree(work, ignore_errors=True)
    return results, {"settle_s": IDLE_SETTLE_SECONDS, **idle["rss"][0]}


def _native(launcher: str) -> str:
    """The native codex binary under the npm launcher (what the runner image runs)."""
    found = sorted(Path(launcher).resolve().parents[1].glob("**/vendor/*/bin/codex"))
    return str(found[0]) if found else launcher


def _floor_round(api: httpx.Client, codex: str, key: str, work: Path, size: int, settle: float = 0.0) -> dict[str, Any]:
    body = {"agent": {"model": "bench"}, "environment": {"type": "self_hosted"}, "input": "hi"}
    sessions = [api.post("/v1/agents/sessions", json=body).json()["environment"] for _ in range(size)]
    started: dict[str, tuple[float, subprocess.Popen[bytes]]] = {}
    load = os.getloadavg()[0]
    try:
        for environment in sessions:
            home = work / environment["id"]
            home.mkdir()
            argv = [codex, "exec-server", "--remote", environment["remote_url"], "--environment-id", environment["id"]]
            env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CODEX_HOME": str(home), "CODEX_API_KEY": key}
            spawned = time.time()
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
            started[environment["id"]] = (spawned, proc)

        def registered() -> dict[str, float] | None:
            found = {
                r["environment_id"]: r["received_at"]
                for r in api.get("/admin/registrations").json()["data"]
                if r["status_code"] == 200 and r["environment_id"] in started
            }
            return found if len(found) == len(started) else None

        arrived: dict[str, float] = wait_for(registered, 60, "every codex to register", interval=0.02)
        cpu = [_cpu_seconds(proc.pid) for _, proc in started.values()]
        time.sleep(settle)
        rss = [_rss(proc.pid) for _, proc in started.values()]
    finally:
        for _, proc in started.values():
            _stop_group(proc)
    latencies = [arrived[e] - started[e][0] for e in started]
    return {"size": size, "load_average": load, "spawn_to_registered_s": latencies, "cpu_s": cpu, "rss": rss}


def _rss(pid: int) -> dict[str, int]:
    """A process's resident set in bytes: all of it (``VmRSS``), its anonymous memory (``RssAnon``,
    what a container's cgroup counts as its RSS) and its file pages (``RssFile``: mostly the codex
    binary, in the page cache shared by every codex of the machine); empty once it is gone."""
    fields = {"VmRSS:": "rss_bytes", "RssAnon:": "anon_bytes", "RssFile:": "file_bytes"}
    found: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name = line.split(maxsplit=1)[0] if line else ""
            if name in fields:
                found[fields[name]] = int(line.split()[1]) * 1024
    return found


def _cpu_seconds(pid: int, children: bool = False) -> float:
    """A process's CPU seconds (user + system; with ``children``, its reaped children's too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


def _ok(api: httpx.Client, path: str) -> bool:
    try:
        return api.get(path, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(timeout=10)


# -- the node ----------------------------------------------------------------------------------


class PodWatch:
    """A watch of the sandbox namespace's pods, read raw (the client's models cost more CPU than
    the rest of the bench): when each pod was first seen Running. Each watch request ends after
    a second (server side) and the next one goes on from its resource version, so ``stop`` never
    has to close a response another thread reads."""

    def __init__(self, world: Any, namespace: str) -> None:
        self._core = world.core
        self._namespace = namespace
        self._stopping = threading.Event()
        self.running: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        version = ""
        while not self._stopping.is_set():
            try:
                response = self._core.list_namespaced_pod(
                    self._namespace, watch=True, timeout_seconds=1, resource_version=version, _preload_content=False
                )
                for line in _lines(response):
                    event = json.loads(line)
                    if event.get("type") == "ERROR":  # 410: the version expired; list afresh
                        version = ""
                        continue
                    pod = event["object"]
                    version = pod["metadata"]["resourceVersion"]
                    if pod.get("status", {}).get("phase") == "Running":
                        self.running.setdefault(pod["metadata"]["name"], time.time())
            except Exception:  # a dropped connection: watch again
                version = ""
                time.sleep(0.2)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed response, each as soon as it has arrived."""
    pending = b""
    for chunk in response.stream(65536):
        *lines, pending = (pending + chunk).split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending


def node_run(sizes: list[int], samples: int, pre_puller: bool) -> dict[str, Any]:
    from tests.node.conftest import NODE_DNS_NAMES, SANDBOX_NAMESPACE, WARM_TEMPLATE, install
    from tests.node.node import load_images, real_node, say

    images = load_images()
    bursts: list[dict[str, Any]] = []
    # Cold sandboxes only: no warm pool (its pods would unpack the runner image at the install);
    # the pre-puller only with --pre-puller.
    overrides = {"sandbox": {"templates": {WARM_TEMPLATE: None}, "prePuller": {"enabled": pre_puller}}}
    with real_node(images, dns_names=NODE_DNS_NAMES) as node, install(node, images, overrides) as world:
        pods = PodWatch(world, SANDBOX_NAMESPACE)
        sim = httpx.Client(
            base_url=world.simulator_url,
            timeout=10,
            headers={"authorization": f"Bearer {world.api_key}", "openai-beta": "agents=v1"},
        )
        try:
            say("the node's first sandbox (not counted in the bursts)")
            first = burst(world, sim, pods, 1)
            say(f"first sandbox: delivery → registered {first['sessions'][0]['delivered_to_registered_s']:.2f}s")
            for size in sizes:
                for n in range(max(1, math.ceil(samples / size))):
                    result = burst(world, sim, pods, size, memory=n == 0)
                    bursts.append(result)
                    summary = [s["delivered_to_registered_s"] for s in result["sessions"]]
                    say(
                        f"{size} at once: delivery → registered p50 {statistics.median(summary):.2f}s "
                        f"max {max(summary):.2f}s (load {result['load_average'][0]:.2f})"
                    )
        finally:
            sim.close()
            pods.stop()
    return {"first_sandbox": first, "pre_puller": pre_puller, "bursts": bursts}


def burst(world: Any, sim: httpx.Client, pods: PodWatch, size: int, memory: bool = False) -> dict[str, Any]:
    from tests.node.test_real_node import _pods

    node = world.node
    load = os.getloadavg()
    idle_before, idle_busy_before, idle_started = node_cpu(node), machine_busy(), time.monotonic()
    time.sleep(IDLE_WINDOW_SECONDS)
    idle_after, idle_busy_after = node_cpu(node), machine_busy()
    idle_seconds = time.monotonic() - idle_started
    idle = {k: (idle_after.get(k, 0.0) - idle_before.get(k, 0.0)) / idle_seconds for k in idle_after}
    cpu_before, busy_before = node_cpu(node), machine_busy()
    body = {"agent": {"model": "node-test"}, "environment": {"type": "self_hosted"}, "input": "hi"}
    created: list[dict[str, Any]] = []

    def create() -> None:
        response = sim.post("/v1/agents/sessions", json=body)
        response.raise_for_status()
        created.append(response.json())

    threads = [threading.Thread(target=create) for _ in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(created) == size, f"{len(created)} of {size} sessions created"
    environments = {s["environment"]["id"]: s["id"] for s in created}

    def registered() -> dict[str, float] | None:
        found: dict[str, float] = {}
        for r in sim.get("/admin/registrations").json()["data"]:
            sid = environments.get(r["environment_id"])
            if sid and r["status_code"] == 200:
                found[sid] = min(found.get(sid, r["received_at"]), r["received_at"])
        return found if len(found) == size else None

    registered_at: dict[str, float] = wait_for(registered, 600, "every executor to register", interval=0.5)
    cpu_after, busy_after = node_cpu(node), machine_busy()
    time.sleep(1.5)  # the kubelet reports the last containers Running at its next relist
    sessions, worker_lines = timelines(world, sim, pods, created, registered_at)
    held = idle_memory(world, sim, list(environments), [s["pod"] for s in sessions]) if memory else []
    for session in created:
        sim.post(f"/admin/sessions/{session['id']}/fail", json={"error": "bench"})
    for session in created:
        wait_for(lambda s=session["id"]: not _pods(world, s), 300, "the session's pod to be deleted", interval=0.5)
    cpu = {k: round(cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0), 2) for k in cpu_after}
    first, last = min(s["delivered"] for s in sessions), max(s["registered"] for s in sessions)
    window = last - first
    return {
        "size": size,
        "load_average": load,
        "sessions": sessions,
        "idle_memory": held,
        "cpu_s": {k: v for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0},
        "machine_busy_s": round(busy_after - busy_before, 2),
        "idle_cpu_per_s": {k: round(v, 3) for k, v in sorted(idle.items(), key=lambda kv: -kv[1]) if v > 0},
        "idle_machine_busy_per_s": round((idle_busy_after - idle_busy_before) / idle_seconds, 2),
        "window_s": round(window, 2),
        "worker_jobs": worker_jobs(worker_lines, first, last),
        "worker_lines": [line for line in worker_lines if first - 1 <= line["time"] <= last + 1],
    }


def timelines(
    world: Any, sim: httpx.Client, pods: PodWatch, created: list[dict[str, Any]], registered_at: dict[str, float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from tests.node.conftest import NAMESPACE, SANDBOX_NAMESPACE
    from tests.node.test_real_node import _pods

    worker_lines = worker_log(world, NAMESPACE)
    scheduled = scheduled_events(world, SANDBOX_NAMESPACE)
    runtime = containerd_stages(world.node.workdir / "containerd.log")
    delivered = delivered_at(sim)
    out = []
    for session in created:
        sid = session["id"]
        [pod] = _pods(world, sid)
        name = pod.metadata.name
        mine = [line for line in worker_lines if line.get("session_id") == sid]
        taken = [line["time"] for line in mine if line.get("event") == "task started"]
        pod_created = [line["time"] for line in mine if line.get("event") == "pod created"]
        looks = [line["time"] for line in mine if line.get("event") == "session looked up"]
        log = world.core.read_namespaced_pod_log(name, SANDBOX_NAMESPACE, container="executor")
        row = {
            "session_id": sid,
            "pod": name,
            "delivered": delivered[sid],
            "job_taken": min(taken) if taken else None,
            "pod_created": min(pod_created) if pod_created else None,
            "scheduled": scheduled.get(name),
            **runtime.get(name, {}),
            "registered": registered_at[sid],
            "running_seen": pods.running.get(name),
            "looks_before_registered": sum(1 for t in looks if t <= registered_at[sid]),
            "registration_retries": len(RETRY.findall(log)),
        }
        row["delivered_to_registered_s"] = row["registered"] - row["delivered"]
        out.append(row)
    return out, worker_lines


def worker_jobs(lines: list[dict[str, Any]], start: float, end: float) -> dict[str, dict[str, float]]:
    """The workers' session jobs that began in [start, end], by what their first round decided
    (``start``; ``look``: keep or ignore, the first looks; ``none``: no round, the work was
    already done): how many, and the seconds they held a worker process (task started → done)."""
    began: dict[str, float] = {}
    ended: dict[str, float] = {}
    kind: dict[str, str] = {}
    for line in lines:
        task = line.get("task_id")
        if not task:
            continue
        event = line.get("event")
        if event == "task started":
            began.setdefault(task, line["time"])
        elif event == "task done":
            ended[task] = line["time"]
        elif event == "session looked up" and task not in kind:
            kind[task] = "start" if line.get("verdict") in ("start", "replace") else "look"
    jobs: dict[str, dict[str, float]] = {}
    for task, at in began.items():
        if start <= at <= end and task in ended:
            entry = jobs.setdefault(kind.get(task, "none"), {"count": 0, "seconds": 0.0})
            entry["count"] += 1
            entry["seconds"] = round(entry["seconds"] + ended[task] - at, 3)
    return jobs


def delivered_at(sim: httpx.Client) -> dict[str, float]:
    """Each session's first action_required delivery the receiver answered 2xx (its end)."""
    events = {e["id"]: e["data"]["id"] for e in sim.get("/admin/events").json()["data"]}
    found: dict[str, float] = {}
    for delivery in sim.get("/admin/deliveries?type=agent.session.action_required").json()["data"]:
        ok = [a for a in delivery["attempts"] if a["status_code"] and 200 <= a["status_code"] < 300]
        sid = events.get(delivery["event_id"])
        if ok and sid:
            at = float(ok[0]["started_at"] + (ok[0]["duration_seconds"] or 0.0))
            found[sid] = min(found.get(sid, at), at)
    return found


def worker_log(world: Any, ns: str) -> list[dict[str, Any]]:
    """Every JSON log line of the worker pods, with the pod it came from."""
    lines = []
    for pod in world.core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=worker").items:
        text = world.core.read_namespaced_pod_log(pod.metadata.name, ns, container=pod.spec.containers[0].name)
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and "time" in record:
                    lines.append({**record, "worker_pod": pod.metadata.name})
    return lines


def scheduled_events(world: Any, sbx: str) -> dict[str, float]:
    """Each pod's ``Scheduled`` Event time (the scheduler writes events.k8s.io Events, with a
    microsecond eventTime; read raw: the client's models refuse the kubelet's, which have none)."""
    response = world.core.list_namespaced_event(sbx, _preload_content=False)
    found: dict[str, float] = {}
    for event in json.loads(response.data)["items"]:
        if event.get("reason") == "Scheduled" and event.get("eventTime"):
            found[event["involvedObject"]["name"]] = _instant(event["eventTime"])
    return found


def containerd_stages(log: Path) -> dict[str, dict[str, float]]:
    """From containerd's log (the CRI calls the kubelet makes, nanosecond times): per pod, when
    its sandbox was asked for and ready, and when its runner container was asked for and started."""
    pods: dict[str, dict[str, float]] = {}
    sandbox_pod: dict[str, str] = {}
    container_pod: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = CONTAINERD_LINE.match(line)
        if not match:
            continue
        at, msg = _instant(match.group(1)), match.group(2).replace('\\"', '"')
        if msg.startswith("RunPodSandbox for"):
            name = re.search(r"Name:([^,]+),", msg)
            if name is None:
                continue
            pod = pods.setdefault(name.group(1), {})
            returned = re.search(r'returns sandbox id "([0-9a-f]+)"', msg)
            if returned:
                pod["sandbox_ready"] = at
                sandbox_pod[returned.group(1)] = name.group(1)
            else:
                pod.setdefault("sandbox_asked", at)
        elif msg.startswith("CreateContainer within sandbox") and "Name:executor," in msg:
            sandbox = re.search(r'sandbox "([0-9a-f]+)"', msg)
            owner = sandbox_pod.get(sandbox.group(1)) if sandbox else None
            if owner is None:
                continue
            returned = re.search(r'returns container id "([0-9a-f]+)"', msg)
            if returned:
                container_pod[returned.group(1)] = owner
            else:
                pods[owner].setdefault("container_asked", at)
        elif msg.startswith("StartContainer for") and "returns successfully" in msg:
            container = re.search(r'StartContainer for "([0-9a-f]+)"', msg)
            owner = container_pod.get(container.group(1)) if container else None
            if owner is not None:
                pods[owner]["container_started"] = at
    return pods


def _instant(text: str) -> float:
    """An RFC 3339 time with up to nanoseconds (``2026-12-01T05:22:08.871149981Z``) as Unix seconds."""
    whole, _, rest = text.partition(".")
    fraction = rest.rstrip("Z").split("+")[0]
    stamp = datetime.fromisoformat(whole.rstrip("Z") + "+00:00")
    return stamp.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def idle_memory(world: Any, sim: httpx.Client, environments: list[str], names: list[str]) -> list[dict[str, Any]]:
    """Each runner container's memory once its codex is connected and idle (``IDLE_SETTLE_SECONDS``
    after the last connection), as the kubelet's summary has it (what ``kubectl top`` and
    evictions read): the container's working set and RSS."""
    from tests.node.conftest import SANDBOX_NAMESPACE

    node = world.node

    def connected() -> bool:
        listed = sim.get("/admin/environments").json()["data"]
        return all(e["status"] == "connected" for e in listed if e["id"] in environments)

    wait_for(connected, 120, "every executor to be connected", interval=0.5)
    time.sleep(IDLE_SETTLE_SECONDS)
    summary = httpx.get(
        f"{node.server_url}/api/v1/nodes/{node.name}/proxy/stats/summary",
        headers={"authorization": f"Bearer {node.admin_token}"},
        verify=node.ca_file,
        timeout=30,
    ).json()
    found = []
    for pod in summary.get("pods", []):
        ref = pod["podRef"]
        if ref["namespace"] != SANDBOX_NAMESPACE or ref["name"] not in names:
            continue
        for container in pod.get("containers", []):
            if container["name"] == "executor":
                found.append(
                    {
                        "pod": ref["name"],
                        "working_set_bytes": container["memory"].get("workingSetBytes"),
                        "rss_bytes": container["memory"].get("rssBytes"),
                        "usage_bytes": container["memory"].get("usageBytes"),
                    }
                )
    return found


def node_cpu(node: Any) -> dict[str, float]:
    """CPU seconds so far of the node's processes (reaped children included), by executable;
    its pods by their cgroup (cpuacct), by the pod's component; and this bench process."""
    totals: dict[str, float] = {}
    for pid, what in node.processes():
        name = _kind(what, pid)
        if name is not None:
            totals[name] = totals.get(name, 0.0) + _cpu_seconds(pid, children=True)
    for name, seconds in _pod_cgroups(node).items():
        totals[name] = totals.get(name, 0.0) + seconds
    totals["bench (its DNS server, watch, clients)"] = _cpu_seconds(os.getpid())
    return totals


def _kind(what: str, pid: int) -> str | None:
    """Which part of the node a process is, by its executable's name (the simulator by its
    module); None for a process of a pod (counted by its cgroup instead)."""
    if what.startswith("(in "):
        return None
    argv = what.split()
    program = Path(argv[0]).name if argv else str(pid)
    if "agents_simulator" in argv:
        return "simulator"
    if program.startswith("containerd-shim"):
        return "containerd shims (runc)"
    return program


def _pod_cgroups(node: Any) -> dict[str, float]:
    """cpuacct usage of every pod of the node, summed by the pod's kind."""
    root = Path("/sys/fs/cgroup/cpuacct") / node.name / "kubepods"
    found: dict[str, float] = {}
    kinds = _pod_kinds(node)
    for usage in root.rglob("pod*/cpuacct.usage") if root.exists() else []:
        uid = usage.parent.name.removeprefix("pod").replace("_", "-")
        kind = kinds.get(uid, "pods (gone)")
        with contextlib.suppress(OSError, ValueError):
            found[kind] = found.get(kind, 0.0) + int(usage.read_text()) / 1e9
    return found


def _pod_kinds(node: Any) -> dict[str, str]:
    from kubernetes import client

    kinds = {}
    with node.api_client() as api:
        for pod in client.CoreV1Api(api).list_pod_for_all_namespaces().items:
            labels = pod.metadata.labels or {}
            component = labels.get("app.kubernetes.io/component") or labels.get("k8s-app") or pod.metadata.name
            kinds[pod.metadata.uid] = f"pods: {component}"
    return kinds


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every process, ours or not)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / CLK_TCK


# -- the report --------------------------------------------------------------------------------


def print_floor(rows: list[dict[str, Any]]) -> None:
    print("\ncodex exec-server alone (no container, no Kubernetes; simulator on loopback, plain HTTP)")
    print("| at once | runs | spawn → registered p50 | p99 | max | CPU per codex until registered (mean) | load |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in sorted({r["size"] for r in rows}):
        mine = [r for r in rows if r["size"] == size]
        lat = [v for r in mine for v in r["spawn_to_registered_s"]]
        cpu = [v for r in mine for v in r["cpu_s"]]
        load = ", ".join(f"{r['load_average']:.1f}" for r in mine)
        print(
            f"| {size} | {len(mine)} | {statistics.median(lat):.2f} s | {percentile(lat, 0.99):.2f} s | "
            f"{max(lat):.2f} s | {statistics.mean(cpu) * 1000:.0f} ms | {load} |"
        )


def print_first(first: dict[str, Any], pre_puller: bool) -> None:
    """The node's first sandbox, stage by stage: whatever the runner image still needs (here,
    imported without unpacking: its unpack) lands on it, unless the pre-puller did it before."""
    [row] = first["sessions"]
    how = "with the pre-puller" if pre_puller else "without the pre-puller"
    print(f"\nthe node's first sandbox, {how} (load {first['load_average'][0]:.2f}):")
    for start, end, label in STAGES:
        if row.get(start) is not None and row.get(end) is not None:
            print(f"  {label}: {row[end] - row[start]:.2f} s")


def print_bursts(bursts: list[dict[str, Any]]) -> None:
    for size in sorted({b["size"] for b in bursts}):
        mine = [b for b in bursts if b["size"] == size]
        rows = [s for b in mine for s in b["sessions"]]
        loads = ", ".join(f"{b['load_average'][0]:.2f}" for b in mine)
        print(f"\n{size} at once: {len(rows)} sessions in {len(mine)} burst(s); load average at each start: {loads}")
        print("| stage | p50 | p90 | p99 | max |")
        print("| --- | --- | --- | --- | --- |")
        for start, end, label in STAGES:
            values = [s[end] - s[start] for s in rows if s.get(start) is not None and s.get(end) is not None]
            if not values:
                print(f"| {label} | n/a | | | |")
                continue
            qs = [percentile(values, q) for q in (0.5, 0.9, 0.99)]
            print(f"| {label} | " + " | ".join(f"{v:.2f} s" for v in qs) + f" | {max(values):.2f} s |")
        retries = sum(1 for s in rows if s["registration_retries"])
        looks = [s["looks_before_registered"] for s in rows]
        print(
            f"retried a registration: {retries}/{len(rows)}; worker looks per session before its "
            f"registration: mean {statistics.mean(looks):.1f}, max {max(looks)}"
        )
        for b in mine:
            top = ", ".join(f"{k} {v:.2f}" for k, v in b["cpu_s"].items() if v >= 0.01)
            idle = ", ".join(f"{k} {v:.2f}" for k, v in b["idle_cpu_per_s"].items() if v >= 0.01)
            print(
                f"CPU s in the burst ({b['window_s']:.1f} s from first delivery to last registration; "
                f"the machine was busy {b['machine_busy_s']:.1f} CPU s): {top}"
            )
            print(f"  before it, idle, CPU s per s: machine {b['idle_machine_busy_per_s']:.2f}; {idle}")
            jobs = ", ".join(f"{k} {v['count']} ({v['seconds']:.2f} s)" for k, v in sorted(b["worker_jobs"].items()))
            print(f"  worker jobs begun in it, by their first round (count, process-seconds held): {jobs}")
        memory = [m for b in mine for m in b["idle_memory"]]
        if memory:
            mib = 1024 * 1024
            ws = [m["working_set_bytes"] / mib for m in memory if m["working_set_bytes"] is not None]
            rss = [m["rss_bytes"] / mib for m in memory if m["rss_bytes"] is not None]
            print(
                f"idle sandbox memory ({len(memory)} runner containers, codex connected, "
                f"{IDLE_SETTLE_SECONDS:.0f} s after the last connection): working set p50 "
                f"{statistics.median(ws):.1f} MiB, max {max(ws):.1f}; RSS p50 {statistics.median(rss):.1f} MiB, "
                f"max {max(rss):.1f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,20", help="sessions at once, comma-separated")
    parser.add_argument("--samples", type=int, default=10, help="sessions timed per size, at least")
    parser.add_argument("--floor-only", action="store_true", help="codex's own start only (no node)")
    parser.add_argument(
        "--pre-puller", action="store_true", help="install with the image pre-puller (sandbox.prePuller)"
    )
    parser.add_argument("--out", type=Path, help="where to write the results (default: by mode, under bench/results)")
    args = parser.parse_args()
    try:
        sizes = [int(v) for v in args.sizes.split(",") if v.strip()]
    except ValueError:
        print(f"--sizes must be whole numbers, comma-separated, got '{args.sizes}'", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.samples < 1:
        print("--sizes and --samples must be at least 1", file=sys.stderr)
        return 2
    if not args.floor_only and os.geteuid() != 0:
        print("bench/cold_burst.py needs root (it runs a real node; see tests/node)", file=sys.stderr)
        return 2
    data: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average": os.getloadavg()}
    data["floor"], data["local_idle_memory"] = codex_floor(sizes)
    print_floor(data["floor"])
    held = {k: v / 2**20 for k, v in data["local_idle_memory"].items() if k.endswith("_bytes")}
    print(
        f"one idle codex exec-server, {IDLE_SETTLE_SECONDS:.0f} s after its registration: RSS "
        f"{held.get('rss_bytes', 0):.1f} MiB (anonymous {held.get('anon_bytes', 0):.1f}, "
        f"file {held.get('file_bytes', 0):.1f})"
    )
    if not args.floor_only:
        data.update(node_run(sizes, args.samples, args.pre_puller))
        print_first(data["first_sandbox"], args.pre_puller)
        print_bursts(data["bursts"])
    out = RESULTS
    if args.out is not None:
        out = args.out
    elif args.floor_only:
        out = RESULTS.with_name("cold_burst_floor.json")
    elif args.pre_puller:
        out = RESULTS.with_name("cold_burst_pre_puller.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
