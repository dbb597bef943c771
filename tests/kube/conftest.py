"""A Kubernetes world for the runner: a real kube-apiserver + etcd, the test kubelet, a
sandbox namespace that enforces Pod Security "restricted", the executor key Secret, and the
Agents API simulator that the real codex (through the runner image's entrypoint) dials."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from controller.model import SandboxSpec
from controller.runners.kubernetes import names
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import kube_api  # noqa: F401  (the fixture)
from tests.envtest.kubelet import TestKubelet, create_executor_key_secret, runner_kubelet
from tests.support.codex import codex_binary
from tests.support.simulator import SimulatorProcess

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
            create_executor_key_secret(self.core, name, self.simulator.environment_key, EXECUTOR_SECRET)
        self.kubelet.namespaces.append(name)
        return name


def new_session(world: KubeWorld) -> SandboxSpec:
    """A session created at the world's simulator, as the spec a runner is given."""
    with world.simulator.http() as api:
        response = api.post(
            "/v1/agents/sessions",
            json={"agent": {"model": "m"}, "environment": {"type": "self_hosted"}, "input": "hi"},
        )
    response.raise_for_status()
    session = response.json()
    env = session["environment"]
    return SandboxSpec(session["id"], env["id"], env["remote_url"], env["workspace_directory"])


@pytest.fixture
def quiet(kube_api: KubeAPIServer) -> Iterator[tuple[client.CoreV1Api, str]]:  # noqa: F811
    """A namespace enforcing "restricted" (it admits a Localhost profile) that no kubelet serves."""
    api_client = kube_api.api_client()
    namespace = f"ns-{uuid.uuid4().hex[:8]}"
    kube_api.create_namespace(namespace, RESTRICTED)
    try:
        yield client.CoreV1Api(api_client), namespace
    finally:
        api_client.close()


@pytest.fixture(scope="module")
def kube_world(kube_api: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeWorld]:  # noqa: F811
    directory = tmp_path_factory.mktemp("kube")
    codex = codex_binary()
    api_client = kube_api.api_client()
    core = client.CoreV1Api(api_client)
    simulator = SimulatorProcess(directory, args=["--turn-seconds", "0.5"]).start()
    kubelet = runner_kubelet(api_client, [], directory / "node", codex, node_name=f"node-{uuid.uuid4().hex[:6]}")
    kubelet.start()
    world = KubeWorld(kube_api, core, "", kubelet, simulator)
    world.namespace = world.new_namespace(RESTRICTED)
    try:
        yield world
    finally:
        kubelet.stop()
        simulator.stop()
        api_client.close()


class ActsAfterListing:
    """The runner's API, with ``between`` run once just after the runner lists pods by a label
    selector containing ``label`` (a session's pods, by default; a pool's with its pool label):
    another placement acting in the instant between that look and the runner's next step."""

    def __init__(
        self, api: client.CoreV1Api, between: Callable[[], object], label: str = names.SESSION_HASH_LABEL
    ) -> None:
        self._api = api
        self._between: Callable[[], object] | None = between
        self._label = label

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        pods = self._api.list_namespaced_pod(namespace, **kwargs)
        if self._between is not None and self._label in kwargs.get("label_selector", ""):
            between, self._between = self._between, None
            between()
        return pods
