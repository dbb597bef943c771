"""A small test kubelet: plays the node for a real kube-apiserver.

It registers a Node, binds pending pods of the namespaces it watches to it, and actually
runs each pod's (single) container as a local process: the image maps to a local command
(the runner image → ``runner_image/entrypoint.sh`` with the npm-installed codex), the env
is the pod's own with ``valueFrom`` resolved from Secrets and ConfigMaps, and every
volume mount (workspace, home, tmp) maps to a per-pod directory, as does ``workingDir``.
A downward-API volume of the pod's annotations or labels is written there, and rewritten
(each file replaced atomically) when they change, as the kubelet does.
It reports status (Pending → Running; Failed/Succeeded when the process exits, since
sandbox pods use ``restartPolicy: Never``), kills the process when a pod is deleted and
then finishes the deletion, and can inject faults: a container exit, a slow start, an
eviction.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

_FIELD = re.compile(r"metadata\.(?P<kind>annotations|labels)\['(?P<key>[^']+)'\]")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    process: subprocess.Popen[bytes]
    uid: str
    name: str
    started: str
    reported_exit: bool = False
    downward: dict[str, Path] = field(default_factory=dict)  # downward-API volume name → its directory


@dataclass
class Faults:
    start_delay_seconds: float = 0.0
    pending_kills: dict[str, int] = field(default_factory=dict)  # pod name → exit code
    pending_evictions: set[str] = field(default_factory=set)
    hold_deletions: bool = False


class TestKubelet:
    __test__ = False  # a helper, not a test class

    def __init__(
        self,
        api_client: client.ApiClient,
        namespaces: Sequence[str],
        images: Mapping[str, Sequence[str]],
        work_root: Path,
        image_env: Mapping[str, str] | None = None,
        node_name: str = "test-node",
        interval: float = 0.2,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.namespaces = list(namespaces)
        self.images = {k: list(v) for k, v in images.items()}
        self.work_root = work_root
        self.image_env = dict(image_env or {})
        self.node_name = node_name
        self.interval = interval
        self.faults = Faults()
        self.containers: dict[str, Container] = {}  # pod uid → container
        self.started_pods: list[str] = []  # pod names, in start order
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-kubelet", daemon=True)
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> TestKubelet:
        node = client.V1Node(
            metadata=client.V1ObjectMeta(name=self.node_name, labels={"kubernetes.io/hostname": self.node_name}),
            status=client.V1NodeStatus(
                capacity={"cpu": "64", "memory": "256Gi", "pods": "500"},
                allocatable={"cpu": "64", "memory": "256Gi", "pods": "500"},
            ),
        )
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for container in list(self.containers.values()):
            self._kill(container.process)

    # -- faults ---------------------------------------------------------------------------

    def exit_container(self, pod_name: str, code: int = 1) -> None:
        """The container's process dies with ``code`` (the pod then reports Failed)."""
        with self._lock:
            self.faults.pending_kills[pod_name] = code

    def evict(self, pod_name: str) -> None:
        """Node-pressure eviction, as a kubelet does it: kill, then phase Failed, reason Evicted."""
        with self._lock:
            self.faults.pending_evictions.add(pod_name)

    def kill_process(self, pod_name: str) -> None:
        """Kill a pod's process without reporting anything (a hung node)."""
        for container in list(self.containers.values()):
            if container.name == pod_name:
                self._kill(container.process, signal.SIGKILL)

    def hold_deletions(self, hold: bool) -> None:
        """Leave deleted pods terminating (as a slow node does) until released."""
        self.faults.hold_deletions = hold

    def slow_start(self, seconds: float) -> None:
        self.faults.start_delay_seconds = seconds

    def live_processes(self) -> int:
        return sum(1 for c in self.containers.values() if c.process.poll() is None)

    # -- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for namespace in self.namespaces:
                    for pod in self.core.list_namespaced_pod(namespace).items:
                        self._handle(pod)
            except Exception as exc:  # keep playing the node; record what went wrong
                self.errors.append(repr(exc))
            self._stop.wait(self.interval)

    def _handle(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        container = self.containers.get(meta.uid)
        if meta.deletion_timestamp is not None:
            if not self.faults.hold_deletions:
                self._finish_deletion(pod, container)
            return
        if not spec.node_name:
            self._bind(pod)
            return
        if spec.node_name != self.node_name:
            return
        if container is None:
            if pod.status.phase in (None, "Pending") and self._due(pod):
                self._start(pod)
            return
        with self._lock:
            kill_code = self.faults.pending_kills.pop(meta.name, None)
            evict = meta.name in self.faults.pending_evictions
            self.faults.pending_evictions.discard(meta.name)
        if kill_code is not None:
            self._kill(container.process, signal.SIGKILL)
            self._report_exit(pod, container, kill_code)
            return
        if evict:
            self._kill(container.process)
            container.reported_exit = True
            self._patch_status(
                pod, {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
            )
            return
        self._project(pod, container.downward)
        code = container.process.poll()
        if code is not None and not container.reported_exit:
            self._report_exit(pod, container, code)

    def _due(self, pod: Any) -> bool:
        created = pod.metadata.creation_timestamp
        if not self.faults.start_delay_seconds or created is None:
            return True
        return (dt.datetime.now(dt.UTC) - created).total_seconds() >= self.faults.start_delay_seconds

    def _bind(self, pod: Any) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node_name),
        )
        try:
            self.core.create_namespaced_pod_binding(
                pod.metadata.name, pod.metadata.namespace, body, _preload_content=False
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _start(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        c = spec.containers[0]
        pod_dir = self.work_root / meta.namespace / f"{meta.name}-{meta.uid[:8]}"
        mounts = {}
        for mount in c.volume_mounts or []:
            local = pod_dir / "volumes" / mount.name
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount.mount_path.rstrip("/")] = local
        downward = {
            v.name: pod_dir / "volumes" / v.name
            for v in spec.volumes or []
            if v.downward_api is not None and (pod_dir / "volumes" / v.name).is_dir()
        }
        self._project(pod, downward)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.image_env}
        for var in c.env or []:
            env[var.name] = self._remap(self._value(meta.namespace, var), mounts)
        argv = [*self.images.get(c.image, [c.image]), *(c.command or []), *(c.args or [])]
        cwd = self._remap(c.working_dir or "/", mounts)
        cwd_path = Path(cwd) if Path(cwd).is_dir() else pod_dir
        pod_dir.mkdir(parents=True, exist_ok=True)
        with open(pod_dir / "container.log", "ab") as log:
            process = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd_path,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = _now()
        self.containers[meta.uid] = Container(process, meta.uid, meta.name, started, downward=downward)
        self.started_pods.append(meta.name)
        self._patch_status(
            pod,
            {
                "phase": "Running",
                "startTime": started,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}],
                "containerStatuses": [
                    {
                        "name": c.name,
                        "image": c.image,
                        "imageID": f"local://{c.image}",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": started}},
                    }
                ],
            },
        )

    @staticmethod
    def _project(pod: Any, downward: Mapping[str, Path]) -> None:
        """Write the pod's downward-API volumes (annotations and labels only), changed files only."""
        for volume in pod.spec.volumes or []:
            if volume.name not in downward:
                continue
            for item in volume.downward_api.items or []:
                found = _FIELD.fullmatch(item.field_ref.field_path if item.field_ref else "")
                if found is None:
                    raise ValueError(f"unsupported downward-API field in volume {volume.name}")
                values = (pod.metadata.annotations if found["kind"] == "annotations" else pod.metadata.labels) or {}
                value = values.get(found["key"], "")
                target = downward[volume.name] / item.path
                if not target.exists() or target.read_text() != value:
                    partial = target.with_name(f".{item.path}.tmp")
                    partial.write_text(value)
                    partial.replace(target)

    def _value(self, namespace: str, var: Any) -> str:
        if var.value_from is None:
            return var.value or ""
        source = var.value_from
        if source.secret_key_ref is not None:
            ref = source.secret_key_ref
            secret = self.core.read_namespaced_secret(ref.name, namespace)
            import base64

            return base64.b64decode((secret.data or {})[ref.key]).decode()
        if source.config_map_key_ref is not None:
            ref = source.config_map_key_ref
            return str((self.core.read_namespaced_config_map(ref.name, namespace).data or {})[ref.key])
        raise ValueError(f"unsupported valueFrom for {var.name}")

    @staticmethod
    def _remap(value: str, mounts: Mapping[str, Path]) -> str:
        for path, local in sorted(mounts.items(), key=lambda item: -len(item[0])):
            if value == path or value.startswith(path + "/"):
                return str(local) + value[len(path) :]
        return value

    def _report_exit(self, pod: Any, container: Container, code: int) -> None:
        container.reported_exit = True
        c = pod.spec.containers[0]
        finished = _now()
        self._patch_status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": finished}],
                "containerStatuses": [
                    {
                        "name": c.name,
                        "image": c.image,
                        "imageID": f"local://{c.image}",
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "startedAt": container.started,
                                "finishedAt": finished,
                                "reason": "Completed" if code == 0 else "Error",
                            }
                        },
                    }
                ],
            },
        )

    def _finish_deletion(self, pod: Any, container: Container | None) -> None:
        if container is not None and container.process.poll() is None:
            self._kill(container.process)
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod.metadata.uid)
                ),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _patch_status(self, pod: Any, status: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    @staticmethod
    def _kill(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 10.0) -> None:
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        except ProcessLookupError:
            pass


RUNNER_IMAGE = "sandbox-controller-runner:test"
ENTRYPOINT = Path(__file__).resolve().parents[2] / "runner_image" / "entrypoint.sh"


def runner_kubelet(
    api_client: client.ApiClient, namespaces: Sequence[str], work_root: Path, codex: str, node_name: str = "test-node"
) -> TestKubelet:
    """A kubelet on which the runner image is the real entrypoint with the npm-installed codex
    (registration retries kept short for tests)."""
    return TestKubelet(
        api_client,
        namespaces=namespaces,
        images={RUNNER_IMAGE: ["bash", str(ENTRYPOINT)]},
        work_root=work_root,
        image_env={"CODEX_BIN": codex, "RETRY_INITIAL_SECONDS": "0.5", "RETRY_MAX_SECONDS": "2"},
        node_name=node_name,
    )


def create_executor_key_secret(core: client.CoreV1Api, namespace: str, key: str, name: str) -> None:
    """The Secret sandbox pods read CODEX_API_KEY from (key ``executor-key``)."""
    import base64

    core.create_namespaced_secret(
        namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=name),
            data={"executor-key": base64.b64encode(key.encode()).decode()},
        ),
    )
