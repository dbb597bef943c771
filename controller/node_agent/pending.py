"""Which checkpoint request the agent serves next, and its answer (pure).

The agent serves only **managed** sandbox pods (the controller's selector labels) of the sandbox
namespace **bound to its node** that carry a request with no answer (``checkpoints.pending_request``),
one at a time, oldest first. A pod being deleted is left alone: its worker gave up waiting.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.objects import Pod

REASON_LIMIT = 500
"""The most characters of a reason (the kubelet's body, ctr's stderr) an answer carries."""


def managed(pod: Pod) -> bool:
    return all(pod.labels.get(key) == value for key, value in names.selector_labels().items())


def next_request(pods: Iterable[Pod], node: str) -> tuple[Pod, str] | None:
    """The pod to checkpoint next and its request; None when none asks."""
    asking = [
        (pod, request)
        for pod in pods
        if managed(pod)
        and pod.node_name == node
        and not pod.deleting
        and (request := checkpoints.pending_request(pod.annotations)) is not None
    ]
    asking.sort(key=lambda found: (found[0].created_at, found[0].name))
    return asking[0] if asking else None


def trimmed(text: str, limit: int = REASON_LIMIT) -> str:
    """One line of at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def taken(request: str, image: str, size_bytes: int, seconds: float) -> str:
    """The answer to ``request``: the checkpoint image ``image``."""
    return checkpoints.Answer(request=request, image=image, size_bytes=size_bytes, seconds=round(seconds, 3)).encode()


def failed(request: str, why: str) -> str:
    """The answer to ``request``: no checkpoint, and why."""
    return checkpoints.Answer(request=request, error=trimmed(why) or "failed").encode()


def answer_patch(pod: Pod, answer: str) -> list[dict[str, str]]:
    """A JSON patch setting the answer on ``pod``, guarded by its uid (never on a newer pod of
    the same name)."""
    key = checkpoints.CHECKPOINT_ANSWER.replace("~", "~0").replace("/", "~1")
    return [
        {"op": "test", "path": "/metadata/uid", "value": pod.uid},
        {"op": "add", "path": f"/metadata/annotations/{key}", "value": answer},
    ]
