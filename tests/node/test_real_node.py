"""The chart on a real node: containerd 2.3 + runc 1.4 + the real kubelet v1.37 in a network namespace,
the images built here without a registry, the whole loop with the real ``codex exec-server``.

The network is production's shape: NetworkPolicy is enforced (kube-router, firewall only), and
each sandbox's codex dials ``https://api.openai.com`` (the sessions' ``remote_url``, under the
controller's default allowlist) by name through the cluster DNS pods, over TLS on 443 to a
public-range address inside the namespace, where the simulator serves with a certificate from
the test's CA; the pods trust that CA through the chart's ``sandbox.caBundle``. What the
enforced policy lets a sandbox reach, and what not, is tests/node/test_network_policy.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.runners.kubernetes import names
from controller.runners.kubernetes.manifests import RUNNER_UID
from tests.node.conftest import (
    IDLE_TIMEOUT_SECONDS,
    NAMESPACE,
    PERSISTENT_TEMPLATE,
    PUBLIC_URL,
    RELEASE,
    SANDBOX_NAMESPACE,
    WARM_POOL_SIZE,
    WARM_TEMPLATE,
    Installed,
)
from tests.node.node import runtime_pins
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

pytestmark = [pytest.mark.timeout(1800)]

# The run's figures (for BENCHMARKS.md), beside the cached images, not in the work tree.
CACHE = Path(os.environ.get("SANDBOX_CONTROLLER_CACHE", Path.home() / ".cache" / "sandbox-controller"))
FIGURES = CACHE / "node" / "figures.json"


@pytest.fixture
def world(installed: Installed) -> Installed:
    """The installed world (the chart, the simulator and the node)."""
    return installed


def _simulator(world: Installed) -> httpx.Client:
    return httpx.Client(
        base_url=world.simulator_url,
        timeout=10,
        headers={"authorization": f"Bearer {world.api_key}", "openai-beta": "agents=v1"},
    )


def _admin(world: Installed, path: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(world.simulator_url + path, timeout=10).json()["data"]
    return data


def _create_session(world: Installed, template: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": {"model": "node-test"}, "environment": {"type": "self_hosted"}, "input": "hi"}
    if template:
        body["metadata"] = {"sandbox_template": template}
    with _simulator(world) as sim:
        response = sim.post("/v1/agents/sessions", json=body)
    response.raise_for_status()
    session: dict[str, Any] = response.json()
    return session


def _pods(world: Installed, session_id: str) -> list[Any]:
    items: list[Any] = world.core.list_namespaced_pod(
        SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
    ).items
    return items


def _running(world: Installed, session_id: str) -> Any:
    running = [p for p in _pods(world, session_id) if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return running[0] if running else None


def _registered(world: Installed, environment_id: str) -> list[dict[str, Any]]:
    registrations = _admin(world, f"/admin/registrations?environment_id={environment_id}")
    return [r for r in registrations if r["status_code"] == 200]


def _connected(world: Installed, environment_id: str) -> bool:
    return any(e["id"] == environment_id and e["status"] == "connected" for e in _admin(world, "/admin/environments"))


def _delivered_at(world: Installed, session_id: str) -> float | None:
    events = _admin(world, "/admin/events")
    mine = {e["id"] for e in events if e["type"] == "agent.session.action_required" and e["data"]["id"] == session_id}
    for delivery in _admin(world, "/admin/deliveries?type=agent.session.action_required"):
        if delivery["event_id"] in mine and delivery["state"] == "delivered":
            ok = [a for a in delivery["attempts"] if a["status_code"] and 200 <= a["status_code"] < 300]
            return float(ok[0]["started_at"] + (ok[0]["duration_seconds"] or 0.0))
    return None


def _one_session(world: Installed, timeout: float = 300, template: str | None = None) -> dict[str, Any]:
    """Create a session and follow it to a connected executor; returns the timeline."""
    session = _create_session(world, template)
    session_id, environment_id = session["id"], session["environment"]["id"]
    delivered = wait_for(lambda: _delivered_at(world, session_id), timeout, "the webhook to be accepted", interval=0.2)
    pod = wait_for(lambda: _running(world, session_id), timeout, "the sandbox pod to run", interval=0.2)
    running_at = time.time()
    [first, *_] = wait_for(lambda: _registered(world, environment_id), timeout, "the executor to register", 0.2)
    wait_for(lambda: _connected(world, environment_id), timeout, "the executor to connect", interval=0.5)
    return {
        "session_id": session_id,
        "environment_id": environment_id,
        "pod": pod.metadata.name,
        "key_matched": first["key_matched"],
        "delivered_at": delivered,
        "running_at": running_at,
        "registered_at": float(first["received_at"]),
    }


# -- the chart --------------------------------------------------------------------------------


def test_the_chart_runs_as_real_containers(installed: Installed) -> None:
    """helm install with default values plus the three credentials: receiver, workers,
    scheduler and Redis run as real containers from the locally built images, under the
    chart's ServiceAccounts; the sandbox namespace enforces Pod Security "restricted"."""
    core = installed.core
    pods = core.list_namespaced_pod(NAMESPACE).items
    components: dict[str, list[Any]] = {}
    for pod in pods:
        component = pod.metadata.labels.get("app.kubernetes.io/component", "")
        components.setdefault(component, []).append(pod)
    assert {"receiver", "worker", "scheduler", "redis"} <= set(components), sorted(components)
    controller_ref = installed.images["sandbox-controller"].ref
    for component in ("receiver", "worker", "scheduler", "redis"):
        for pod in components[component]:
            assert pod.status.phase == "Running", (pod.metadata.name, pod.status.phase)
            [status] = [s for s in pod.status.container_statuses if s.name == pod.spec.containers[0].name]
            assert status.ready and status.state.running and status.container_id.startswith("containerd://")
            expected = installed.images["redis"].ref if component == "redis" else controller_ref
            assert pod.spec.containers[0].image == expected
            if component != "redis":
                assert pod.spec.service_account_name.startswith(f"{RELEASE}-sandbox-controller")
    labels = core.read_namespace(SANDBOX_NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # Enforced by the API server: a root pod is refused in the sandbox namespace.
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(
            SANDBOX_NAMESPACE,
            {"metadata": {"name": "root-pod"}, "spec": {"containers": [{"name": "c", "image": controller_ref}]}},
            dry_run="All",
        )
    assert refused.value.status in (400, 403, 422)
    assert "restricted" in refused.value.body or "sandbox pods" in refused.value.body


def test_the_node_runs_the_pinned_containerd_and_runc_built_from_go_modules(installed: Installed) -> None:
    """The runtime under every pod of the tier is the one tests/envtest/build.sh pins and builds
    (not a distribution's containerd or runc): the kubelet reports the pinned containerd, and the
    runtime options containerd gives each container's shim name the built runc, which is the
    pinned release."""
    node = installed.node
    pins = runtime_pins()
    info = installed.core.read_node(node.name).status.node_info
    assert info.container_runtime_version == f"containerd://{pins['containerd'].removeprefix('v')}"
    runc = node.bin_dir / "runc"
    assert (
        f"runc version {pins['runc'].removeprefix('v')}\n"
        in subprocess.run([str(runc), "--version"], capture_output=True, text=True, check=True).stdout
    )
    containers = node.ctr("containers", "ls", "-q").stdout.split()
    assert containers
    for container in containers:
        runtime = json.loads(node.ctr("containers", "info", container).stdout)["Runtime"]
        assert runtime["Name"] == "io.containerd.runc.v2", runtime
        # containerd.runc.v1.Options, protobuf-encoded: BinaryName holds the path as it is.
        options = base64.b64decode(runtime["Options"]["value"])
        assert str(runc).encode() in options, (container, options)


# -- the whole loop ---------------------------------------------------------------------------


def test_a_signed_webhook_becomes_a_connected_executor_in_a_container(world: Installed) -> None:
    """L8: webhook (signed) → receiver Service → worker → sandbox pod (runner image, restricted)
    → the real codex exec-server dials out: registers with the key from the Secret and connects, over TLS
    to https://api.openai.com (the session's remote_url, allowed by the default allowlist),
    trusting the CA the chart's sandbox.caBundle mounts."""
    timeline = _one_session(world)
    assert timeline["key_matched"] is True
    [registration] = _registered(world, timeline["environment_id"])
    assert registration["scheme"] == "https"  # through the TLS listener at the public address
    pod = world.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    container = pod.spec.containers[0]
    assert container.image == world.images["sandbox-runner"].ref
    env = {e.name: e for e in container.env}
    assert env["ENVIRONMENT_ID"].value == timeline["environment_id"]
    assert env["REMOTE_URL"].value == PUBLIC_URL
    assert env["SSL_CERT_FILE"].value == "/etc/sandbox-ca/ca-bundle.crt"
    [volume] = [v for v in pod.spec.volumes if v.name == "ca-bundle"]
    bundle = world.core.read_namespaced_config_map(volume.config_map.name, SANDBOX_NAMESPACE)
    assert bundle.data["ca-bundle.crt"] == world.ca.pem
    assert not pod.spec.ephemeral_containers  # nothing but the runner in the pod
    assert env["CODEX_API_KEY"].value is None and env["CODEX_API_KEY"].value_from.secret_key_ref
    assert pod.spec.automount_service_account_token is False


def test_a_killed_sandbox_pod_is_replaced_exactly_once(world: Installed) -> None:
    """L14: the sandbox pod of a connected session is killed (deleted at once); the next
    connection request gets exactly one new pod (the next generation), whose executor
    registers again."""
    timeline = _one_session(world)
    session_id, environment_id = timeline["session_id"], timeline["environment_id"]
    assert len(_registered(world, environment_id)) == 1
    world.core.delete_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: not _connected(world, environment_id), 120, "the kill to drop the executor's link", 0.5)
    with _simulator(world) as sim:
        sim.post(
            f"/v1/agents/sessions/{session_id}/events",
            json={
                "events": [
                    {
                        "type": "agent.session.input.message",
                        "input": [{"role": "user", "type": "message", "content": "again"}],
                    }
                ]
            },
        ).raise_for_status()
    wait_for(lambda: len(_registered(world, environment_id)) == 2, 300, "the replacement to register", 0.5)
    wait_for(lambda: _connected(world, environment_id), 120, "the replacement to connect", interval=0.5)
    time.sleep(5)  # settle, then count: one replacement, not two
    live = [p for p in _pods(world, session_id) if not p.metadata.deletion_timestamp]
    assert [p.metadata.labels[names.GENERATION_LABEL] for p in live] == ["2"]
    assert live[0].metadata.name != timeline["pod"] and live[0].status.phase == "Running"
    assert len(_registered(world, environment_id)) == 2


def test_a_failed_session_releases_its_pod_and_volume(world: Installed) -> None:
    """L16: a failed session → its sandbox pod and workspace volume are deleted."""
    timeline = _one_session(world, template=PERSISTENT_TEMPLATE)
    session_id = timeline["session_id"]

    def claims() -> list[Any]:
        items: list[Any] = world.core.list_namespaced_persistent_volume_claim(
            SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
        ).items
        return items

    [claim] = claims()
    assert claim.status.phase == "Bound"  # the running pod mounts it
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "node test"}, timeout=10)

    def gone() -> bool:
        return not _pods(world, session_id) and not claims()

    wait_for(gone, 180, "the failed session's pod and volume to be deleted", interval=0.5)


def _status(world: Installed, session_id: str) -> str:
    with _simulator(world) as sim:
        return str(sim.get(f"/v1/agents/sessions/{session_id}").json()["status"])


def _claims(world: Installed, session_id: str) -> list[Any]:
    items: list[Any] = world.core.list_namespaced_persistent_volume_claim(
        SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
    ).items
    return items


def _worker_log_lines(world: Installed) -> list[dict[str, Any]]:
    """The JSON log lines of every worker pod of the release."""
    lines: list[dict[str, Any]] = []
    workers = world.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=worker").items
    for pod in workers:
        for container in pod.spec.containers:
            text = world.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, container=container.name)
            for line in text.splitlines():
                with contextlib.suppress(ValueError):
                    parsed = json.loads(line)
                    if isinstance(parsed, dict):
                        lines.append(parsed)
    return lines


def _stops(world: Installed, session_id: str) -> list[dict[str, Any]]:
    return [
        line
        for line in _worker_log_lines(world)
        if line.get("event") == "sandbox stopped" and line.get("session_id") == session_id
    ]


def test_a_command_runs_as_the_runners_non_root_uid_in_the_workspace(world: Installed) -> None:
    """Issue 12: a command run by the simulator over the executor's link, in a sandbox pod on
    the real node, runs as the runner's non-root uid (the image's USER and the pod's
    runAsUser) in the session's workspace directory (the pod's workingDir and volume)."""
    timeline = _one_session(world)
    session_id = timeline["session_id"]
    pod = world.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    wait_for(lambda: _status(world, session_id) == "idle", 120, "the first turn to end idle", interval=0.5)
    turn = run_turn(world.simulator_url, session_id, [["id", "-u"], ["id", "-g"], ["pwd"]], timeout=300)
    uid, gid, pwd = turn["commands"]
    for command in (uid, gid, pwd):
        assert (command["status"], command["exit_code"]) == ("completed", 0), command
    assert RUNNER_UID != 0
    assert uid["stdout"] == f"{RUNNER_UID}\n"
    assert gid["stdout"] == f"{RUNNER_UID}\n"
    workspace = pod.spec.containers[0].working_dir
    assert workspace == "/workspace"  # the session's environment.workspace_directory (the chart's routing value)
    assert pwd["stdout"] == f"{workspace}\n"
    assert pwd["cwd"] == workspace
    mounts = {m.mount_path: m.name for m in pod.spec.containers[0].volume_mounts}
    assert mounts[workspace] == "workspace"


def test_idle_stop_deletes_the_pod_keeps_the_volume_and_the_next_pod_finds_the_file(world: Installed) -> None:
    """L11, L16: in a session of the persistent-workspace template a command writes
    ``notes.txt`` into the workspace; the session goes idle, and once the idle timeout has
    passed the controller stops the sandbox (logged with cause idle): the pod is deleted and the
    workspace PVC stays Bound. The next input asks for a connection: a new pod mounts the same
    claim, and its command reads the file written before the stop."""
    timeline = _one_session(world, template=PERSISTENT_TEMPLATE)
    session_id, environment_id = timeline["session_id"], timeline["environment_id"]
    [claim] = _claims(world, session_id)
    written = run_turn(world.simulator_url, session_id, [["sh", "-c", "echo kept > notes.txt"]], timeout=300)
    [write] = written["commands"]
    assert (write["status"], write["exit_code"]) == ("completed", 0), write

    # Idle, then past the timeout: the pod goes, the volume stays.
    wait_for(lambda: _status(world, session_id) == "idle", 120, "the turn to end idle", interval=0.5)
    wait_for(lambda: not _pods(world, session_id), IDLE_TIMEOUT_SECONDS + 180, "the idle stop to delete the pod", 1)
    [stop] = wait_for(lambda: _stops(world, session_id), 60, "the worker to log the stop", interval=1)
    assert stop["cause"] == "idle" and stop["idle_timeout_seconds"] == IDLE_TIMEOUT_SECONDS, stop
    assert _status(world, session_id) == "idle"
    wait_for(lambda: not _connected(world, environment_id), 60, "the executor's link to drop", interval=0.5)
    [kept] = _claims(world, session_id)
    assert kept.metadata.uid == claim.metadata.uid and kept.status.phase == "Bound"
    assert kept.metadata.deletion_timestamp is None

    # The next input: a new pod on the same claim reads the file.
    read = run_turn(world.simulator_url, session_id, [["cat", "notes.txt"]], timeout=600)
    [cat] = read["commands"]
    assert (cat["status"], cat["stdout"], cat["exit_code"]) == ("completed", "kept\n", 0), cat
    assert len(_registered(world, environment_id)) == 2  # a new executor registered afresh
    # The new pod (it may be on its way out already: the session is idle again).
    [pod] = [p for p in _pods(world, session_id) if p.metadata.name != timeline["pod"]]
    assert pod.metadata.labels[names.GENERATION_LABEL] == "2"
    [volume] = [v for v in pod.spec.volumes if v.name == "workspace"]
    assert volume.persistent_volume_claim.claim_name == claim.metadata.name
    [still] = _claims(world, session_id)
    assert still.metadata.uid == claim.metadata.uid


def test_ten_sessions_at_once(world: Installed) -> None:
    """Ten sessions created together: ten sandbox pods, ten registrations, each with the
    key from the Secret. The timelines are the tier's figures (printed, and kept in the cache)."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(_one_session(world, timeout=600))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=900)
    assert not errors, errors
    assert len(results) == 10
    assert len({r["pod"] for r in results}) == 10
    assert all(r["key_matched"] for r in results)
    _record_figures(world, results)


# -- the image pre-puller -----------------------------------------------------------------------


def test_the_pre_puller_keeps_the_runner_image_on_the_node(world: Installed) -> None:
    """The chart's image pre-puller (sandbox.prePuller, on in the tier's values) runs on the node:
    its DaemonSet's pod ran the runner image in an init container that exited 0, and stays with
    its pause container running, so the kubelet keeps the image. The image is unpacked in the
    node's containerd (imported here without unpacking: on this registry-less node the unpack is
    all a "pull" does), and a sandbox pod then starts with it present (no pull)."""
    from kubernetes import client

    apps = client.AppsV1Api(world.api)
    name = f"{RELEASE}-sandbox-controller-image-puller"

    def ready() -> bool:
        status = apps.read_namespaced_daemon_set(name, NAMESPACE).status
        return bool(status.desired_number_scheduled == 1 and status.number_ready == 1)

    wait_for(ready, 300, "the pre-puller's pod to be ready on the node", interval=1)
    [pod] = world.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=image-puller").items
    runner = world.images["sandbox-runner"].ref
    [pulled] = pod.status.init_container_statuses
    assert pulled.image == runner or pulled.image.endswith(runner.split("/", 1)[1]), pulled.image
    assert pulled.state.terminated.exit_code == 0 and pulled.state.terminated.reason == "Completed"
    [pause] = pod.status.container_statuses
    assert pause.state.running is not None and pause.ready
    checked = world.node.ctr("images", "check").stdout.splitlines()
    [line] = [row for row in checked if row.startswith(runner + " ")]
    assert line.split()[-1] == "true", checked  # UNPACKED, in the snapshotter the kubelet uses

    timeline = _one_session(world)
    events = world.core.list_namespaced_event(
        SANDBOX_NAMESPACE, field_selector=f"involvedObject.name={timeline['pod']},reason=Pulled"
    ).items
    assert events and all("already present on machine" in e.message for e in events), [e.message for e in events]
    session_id = timeline["session_id"]
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "done"}, timeout=10)
    wait_for(lambda: not _pods(world, session_id), 180, "the session's pod to be deleted", interval=0.5)


# -- warm pools ---------------------------------------------------------------------------------


def warm_ready(world: Installed) -> list[Any]:
    """The warm pool's unclaimed pods that run."""
    pods = world.core.list_namespaced_pod(SANDBOX_NAMESPACE, label_selector=names.pool_selector(WARM_TEMPLATE)).items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def bound_after(world: Installed, pod: Any) -> float | None:
    """Seconds from a warm pod's claim (its claimed-at annotation) to its entrypoint seeing the
    binding (the kubelet's refresh of the downward-API volume, plus the entrypoint's poll)."""
    claimed = float(pod.metadata.annotations[names.CLAIMED_AT_ANNOTATION])
    text = world.core.read_namespaced_pod_log(
        pod.metadata.name, SANDBOX_NAMESPACE, container=pod.spec.containers[0].name, timestamps=True
    )
    for line in text.splitlines():
        if "claimed: starting the executor" in line:
            stamp = line.split(" ", 1)[0]
            seen = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            return seen - claimed
    return None


def test_a_webhook_is_served_by_a_warm_pod_which_is_never_reused(world: Installed) -> None:
    """L8, L1, L2: with the warm template's pool ready, a signed webhook for a session of that
    template gets a pod of the pool, claimed and bound late: the real codex in it registers
    with the session's environment and the key from the Secret (never in the pod's spec or
    annotations; no service-account token). The pool refills to its size; when the session
    fails the claimed pod is deleted and never serves again."""
    wait_for(lambda: len(warm_ready(world)) >= WARM_POOL_SIZE, 300, "the warm pool to be ready", interval=0.5)
    warm_uids = {p.metadata.uid for p in warm_ready(world)}
    timeline = _one_session(world, template=WARM_TEMPLATE)
    assert timeline["key_matched"] is True
    pod = world.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    assert pod.metadata.uid in warm_uids
    assert pod.metadata.labels[names.POOL_STATE_LABEL] == names.CLAIMED
    assert pod.metadata.annotations[names.ENVIRONMENT_ID_ANNOTATION] == timeline["environment_id"]
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert "REMOTE_URL" not in env and "ENVIRONMENT_ID" not in env
    assert env["CODEX_API_KEY"].value is None and env["CODEX_API_KEY"].value_from.secret_key_ref
    assert pod.spec.automount_service_account_token is False
    assert world.environment_key not in json.dumps(world.api.sanitize_for_serialization(pod))
    refresh = wait_for(lambda: bound_after(world, pod), 60, "the entrypoint's claimed line", interval=0.5)
    print(f"node figures: warm pod bound {refresh:.2f}s after its claim (downward-API refresh + poll)")

    # Refilled: the pool is back to its size, without the claimed pod.
    def refilled() -> bool:
        ready = warm_ready(world)
        return len(ready) >= WARM_POOL_SIZE and pod.metadata.uid not in {p.metadata.uid for p in ready}

    wait_for(refilled, 300, "the warm pool to be refilled", interval=0.5)

    # One session only: the failed session's pod is deleted and never comes back to the pool.
    session_id = timeline["session_id"]
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "node test"}, timeout=10)
    wait_for(lambda: not _pods(world, session_id), 180, "the claimed pod to be deleted", interval=0.5)
    pool = world.core.list_namespaced_pod(SANDBOX_NAMESPACE, label_selector=names.managed_selector()).items
    assert pod.metadata.uid not in {p.metadata.uid for p in pool}
    assert len(_registered(world, timeline["environment_id"])) == 1


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _record_figures(world: Installed, results: list[dict[str, Any]]) -> None:
    to_running = [r["running_at"] - r["delivered_at"] for r in results]
    to_registered = [r["registered_at"] - r["delivered_at"] for r in results]
    figures = {
        "run": uuid.uuid4().hex[:8],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sessions": len(results),
        "delivery_to_running_p50_s": round(statistics.median(to_running), 2),
        "delivery_to_running_p99_s": round(_percentile(to_running, 0.99), 2),
        "delivery_to_registered_p50_s": round(statistics.median(to_registered), 2),
        "delivery_to_registered_p99_s": round(_percentile(to_registered, 0.99), 2),
        "node_ready_s": round(world.node.timings.get("node_ready", 0.0), 1),
        "chart_install_s": round(world.install_seconds, 1),
        "images": {
            name: {"size_bytes": image.size_bytes, "build_seconds": image.build_seconds}
            for name, image in world.images.items()
        },
    }
    print("node figures: " + json.dumps(figures))
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
