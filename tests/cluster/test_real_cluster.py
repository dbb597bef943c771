"""Opt-in tier: install the chart into a real cluster (kind, k3d, ...) and run one session.

Runs only with ``SANDBOX_CONTROLLER_CLUSTER_TESTS=1`` and ``KUBECONFIG`` naming the cluster
(cluster-admin: it creates namespaces). Otherwise it skips: CI has no cluster, and this tier
is opt-in by design. Images come from the environment and must be pullable by the nodes
(``kind load docker-image ...`` / ``k3d image import ...``)::

    SANDBOX_CONTROLLER_IMAGE=sandbox-controller/sandbox-controller:dev        # docker build -t ... .
    SANDBOX_CONTROLLER_SIMULATOR_IMAGE=sandbox-controller/simulator:dev      # docker build --target simulator -t ... .
    SANDBOX_CONTROLLER_RUNNER_IMAGE=sandbox-controller/sandbox-runner:0.171.0  # make -C runner_image image
    SANDBOX_CONTROLLER_CLUSTER_TESTS=1 KUBECONFIG=~/.kube/config scripts/test cluster

What runs, all in one fresh namespace: the Agents API simulator (``sandbox-controller
simulator`` from the Dockerfile's ``simulator`` target, a Deployment + Service made by this test), and the
chart installed with Helm 4's library (helm-python-sdk) pointing ``api.baseUrl`` at the
simulator and the simulator's webhooks at the receiver Service. The test creates a session
(from a pod in the cluster), then checks: the signed webhook was delivered and accepted, a
sandbox pod for the session appears in the sandbox namespace (Pod Security "restricted"),
runs the runner image with the session's environment, the real ``codex exec-server``
registers with the simulator and connects, and a command run over its link comes back from
the node as the runner's non-root uid, in the session's workspace directory.

One stand-in, said plainly: codex sends its key only to ``https://*.openai.com`` or a
loopback host, so the simulator's ``remote_url`` is ``http://127.0.0.1:<port>``. Inside the
sandbox pod that is the pod itself; the test therefore adds an ephemeral container (same
network namespace, "restricted"-compliant) that forwards the pod's loopback port to the
simulator Service on TCP 443; the chart's values add an egress rule to the simulator's pods
(sandbox egress never reaches private ranges otherwise), and the controller image, which the
forwarder runs, to ``sandbox.podPolicy.extraImages`` (the pod policy holds ephemeral containers
to the allowed images). In production that hop is the pod's HTTPS route to api.openai.com.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sandbox-controller"
RELEASE = "demo"
SIMULATOR = "agents-api-simulator"
SIM_PORT = 8090
ENABLED = os.environ.get("SANDBOX_CONTROLLER_CLUSTER_TESTS") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG", "")

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not ENABLED,
        reason="opt-in tier (expected to skip in CI): set SANDBOX_CONTROLLER_CLUSTER_TESTS=1 and KUBECONFIG "
        "to a real cluster (kind/k3d) to install the chart and run a session; see docs/kubernetes.md",
    ),
    pytest.mark.skipif(
        ENABLED and not (KUBECONFIG and all(Path(p).is_file() for p in KUBECONFIG.split(os.pathsep))),
        reason="SANDBOX_CONTROLLER_CLUSTER_TESTS=1 but KUBECONFIG does not name an existing kubeconfig file",
    ),
]


# A few lines of stdlib Python (the controller image has it): 127.0.0.1:<port> in the sandbox
# pod's network namespace -> the simulator Service. WebSockets are plain TCP here.
FORWARDER = """
import asyncio, sys
host, port, listen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
async def handle(reader, writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        print("forwarder: cannot reach", host, port, exc, flush=True)
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""

CREATE_SESSION = """
import json, os, httpx
response = httpx.post(
    os.environ["SIMULATOR_URL"] + "/v1/agents/sessions",
    headers={"Authorization": "Bearer " + os.environ["API_KEY"]},
    json={"agent": {"model": "cluster-test"}, "environment": {"type": "self_hosted"}, "input": "hi"},
    timeout=30,
)
response.raise_for_status()
print(json.dumps(response.json()))
"""


def _image(variable: str) -> tuple[str, str]:
    value = os.environ.get(variable, "")
    repository, _, tag = value.rpartition(":")
    if not value or not repository or "/" in tag or "@" in value:
        pytest.fail(f"{variable} must name an image as repository:tag (pullable by the cluster), got {value!r}")
    return repository, tag


def _restricted_container() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@dataclass
class Cluster:
    api: Any
    core: Any
    namespace: str
    sandbox_namespace: str
    api_key: str
    environment_key: str
    webhook_secret: str
    controller_image: str
    simulator_image: str

    def simulator_admin(self, path: str) -> Any:
        """GET the simulator's admin API through the API server's service proxy."""
        from kubernetes.dynamic import DynamicClient

        response = DynamicClient(self.api).request(
            "get",
            f"/api/v1/namespaces/{self.namespace}/services/{SIMULATOR}:http/proxy{path}",
            serialize=False,
        )
        return json.loads(response.data)

    def simulator_admin_post(self, path: str, body: dict[str, Any]) -> Any:
        """POST to the simulator's admin API through the API server's service proxy."""
        from kubernetes.dynamic import DynamicClient

        response = DynamicClient(self.api).request(
            "post",
            f"/api/v1/namespaces/{self.namespace}/services/{SIMULATOR}:http/proxy{path}",
            body=body,
            serialize=False,
        )
        return json.loads(response.data)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    from kubernetes import client, config

    import tests.chart.test_chart as chart_tests

    controller_repo, controller_tag = _image("SANDBOX_CONTROLLER_IMAGE")
    runner_repo, runner_tag = _image("SANDBOX_CONTROLLER_RUNNER_IMAGE")
    simulator_repo, simulator_tag = _image("SANDBOX_CONTROLLER_SIMULATOR_IMAGE")
    helm = chart_tests._helm()
    api = config.new_client_from_config(config_file=KUBECONFIG.split(os.pathsep)[0])
    core = client.CoreV1Api(api)
    namespace = f"scc-{uuid.uuid4().hex[:8]}"
    world = Cluster(
        api,
        core,
        namespace,
        f"{namespace}-sandboxes",
        api_key=f"sk-cluster-{secrets.token_hex(16)}",
        environment_key=f"envkey-cluster-{secrets.token_hex(16)}",
        webhook_secret="whsec_" + base64.b64encode(secrets.token_bytes(24)).decode(),
        controller_image=f"{controller_repo}:{controller_tag}",
        simulator_image=f"{simulator_repo}:{simulator_tag}",
    )
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        _start_simulator(world)
        values = {
            "image": {"repository": controller_repo, "tag": controller_tag},
            "webhook": {"signingSecrets": [world.webhook_secret]},
            "apiKey": {"value": world.api_key},
            "api": {"baseUrl": f"http://{SIMULATOR}.{namespace}.svc:{SIM_PORT}"},
            "remoteUrlAllowlist": ["127.0.0.1"],  # the simulator's remote_url, forwarded in the pod
            "receiver": {"replicas": 1},
            "worker": {"replicas": 1},
            "sandbox": {
                "image": {"repository": runner_repo, "tag": runner_tag},
                # The test's loopback forwarder (an ephemeral container) runs the controller image.
                "podPolicy": {"extraImages": [world.controller_image]},
                "executorKey": {"value": world.environment_key},
                # The simulator lives in a private range, which sandbox egress never reaches
                # otherwise: let the sandbox pods reach exactly its pods (443 via the Service,
                # SIM_PORT once a CNI has translated the Service address).
                "networkPolicy": {
                    "egress": {
                        "extraRules": [
                            {
                                "to": [
                                    {
                                        "namespaceSelector": {
                                            "matchLabels": {"kubernetes.io/metadata.name": namespace}
                                        },
                                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": SIMULATOR}},
                                    }
                                ],
                                "ports": [{"port": 443, "protocol": "TCP"}, {"port": SIM_PORT, "protocol": "TCP"}],
                            }
                        ]
                    }
                },
            },
        }
        with helm.Chart.load(str(CHART)) as chart, helm.Config(namespace=namespace) as cfg:  # KUBECONFIG
            release = cfg.install(chart, RELEASE, values, namespace=namespace, wait="watcher", timeout=600)
            assert release["status"] == "deployed", release
            try:
                # The chart's own `helm test` hook: the receiver answers /readyz (Redis reachable).
                cfg.test(RELEASE, timeout=180)
                yield world
            finally:
                cfg.uninstall(RELEASE, wait="watcher", timeout=300, ignore_not_found=True)
    finally:
        core.delete_namespace(namespace)
        api.close()


def _start_simulator(world: Cluster) -> None:
    from kubernetes import client

    core, ns = world.core, world.namespace
    labels = {"app.kubernetes.io/name": SIMULATOR}
    data = {
        "SANDBOX_CONTROLLER_SIMULATOR_WEBHOOK_SECRET": world.webhook_secret,
        "SANDBOX_CONTROLLER_SIMULATOR_ENVIRONMENT_KEY": world.environment_key,
        "SANDBOX_CONTROLLER_SIMULATOR_API_KEY": world.api_key,
    }
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name=SIMULATOR), string_data=data))
    receiver = f"http://{RELEASE}-sandbox-controller-receiver.{ns}.svc/webhooks"
    pod_spec = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "simulator",
                "image": world.simulator_image,
                "args": [
                    "simulator",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(SIM_PORT),
                    "--webhook-url",
                    receiver,
                    "--webhook-retry-initial-seconds",
                    "2",
                    "--webhook-retry-max-seconds",
                    "10",
                    "--turn-seconds",
                    "1",
                ],
                "envFrom": [{"secretRef": {"name": SIMULATOR}}],
                "ports": [{"name": "http", "containerPort": SIM_PORT}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 2},
                "securityContext": _restricted_container(),
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }
        ],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": SIMULATOR, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    client.AppsV1Api(world.api).create_namespaced_deployment(ns, deployment)
    # Port 8090 for the worker; port 443 for the sandbox pod's forwarder (an HTTPS-like route).
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SIMULATOR, "labels": labels},
        "spec": {
            "selector": labels,
            "ports": [
                {"name": "http", "port": SIM_PORT, "targetPort": "http"},
                {"name": "https-port", "port": 443, "targetPort": "http"},
            ],
        },
    }
    core.create_namespaced_service(ns, service)


def _create_session(world: Cluster) -> dict[str, Any]:
    """POST /v1/agents/sessions from inside the cluster (the API server's service proxy drops
    the Authorization header the simulator's public API needs)."""
    name = f"create-session-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "create",
                    "image": world.controller_image,
                    "command": ["python", "-c", CREATE_SESSION],
                    "env": [
                        {"name": "SIMULATOR_URL", "value": f"http://{SIMULATOR}:{SIM_PORT}"},
                        {
                            "name": "API_KEY",
                            "valueFrom": {
                                "secretKeyRef": {"name": SIMULATOR, "key": "SANDBOX_CONTROLLER_SIMULATOR_API_KEY"}
                            },
                        },
                    ],
                    "securityContext": _restricted_container(),
                }
            ],
        },
    }
    world.core.create_namespaced_pod(world.namespace, pod)

    def finished() -> str | None:
        phase: str = world.core.read_namespaced_pod(name, world.namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, 180, "the session-creating pod to finish", interval=2.0)
    log = world.core.read_namespaced_pod_log(name, world.namespace)
    assert phase == "Succeeded", log
    session: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    return session


def _add_loopback_forwarder(world: Cluster, pod_name: str, remote_url: str) -> None:
    port = int(remote_url.rsplit(":", 1)[1].split("/")[0])
    forwarder = {
        "name": "loopback-to-simulator",
        "image": world.controller_image,
        "command": ["python", "-c", FORWARDER, f"{SIMULATOR}.{world.namespace}.svc", "443", str(port)],
        "securityContext": _restricted_container(),
    }
    world.core.patch_namespaced_pod_ephemeralcontainers(
        pod_name, world.sandbox_namespace, {"spec": {"ephemeralContainers": [forwarder]}}
    )


def test_one_session_through_the_installed_chart(cluster: Cluster) -> None:
    """Install → signed webhook → receiver → worker → sandbox pod ("restricted") → the real
    codex executor registers with the session's environment and connects."""
    from controller.runners.kubernetes import names

    session = _create_session(cluster)
    environment = session["environment"]
    session_id, environment_id = session["id"], environment["id"]

    # The webhook reached the receiver and was accepted (2xx), signature and all.
    def delivered() -> list[dict[str, Any]] | None:
        events = cluster.simulator_admin("/admin/events")["data"]
        mine = {e["id"] for e in events if e["type"] == "agent.session.action_required" and session_id in json.dumps(e)}
        deliveries = cluster.simulator_admin("/admin/deliveries?type=agent.session.action_required")["data"]
        return [d for d in deliveries if d["event_id"] in mine and d["state"] == "delivered"] or None

    wait_for(delivered, 120, "the action_required webhook to be accepted by the receiver", interval=2.0)

    def sandbox_pod() -> Any:
        pods = cluster.core.list_namespaced_pod(
            cluster.sandbox_namespace, label_selector=names.session_selector(session_id)
        ).items
        running = [p for p in pods if p.status.phase == "Running"]
        return running[0] if running else None

    pod = wait_for(
        sandbox_pod,
        300,
        "the session's sandbox pod to run (is the runner image loaded into the cluster?)",
        interval=2.0,
    )
    assert pod.metadata.annotations[names.SESSION_ID_ANNOTATION] == session_id
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["ENVIRONMENT_ID"].value == environment_id
    assert env["REMOTE_URL"].value == environment["remote_url"]
    assert env["CODEX_API_KEY"].value is None and env["CODEX_API_KEY"].value_from.secret_key_ref
    labels = cluster.core.read_namespace(cluster.sandbox_namespace).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

    _add_loopback_forwarder(cluster, pod.metadata.name, environment["remote_url"])

    def registered() -> list[dict[str, Any]] | None:
        data = cluster.simulator_admin(f"/admin/registrations?environment_id={environment_id}")["data"]
        return [r for r in data if r["status_code"] == 200] or None

    [first, *_] = wait_for(registered, 180, "the executor in the sandbox pod to register", interval=2.0)
    assert first["key_matched"] is True

    def connected() -> bool:
        environments = cluster.simulator_admin("/admin/environments")["data"]
        return any(e["id"] == environment_id and e["status"] == "connected" for e in environments)

    wait_for(connected, 120, "the executor's environment to be connected", interval=2.0)

    # The sandbox works: a command runs on the node, as the runner's non-root uid, in the
    # session's workspace directory, and its output comes back over the executor's link.
    from controller.runners.kubernetes.manifests import RUNNER_UID

    result = cluster.simulator_admin_post(
        f"/admin/environments/{environment_id}/exec",
        {"argv": ["sh", "-c", "echo hello > notes.txt; cat notes.txt; id -u; pwd"]},
    )
    assert result["status"] == "completed", result
    assert result["stdout"] == f"hello\n{RUNNER_UID}\n{environment['workspace_directory']}\n"
