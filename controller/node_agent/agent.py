"""The node agent's loop: serve its node's checkpoint requests one at a time, then collect
what nothing names any more (``controller.node_agent``'s docstring).

Every look at the API server, the kubelet and containerd may fail: a failed step is logged and
the loop goes on after a short back-off (doubling up to ``MAX_BACKOFF_SECONDS``). SIGTERM (and
SIGINT) end it between steps: a checkpoint in progress finishes and is answered first.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from controller import logs
from controller.config import NodeAgentSettings
from controller.errors import ControllerError
from controller.node_agent import archives, collection, pending
from controller.node_agent.containerd import Containerd, CtrFailed
from controller.node_agent.images import write_checkpoint_image
from controller.node_agent.kubelet import Kubelet
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.api import KubeApi, connect
from controller.runners.kubernetes.objects import Pod

log = logs.get(__name__)
MAX_BACKOFF_SECONDS = 30.0
MAX_COLLECT_INTERVAL_SECONDS = 30.0


def backoff(poll_seconds: float, failures: int) -> float:
    """How long the loop waits after ``failures`` failed steps in a row (0: the poll)."""
    return min(poll_seconds * 2 ** min(failures, 10), MAX_BACKOFF_SECONDS) if failures else poll_seconds


class Agent:
    def __init__(
        self,
        settings: NodeAgentSettings,
        namespace: str,
        kube: KubeApi,
        kubelet: Kubelet,
        containerd: Containerd,
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._namespace = namespace
        self._kube = kube
        self._kubelet = kubelet
        self._containerd = containerd
        self._stop = stop
        self._clock = clock
        self._directory = Path(settings.checkpoint_directory)
        self._unnamed: collection.Unnamed = {}
        self._collected_at = float("-inf")
        self._unsent: dict[tuple[str, str], str] = {}
        """Answers taken but not yet on their pod (the patch failed): (pod uid, request) → answer."""

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                busy = self.step()
                failures = 0
            except (ControllerError, OSError, CtrFailed) as exc:
                failures += 1
                busy = False
                log.warning(
                    "node agent step failed",
                    extra={"reason": pending.trimmed(str(exc), 300), "error": type(exc).__name__, "failures": failures},
                )
            if not busy:
                self._stop.wait(backoff(self._settings.poll_seconds, failures))

    def step(self) -> bool:
        """One look: serve the next request (True: look again at once), else collect when due."""
        pods = self._kube.list_pods(self._namespace, names.managed_selector(), self._settings.node_name)
        uids = {pod.uid for pod in pods}
        self._unsent = {key: answer for key, answer in self._unsent.items() if key[0] in uids}
        found = pending.next_request(pods, self._settings.node_name)
        if found is not None:
            self.serve(*found)
            return True
        interval = min(self._settings.image_grace_seconds / 2, MAX_COLLECT_INTERVAL_SECONDS)
        if self._clock() - self._collected_at >= interval:
            self.collect()
            self._collected_at = self._clock()
        return False

    # -- a checkpoint ---------------------------------------------------------------------

    def serve(self, pod: Pod, request: str) -> None:
        """Checkpoint ``pod`` for ``request`` and put the answer on it."""
        answer = self._unsent.get((pod.uid, request))
        if answer is None:
            answer = self._checkpoint(pod, request)
            self._unsent[(pod.uid, request)] = answer
        # Raises when the API server cannot be reached: the answer is kept and sent at the next look.
        if self._kube.patch_pod_if(self._namespace, pod.name, pending.answer_patch(pod, answer)) is None:
            log.info("checkpoint answer not delivered: the pod is gone", extra={"pod": pod.name})
        del self._unsent[(pod.uid, request)]

    def _checkpoint(self, pod: Pod, request: str) -> str:
        started = time.monotonic()
        try:
            image, size = self._take(pod)
        except _Failed as exc:
            log.warning("checkpoint failed", extra={"session_id": pod.session_id, "pod": pod.name, "reason": exc.why})
            return pending.failed(request, exc.why)
        seconds = time.monotonic() - started
        log.info(
            "checkpoint taken",
            extra={
                "session_id": pod.session_id,
                "pod": pod.name,
                "image": image,
                "size_bytes": size,
                "seconds": round(seconds, 3),
            },
        )
        return pending.taken(request, image, size, seconds)

    def _take(self, pod: Pod) -> tuple[str, int]:
        """The checkpoint image of ``pod`` and its size; ``_Failed`` with the reason. The
        kubelet's archive and the OCI archive are removed whatever happens."""
        if not pod.workspace_claim:
            raise _Failed("the pod has no workspace claim (its 'workspace' volume names none)")
        image = checkpoints.image_ref(self._namespace, pod.workspace_claim, pod.uid)
        try:
            status, body = self._kubelet.checkpoint(self._namespace, pod.name, checkpoints.CONTAINER)
        except OSError as exc:
            raise _Failed(f"cannot reach the kubelet: {exc}") from exc
        if status != 200:
            raise _Failed(f"the kubelet answered {status}: {body}")
        try:
            archive = archives.archive_path(self._directory, body, pod.name, self._namespace, checkpoints.CONTAINER)
        except archives.ArchiveRefused as exc:
            raise _Failed(str(exc)) from exc
        oci = archives.oci_path(archive)
        try:
            size = archive.stat().st_size
            write_checkpoint_image(archive, oci, image, checkpoints.CONTAINER)
            self._containerd.import_image(str(oci), image)
        except OSError as exc:
            raise _Failed(f"cannot make the checkpoint image: {exc}") from exc
        except CtrFailed as exc:
            raise _Failed(str(exc)) from exc
        finally:
            for path in (oci, archive):
                path.unlink(missing_ok=True)
        return image, size

    # -- collection -----------------------------------------------------------------------

    def collect(self) -> None:
        """Delete the checkpoint images nothing names (``collection``), and the archives a
        crashed agent left."""
        # Only this sandbox namespace's images: another release's agent on the node keeps its own.
        images = [i for i in self._containerd.images() if checkpoints.image_namespace(i) == self._namespace]
        # Pods first, then claims. The worker writes a suspension's record on its claim only
        # after this agent's answer is on the pod, and deletes the pod only after that: an image
        # the pod's answer named when the pods were listed is named by the claim's record when
        # the claims are listed after them (or the pod list still has the pod). Listed the other
        # way round, a claim read before its record and a pod list read after the pod's deletion
        # would both miss it. (A restore moves the name the other way, record to pod: the grace
        # between two looks covers that.) Every pod of the namespace counts, managed or not.
        pods = self._kube.list_pods(self._namespace, "")
        claims = self._kube.list_claims(self._namespace, "")
        now = self._clock()
        decided = collection.sweep(
            images, collection.named_images(pods, claims), self._unnamed, now, self._settings.image_grace_seconds
        )
        kept = dict(decided.unnamed)
        for image in decided.delete:
            try:
                self._containerd.remove(image)
            except CtrFailed as exc:
                kept[image] = self._unnamed.get(image, now)  # tried again at the next look
                log.warning("checkpoint image not deleted", extra={"image": image, "reason": pending.trimmed(str(exc))})
                continue
            log.info(
                "checkpoint image deleted",
                extra={"image": image, "why": f"nothing named it for {self._settings.image_grace_seconds:g}s"},
            )
        self._unnamed = kept
        self._remove_strays(now)

    def _remove_strays(self, now: float) -> None:
        files = []
        with os.scandir(self._directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    files.append((entry.name, entry.stat(follow_symlinks=False).st_mtime))
        grace = self._settings.image_grace_seconds
        for name in archives.strays(files, self._namespace, checkpoints.CONTAINER, now, grace):
            (self._directory / name).unlink(missing_ok=True)
            log.info("checkpoint archive removed", extra={"file": name, "why": "left by an agent that stopped"})


class _Failed(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = pending.trimmed(why)


def run(settings: NodeAgentSettings, namespace: str) -> int:
    """``sandbox-controller node-agent``: the loop until SIGTERM or SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop.set())
    kube = connect("the node agent", grantee="the node agent's service account")
    agent = Agent(
        settings,
        namespace,
        kube,
        Kubelet(settings.kubelet_url, settings.kubelet_ca_file, settings.kubelet_token_file),
        Containerd(settings.ctr, settings.containerd_address),
        stop,
    )
    log.info(
        "node agent started",
        extra={"node": settings.node_name, "namespace": namespace, "kubelet": settings.kubelet_url},
    )
    agent.run()
    log.info("node agent stopped", extra={"node": settings.node_name})
    return 0
