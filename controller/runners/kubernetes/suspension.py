"""Suspending a sandbox pod with its memory, and choosing whether its session's next pod is
restored (a template's ``suspend: checkpoint``; the protocol is ``checkpoints``).

``take`` asks the node agent of the pod's node for a checkpoint (an annotation on the pod) and
waits, bounded, for its answer; ``keep`` writes the suspension's record on the session's claim
once the pod is gone. ``restore_for`` reads that record at the session's next start and decides
(``checkpoints.restore_choice``): a restore is marked on the record with its generation before
its pod is created; a record that cannot be restored (tried already, another environment, past
the maximum lifetime) is dropped, logged and counted as a fresh start on the same workspace.
``settle`` drops the record once its restored pod is seen running: the restore took, and a later
start of the session is an ordinary one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from controller import logs
from controller.model import Handle, SandboxSpec
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.objects import Pod

log = logs.get(__name__)
POLL_SECONDS = 0.2
"""How often a worker reads the pod while it waits for the agent's answer."""
_SETTLED_KEPT = 10000
"""Restored pods whose record this process dropped already (each is read once)."""


class Suspensions:
    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        timeout_seconds: float,
        max_lifetime_seconds: float | None,
        on_resume: Callable[[str], None],
    ) -> None:
        """``on_resume`` is told ``restored`` or ``fresh_start`` for each start of a session
        that had a checkpoint (``controller_sandbox_resumes_total``)."""
        self._kube = kube
        self._ns = namespace
        self._timeout = timeout_seconds
        self._max_lifetime = max_lifetime_seconds
        self._on_resume = on_resume
        self._settled: set[str] = set()

    # -- suspend ---------------------------------------------------------------------------

    def take(self, handle: Handle, pod: Pod) -> checkpoints.Record | None:
        """Have the pod's node agent checkpoint it; the record to keep once the pod is deleted,
        or None (logged) when there is no checkpoint: the agent refused or failed, did not
        answer within the timeout, or the pod went meanwhile."""
        where = {"session_id": handle.session_id, "pod": pod.name, "node": pod.node_name}
        request = uuid.uuid4().hex
        if self._kube.patch_pod_if(self._ns, pod.name, checkpoints.request_patch(pod.uid, request)) is None:
            log.warning("checkpoint failed, sandbox stopped instead", extra={**where, "reason": "the pod went"})
            return None
        answer = self._answer(pod.name, request)
        if answer is None or not answer.ok:
            reason = answer.error if answer is not None else self._silence(pod)
            log.warning("checkpoint failed, sandbox stopped instead", extra={**where, "reason": reason[:500]})
            return None
        log.info(
            "checkpoint taken",
            extra={**where, "image": answer.image, "size_bytes": answer.size_bytes, "seconds": answer.seconds},
        )
        return checkpoints.Record(
            image=answer.image,
            node=pod.node_name,
            environment_id=handle.environment_id,
            suspended_at=time.time(),
            lineage_started_at=handle.lineage_started_at or handle.created_at or time.time(),
            size_bytes=answer.size_bytes,
        )

    def _answer(self, name: str, request: str) -> checkpoints.Answer | None:
        deadline = time.monotonic() + self._timeout
        while True:
            pod = self._kube.read_pod(self._ns, name)
            if pod is None:
                return checkpoints.Answer(request, error="the pod went before the agent answered")
            answer = checkpoints.answer_of(pod.annotations, request)
            if answer is not None:
                return answer
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_SECONDS)

    def _silence(self, pod: Pod) -> str:
        return (
            f"no answer from the node agent of node {pod.node_name or '(none)'} within {self._timeout:g}s "
            "(is sandbox.checkpoints enabled, and its pod running on that node?)"
        )

    def keep(self, session_id: str, record: checkpoints.Record) -> None:
        """Write the record on the session's claim (the pod is gone by now); when that fails the
        image is unnamed and its agent deletes it, and the next start is fresh."""
        if not self._kube.patch_claim_if(self._ns, names.pvc_name(session_id), checkpoints.record_patch(record)):
            log.warning("checkpoint not recorded: the workspace claim is gone", extra={"session_id": session_id})
            return
        log.info(
            "sandbox suspended",
            extra={
                "session_id": session_id,
                "image": record.image,
                "node": record.node,
                "size_bytes": record.size_bytes,
            },
        )

    # -- restore ---------------------------------------------------------------------------

    def restore_for(self, spec: SandboxSpec, generation: int) -> checkpoints.Record | None:
        """The record the pod of ``generation`` is restored from (marked with that generation),
        or None: the session has none, or it cannot be restored (then it is dropped, and the
        fresh start logged and counted)."""
        path = names.pvc_name(spec.session_id)
        claim = self._kube.read_claim(self._ns, path)
        if claim is None or claim.deleting:
            return None
        found = claim.annotations.get(checkpoints.CHECKPOINT_RECORD, "")
        if not found:
            return None
        record = checkpoints.record_of(claim.annotations)
        restore, why = checkpoints.restore_choice(
            record, generation, spec.environment_id, time.time(), self._max_lifetime
        )
        if restore and record is not None:
            if record.restore_generation != generation and not self._kube.patch_claim_if(
                self._ns, path, checkpoints.mark_patch(found, record, generation)
            ):
                return None  # the record changed since it was read (a rival's start): none is restored twice
            return record
        self._kube.patch_claim_if(self._ns, path, checkpoints.drop_patch(found))
        log.warning(
            "restore impossible, starting a fresh executor",
            extra={
                "session_id": spec.session_id,
                "generation": generation,
                "reason": why or "the record cannot be read",
            },
        )
        self._on_resume("fresh_start")
        return None

    def restored(self, pod: Pod, record: checkpoints.Record) -> None:
        """A pod was created from the record (``placement``): logged and counted."""
        log.info(
            "sandbox restored",
            extra={
                "session_id": pod.session_id,
                "pod": pod.name,
                "image": record.image,
                "node": record.node,
                "suspended_seconds": round(max(0.0, time.time() - record.suspended_at), 1),
            },
        )
        self._on_resume("restored")

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint not yet restored from: ``size_bytes`` and ``suspended_at``."""
        claim = self._kube.read_claim(self._ns, names.pvc_name(session_id))
        record = None if claim is None else checkpoints.record_of(claim.annotations)
        if record is None or record.restore_generation is not None:
            return None
        return {"size_bytes": float(record.size_bytes), "suspended_at": record.suspended_at}

    def settle(self, pod: Pod) -> None:
        """A restored pod seen running: its restore took, so its record is dropped (a later
        start of the session is then an ordinary one, not a restore that failed). Once per pod
        in this process."""
        if pod.uid in self._settled:
            return
        path = names.pvc_name(pod.session_id)
        claim = self._kube.read_claim(self._ns, path)
        record = None if claim is None else checkpoints.record_of(claim.annotations)
        if claim is not None and record is not None and record.restore_generation == pod.generation:
            self._kube.patch_claim_if(
                self._ns, path, checkpoints.drop_patch(claim.annotations[checkpoints.CHECKPOINT_RECORD])
            )
        self._settled.add(pod.uid)
        while len(self._settled) > _SETTLED_KEPT:
            self._settled.pop()
