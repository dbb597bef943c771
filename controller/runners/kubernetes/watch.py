"""A watch on the sandbox pods: the sessions whose pod changed in a way that matters.

One thread lists the pods the runner manages (its label selector, in the sandbox namespace)
once, then watches them from the list's resource version. The server closes each watch after
``timeout_seconds`` (so a silently dead connection cannot hold it forever) and the watch
resumes from the last resource version it saw (bookmarks keep that fresh), so no event is
missed across the cycle. When that version has expired (HTTP 410 Gone), it lists again and
compares the list with what it knew (``sandbox_changes.look_again_after_list``): a pod deleted
while it was away is still noticed. Any other error (the API server away, 5xx, a connection
reset) is retried with a bounded, jittered backoff, resuming where it stopped. The list and
the stream go through ``api.KubeApi`` (the one door; its errors, translated there, are logged
here: a missing permission names the grant it needs).

Each pod seen becomes a ``Sighting``; ``sandbox_changes.look_again`` decides whether the change
matters (deleted, failed, a container terminated or restarted, became Ready), and if it does
the session id is handed to ``notify``. The watch decides nothing else and touches nothing: the
scheduler wants work on each notified session and enqueues it like a sweep would.

``live()`` says whether the watch is currently established (listed, and its last request
succeeded); the scheduler's partial sweeps rely on it only then.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from controller import logs
from controller.errors import ControllerError
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import Expired, KubeApi, PodStream
from controller.runners.kubernetes.objects import Pod
from controller.sandbox_changes import Sighting, look_again, look_again_after_list

log = logs.get(__name__)
TIMEOUT_SECONDS = 300
"""The server closes each watch after this; the next one resumes from the last resource version."""
LIST_TIMEOUT_SECONDS = 120
"""A list that has not answered after this is given up and tried again."""
BACKOFF_SECONDS = (0.5, 30.0)
"""First and longest wait before retrying after an error (doubling, with jitter)."""


def sighting(pod: Pod) -> Sighting:
    """What ``sandbox_changes`` needs to know about a pod."""
    return Sighting(pod.session_id, pod.uid, pod.health, ready=pod.ready, restarts=pod.restarts)


class PodWatch:
    """The watch on sandbox pods in ``namespace``; ``start`` runs it in a thread."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        timeout_seconds: int = TIMEOUT_SECONDS,
        backoff_seconds: tuple[float, float] = BACKOFF_SECONDS,
    ) -> None:
        self._kube = kube
        self._ns = namespace
        self._timeout = timeout_seconds
        self._backoff = backoff_seconds
        self.known: dict[str, Sighting] = {}
        """The last sighting of every pod, by uid (what a new list is compared with)."""
        self.resource_version: str | None = None
        """Where the next watch resumes; None: list first."""
        self.lists = 0
        self.streams = 0
        """Lists and watch requests made (how often it had to list again, and cycled)."""
        self._live = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: PodStream | None = None

    # -- the scheduler's side -------------------------------------------------------------

    def start(self, notify: Callable[[str], None]) -> None:
        """Watch in a daemon thread, handing each session whose pod changed to ``notify``."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, args=(notify,), name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching (the open request is cut, not waited for) and wait for the thread."""
        self._stop.set()
        thread, waited = self._thread, 0.0
        while thread is not None and thread.is_alive() and waited < timeout:
            current = self._current
            if current is not None:
                current.stop()  # again each time: the request may not have been open yet
            thread.join(0.2)
            waited += 0.2
        self._thread = None
        self._live.clear()

    def live(self) -> bool:
        return self._live.is_set()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, notify: Callable[[str], None]) -> None:
        log.info("pod watch started", extra={"namespace": self._ns})
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    if self.resource_version is None:
                        self._list(notify)
                    self._watch(notify)
                    failures = 0
                except Expired:
                    log.info("pod watch expired; listing the pods again", extra={"namespace": self._ns})
                    self.resource_version = None
                    continue
                except (ControllerError, ValueError) as exc:  # refused, unreachable, or a garbled answer
                    if self._stop.is_set():
                        break  # ``stop`` cut the connection
                    failures += 1
                    self._failed(failures, str(exc) or type(exc).__name__)
                except Exception as exc:  # a bug: say so, keep watching
                    if self._stop.is_set():
                        break
                    failures += 1
                    log.exception("pod watch failed unexpectedly", extra={"error_type": type(exc).__name__})
                    self._failed(failures, type(exc).__name__)
        finally:
            self._live.clear()  # nobody watches now: partial sweeps must not count on it
        log.info("pod watch stopped", extra={"namespace": self._ns})

    def _list(self, notify: Callable[[str], None]) -> None:
        pods, version = self._kube.list_pods_at(self._ns, names.managed_selector(), LIST_TIMEOUT_SECONDS)
        self.lists += 1
        listed = [sighting(pod) for pod in pods]
        changed = look_again_after_list(self.known, listed)
        self.known = {s.uid: s for s in listed}
        self.resource_version = version
        self._live.set()
        if self.lists > 1 or changed:
            log.info(
                "pod watch listed the pods", extra={"namespace": self._ns, "pods": len(listed), "changed": len(changed)}
            )
        for session_id in changed:
            notify(session_id)

    def _watch(self, notify: Callable[[str], None]) -> None:
        current = self._kube.watch_pods(self._ns, names.managed_selector(), self.resource_version, self._timeout)
        self._current = current
        if self._stop.is_set():
            return
        self.streams += 1
        try:
            for kind, pod in current:
                self._live.set()
                if pod is not None:  # None: a bookmark, which only moves the resource version
                    self._observe(kind, pod, notify)
                if current.resource_version:
                    self.resource_version = current.resource_version
                if self._stop.is_set():
                    break
        finally:
            self._current = None
        self._live.set()  # the server closed the watch as asked: resume from resource_version

    def _observe(self, kind: str, pod: Pod, notify: Callable[[str], None]) -> None:
        now = sighting(pod)
        before = self.known.get(now.uid)
        if kind == "DELETED":
            self.known.pop(now.uid, None)
            session_id = look_again(before or now, None)
        else:
            self.known[now.uid] = now
            session_id = look_again(before, now)
        if session_id:
            log.info(
                "sandbox changed; its session is looked at again",
                extra={"session_id": session_id, "pod": pod.name, "event": kind, "health": now.health.value},
            )
            notify(session_id)

    def _failed(self, failures: int, reason: str) -> None:
        self._live.clear()
        first, longest = self._backoff
        wait = min(longest, first * 2 ** (failures - 1)) * random.uniform(0.5, 1.0)
        log.warning(
            "pod watch failed; retrying",
            extra={"namespace": self._ns, "reason": reason, "retry_in_seconds": round(wait, 2), "failures": failures},
        )
        self._stop.wait(wait)
