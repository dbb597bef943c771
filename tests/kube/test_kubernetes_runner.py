"""The Kubernetes runner against a real kube-apiserver (RBAC, PodSecurity admission on),
with the test kubelet running the runner image's entrypoint and the real codex, which
registers with the simulator."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from controller.errors import RunnerRejected
from controller.model import Handle, Health, SandboxSpec
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.runner import KubernetesRunner
from tests.envtest.kubelet import RUNNER_IMAGE
from tests.kube.conftest import ActsAfterListing, KubeWorld, new_session
from tests.support.processes import wait_for

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
TEMPLATE = SandboxTemplate(image=RUNNER_IMAGE)


def _runner(world: KubeWorld, namespace: str | None = None, template: SandboxTemplate = TEMPLATE) -> KubernetesRunner:
    return KubernetesRunner(
        KubeApi(world.core), PodSettings(namespace=namespace or world.namespace), lambda name: template
    )


def _pods(world: KubeWorld, namespace: str, spec: SandboxSpec) -> list[client.V1Pod]:

    selector = names.session_selector(spec.session_id)
    return list(world.core.list_namespaced_pod(namespace, label_selector=selector).items)


def test_the_pod_runs_the_executor_which_registers_with_the_sessions_environment(kube_world: KubeWorld) -> None:
    """L8, L2: the pod passes "restricted" admission; its container gets REMOTE_URL and
    ENVIRONMENT_ID from the session and CODEX_API_KEY only from the Secret; the real codex
    (started by the runner image's entrypoint) registers with the right id and key."""
    runner = _runner(kube_world)
    spec = new_session(kube_world)
    handle = runner.ensure(spec, 1)
    pod = kube_world.core.read_namespaced_pod(handle.name, kube_world.namespace)
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["REMOTE_URL"].value == spec.remote_url and env["ENVIRONMENT_ID"].value == spec.environment_id
    assert env["CODEX_API_KEY"].value is None and env["CODEX_API_KEY"].value_from.secret_key_ref.name
    assert kube_world.simulator.environment_key not in json.dumps(client.ApiClient().sanitize_for_serialization(pod))
    assert pod.spec.automount_service_account_token is False
    registered = wait_for(
        lambda: [r for r in kube_world.simulator.registrations(spec.environment_id) if r["status_code"] == 200],
        60,
        "the executor in the pod to register",
    )
    assert registered[0]["key_matched"] is True
    wait_for(lambda: runner.status(handle) is Health.RUNNING, 30, "the pod to run")
    assert kube_world.simulator.environment_status(spec.environment_id) == "connected"
    runner.release(handle)
    wait_for(lambda: not _pods(kube_world, kube_world.namespace, spec), 30, "the pod to be gone")
    events = kube_world.core.list_namespaced_event(
        kube_world.namespace, field_selector=f"involvedObject.name={handle.name}"
    ).items
    assert {e.reason for e in events} == {"SandboxStarted", "SandboxReleased"}
    assert all(kube_world.simulator.environment_key not in (e.message or "") for e in events)


def test_concurrent_ensures_create_one_pod(kube_world: KubeWorld) -> None:
    """L1: eight concurrent ensure() calls for one session (two runner instances) → one pod."""
    runners = [_runner(kube_world), _runner(kube_world)]
    spec = new_session(kube_world)
    with ThreadPoolExecutor(max_workers=8) as pool:
        handles = list(pool.map(lambda i: runners[i % 2].ensure(spec, 1), range(8)))
    assert {h.uid for h in handles} == {handles[0].uid}
    assert len(_pods(kube_world, kube_world.namespace, spec)) == 1
    runners[0].release(handles[0])


def _told(world: KubeWorld, pod: str) -> list[str]:
    """The reasons of the controller's Events on ``pod`` (what ``kubectl describe`` shows), in
    alphabetical order (their stamps are to the second: two of one second have no order)."""
    found = world.core.list_namespaced_event(world.namespace, field_selector=f"involvedObject.name={pod}").items
    return sorted(e.reason for e in found if e.reason.startswith("Sandbox"))


def test_a_cold_start_is_told_once_by_the_placement_that_created_it(kube_world: KubeWorld) -> None:
    """L1: a template without a pool; a twin runner creates the session's pod in the instant
    between this runner's look and its create, so this runner's create meets the name taken.
    Both return that one pod; it is told once, by its creator: to ``on_placed`` as cold for
    ``no_pool``, and to ``kubectl describe`` (``SandboxStarted``); each runner says it placed
    it cold. Its release is told once too (``SandboxReleased``)."""
    placed: list[tuple[str, str, str]] = []
    settings = PodSettings(namespace=kube_world.namespace)

    def runner(core: Any) -> KubernetesRunner:
        return KubernetesRunner(
            KubeApi(core), settings, lambda name: TEMPLATE, on_placed=lambda *what: placed.append(what)
        )

    spec = new_session(kube_world)
    twin = runner(kube_world.core)
    raced: dict[str, Handle] = {}
    late = runner(ActsAfterListing(kube_world.core, lambda: raced.setdefault("twin", twin.ensure(spec, 1))))
    handle = late.ensure(spec, 1)
    assert raced["twin"] == handle and handle.generation == 1
    assert placed == [("default", "cold", "no_pool")]
    assert late.placement(spec.session_id) == twin.placement(spec.session_id) == ("default", "cold")
    assert _told(kube_world, handle.name) == ["SandboxStarted"]
    late.release(handle)
    assert _told(kube_world, handle.name) == ["SandboxReleased", "SandboxStarted"]


def test_a_terminating_pod_is_never_reused_and_stale_deletes_miss(kube_world: KubeWorld) -> None:
    """L14: while generation 1 is terminating, ensuring generation 1 again creates the next
    generation instead of adopting the dying pod; a delete with the old pod's UID never
    removes the new one."""
    runner = _runner(kube_world)
    spec = new_session(kube_world)
    first = runner.ensure(spec, 1)
    # An unbound pod is deleted at once by the API server; a bound one waits for its kubelet.
    wait_for(lambda: runner.status(first) is Health.RUNNING, 30, "generation 1 to run")
    kube_world.kubelet.hold_deletions(True)
    try:
        runner.release(first)
        wait_for(lambda: runner.status(first) is Health.TERMINATING, 30, "generation 1 to be terminating")
        second = runner.ensure(spec, 1)
        assert second.name != first.name and second.generation == 2
        runner.release(first)  # stale: must not touch generation 2
        assert runner.status(second) in (Health.STARTING, Health.RUNNING)
    finally:
        kube_world.kubelet.hold_deletions(False)
    runner.release(second)


def test_a_failed_or_evicted_pod_reports_failed(kube_world: KubeWorld) -> None:
    """L14: a container that exits, or an evicted pod, is seen as FAILED (so it is replaced)."""
    runner = _runner(kube_world)
    spec = new_session(kube_world)
    handle = runner.ensure(spec, 1)
    wait_for(lambda: runner.status(handle) is Health.RUNNING, 30, "the pod to run")
    kube_world.kubelet.exit_container(handle.name, 1)
    wait_for(lambda: runner.status(handle) is Health.FAILED, 30, "the failure to be reported")
    assert runner.find(spec.session_id) is None
    replacement = runner.ensure(spec, handle.generation + 1)
    wait_for(lambda: runner.status(replacement) is Health.RUNNING, 30, "the replacement to run")
    kube_world.kubelet.evict(replacement.name)
    wait_for(lambda: runner.status(replacement) is Health.FAILED, 30, "the eviction to be reported")
    for h in (handle, replacement):
        runner.release(h)


@pytest.mark.parametrize(
    "template",
    [
        TEMPLATE,
        replace(TEMPLATE, persist_workspace=True, workspace_size="1Gi"),
        replace(
            TEMPLATE,
            node_selector={"kubernetes.io/os": "linux"},
            active_deadline_seconds=3600,
            tolerations=({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},),
            image_pull_secrets=("regcred",),
        ),
        replace(TEMPLATE, runtime_class_name="gvisor"),
    ],
    ids=["default", "persistent-workspace", "scheduling", "runtime-class"],
)
def test_every_template_option_is_admitted_where_restricted_is_enforced(
    kube_world: KubeWorld, template: SandboxTemplate
) -> None:
    """L2, L16: every sandbox pod the runner builds passes Pod Security "restricted"."""
    if template.runtime_class_name:
        _ensure_runtime_class(kube_world, template.runtime_class_name)
    runner = _runner(kube_world, template=template)
    spec = new_session(kube_world)
    handle = runner.ensure(spec, 1)
    assert runner.status(handle) in (Health.STARTING, Health.RUNNING)
    runner.release(handle)
    runner.discard(spec.session_id)


def test_the_codex_sandbox_opt_in_is_refused_under_restricted_and_admitted_where_allowed(
    kube_world: KubeWorld,
) -> None:
    """L2: Codex's own sandbox (unconfined seccomp, user namespaces) is an explicit opt-in
    that a "restricted" namespace refuses; a namespace that allows it admits it."""
    opt_in = replace(TEMPLATE, codex_sandbox=True)
    spec = new_session(kube_world)
    with pytest.raises(RunnerRejected, match=r"admission refused.*violates PodSecurity \"restricted"):
        _runner(kube_world, template=opt_in).ensure(spec, 1)
    privileged = kube_world.new_namespace({"pod-security.kubernetes.io/enforce": "privileged"})
    runner = _runner(kube_world, namespace=privileged, template=opt_in)
    handle = runner.ensure(spec, 1)
    pod = kube_world.core.read_namespaced_pod(handle.name, privileged)
    assert pod.spec.host_users is False
    runner.release(handle)


def _ensure_runtime_class(world: KubeWorld, name: str) -> None:
    api = client.NodeV1Api(world.core.api_client)
    try:
        api.create_runtime_class(client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=name), handler="runsc"))
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise


def test_a_node_slow_to_start_the_pod_still_gets_one_pod(kube_world: KubeWorld) -> None:
    """L1, L14: while the node takes its time starting the container, the pod is STARTING and
    ensuring again (a retried delivery) returns that same pod instead of a second one."""
    runner = _runner(kube_world)
    spec = new_session(kube_world)
    kube_world.kubelet.slow_start(3.0)
    try:
        handle = runner.ensure(spec, 1)
        assert runner.status(handle) is Health.STARTING
        again = runner.ensure(spec, 1)
        assert again.uid == handle.uid
        wait_for(lambda: runner.status(handle) is Health.RUNNING, 30, "the slow node to start it")
    finally:
        kube_world.kubelet.slow_start(0.0)
    assert len(_pods(kube_world, kube_world.namespace, spec)) == 1
    runner.release(handle)


def test_a_persistent_workspace_outlives_its_pod_until_discarded(kube_world: KubeWorld) -> None:
    """L16: with workspace persistence the PVC stays when the pod is released (replacement,
    crash), is listed for the sweep, and goes only with discard (session released for good)."""
    runner = _runner(kube_world, template=replace(TEMPLATE, persist_workspace=True, workspace_size="1Gi"))
    spec = new_session(kube_world)
    handle = runner.ensure(spec, 1)
    assert runner.keeps_workspace(spec.session_id)
    runner.release(handle)
    wait_for(lambda: not _pods(kube_world, kube_world.namespace, spec), 30, "the pod to be gone")
    assert runner.keeps_workspace(spec.session_id)
    assert spec.session_id in runner.workspaces()
    runner.discard(spec.session_id)
    # Deleted; here it stays terminating (no controller-manager removes its pvc-protection finalizer).
    wait_for(lambda: not runner.keeps_workspace(spec.session_id), 30, "the PVC to be deleted")
    assert spec.session_id not in runner.workspaces()
    assert runner.keeps_workspace("sess_never_seen") is False


def test_an_idle_stop_deletes_the_pod_keeps_the_pvc_and_the_next_start_mounts_it(kube_world: KubeWorld) -> None:
    """L11/L16: the lifecycle's idle STOP (fake clock and session, real runner and API server)
    deletes the pod and keeps the session's PVC; the next environment_connection starts a new
    pod of the next generation that mounts that same claim; nothing is discarded."""
    from controller import lifecycle
    from controller.decide import Verdict
    from controller.lifecycle import Deps
    from controller.model import Environment, RequiredAction, Session, SessionStatus
    from controller.trust import Policy
    from tests.support.clock import FakeClock
    from tests.support.fakes import FakeSessions, FakeStore

    runner = _runner(kube_world, template=replace(TEMPLATE, persist_workspace=True, workspace_size="1Gi"))
    spec = new_session(kube_world)
    clock = FakeClock(1_700_000_000.0)
    sessions, store = FakeSessions(), FakeStore()
    environment = Environment("self_hosted", spec.environment_id, spec.remote_url, spec.workspace_directory)
    wants = Session(
        spec.session_id,
        SessionStatus.REQUIRES_ACTION,
        environment,
        (RequiredAction("environment_connection", spec.environment_id),),
    )
    deps = Deps(sessions, store, runner, clock, idle_timeout_seconds=60, trust_policy=Policy(("127.0.0.1",)))

    def deliver() -> list[Verdict]:
        store.want(spec.session_id)
        result = lifecycle.work(spec.session_id, deps)
        assert isinstance(result, list)
        return [d.verdict for d in result]

    sessions.put(wants)
    assert deliver() == [Verdict.START]
    first = _pods(kube_world, kube_world.namespace, spec)
    assert len(first) == 1
    sessions.put(replace(wants, status=SessionStatus.IDLE, required_actions=(), last_active_at=int(clock.now())))
    clock.advance(60)
    assert deliver() == [Verdict.STOP]
    wait_for(lambda: not _pods(kube_world, kube_world.namespace, spec), 30, "the pod to be deleted")
    assert runner.keeps_workspace(spec.session_id)
    sessions.put(wants)
    assert deliver() == [Verdict.START]
    [second] = _pods(kube_world, kube_world.namespace, spec)
    assert second.metadata.uid != first[0].metadata.uid
    claims = [v.persistent_volume_claim.claim_name for v in second.spec.volumes if v.persistent_volume_claim]
    assert claims == [names.pvc_name(spec.session_id)]
    record = store.record(spec.session_id)
    assert record is not None and record.handle.generation == 2 and not record.stopped
    runner.release(record.handle)
    runner.discard(spec.session_id)
