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
    registered_after   the last read of the worker's watch job that found the executor not
                       registered yet (the worker's clock; none when its first read found it)
    registered         the first read that found the executor registered: the first that
                       found the environment ``connected`` (the worker's clock; see below)
    connected          the Agents API first reported the environment connected, as the
                       worker's watch job saw it (the worker's clock; it asks every 0.5–5 s)

A stage is the time between two stamps of one clock (``STAGES``), so no stage compares two
machines' clocks except the queue wait (the receiver's and the worker's: keep their nodes in
time sync, as the delivery histograms already need). The API server stamps the pod's times to
the second, so the pod's own stages (``scheduled``, ``container_started``) are whole seconds.
A warm pod was created, scheduled and started before its session claimed it: its start has no
pod stages. The local runner has the worker's stages only.

The executor's registration has no stamp the Agents API reports: an environment reports only
its ``status`` (no time), and one the application hosts goes from ``pending`` to ``connected``
with no status for "registered, not connected yet"; an executor opens its link right after
its registration is answered. So the first read that can tell the executor registered is the
first that finds the environment connected, and ``registered`` is that read's time: the
registration happened between ``registered_after`` (or ``placed``) and ``registered``, a
window as long as the watch's interval then (0.5 s at first, √2 times longer each read, at
most 5 s), which ``render`` prints. Its stage, ``executor_registered``, runs from the
container started (the kubelet's stamp, to the second: a cold pod's; the second stage that
compares two machines' clocks) or else from ``placed`` (a warm pod's executor starts at its
claim) to ``registered``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

STAMPS = (
    "delivered",
    "taken",
    "placed",
    "pod_created",
    "scheduled",
    "container_started",
    "registered_after",
    "registered",
    "connected",
)
STAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("queue_wait", ("delivered",), "taken"),
    ("placing", ("taken",), "placed"),
    ("scheduled", ("pod_created",), "scheduled"),
    ("container_started", ("scheduled",), "container_started"),
    ("executor_registered", ("container_started", "placed"), "registered"),
    ("connected", ("placed",), "connected"),
)
"""Each stage as (name, from stamps (the first known of them), to stamp)."""
DESCRIPTIONS = {
    "queue_wait": "the job waited in the queue",
    "placing": "the worker placed the sandbox (a pod created, or a warm pod claimed)",
    "scheduled": "the pod waited to be scheduled",
    "container_started": "the node started its container (image, sandbox, network)",
    "executor_registered": "the executor started and registered (as first seen: see the window above)",
    "connected": "the executor started, registered and connected",
}


def stages(stamps: Mapping[str, float]) -> list[tuple[str, float]]:
    """The stages both of whose stamps are known, in order, each at least 0 s (a clock a little
    behind another never makes a stage negative)."""
    found = []
    for name, begins, end in STAGES:
        begin = next((b for b in begins if stamps.get(b)), None)
        if begin is not None and stamps.get(end):
            found.append((name, max(0.0, stamps[end] - stamps[begin])))
    return found


def render(stamps: Mapping[str, float], source: str, template: str) -> list[str]:
    """The timeline as ``explain`` prints it: each stamp known, then each stage."""
    if not stamps:
        return []
    lines = [f"last start: {source or 'unknown'} (template {template or 'unknown'})"]
    for name in STAMPS:
        if stamps.get(name):
            lines.append(f"  {name:<18} {_clock(stamps[name])} UTC")
    after = stamps.get("registered_after") or stamps.get("placed")
    if after and stamps.get("registered"):
        lines.append(
            f"  registered between {_clock(after)} and {_clock(stamps['registered'])} UTC "
            f"({max(0.0, stamps['registered'] - after):.3f} s: the API reports no registration time; "
            "the watch's last read that found it not yet, and its first that found it connected)"
        )
    for name, seconds in stages(stamps):
        lines.append(f"  {name:<19}{seconds:7.3f} s  {DESCRIPTIONS[name]}")
    return lines


def _clock(stamp: float) -> str:
    return datetime.fromtimestamp(round(stamp, 3), UTC).strftime("%H:%M:%S.%f")[:12]
