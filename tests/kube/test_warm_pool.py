"""Warm pools against a real kube-apiserver (Pod Security "restricted" enforced), with the test
kubelet running the runner image's entrypoint and the real codex: a warm pod waits, a claim
binds it late (its downward-API volume), its executor registers; claims race safely."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller import wiring
from controller.metrics import COLD_STARTS_TOTAL, PLACEMENTS_TOTAL, Metrics
from controller.model import Handle, Health, PoolState, SandboxSpec
from controller.runners.kubernetes import names, placement
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, claim_patch, make_pod
from controller.runners.kubernetes.objects import PodRef
from controller.runners.kubernetes.placement import Placement
from controller.runners.kubernetes.runner import KubernetesRunner
from controller.runners.kubernetes.templates import Templates
from controller.store.redis import RedisDemandLog
from tests.envtest.kubelet import RUNNER_IMAGE
from tests.kube.conftest import RESTRICTED, ActsAfterListing, KubeWorld, new_session
from tests.support.pods import pod_of
from tests.support.processes import wait_for
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]


def _template(size: int) -> SandboxTemplate:
    return SandboxTemplate(name="fast", image=RUNNER_IMAGE, warm_pool_size=size)


def _runner(
    world: KubeWorld, namespace: str, template: SandboxTemplate, placed: list[tuple[str, str, str]] | None = None
) -> KubernetesRunner:
    """A runner of the test's pool; ``placed`` collects what it tells ``on_placed``."""
    on_placed = (lambda *what: placed.append(what)) if placed is not None else (lambda *what: None)
    return KubernetesRunner(
        KubeApi(world.core), PodSettings(namespace=namespace), lambda name: template, [template], on_placed=on_placed
    )


def _pools(world: KubeWorld, namespace: str, template: SandboxTemplate) -> Placement:
    """The placement protocol and pool of another runner (a rival placement, or the pool's tending)."""
    return Placement(KubeApi(world.core), PodSettings(namespace=namespace), [template], lambda *placed: None)


@pytest.fixture
def namespace(kube_world: KubeWorld) -> Iterator[str]:
    """A namespace of its own per test (so each test sees only its pool); emptied at the end."""
    name = kube_world.new_namespace(RESTRICTED)
    yield name
    kube_world.core.delete_collection_namespaced_pod(name)
    wait_for(lambda: not kube_world.core.list_namespaced_pod(name).items, 60, "the test's pods to be gone")


def _ready(world: KubeWorld, namespace: str) -> list[Any]:
    """The pool's unclaimed pods that run (the entrypoint waits for a binding)."""
    pods = world.core.list_namespaced_pod(namespace, label_selector=names.pool_selector("fast")).items
    return [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def _live(world: KubeWorld, namespace: str, spec: SandboxSpec) -> list[Any]:
    pods = world.core.list_namespaced_pod(namespace, label_selector=names.session_selector(spec.session_id)).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _registered(world: KubeWorld, spec: SandboxSpec) -> list[dict[str, Any]]:
    return [r for r in world.simulator.registrations(spec.environment_id) if r["status_code"] == 200]


def test_a_claimed_warm_pod_binds_late_registers_and_is_refilled(kube_world: KubeWorld, namespace: str) -> None:
    """L8, L2, L1: the pool fills to its size; warm pods start no executor. A session claims one:
    the pod gets the session's labels and the binding, and the real codex in it registers with
    the session's environment id and the key from the Secret (never in the pod's annotations).
    The claim adds no pod; the pool's next tending refills it (no placements noted here, so
    nothing holds it); the released pod is gone and no later session gets it. The tending
    reports the pool as it found it; the placement is told as warm."""
    template = _template(2)
    placed: list[tuple[str, str, str]] = []
    runner = _runner(kube_world, namespace, template, placed)
    assert runner.tend_pools() == [PoolState("fast", size=2, ready=0, starting=0)]
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "two warm pods to run")
    assert runner.tend_pools() == [PoolState("fast", size=2, ready=2, starting=0)]
    warm_names = {p.metadata.name for p in _ready(kube_world, namespace)}

    spec = new_session(kube_world)
    handle = runner.ensure(spec, 1)
    assert handle.name in warm_names and handle.generation == 1
    assert handle.environment_id == spec.environment_id
    pod = kube_world.core.read_namespaced_pod(handle.name, namespace)
    assert pod.metadata.labels[names.SESSION_HASH_LABEL] == names.session_hash(spec.session_id)
    assert pod.metadata.labels[names.POOL_STATE_LABEL] == names.CLAIMED
    assert pod.metadata.annotations[names.REMOTE_URL_ANNOTATION] == spec.remote_url
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert "REMOTE_URL" not in env and env["CODEX_API_KEY"].value_from.secret_key_ref.name
    assert kube_world.simulator.environment_key not in json.dumps(client.ApiClient().sanitize_for_serialization(pod))
    [registered] = wait_for(lambda: _registered(kube_world, spec), 60, "the claimed pod's executor to register")
    assert registered["key_matched"] is True
    wait_for(lambda: kube_world.simulator.environment_status(spec.environment_id) == "connected", 30, "connected")
    assert runner.find(spec.session_id) == handle
    assert runner.ensure(spec, 1) == handle  # looked up again: the same pod, not another claim
    assert placed == [("fast", "warm", "")]

    # The claim added no pod; the tending refills the pool: two unclaimed pods again, the
    # claimed one not among them.
    assert len(kube_world.core.list_namespaced_pod(namespace, label_selector=names.pool_selector("fast")).items) == 1
    assert runner.tend_pools() == [PoolState("fast", size=2, ready=1, starting=0)]
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "the pool to be refilled")
    assert handle.name not in {p.metadata.name for p in _ready(kube_world, namespace)}

    # Served one session: released, it is deleted; a second session gets another pod.
    runner.release(handle)
    wait_for(lambda: runner.status(handle) is Health.GONE, 60, "the claimed pod to be gone")
    other = new_session(kube_world)
    second = runner.ensure(other, 1)
    assert second.name != handle.name and second.uid != handle.uid
    wait_for(lambda: _registered(kube_world, other), 60, "the second session's executor to register")
    assert len(_registered(kube_world, spec)) == 1  # the first environment registered once, never again


def test_two_sessions_racing_for_one_warm_pod_get_one_pod_each(kube_world: KubeWorld, namespace: str) -> None:
    """L1: two sessions claim at the same moment (two runners) from a pool of one: exactly one
    gets the warm pod; the other gets a cold one (a claim adds no pod to refill the pool); each
    session has exactly one pod,
    and each placement is told as what it was (warm for a claimed pod, cold for a created one)."""
    template = _template(1)
    placed: list[tuple[str, str, str]] = []
    runners = [_runner(kube_world, namespace, template, placed), _runner(kube_world, namespace, template, placed)]
    runners[0].tend_pools()
    [warm] = wait_for(lambda: _ready(kube_world, namespace), 60, "the warm pod to run")
    specs = [new_session(kube_world), new_session(kube_world)]
    barrier = threading.Barrier(2)

    def claim(i: int) -> Handle:
        barrier.wait()
        return runners[i].ensure(specs[i], 1)

    with ThreadPoolExecutor(max_workers=2) as pool:
        handles = list(pool.map(claim, range(2)))
    for spec, handle in zip(specs, handles, strict=True):
        assert [p.metadata.uid for p in _live(kube_world, namespace, spec)] == [handle.uid]
    assert sorted(h.name == warm.metadata.name for h in handles) == [False, True]
    assert handles[0].uid != handles[1].uid
    told = sorted(
        ("fast", "cold", "pool_empty") if h.name.startswith("sbx-") else ("fast", "warm", "") for h in handles
    )
    assert sorted(placed) == told and ("fast", "warm", "") in told
    for spec in specs:
        wait_for(lambda spec=spec: _registered(kube_world, spec), 60, "both executors to register")


def test_concurrent_ensures_for_one_session_keep_one_pod(kube_world: KubeWorld, namespace: str) -> None:
    """L1: eight concurrent ensure() calls for one session (two runners) with a pool of three:
    each may claim a warm pod, but after placing it each looks for the session's other pods and
    yields; one pod survives and every call returns it."""
    template = _template(3)
    runners = [_runner(kube_world, namespace, template), _runner(kube_world, namespace, template)]
    runners[0].tend_pools()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 3, 60, "three warm pods to run")
    spec = new_session(kube_world)
    with ThreadPoolExecutor(max_workers=8) as pool:
        handles = list(pool.map(lambda i: runners[i % 2].ensure(spec, 1), range(8)))
    assert {h.uid for h in handles} == {handles[0].uid}
    assert [p.metadata.uid for p in _live(kube_world, namespace, spec)] == [handles[0].uid]
    wait_for(lambda: _registered(kube_world, spec), 60, "the one executor to register")


def test_a_lone_claimed_pod_is_the_sessions_only_once_its_placement_record_names_it(
    kube_world: KubeWorld, namespace: str
) -> None:
    """L1: a warm pod is claimed before its placement record is written, so a lone claimed pod
    may belong to a placement about to lose. Staged step by step: (1) a placement claimed a pod
    and stopped before recording it: ensure() records that pod and returns it, claiming no
    other; (2) a placement has claimed a pod, and just after ensure() lists it alone, a rival
    claims another and records it first: ensure() returns the rival's pod and deletes the
    loser, so the session keeps exactly one pod."""
    template = _template(3)
    runner, rival = _runner(kube_world, namespace, template), _pools(kube_world, namespace, template)
    runner.tend_pools()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 3, 60, "three warm pods to run")
    warm = _ready(kube_world, namespace)

    def claim(pod: Any, spec: SandboxSpec) -> Any:
        return kube_world.core.patch_namespaced_pod(pod.metadata.name, namespace, claim_patch(spec, 1, time.time()))

    stranded = new_session(kube_world)
    orphan = claim(warm[0], stranded)
    handle = runner.ensure(stranded, 1)
    assert handle.uid == orphan.metadata.uid
    assert rival.holder(stranded.session_id, 1) == PodRef(handle.name, handle.uid)
    assert [p.metadata.uid for p in _live(kube_world, namespace, stranded)] == [handle.uid]

    raced = new_session(kube_world)
    loser = claim(warm[1], raced)
    won: dict[str, Any] = {}

    def rival_places_first() -> None:
        won["pod"] = claim(warm[2], raced)
        assert rival.placed(raced.session_id, 1, pod_of(won["pod"]))

    staged = KubernetesRunner(
        KubeApi(ActsAfterListing(kube_world.core, rival_places_first)),  # type: ignore[arg-type]
        PodSettings(namespace=namespace),
        lambda name: template,
        [template],
    )
    handle = staged.ensure(raced, 1)
    assert handle.uid == won["pod"].metadata.uid != loser.metadata.uid
    wait_for(
        lambda: [p.metadata.uid for p in _live(kube_world, namespace, raced)] == [handle.uid],
        60,
        "the losing pod to be deleted",
    )
    wait_for(lambda: _registered(kube_world, raced), 60, "the winning pod's executor to register")


def test_a_cold_start_that_meets_a_dying_rival_defers_to_the_record_not_to_a_new_generation(
    kube_world: KubeWorld, namespace: str
) -> None:
    """L1, L14: staged step by step. A placement finds no record and lists the pool; just then a
    rival claims the warm pod and records it, and a third placement's cold pod of generation 1,
    which lost, is being deleted. Our placement's claim misses and its cold pod's name belongs to
    that dying pod: it reads the record again and returns the rival's pod. It must not move to
    generation 2, which would leave the session two live pods of two generations."""
    template = _template(1)
    runner, rival = _runner(kube_world, namespace, template), _pools(kube_world, namespace, template)
    runner.tend_pools()
    [warm] = wait_for(lambda: _ready(kube_world, namespace), 60, "the warm pod to run")
    spec = new_session(kube_world)
    hold = "test.sandbox-controller.dev/hold"
    dying = make_pod(spec, 1, template, PodSettings(namespace=namespace))
    dying["metadata"]["finalizers"] = [hold]

    def rivals_act() -> None:
        claimed = kube_world.core.patch_namespaced_pod(warm.metadata.name, namespace, claim_patch(spec, 1, time.time()))
        assert rival.placed(spec.session_id, 1, pod_of(claimed))
        kube_world.core.create_namespaced_pod(namespace, dying)
        kube_world.core.delete_namespaced_pod(dying["metadata"]["name"], namespace)  # held by its finalizer

    staged = KubernetesRunner(
        KubeApi(ActsAfterListing(kube_world.core, rivals_act, label=names.POOL_LABEL)),  # type: ignore[arg-type]
        PodSettings(namespace=namespace),
        lambda name: template,
        [template],
    )
    try:
        handle = staged.ensure(spec, 1)
        assert (handle.uid, handle.generation) == (warm.metadata.uid, 1)
        live = wait_for(lambda: _live(kube_world, namespace, spec), 30, "the session's pod")
        assert [p.metadata.uid for p in live] == [warm.metadata.uid]
    finally:
        kube_world.core.patch_namespaced_pod(dying["metadata"]["name"], namespace, {"metadata": {"finalizers": None}})


def test_the_pool_replaces_dead_and_old_pods_and_never_deletes_a_claimed_one(
    kube_world: KubeWorld, namespace: str
) -> None:
    """A warm pod whose container died is replaced; a template change (another shape) replaces
    the old pods; a pod claimed between the pool's look and its delete is left to its session."""
    template = _template(1)
    runner = _runner(kube_world, namespace, template)
    runner.tend_pools()
    [first] = wait_for(lambda: _ready(kube_world, namespace), 60, "the warm pod to run")
    kube_world.kubelet.exit_container(first.metadata.name, 1)

    def replaced() -> bool:
        runner.tend_pools()
        return [p.metadata.name for p in _ready(kube_world, namespace)] not in ([], [first.metadata.name])

    wait_for(replaced, 60, "the dead warm pod to be replaced", interval=0.5)
    [second] = _ready(kube_world, namespace)

    changed = SandboxTemplate(name="fast", image=RUNNER_IMAGE, warm_pool_size=1, resources={})
    other = _runner(kube_world, namespace, changed)

    def reshaped() -> bool:
        other.tend_pools()
        return [p.metadata.name for p in _ready(kube_world, namespace)] not in ([], [second.metadata.name])

    wait_for(reshaped, 60, "the pod of the old shape to be replaced", interval=0.5)

    # Claimed after the pool listed it: the pool's delete carries the listed resourceVersion and misses.
    [third] = _ready(kube_world, namespace)
    tending = _pools(kube_world, namespace, changed)
    seen = tending.warm_pods(changed)  # the pool's own view, taken before the claim
    spec = new_session(kube_world)
    handle = other.ensure(spec, 1)
    assert handle.name == third.metadata.name
    for pod in seen:
        tending.delete_unclaimed(pod)
    assert other.status(handle) in (Health.STARTING, Health.RUNNING)
    wait_for(lambda: _registered(kube_world, spec), 60, "the claimed pod's executor to register")


def test_the_tending_refreshes_a_claimed_pods_binding_once_when_the_claim_is_old_enough(
    kube_world: KubeWorld, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's tending updates a claimed pod once its claim is ``BINDING_REFRESH_AFTER_SECONDS``
    old (the kubelet, which may have rewritten the binding from the pod as it was before the
    claim, syncs it again): a label on that pod, none on a ready one; a younger claim is left
    alone, and a refreshed pod is not patched again."""
    template = _template(2)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "the warm pods to run")
    spec = new_session(kube_world)
    handle = _runner(kube_world, namespace, template).ensure(spec, 1)
    calls: list[str] = []
    tending = Placement(
        KubeApi(_Counted(kube_world.core, calls)),  # type: ignore[arg-type]
        PodSettings(namespace=namespace),
        [template],
        lambda *placed: None,
    )

    def refreshed() -> list[str]:
        pods = kube_world.core.list_namespaced_pod(namespace, label_selector=names.managed_selector()).items
        return [p.metadata.name for p in pods if (p.metadata.labels or {}).get(names.BINDING_REFRESHED_LABEL)]

    after = "controller.runners.kubernetes.pool.BINDING_REFRESH_AFTER_SECONDS"
    monkeypatch.setattr(after, 3600.0)  # the claim is too young
    tending.tend()
    assert "patch_namespaced_pod" not in calls
    assert refreshed() == []
    monkeypatch.setattr(after, 0.0)
    tending.tend()
    assert calls.count("patch_namespaced_pod") == 1, calls
    assert refreshed() == [handle.name]
    pod = kube_world.core.read_namespaced_pod(handle.name, namespace)
    assert pod.metadata.uid == handle.uid and pod.metadata.labels[names.POOL_STATE_LABEL] == names.CLAIMED
    calls.clear()
    tending.tend()
    assert "patch_namespaced_pod" not in calls, calls
    wait_for(lambda: _registered(kube_world, spec), 60, "the claimed pod's executor to register")


def test_a_session_with_another_workspace_directory_gets_a_cold_pod(kube_world: KubeWorld, namespace: str) -> None:
    """L8: warm pods mount the configured workspace directory; a session naming another one
    (which routing would not serve) is never bound to one: it gets a cold pod of its own shape,
    told as cold for that reason."""
    template = _template(1)
    placed: list[tuple[str, str, str]] = []
    runner = _runner(kube_world, namespace, template, placed)
    runner.tend_pools()
    [warm] = wait_for(lambda: _ready(kube_world, namespace), 60, "the warm pod to run")
    spec = replace(new_session(kube_world), workspace_directory="/elsewhere")
    handle = runner.ensure(spec, 1)
    assert handle.name.startswith("sbx-")
    assert placed == [("fast", "cold", "workspace_directory")]
    assert [p.metadata.name for p in _ready(kube_world, namespace)] == [warm.metadata.name]
    pod = kube_world.core.read_namespaced_pod(handle.name, namespace)
    assert pod.spec.containers[0].working_dir == "/elsewhere"


def test_a_placement_whose_pod_is_gone_moves_on_to_the_next_generation(kube_world: KubeWorld, namespace: str) -> None:
    """L14, L1: the placement record of generation 1 outlives its pod (here no garbage collector
    deletes it with the pod, as a cluster's does); ensuring generation 1 again (a retry after
    the pod died) places generation 2, never waits on the dead record. The record is a Lease
    owned by the placed pod; the claim is told to ``kubectl describe`` by an Event (no key in
    either)."""
    template = _template(2)
    runner = _runner(kube_world, namespace, template)
    runner.tend_pools()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "two warm pods to run")
    spec = new_session(kube_world)
    first = runner.ensure(spec, 1)
    leases = client.CoordinationV1Api(kube_world.core.api_client)
    record = leases.read_namespaced_lease(names.placement_name(spec.session_id, 1), namespace)
    [owner] = record.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("Pod", first.name, first.uid)
    assert record.spec.holder_identity == first.name
    selector = f"involvedObject.name={first.name}"
    [event] = [e for e in kube_world.core.list_namespaced_event(namespace, field_selector=selector).items]
    assert event.reason == "SandboxClaimed" and spec.session_id in event.message
    for shown in (record, event):
        assert kube_world.simulator.environment_key not in json.dumps(
            client.ApiClient().sanitize_for_serialization(shown)
        )
    runner.release(first)
    wait_for(lambda: runner.status(first) is Health.GONE, 60, "the first pod to be gone")
    second = runner.ensure(spec, 1)
    assert second.generation == 2 and second.uid != first.uid
    assert [p.metadata.uid for p in _live(kube_world, namespace, spec)] == [second.uid]


def test_a_pool_sized_by_demand_serves_a_burst_warm_after_the_first_and_drains_to_zero(
    kube_world: KubeWorld, namespace: str, tmp_path: Path
) -> None:
    """``warmPool: {min: 0, max: 3}``, placements noted in a real Redis (its clock): the pool
    starts empty; a first burst of three sessions goes cold (``pool_empty``) and is noted; the
    tendings raise the target to the burst's size and fill the pool; a second burst of three
    is served warm, every one of it (the pool grew only once the first burst was placed: no pod
    added while it was); once no session has come for a window, the tendings take
    the pool down to zero pods. The runner tells each start's template and source, and a cold
    pod's own start stamps (created, scheduled, container started: in that order)."""
    template = SandboxTemplate(
        name="fast",
        image=RUNNER_IMAGE,
        warm_pool_min=0,
        warm_pool_max=3,
        warm_window_seconds=25,  # the pool fills within ~10 s of the first burst (5 s of it settling)
        warm_interval_seconds=5,
        warm_headroom_percent=0,
    )
    server = RedisServer(tmp_path / "redis").start()
    redis_client = connect(server.url)
    try:
        metrics = Metrics()
        placed = wiring.placements(
            Templates({"default": SandboxTemplate(), "fast": template}, {}), metrics, RedisDemandLog(redis_client)
        )
        runner = KubernetesRunner(
            KubeApi(kube_world.core),
            PodSettings(namespace=namespace),
            lambda name: template,
            [template],
            on_placed=placed,
            demand=RedisDemandLog(redis_client),
        )
        assert runner.tend_pools() == [PoolState("fast", size=0, ready=0, starting=0)]
        assert not kube_world.core.list_namespaced_pod(namespace).items

        def burst() -> list[Handle]:
            specs = [new_session(kube_world) for _ in range(3)]
            with ThreadPoolExecutor(max_workers=3) as threads:
                return list(threads.map(lambda spec: runner.ensure(spec, 1), specs))

        first = burst()
        assert all(h.name.startswith("sbx-") for h in first), [h.name for h in first]
        assert metrics.value(COLD_STARTS_TOTAL, template="fast", reason="pool_empty") == 3
        # Just placed: the tending raises the target to the burst but adds no pod while its
        # sessions are being placed (``pool.settling``: their pods start without new ones beside).
        assert runner.tend_pools() == [PoolState("fast", size=3, ready=0, starting=0)]
        assert not kube_world.core.list_namespaced_pod(namespace, label_selector=names.pool_selector("fast")).items
        # Each start's pod stages, as the API server and the kubelet stamped them (to the second).
        assert {runner.placement(h.session_id) for h in first} == {("fast", "cold")}
        stamps = wait_for(
            lambda: (s := runner.start_stamps(first[0])) and "container_started" in s and s,
            60,
            "the container to start",
        )
        assert stamps["pod_created"] <= stamps["scheduled"] <= stamps["container_started"] <= time.time()

        def filled() -> bool:
            [pool] = runner.tend_pools()
            return pool.size == 3 and len(_ready(kube_world, namespace)) == 3

        wait_for(filled, 120, "the pool to rise to the burst and fill", interval=0.5)
        for handle in first:
            runner.release(handle)

        second = burst()
        last_placed = time.monotonic()
        assert all(h.name.startswith("warm-fast-") for h in second), [h.name for h in second]
        assert {runner.placement(h.session_id) for h in second} == {("fast", "warm")}
        assert runner.start_stamps(second[0]) == {}  # its pod's stages came before its session
        assert metrics.value(PLACEMENTS_TOTAL, template="fast", source="warm") == 3
        assert metrics.value(COLD_STARTS_TOTAL, template="fast", reason="pool_empty") == 3
        for handle in second:
            runner.release(handle)
        [pool] = runner.tend_pools()
        assert pool.size == 3  # the burst is still in the window: the target holds (it scales down slowly)

        def drained() -> bool:
            [pool] = runner.tend_pools()
            left = kube_world.core.list_namespaced_pod(namespace, label_selector=names.pool_selector("fast")).items
            return pool.size == 0 and not [p for p in left if p.metadata.deletion_timestamp is None]

        # Down once the last placement has left the window (25 s), well before the notes' key
        # would expire by itself (a minute later): the window, not the key's TTL, drains it.
        deadline = last_placed + template.warm_window_seconds + 25
        wait_for(drained, deadline - time.monotonic(), "the pool to drain to zero once demand stopped", interval=1.0)
    finally:
        redis_client.close()
        server.stop()


class _Counted:
    """An API of the client library whose every call is noted by its method's name in ``calls``
    (one request to the API server each: a round trip)."""

    def __init__(self, api: Any, calls: list[str]) -> None:
        self._api = api
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._calls.append(name)
            return method(*args, **kwargs)

        return counted


CLAIM_CALLS = [
    "list_namespaced_pod",  # the session's live pods: none yet (L1: its pod, if it has one), the round's look (find)
    "read_namespaced_lease",  # the generation's placement record: none yet
    "list_namespaced_pod",  # the pool: what there is to claim
    "patch_namespaced_pod",  # the claim (its test operation: only while unclaimed)
    "create_namespaced_lease",  # the placement record naming the claimed pod
    "create_namespaced_event",  # SandboxClaimed, for kubectl describe
]
"""What a new session's round (its look, ``find``, then ``ensure``) asks of the API server to
claim a ready warm pod, in order."""


def _counted_runner(world: KubeWorld, namespace: str, template: SandboxTemplate, calls: list[str]) -> KubernetesRunner:
    """A runner of the test's pool whose every request to the API server is noted in ``calls``."""
    core = _Counted(world.core, calls)
    leases = _Counted(client.CoordinationV1Api(world.core.api_client), calls)
    return KubernetesRunner(
        KubeApi(core, leases=leases),  # type: ignore[arg-type]
        PodSettings(namespace=namespace),
        lambda name: template,
        [template],
    )


def test_a_claim_of_a_ready_warm_pod_makes_exactly_its_six_requests(kube_world: KubeWorld, namespace: str) -> None:
    """L1: a new session's round, its look (``find``: no live pod) and its claim of a ready warm
    pod (``ensure``), is six requests to the API server, in order (``CLAIM_CALLS``): its live
    pods, its placement record, the pool, the claim, the record written, the Event. ``ensure``
    does not list the session's live pods again right after the look saw none (a seventh
    request, once on every new session's path, on the 2-core node ten of them at once); nor is
    the pod the claim's patch returned read back after the record is written. The pod returned
    is the claimed one, alive and recorded."""
    template = _template(1)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 1, 60, "the warm pod to run")
    [warm] = _ready(kube_world, namespace)
    calls: list[str] = []
    runner = _counted_runner(kube_world, namespace, template, calls)
    spec = new_session(kube_world)
    assert runner.find(spec.session_id) is None
    handle = runner.ensure(spec, 1)
    assert calls == CLAIM_CALLS, calls
    assert (handle.name, handle.uid, handle.generation) == (warm.metadata.name, warm.metadata.uid, 1)
    assert handle.environment_id == spec.environment_id
    record = kube_world.core.read_namespaced_pod(handle.name, namespace)
    assert record.metadata.labels[names.POOL_STATE_LABEL] == names.CLAIMED
    assert _pools(kube_world, namespace, template).holder(spec.session_id, 1) == PodRef(handle.name, handle.uid)
    calls.clear()
    assert runner.ensure(spec, 1) == handle  # looked up again: the same pod, no claim
    assert calls[0] == "list_namespaced_pod"  # the look was used once: this ensure lists for itself
    assert "patch_namespaced_pod" not in calls


def test_an_ensure_lists_the_sessions_pods_itself_unless_a_look_just_saw_none(
    kube_world: KubeWorld, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L1: ``ensure`` lists the session's live pods itself when no look (``find``) came before
    it, and when the look is older than ``NONE_SEEN_FRESH_SECONDS``: only a look made moments
    before, under the same lease, stands in for the list."""
    template = _template(2)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "the warm pods to run")
    calls: list[str] = []
    runner = _counted_runner(kube_world, namespace, template, calls)
    runner.ensure(new_session(kube_world), 1)  # no look before it
    assert calls == CLAIM_CALLS, calls
    calls.clear()
    monkeypatch.setattr(placement, "NONE_SEEN_FRESH_SECONDS", 0.0)  # every look is stale at once
    spec = new_session(kube_world)
    assert runner.find(spec.session_id) is None
    runner.ensure(spec, 1)
    assert calls == ["list_namespaced_pod", *CLAIM_CALLS], calls


def test_a_look_that_saw_no_pod_still_defers_to_a_rival_that_placed_one_since(
    kube_world: KubeWorld, namespace: str
) -> None:
    """L1: a round whose look (``find``) saw no live pod, and whose ``ensure`` therefore does
    not list them again, still returns the pod a rival placed for the session in between (its
    lease lapsed, say): the placement record decides, and no second warm pod is claimed."""
    template = _template(2)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "the warm pods to run")
    spec = new_session(kube_world)
    late = _runner(kube_world, namespace, template)
    assert late.find(spec.session_id) is None
    rival = _runner(kube_world, namespace, template).ensure(spec, 1)
    mine = late.ensure(spec, 1)
    assert (mine.name, mine.uid) == (rival.name, rival.uid)
    assert [p.metadata.uid for p in _live(kube_world, namespace, spec)] == [rival.uid]
    assert len(_ready(kube_world, namespace)) == 1  # the other warm pod was not claimed


def test_a_claim_reads_its_answers_as_json_and_builds_no_model_of_the_client(
    kube_world: KubeWorld, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L1: a new session's look (``find``) and claim of a ready warm pod read every answer as
    the API server's JSON (``objects.pod_from_json``): the client deserializes none into its
    models (a pool's list of ten pods cost 3.4 ms of CPU that way, 0.5 ms as JSON; on the 2-core
    node ten claims at once), and the pod returned is the claimed one, alive and recorded."""
    size = 10
    template = _template(size)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == size, 120, "the warm pods to run")
    api_client = kube_world.api.api_client()  # the runner's own (the test kubelet reads on the world's)
    runner = KubernetesRunner(
        KubeApi(client.CoreV1Api(api_client)), PodSettings(namespace=namespace), lambda name: template, [template]
    )
    spec = new_session(kube_world)
    built: list[str] = []
    real = api_client.deserialize

    def deserialize(text: str, kind: str, content_type: str | None) -> Any:
        built.append(kind)
        return real(text, kind, content_type)

    monkeypatch.setattr(api_client, "deserialize", deserialize)
    try:
        assert runner.find(spec.session_id) is None
        handle = runner.ensure(spec, 1)
    finally:
        api_client.close()
    assert built == [], built
    pod = pod_of(kube_world.core.read_namespaced_pod(handle.name, namespace))
    assert pod.claimed and pod.alive and pod.uid == handle.uid
    assert _pools(kube_world, namespace, template).holder(spec.session_id, 1) == PodRef(handle.name, handle.uid)
    told = kube_world.core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={handle.uid}").items
    assert [(e.reason, e.source.component) for e in told] == [("SandboxClaimed", "sandbox-controller")]


def _connections(api_client: client.ApiClient) -> int:
    """Connections the client's pool has opened to the API server so far."""
    pools = api_client.rest_client.pool_manager.pools
    return sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118 (it refuses iteration)


def test_a_runner_connected_at_its_start_claims_on_that_connection(kube_world: KubeWorld, namespace: str) -> None:
    """A runner that ``connect``ed (a worker pool process, at its start) makes its first claim
    on the connection it opened then: the claim opens none (a TLS handshake on each side,
    inside the first claim of each of ten fresh processes at once on the 2-core node). The
    control: a runner that did not connect opens one inside its first claim."""
    template = _template(2)
    _pools(kube_world, namespace, template).tend()
    wait_for(lambda: len(_ready(kube_world, namespace)) == 2, 60, "the warm pods to run")
    for connected in (True, False):
        api_client = kube_world.api.api_client()
        try:
            runner = KubernetesRunner(
                KubeApi(client.CoreV1Api(api_client)),
                PodSettings(namespace=namespace),
                lambda name: template,
                [template],
            )
            if connected:
                runner.connect()
            before = _connections(api_client)
            spec = new_session(kube_world)
            assert runner.find(spec.session_id) is None
            assert runner.placement(spec.session_id) is None
            runner.ensure(spec, 1)
            assert runner.placement(spec.session_id) == ("fast", "warm")
            assert (before, _connections(api_client)) == ((1, 1) if connected else (0, 1))
        finally:
            api_client.close()
