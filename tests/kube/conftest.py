"""A Kubernetes world for the runner: a real kube-apiserver + etcd, the test kubelet, a
sandbox namespace that enforces Pod Security "restricted", the executor key Secret, and the
Agents API simulator that the real codex (through the runner image's entrypoint) dials."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import kube_api  # noqa: F401  (the fixture)
from tests.envtest.kubelet import TestKubelet
from tests.support.codex import codex_binary
from tests.support.simulator import SimulatorProcess

ROOT = Path(__file__).resolve().parents[2]
RUNNER_IMAGE = "sandbox-controller-runner:test"
EXECUTOR_SECRET = "sandbox-executor-key"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@dataclass
class KubeWorld:
    api: KubeAPIServer
    core: client.CoreV1Api
    namespace: str
    kubelet: TestKubelet
    simulator: SimulatorProcess

    def new_namespace(self, labels: dict[str, str], with_secret: bool = True) -> str:
        name = f"ns-{uuid.uuid4().hex[:8]}"
        self.api.create_namespace(name, labels)
        if with_secret:
            self.core.create_namespaced_secret(
                name,
                client.V1Secret(
                    metadata=client.V1ObjectMeta(name=EXECUTOR_SECRET),
                    data={"executor-key": base64.b64encode(self.simulator.environment_key.encode()).decode()},
                ),
            )
        self.kubelet.namespaces.append(name)
        return name


@pytest.fixture(scope="module")
def kube_world(kube_api: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:  # noqa: F811
    directory = tmp_path_factory.mktemp("kube")
    codex = codex_binary()
    api_client = kube_api.api_client()
    core = client.CoreV1Api(api_client)
    simulator = SimulatorProcess(directory, args=["--turn-seconds", "0.5"]).start()
    kubelet = TestKubelet(
        api_client,
        namespaces=[],
        images={RUNNER_IMAGE: ["bash", str(ROOT / "runner_image" / "entrypoint.sh")]},
        work_root=directory / "node",
        image_env={"CODEX_BIN": codex, "RETRY_INITIAL_SECONDS": "0.5", "RETRY_MAX_SECONDS": "2"},
        node_name=f"node-{uuid.uuid4().hex[:6]}",
    ).start()
    world = KubeWorld(kube_api, core, "", kubelet, simulator)
    world.namespace = world.new_namespace(RESTRICTED)
    try:
        yield world
    finally:
        kubelet.stop()
        simulator.stop()
        api_client.close()
