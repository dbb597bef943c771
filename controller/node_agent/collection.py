"""Which checkpoint images the agent deletes (pure): the rule of ``checkpoints``' docstring.

An image is **named** while a workspace claim's record names it (a suspension waiting for its
restore), a pod's answer names it (a suspension whose record is being written), or a pod's
container names it as its image (a restore). The agent deletes only images under
``checkpoints.IMAGE_REPOSITORY`` of its own sandbox namespace (no other image of the node is its,
nor another release's checkpoints), and one of those only once
it was unnamed at every look over at least the grace: the first look that finds it unnamed
starts its clock (``Unnamed``), a look that finds it named again stops it, and a look at least
the grace later that still finds it unnamed deletes it. So a record being written or a restore
being created, each of which moves the name from one object to another, never loses its image.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.runners.kubernetes import checkpoints
from controller.runners.kubernetes.objects import Claim, Pod

Unnamed = Mapping[str, float]
"""Each checkpoint image unnamed at every look since, with the time of the first of those looks."""


def named_images(pods: Iterable[Pod], claims: Iterable[Claim]) -> set[str]:
    """Every image a claim's record, a pod's answer or a pod's container names."""
    named: set[str] = set()
    for claim in claims:
        record = checkpoints.record_of(claim.annotations)
        if record is not None:
            named.add(record.image)
    for pod in pods:
        named.update(pod.images)
        answer = _answer_image(pod.annotations.get(checkpoints.CHECKPOINT_ANSWER, ""))
        if answer:
            named.add(answer)
    return named


def _answer_image(raw: str) -> str:
    """The image a pod's answer names, whichever request it answers ("" for none, unreadable)."""
    try:
        found = json.loads(raw) if raw else {}
    except ValueError:
        return ""
    return str(found.get("image") or "") if isinstance(found, dict) else ""


@dataclass(frozen=True)
class Sweep:
    delete: tuple[str, ...]
    """The images to delete now."""
    unnamed: dict[str, float]
    """The images unnamed at this look and kept, for the next look (``Unnamed``)."""


def sweep(images: Iterable[str], named: set[str], unnamed: Unnamed, now: float, grace_seconds: float) -> Sweep:
    """This look's decision on the node's ``images``: delete the checkpoint images nothing
    ``named`` at any look since one at least ``grace_seconds`` before ``now`` (``unnamed``,
    from the last look); start the clock of those unnamed for the first time."""
    delete: list[str] = []
    kept: dict[str, float] = {}
    for image in sorted(set(images)):
        if checkpoints.image_claim(image) is None or image in named:
            continue
        since = unnamed.get(image, now)
        if now - since >= grace_seconds:
            delete.append(image)
        else:
            kept[image] = since
    return Sweep(tuple(delete), kept)
