"""A sandbox start's timeline, stage by stage (pure): where the seconds between a delivery and
a connected executor went.

Each stamp is taken by the part that did the work, in Unix seconds:

    delivered          the receiver took the delivery (its clock; the job carries it)
    taken              a worker took the job (the worker's clock)
    placed             that worker has the sandbox placed and recorded: a pod created, or a
                       warm pod claimed (the worker's clock)
    pod_created        the API server created the pod (its ``creationTimestamp``)
    scheduled          the pod's ``PodScheduled`` condition turned True (the scheduler's stamp)
    container_started  the container's ``running.startedAt`` (the kubelet's stamp)
    connected          the Agents API first reported the environment connected, as the
                       worker's watch job saw it (the worker's clock; it asks every 0.5–5 s)

A stage is the time between two stamps of one clock (``STAGES``), so no stage compares two
machines' clocks except the queue wait (the receiver's and the worker's: keep their nodes in
time sync, as the delivery histograms already need). The API server stamps the pod's times to
the second, so the pod's own stages (``scheduled``, ``container_started``) are whole seconds.
A warm pod was created, scheduled and started before its session claimed it: its start has no
pod stages. The executor's registration has no stamp the Agents API reports; it lies within
``connected``. The local runner has the worker's stages only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

STAMPS = ("delivered", "taken", "placed", "pod_created", "scheduled", "container_started", "connected")
STAGES: tuple[tuple[str, str, str], ...] = (
    ("queue_wait", "delivered", "taken"),
    ("placing", "taken", "placed"),
    ("scheduled", "pod_created", "scheduled"),
    ("container_started", "scheduled", "container_started"),
    ("connected", "placed", "connected"),
)
"""Each stage as (name, from stamp, to stamp)."""
DESCRIPTIONS = {
    "queue_wait": "the job waited in the queue",
    "placing": "the worker placed the sandbox (a pod created, or a warm pod claimed)",
    "scheduled": "the pod waited to be scheduled",
    "container_started": "the node started its container (image, sandbox, network)",
    "connected": "the executor started, registered and connected",
}


def stages(stamps: Mapping[str, float]) -> list[tuple[str, float]]:
    """The stages both of whose stamps are known, in order, each at least 0 s (a clock a little
    behind another never makes a stage negative)."""
    return [
        (name, max(0.0, stamps[end] - stamps[begin]))
        for name, begin, end in STAGES
        if stamps.get(begin) and stamps.get(end)
    ]


def render(stamps: Mapping[str, float], source: str, template: str) -> list[str]:
    """The timeline as ``explain`` prints it: each stamp known, then each stage."""
    if not stamps:
        return []
    lines = [f"last start: {source or 'unknown'} (template {template or 'unknown'})"]
    for name in STAMPS:
        if stamps.get(name):
            when = datetime.fromtimestamp(round(stamps[name], 3), UTC).strftime("%H:%M:%S.%f")[:12]
            lines.append(f"  {name:<18} {when} UTC")
    for name, seconds in stages(stamps):
        lines.append(f"  {name:<18} {seconds:7.3f} s  {DESCRIPTIONS[name]}")
    return lines
