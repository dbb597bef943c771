"""Suspend with memory on Kubernetes (a template's ``suspend: checkpoint``): what the controller
and the node agent (``controller.node_agent``, a DaemonSet on the sandbox nodes) say to each
other, through annotations on the objects they already share, and the record a suspension
leaves on the session's workspace claim. Pure values and parsing; no I/O.

**The request** (the worker, at an idle stop): the pod gets ``CHECKPOINT_REQUEST`` = a fresh
nonce. **The answer** (the agent of the pod's node): ``CHECKPOINT_ANSWER`` = JSON
``{"request": nonce, "image": ref, "size_bytes": n, "seconds": s}``, or ``{"request": nonce,
"error": why}``. The agent asks its kubelet for the checkpoint archive, makes it a checkpoint
image named ``image_ref`` in the node's containerd and removes the archive. The worker then
deletes the pod and writes the **record** on the claim (``CHECKPOINT_RECORD``, JSON of
``Record``). An answer that never comes (``CONTROLLER_KUBERNETES_CHECKPOINT_TIMEOUT_SECONDS``)
or an error is a plain stop: the pod is deleted, nothing is recorded.

**The restore** (the next ``ensure``): a pod named by the session and generation as always,
pinned to the record's node, whose image is the checkpoint image (``imagePullPolicy: Never``),
annotated ``RESTORED_FROM`` and ``LINEAGE_STARTED_AT`` (the lifetime goes on). Before it is
created, the record is marked with that generation (``restore_generation``): a later generation
finding the mark knows the restore did not take (the restored pod failed or vanished), and
starts afresh on the same workspace instead (``restore_choice``).

**The images** (``image_ref``): ``localhost/sandbox-checkpoint/<namespace>/<claim>:<pod uid
prefix>``; only the agent of the sandbox namespace creates and deletes them (another release's
agent on the same node leaves them alone: it collects only its own namespace's). It deletes one
that nothing names (no record, no pod's answer, no pod's image) at two looks in a row at least
``IMAGE_GRACE_SECONDS`` apart, so a record being written or a restore being created never loses
its image; a session's images are gone once its claim is.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from controller.runners.kubernetes import names

CHECKPOINT_REQUEST = f"{names.PREFIX}/checkpoint-request"
CHECKPOINT_ANSWER = f"{names.PREFIX}/checkpoint-answer"
CHECKPOINT_RECORD = f"{names.PREFIX}/checkpoint"
RESTORED_FROM = f"{names.PREFIX}/restored-from"
LINEAGE_STARTED_AT = f"{names.PREFIX}/lineage-started-at"
IMAGE_REPOSITORY = "localhost/sandbox-checkpoint"
"""Every checkpoint image's repository prefix: the agent only ever deletes images under it, and
the sandbox pod policy lets a pod name one only with its own session's claim."""
IMAGE_GRACE_SECONDS = 60.0
CONTAINER = names.CONTAINER
"""The container the kubelet checkpoints: the sandbox's one."""
RESTORE_FAILURES = frozenset(
    {"CreateContainerError", "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "RunContainerError",
     "InvalidImageName", "CrashLoopBackOff"}
)  # fmt: skip
"""Why a restored pod's container waits when the restore did not take (containerd refused the
checkpoint, the image is gone from the node): such a pod has failed."""

_IMAGE = re.compile(
    r"^localhost/sandbox-checkpoint/([a-z0-9][a-z0-9-]{0,62})/([a-z0-9][a-z0-9.-]{0,252}):([a-z0-9]{1,64})$"
)


def image_ref(namespace: str, claim: str, pod_uid: str) -> str:
    """The checkpoint image of the pod ``pod_uid`` of ``namespace`` whose workspace is ``claim``."""
    tag = re.sub(r"[^a-z0-9]", "", pod_uid.lower())[:12] or "0"
    return f"{IMAGE_REPOSITORY}/{namespace}/{claim}:{tag}"


def image_claim(ref: str) -> str | None:
    """The claim a checkpoint image belongs to; None when ``ref`` is no checkpoint image's."""
    found = _IMAGE.match(ref)
    return found.group(2) if found else None


def image_namespace(ref: str) -> str | None:
    """The sandbox namespace a checkpoint image belongs to; None when ``ref`` is no checkpoint image's."""
    found = _IMAGE.match(ref)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Answer:
    request: str
    image: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.image)

    def encode(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in ("", 0, 0.0)}, sort_keys=True)


def answer_of(annotations: dict[str, str], request: str) -> Answer | None:
    """The agent's answer to ``request`` on a pod; None while there is none (or it answers another)."""
    raw = annotations.get(CHECKPOINT_ANSWER)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        found = Answer(
            request=str(data["request"]),
            image=str(data.get("image", "")),
            size_bytes=int(data.get("size_bytes", 0)),
            seconds=float(data.get("seconds", 0.0)),
            error=str(data.get("error", "")),
        )
    except (ValueError, KeyError, TypeError):
        return Answer(request=request, error=f"unreadable answer: {raw[:200]!r}")
    return found if found.request == request else None


def pending_request(annotations: dict[str, str]) -> str | None:
    """The request on a pod that has no answer yet (what the agent does next); None: nothing asked."""
    request = annotations.get(CHECKPOINT_REQUEST)
    if not request:
        return None
    return request if answer_of(annotations, request) is None else None


@dataclass(frozen=True)
class Record:
    """A suspension, on the session's workspace claim."""

    image: str
    node: str
    environment_id: str
    suspended_at: float
    lineage_started_at: float
    size_bytes: int = 0
    restore_generation: int | None = None
    """The generation whose pod was created from it (None: not yet)."""

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def record_of(annotations: dict[str, str]) -> Record | None:
    """The claim's record; None when there is none, or it cannot be read (then nothing is restored)."""
    raw = annotations.get(CHECKPOINT_RECORD)
    if not raw:
        return None
    try:
        data: dict[str, Any] = json.loads(raw)
        generation = data.get("restore_generation")
        return Record(
            image=str(data["image"]),
            node=str(data["node"]),
            environment_id=str(data["environment_id"]),
            suspended_at=float(data["suspended_at"]),
            lineage_started_at=float(data["lineage_started_at"]),
            size_bytes=int(data.get("size_bytes", 0)),
            restore_generation=None if generation is None else int(generation),
        )
    except (ValueError, KeyError, TypeError):
        return None


def restore_choice(
    record: Record | None, generation: int, environment_id: str, now: float, max_lifetime_seconds: float | None
) -> tuple[bool, str]:
    """Whether the pod of ``generation`` is restored from ``record`` (True, "") or starts afresh
    (False, why; "" when there is no record at all). A restore is tried once: a record already
    tried by an earlier generation did not take."""
    if record is None:
        return False, ""
    if record.restore_generation is not None and record.restore_generation < generation:
        return False, f"the restore into generation {record.restore_generation} did not take"
    if record.environment_id != environment_id:
        return False, "the checkpoint is of another environment"
    if image_claim(record.image) is None:
        return False, f"the record names no checkpoint image ({record.image[:100]!r})"
    if max_lifetime_seconds and now - record.lineage_started_at >= max_lifetime_seconds:
        return False, (
            f"its lineage started {now - record.lineage_started_at:.0f}s ago, past the maximum lifetime "
            f"({max_lifetime_seconds:g}s): a fresh sandbox starts its own"
        )
    return True, ""


def restore_failed(waiting: tuple[str, str] | None, phase: str | None) -> bool:
    """Whether a restored pod shows that its restore did not take."""
    return phase == "Failed" or (waiting is not None and waiting[0] in RESTORE_FAILURES)


def _pointer(key: str) -> str:
    """The JSON pointer of an annotation (``~`` and ``/`` escaped)."""
    return f"/metadata/annotations/{key.replace('~', '~0').replace('/', '~1')}"


def request_patch(pod_uid: str, request: str) -> list[dict[str, Any]]:
    """The JSON patch that asks for a checkpoint of exactly the pod ``pod_uid``."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": pod_uid},
        {"op": "add", "path": _pointer(CHECKPOINT_REQUEST), "value": request},
    ]


def answer_patch(pod_uid: str, answer: Answer) -> list[dict[str, Any]]:
    """The JSON patch of the agent's answer, on exactly the pod ``pod_uid``."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": pod_uid},
        {"op": "add", "path": _pointer(CHECKPOINT_ANSWER), "value": answer.encode()},
    ]


def record_patch(record: Record) -> list[dict[str, Any]]:
    """The JSON patch that writes a suspension's record on the claim (over any earlier one)."""
    return [{"op": "add", "path": _pointer(CHECKPOINT_RECORD), "value": record.encode()}]


def mark_patch(found: str, record: Record, generation: int) -> list[dict[str, Any]]:
    """The JSON patch that marks the record (as read: ``found``) with the generation restored from
    it; it fails when the record changed since it was read."""
    marked = Record(**{**asdict(record), "restore_generation": generation})
    return [
        {"op": "test", "path": _pointer(CHECKPOINT_RECORD), "value": found},
        {"op": "add", "path": _pointer(CHECKPOINT_RECORD), "value": marked.encode()},
    ]


def drop_patch(found: str) -> list[dict[str, Any]]:
    """The JSON patch that removes the record (as read: ``found``), once it is spent."""
    return [
        {"op": "test", "path": _pointer(CHECKPOINT_RECORD), "value": found},
        {"op": "remove", "path": _pointer(CHECKPOINT_RECORD)},
    ]
