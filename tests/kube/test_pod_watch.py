"""The watch on sandbox pods against a real kube-apiserver: the scheduler enqueues the session
of a pod that failed or was deleted, the watch resumes across the server closing it
(``timeoutSeconds``) without missing an event, and lists again after 410 Gone."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from controller import decide, lifecycle, scheduler
from controller.clock import SystemClock
from controller.config import Settings
from controller.decide import Verdict
from controller.inbox import Job
from controller.lifecycle import Deps
from controller.model import Environment, RequiredAction, SandboxSpec, Session, SessionStatus
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.runner import KubernetesRunner
from controller.runners.kubernetes.watch import PodWatch
from controller.store.redis import RedisSessionStore
from controller.trust import Policy
from tests.envtest.cluster import KubeAPIServer
from tests.envtest.fixtures import ensure_binaries
from tests.envtest.kubelet import RUNNER_IMAGE
from tests.kube.conftest import RESTRICTED, KubeWorld, new_session
from tests.support.fakes import FakeSessions
from tests.support.processes import assert_no_process_left, wait_for
from tests.support.redis_clients import connect
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
TEMPLATE = SandboxTemplate(image=RUNNER_IMAGE)


def _runner(world: KubeWorld, namespace: str) -> KubernetesRunner:
    return KubernetesRunner(KubeApi(world.core), PodSettings(namespace=namespace), lambda name: TEMPLATE)


def _pods(world: KubeWorld, namespace: str, session_id: str) -> list[Any]:
    selector = f"{names.managed_selector()},{names.session_selector(session_id)}"
    return list(world.core.list_namespaced_pod(namespace, label_selector=selector).items)


class Seen:
    """Sessions a watch named, in order (``notify`` runs on the watch's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ids: list[str] = []

    def __call__(self, session_id: str) -> None:
        with self._lock:
            self.ids.append(session_id)

    def has(self, *session_ids: str) -> bool:
        with self._lock:
            return set(session_ids) <= set(self.ids)


@pytest.fixture
def quiet_namespace(kube_world: KubeWorld) -> str:
    """A namespace no kubelet serves: its pods stay Pending until the test reports a status."""
    name = f"ns-{uuid.uuid4().hex[:8]}"
    kube_world.api.create_namespace(name, RESTRICTED)
    return name


@pytest.fixture
def pod_watch(kube_world: KubeWorld, quiet_namespace: str) -> Iterator[PodWatch]:
    watch = PodWatch(KubeApi(kube_world.core), quiet_namespace, timeout_seconds=1, backoff_seconds=(0.1, 1.0))
    try:
        yield watch
    finally:
        watch.stop()


def _fail(core: client.CoreV1Api, namespace: str, pod_name: str) -> None:
    """Report the pod's container exited with an error, as a kubelet does."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    terminated = {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}
    status = {
        "phase": "Failed",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [
            {
                "name": "executor",
                "image": RUNNER_IMAGE,
                "imageID": f"local://{RUNNER_IMAGE}",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": status})


def _compact(etcd_url: str) -> None:
    """Compact etcd up to its current revision (through its JSON gateway): older resource
    versions can no longer be watched from."""
    with httpx.Client(base_url=etcd_url, timeout=10) as etcd:
        key = base64.b64encode(b"\0").decode()
        found = etcd.post("/v3/kv/range", json={"key": key, "range_end": key, "limit": 1}).json()
        revision = found["header"]["revision"]
        etcd.post("/v3/kv/compaction", json={"revision": revision, "physical": True}).raise_for_status()


def _start(runner: KubernetesRunner) -> tuple[str, str]:
    """A pod for a new session: (session id, pod name)."""
    session_id = f"sess_{uuid.uuid4().hex[:12]}"
    handle = runner.ensure(SandboxSpec(session_id, f"env_{uuid.uuid4().hex[:8]}", "http://127.0.0.1:1"), 1)
    return session_id, handle.name


def test_the_watch_resumes_after_the_server_closes_it_without_missing_an_event(
    kube_world: KubeWorld, quiet_namespace: str, pod_watch: PodWatch
) -> None:
    """L14, L17: the server closes each watch after timeoutSeconds (1 s here) and the watch
    resumes from the last resource version, never listing again; a pod that fails and a pod
    that is deleted while no watch is open at all (stopped, then started again) are still seen."""
    runner = _runner(kube_world, quiet_namespace)
    seen = Seen()
    quiet, _ = _start(runner)  # there before the watch: its first list sees it, healthy
    pod_watch.start(seen)
    wait_for(pod_watch.live, 30, "the watch to list and watch")
    failing, failing_pod = _start(runner)
    deleted, deleted_pod = _start(runner)
    cycles = pod_watch.streams
    wait_for(lambda: pod_watch.streams >= cycles + 2, 30, "the server to close the watch twice")
    _fail(kube_world.core, quiet_namespace, failing_pod)
    wait_for(lambda: seen.has(failing), 30, "the failed pod's session")
    kube_world.core.delete_namespaced_pod(deleted_pod, quiet_namespace)  # unbound: gone at once
    wait_for(lambda: seen.has(deleted), 30, "the deleted pod's session")
    # Nothing watching at all while two more pods change: the next watch resumes and sees both.
    pod_watch.stop()
    later_failed, later_failed_pod = _start(runner)
    later_deleted, later_deleted_pod = _start(runner)
    _fail(kube_world.core, quiet_namespace, later_failed_pod)
    kube_world.core.delete_namespaced_pod(later_deleted_pod, quiet_namespace)
    pod_watch.start(seen)
    wait_for(lambda: seen.has(later_failed, later_deleted), 30, "changes made while no watch was open")
    assert pod_watch.lists == 1, "every watch resumed from its resource version; none had to list again"
    assert pod_watch.streams >= cycles + 3
    assert quiet not in seen.ids  # a healthy pod nothing happened to asks for nothing
    assert sorted(set(seen.ids)) == sorted({failing, deleted, later_failed, later_deleted})


@pytest.fixture(scope="module")
def uncached() -> Iterator[tuple[KubeAPIServer, client.CoreV1Api, str]]:
    """An API server of its own that serves watches from etcd (no watch cache), so that a
    compacted resource version is answered with 410 Gone as soon as etcd is compacted (with
    the cache, only once the cache's window has moved past it), and a namespace in it."""
    server = KubeAPIServer(ensure_binaries(), extra_apiserver_args=["--watch-cache=false"])
    server.start()
    api_client = server.api_client()
    try:
        namespace = f"ns-{uuid.uuid4().hex[:8]}"
        server.create_namespace(namespace, RESTRICTED)
        yield server, client.CoreV1Api(api_client), namespace
    finally:
        api_client.close()
        server.stop()


def test_an_expired_resource_version_makes_the_watch_list_again_and_catch_up(
    uncached: tuple[KubeAPIServer, client.CoreV1Api, str],
) -> None:
    """L14, L17: when the version to resume from has been compacted away, the API server answers
    410 Gone; the watch lists the pods again, compares the list with what it knew, and names the
    session of a pod deleted and of a pod that failed while it was away (not a healthy one's)."""
    server, core, namespace = uncached
    runner = KubernetesRunner(KubeApi(core), PodSettings(namespace=namespace), lambda name: TEMPLATE)
    watch = PodWatch(KubeApi(core), namespace, timeout_seconds=1, backoff_seconds=(0.1, 1.0))
    seen = Seen()
    try:
        healthy, _ = _start(runner)
        gone, gone_pod = _start(runner)
        failed, failed_pod = _start(runner)
        watch.start(seen)
        wait_for(lambda: watch.live() and len(watch.known) == 3, 30, "the watch to know the three pods")
        watch.stop()
        resume_from = watch.resource_version
        core.delete_namespaced_pod(gone_pod, namespace)
        _fail(core, namespace, failed_pod)
        _compact(server.etcd_url)  # the API server does this every few minutes
        assert watch.resource_version == resume_from and resume_from is not None
        watch.start(seen)
        wait_for(lambda: seen.has(gone, failed), 30, "the sessions of pods that changed while the watch was away")
        assert watch.lists == 2  # the first list, and the one after 410 Gone
        assert healthy not in seen.ids
        assert sorted(s.session_id for s in watch.known.values()) == sorted([healthy, failed])
        # And it watches on from the new list.
        later, later_pod = _start(runner)
        _fail(core, namespace, later_pod)
        wait_for(lambda: seen.has(later), 30, "a pod failing after the new list")
    finally:
        watch.stop()


def test_the_scheduler_enqueues_the_session_of_a_failed_or_deleted_pod_and_the_worker_releases_it(
    kube_world: KubeWorld, tmp_path: Path
) -> None:
    """L14, L17: two kept-warm sessions (no timer: only a sweep or the watch brings them back)
    with real pods run by the test kubelet; the leading scheduler watches their pods. One pod's
    container exits, the other pod is deleted: the scheduler wants work on each session and
    enqueues a job for it (sweeps are an hour apart here, so the watch did it), and working
    that job, as a worker does, stops the session's sandbox (STOP: failed / gone; workspace
    kept) and releases the failed pod."""
    namespace = kube_world.namespace
    runner = _runner(kube_world, namespace)
    server = RedisServer(tmp_path / "redis").start()
    stop = threading.Event()
    thread: threading.Thread | None = None
    watch = PodWatch(KubeApi(kube_world.core), namespace, timeout_seconds=5)
    try:
        client = connect(server.url)
        store = RedisSessionStore(client, lease_ttl_seconds=30)
        sessions = FakeSessions()
        deps = Deps(sessions, store, runner, SystemClock(), trust_policy=Policy(("127.0.0.1",)))
        ids: list[str] = []
        for _ in range(2):
            spec = new_session(kube_world)
            environment = Environment("self_hosted", spec.environment_id, spec.remote_url, spec.workspace_directory)
            wants = Session(
                spec.session_id,
                SessionStatus.REQUIRES_ACTION,
                environment,
                (RequiredAction("environment_connection", spec.environment_id),),
            )
            sessions.put(wants)
            store.want(wants.id)
            assert [d.verdict for d in _work(wants.id, deps)] == [Verdict.START]
            # The executor connected; the session waits for input, its sandbox kept warm.
            sessions.connected[spec.environment_id] = True
            sessions.put(replace(wants, status=SessionStatus.IDLE, required_actions=()))
            store.want(wants.id)
            assert [d.verdict for d in _work(wants.id, deps)] == [Verdict.IGNORE]
            assert store.timer(wants.id) is None
            ids.append(wants.id)
        failing, deleted = ids
        [failing_pod] = _pods(kube_world, namespace, failing)
        [deleted_pod] = _pods(kube_world, namespace, deleted)
        for pod in (failing_pod, deleted_pod):
            wait_for(
                lambda name=pod.metadata.name: (
                    kube_world.core.read_namespaced_pod(name, namespace).status.phase == "Running"
                ),
                60,
                "the pod to run",
            )
        published: list[Job] = []

        def publish(jobs: Sequence[Job], term: str) -> None:  # the leader's publisher, as a list
            published.extend(jobs)

        settings = Settings.from_env(
            {"CONTROLLER_RECONCILE_INTERVAL_SECONDS": "3600", "CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS": "3600"}
        )
        thread = threading.Thread(
            target=scheduler.run,
            args=(settings, store, runner, client, publish, stop),
            kwargs={"watch": watch},
            daemon=True,
        )
        thread.start()
        wait_for(watch.live, 30, "the leader's pod watch")

        def pod_jobs() -> set[str]:
            return {job.session_id for job in list(published) if job.event_type == "pod"}

        kube_world.kubelet.exit_container(failing_pod.metadata.name, 1)
        kube_world.core.delete_namespaced_pod(deleted_pod.metadata.name, namespace)
        wait_for(lambda: {failing, deleted} <= pod_jobs(), 60, "pod jobs for both sessions")
        assert all(job.webhook_id == "" for job in published)
        for session_id in (failing, deleted):
            decisions = _work(session_id, deps)  # the job, as a worker runs it: work is wanted
            # (A look the release's own DELETED event asks for, if it came meanwhile, changes nothing.)
            assert [d.verdict for d in decisions][:1] == [Verdict.STOP], decisions
            assert {d.verdict for d in decisions[1:]} <= {Verdict.IGNORE}, decisions
            record = store.record(session_id)
            assert record is not None and record.stopped
        wait_for(lambda: not _pods(kube_world, namespace, failing), 60, "the failed pod to be released")
        assert not _pods(kube_world, namespace, deleted)
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=30)
            assert not thread.is_alive()
        watch.stop()
        server.stop()
    assert not watch.live()
    assert_no_process_left(tmp_path)


def _work(session_id: str, deps: Deps) -> list[decide.Decision]:
    result = lifecycle.work(session_id, deps)
    assert isinstance(result, list), result
    return result
