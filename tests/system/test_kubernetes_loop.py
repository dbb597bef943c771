"""The whole loop on Kubernetes: signed webhooks → 2 receivers → Redis → 2 Celery workers
(authenticating as a least-privilege ServiceAccount) → pods in a namespace that enforces
Pod Security "restricted" on a real kube-apiserver → the test kubelet runs the runner
image's entrypoint with the real codex → it registers with the simulator."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from controller.runners.kubernetes import names
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import kube_api  # noqa: F401  (the fixture)
from tests.envtest.kubelet import RUNNER_IMAGE, TestKubelet, create_executor_key_secret, runner_kubelet
from tests.support.codex import codex_binary
from tests.support.processes import wait_for
from tests.system.loop import EXECUTOR_KEY, Loop, assert_no_secret

pytestmark = [pytest.mark.system, pytest.mark.kube, pytest.mark.timeout(900)]
NAMESPACE = "sandboxes"
# Exactly what the Helm chart's Role grants (helm/sandbox-controller/templates/rbac.yaml).
RULES = [
    client.V1PolicyRule(
        api_groups=[""],
        resources=["pods", "persistentvolumeclaims"],
        verbs=["create", "get", "list", "watch", "delete"],
    ),
    client.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"]),
]


@dataclass
class KubeLoop:
    loop: Loop
    core: client.CoreV1Api
    kubelet: TestKubelet

    def pods(self, session_id: str | None = None) -> list[Any]:
        selector = names.managed_selector()
        if session_id:
            selector += "," + names.session_selector(session_id)
        return list(self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)

    def registered(self, environment_id: str) -> list[dict[str, Any]]:
        return [
            r for r in self.loop.registrations() if r["environment_id"] == environment_id and r["status_code"] == 200
        ]


def _least_privilege_kubeconfig(api: KubeAPIServer, core: client.CoreV1Api, path: Path) -> str:
    rbac = client.RbacAuthorizationV1Api(core.api_client)
    core.create_namespaced_service_account(
        NAMESPACE, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="controller"))
    )
    rbac.create_namespaced_role(NAMESPACE, client.V1Role(metadata=client.V1ObjectMeta(name="controller"), rules=RULES))
    rbac.create_namespaced_role_binding(
        NAMESPACE,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="controller"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="controller"),
            subjects=[client.RbacV1Subject(kind="ServiceAccount", name="controller", namespace=NAMESPACE)],
        ),
    )
    return api.write_kubeconfig(path, api.service_account_token(NAMESPACE, "controller"), user="controller")


@pytest.fixture(scope="module")
def kube_loop(kube_api: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeLoop]:  # noqa: F811
    directory = tmp_path_factory.mktemp("kube-loop")
    codex = codex_binary()
    admin = kube_api.api_client()
    core = client.CoreV1Api(admin)
    kube_api.create_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "restricted"})
    create_executor_key_secret(core, NAMESPACE, EXECUTOR_KEY, "sandbox-executor-key")
    kubeconfig = _least_privilege_kubeconfig(kube_api, core, directory / "kubeconfig")
    kubelet = runner_kubelet(admin, [NAMESPACE], directory / "node", codex)
    kubelet.start()
    loop = Loop(
        directory,
        codex,
        extra_env={
            "CONTROLLER_RUNNER": "kubernetes",
            "CONTROLLER_KUBERNETES_NAMESPACE": NAMESPACE,
            "CONTROLLER_KUBERNETES_IMAGE": RUNNER_IMAGE,
            "CONTROLLER_EXECUTOR_KEY": None,  # L2: with Kubernetes the controller never holds it
            "KUBECONFIG": kubeconfig,
        },
    )
    try:
        loop.start()
        yield KubeLoop(loop, core, kubelet)
    finally:
        loop.stop()
        kubelet.stop()
        admin.close()


def test_fifty_sessions_with_duplicate_concurrent_deliveries_get_fifty_pods(kube_loop: KubeLoop) -> None:
    """L1, L8: 50 sessions × 5 copies of each delivery, concurrently to 2 receivers, worked by
    2 workers → exactly 50 pods ever created, one per session, each of whose executor
    registers once with its session's environment id and the key from the Secret."""
    loop = kube_loop.loop
    with loop.api() as api:
        sessions = [loop.create_session(api) for _ in range(50)]
    deliveries = loop.copies(sessions, 5)
    sent = time.monotonic()
    with ThreadPoolExecutor(max_workers=32) as pool:
        assert set(pool.map(lambda d: loop.post(*d).status_code, deliveries)) == {200}
    environments = {s["id"]: s["environment"]["id"] for s in sessions}
    seen: dict[str, float] = {}

    def all_registered() -> bool:
        for registration in loop.registrations():
            if registration["status_code"] == 200 and registration["environment_id"] in environments.values():
                seen.setdefault(registration["environment_id"], time.monotonic() - sent)
        return len(seen) == 50

    wait_for(all_registered, 300, "50 executors in pods to register", interval=0.5)
    time.sleep(3)
    per_session = Counter(p.metadata.annotations[names.SESSION_ID_ANNOTATION] for p in kube_loop.pods())
    assert {sid: per_session[sid] for sid in environments} == dict.fromkeys(environments, 1)
    ours = [
        name for name in kube_loop.kubelet.started_pods if any(names.session_hash(s)[:8] in name for s in environments)
    ]
    assert len(ours) == 50, "a pod was created more than once for some session"
    assert [len(kube_loop.registered(env)) for env in environments.values()] == [1] * 50
    times = sorted(seen.values())
    print(
        f"\nFIGURE kubernetes 50x5: registrations after first delivery: median {statistics.median(times):.1f}s, "
        f"max {times[-1]:.1f}s"
    )


def _connected_session(kube_loop: KubeLoop) -> tuple[dict[str, Any], str, Any]:
    """A new session whose executor (in its one pod) registered and holds its link."""
    loop = kube_loop.loop
    started = time.monotonic()
    with loop.api() as api:
        session = loop.create_session(api)
    env = session["environment"]["id"]
    wait_for(lambda: kube_loop.registered(env), 120, "the first executor")
    print(f"\nFIGURE kubernetes, one session: created → executor in pod registered {time.monotonic() - started:.2f}s")
    wait_for(lambda: loop.environment_status(env) == "connected", 30, "connected")
    [pod] = kube_loop.pods(session["id"])
    return session, env, pod


def test_an_evicted_pod_is_replaced_exactly_once(kube_loop: KubeLoop) -> None:
    """L14: the session's pod is evicted; the next connection request replaces it with exactly
    one new pod (the next generation), whose executor registers."""
    loop = kube_loop.loop
    session, env, first = _connected_session(kube_loop)
    kube_loop.kubelet.evict(first.metadata.name)
    wait_for(lambda: loop.environment_status(env) == "disconnected", 30, "the eviction to drop the link")
    loop.submit(session["id"])
    wait_for(lambda: len(kube_loop.registered(env)) == 2, 120, "the replacement to register")
    time.sleep(3)
    live = [
        p for p in kube_loop.pods(session["id"]) if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]
    assert [p.metadata.labels[names.GENERATION_LABEL] for p in live] == ["2"]
    assert len(kube_loop.registered(env)) == 2


def test_a_terminating_pod_is_never_reused(kube_loop: KubeLoop) -> None:
    """L14: the session's running pod is being deleted (a drain on a slow node: it stays
    terminating) and its executor is gone; the next connection request gets a new pod of the
    next generation, never the dying one."""
    loop = kube_loop.loop
    session, env, first = _connected_session(kube_loop)
    kube_loop.kubelet.hold_deletions(True)
    try:
        kube_loop.core.delete_namespaced_pod(first.metadata.name, NAMESPACE, grace_period_seconds=60)
        kube_loop.kubelet.kill_process(first.metadata.name)
        wait_for(lambda: loop.environment_status(env) == "disconnected", 30, "the executor to go")
        loop.submit(session["id"])
        wait_for(lambda: len(kube_loop.registered(env)) == 2, 120, "the replacement to register")
        pods = {p.metadata.name: p for p in kube_loop.pods(session["id"])}
        assert pods[first.metadata.name].metadata.deletion_timestamp is not None  # still terminating
        [replacement] = [p for n, p in pods.items() if n != first.metadata.name]
        assert replacement.metadata.labels[names.GENERATION_LABEL] == "2"
        assert replacement.metadata.deletion_timestamp is None
    finally:
        kube_loop.kubelet.hold_deletions(False)


def test_a_command_in_a_pod_runs_in_its_workspace_and_its_output_comes_back(kube_loop: KubeLoop) -> None:
    """L8: a turn's command runs in the session's pod, in the workspace volume mounted at the
    session's workspace_directory (the pod's workingDir), and its output comes back. The
    pod asks for a non-root uid; the test kubelet runs containers as its own processes and
    does not switch users, so the uid itself is proven only on a real node (tests/cluster)."""
    loop = kube_loop.loop
    session, _env, pod = _connected_session(kube_loop)
    container = pod.spec.containers[0]
    assert container.working_dir == "/workspace"
    run_as = container.security_context.run_as_user or pod.spec.security_context.run_as_user
    assert run_as and run_as != 0
    commands = [["sh", "-c", "echo hello > notes.txt; cat notes.txt"], ["pwd"]]
    response = httpx.post(
        f"{loop.simulator_url}/admin/sessions/{session['id']}/turns", json={"commands": commands}, timeout=10
    )
    response.raise_for_status()
    turn_id = response.json()["id"]

    def finished() -> dict[str, Any] | None:
        turns = httpx.get(f"{loop.simulator_url}/admin/sessions/{session['id']}/turns", timeout=10).json()["data"]
        turn = next(t for t in turns if t["id"] == turn_id)
        return dict(turn) if turn["status"] == "finished" else None

    turn = wait_for(finished, 120, "the turn in the pod to finish", interval=0.5)
    assert isinstance(turn, dict)
    notes, pwd = turn["commands"]
    workspace = kube_loop.kubelet.work_root / NAMESPACE / f"{pod.metadata.name}-{pod.metadata.uid[:8]}"
    workspace = workspace / "volumes" / "workspace"
    assert (notes["status"], notes["stdout"], notes["exit_code"]) == ("completed", "hello\n", 0), notes
    assert pwd["stdout"] == f"{workspace}\n"
    assert (workspace / "notes.txt").read_text() == "hello\n"


def test_no_secret_in_any_output_or_pod(kube_loop: KubeLoop) -> None:
    """L2: no secret in any process's output; the environment key is in no pod spec."""
    assert_no_secret(kube_loop.loop.all_output())
    for pod in kube_loop.pods():
        assert EXECUTOR_KEY not in str(client.ApiClient().sanitize_for_serialization(pod))
