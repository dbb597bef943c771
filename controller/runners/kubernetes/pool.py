"""Warm pools: which warm pod a session claims, and what keeps a pool at its size (pure).

A template with ``warmPool.size`` N keeps N pods started and waiting (``make_warm_pod``). A
session claims one (``claim_order``: running before pending, the oldest first, never one of
another shape or past its age) with a JSON patch that only succeeds while the pod is still
``ready``; the claimed pod then belongs to its session exactly like a cold one (same labels,
same stop/release/replace paths) and is deleted when the session is done with it: a warm pod
serves one session and is never reused. The scheduler's leader tends each pool every few
seconds (``plan``): dead pods, pods of another shape and pods past their age go, and new ones
fill the pool up to its size -- but not while the template's sessions are being placed
(``settling``): a burst's refills, started beside its claimed executors, took the node's CPU
from them (on the 2-core node, ten claims at once: p99 16.4 s with refills at each claim).

A pool sized by demand (``warmPool: {min, max}``) has no fixed size: at each tending its size is
``target`` of the placements (claims and cold starts) of the last window, which the workers
note: the most of them within any one interval of that window (``peak``: a burst counts whole,
wherever it falls), plus the headroom, within [min, max]. It follows a burst up at the next
tending and comes down only once the burst has left the window (as the Horizontal Pod
Autoscaler's scale-down stabilization window does), to ``min`` (0 allowed) when demand stops.

A claimed pod learns its session from its downward-API volume, which the kubelet rewrites when
it syncs the pod after the claim's update. It can miss that update: its volume manager rewrote
the volume from the pod as it was before the claim (on the 2-core node, 7 of 400 claims made ten
at once), and the executor then waited for the kubelet's next periodic sync (``syncFrequency``,
one minute by default). So the tending refreshes each claimed pod's binding once, as soon as it
is ``BINDING_REFRESH_AFTER_SECONDS`` old (``binding_refresh_due``): one more update of the pod, a
label, which makes the kubelet sync it again, by then from the claimed pod. A binding already
written is left as it was (the kubelet writes nothing when the files would not change).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.model import PoolState

SETTLE_SECONDS = 5.0
"""A pool grows only once this long has passed without a placement of its template: a burst's
claims arrive within a second or two, and their executors start in a few."""
SETTLE_LONGEST_SECONDS = 30.0
"""...but it waits at most this long from the first placement of a run of them (each within
``SETTLE_SECONDS`` of the last): a steady stream of sessions never starves its pool's refills."""
BINDING_REFRESH_AFTER_SECONDS = 2.0
"""How old a claim is before the tending refreshes its pod's binding: a claimed executor usually
registers within a second, and the kubelet has long had the claimed pod by then; the refresh's
sync comes after the burst's executors started, not beside them."""


@dataclass(frozen=True)
class WarmPod:
    """What the decisions need to know of one unclaimed warm pod."""

    name: str
    uid: str
    resource_version: str
    created_at: float
    shape: str
    running: bool
    """Its container runs (the entrypoint waits for a binding); else it is still starting."""
    dead: bool = False
    """Failed or finished: it will never serve a session."""
    terminating: bool = False


@dataclass(frozen=True)
class Plan:
    create: int
    delete: tuple[WarmPod, ...]


def _usable(pod: WarmPod, shape: str, now: float, max_age: float) -> bool:
    return not pod.dead and not pod.terminating and pod.shape == shape and now - pod.created_at < max_age


def claim_order(pods: list[WarmPod], shape: str, now: float, max_age: float, spread: str = "") -> list[WarmPod]:
    """The pods a session may claim, best first: running ones (an executor starts at once)
    before pending ones, then the oldest first (closest to its age limit).

    A burst's claims run at once and would all try the same pod first, then the same next, each
    loser a patch later: ``spread`` (the session's id) starts each claimer's turn through the
    running pods at a place of its own (a rotation; no pod is left out), so most of a burst's
    claims win at their first try. (On the 2-core node, ten claims at once by ten workers, each
    giving up after 3 tries, left three sessions cold beside three ready pods.)"""
    usable = sorted((p for p in pods if _usable(p, shape, now, max_age)), key=lambda p: (p.created_at, p.name))
    running = [p for p in usable if p.running]
    if spread and running:
        turn = int.from_bytes(hashlib.sha256(spread.encode()).digest()[:8], "big") % len(running)
        running = running[turn:] + running[:turn]
    return running + [p for p in usable if not p.running]


def plan(pods: list[WarmPod], size: int, shape: str, now: float, max_age: float, hold: bool = False) -> Plan:
    """What keeps a pool at ``size`` usable pods: delete the dead, the misshapen, the too old
    and (youngest first) any beyond the size; create what is missing, unless ``hold`` (its
    sessions are being placed: ``settling``). Pods already being deleted count for nothing."""
    stale = [p for p in pods if not p.terminating and not _usable(p, shape, now, max_age)]
    usable = sorted((p for p in pods if _usable(p, shape, now, max_age)), key=lambda p: (p.created_at, p.name))
    excess = usable[size:] if len(usable) > size else []
    return Plan(create=0 if hold else max(0, size - len(usable)), delete=tuple(stale + excess[::-1]))


def census(template: str, pods: list[WarmPod], size: int, shape: str, now: float, max_age: float) -> PoolState:
    """How many of the pool's pods a session could claim now (``ready``) or soon (``starting``)."""
    usable = [p for p in pods if _usable(p, shape, now, max_age)]
    ready = sum(1 for p in usable if p.running)
    return PoolState(template=template, size=size, ready=ready, starting=len(usable) - ready)


def binding_refresh_due(claimed_at: float | None, deleting: bool, now: float) -> bool:
    """A claimed pod's binding is refreshed once its claim is ``BINDING_REFRESH_AFTER_SECONDS``
    old (``claimed_at`` on the claiming worker's clock; unknown: at once); a pod being deleted
    (its session done within that time) never."""
    if deleting:
        return False
    return claimed_at is None or now - claimed_at >= BINDING_REFRESH_AFTER_SECONDS


def peak(stamps: Sequence[float], now: float, interval: float, window: float) -> int:
    """The most placements within any ``interval`` seconds of the last ``window`` seconds
    (``stamps``: when each placement was noted, on the clock ``now`` reads; any order)."""
    recent = sorted(s for s in stamps if now - window <= s <= now)
    most, first = 0, 0
    for last, stamp in enumerate(recent):
        while stamp - recent[first] >= interval:
            first += 1
        most = max(most, last - first + 1)
    return most


def target(demand: int, minimum: int, maximum: int, headroom_percent: int) -> int:
    """The size a pool sized by demand aims at: ``demand`` (the recent peak) plus its headroom
    (rounded up: with any headroom, any demand keeps one more), within [minimum, maximum]."""
    wanted = demand + math.ceil(demand * headroom_percent / 100)
    return max(minimum, min(maximum, wanted))


def settling(
    stamps: Sequence[float], now: float, quiet: float = SETTLE_SECONDS, longest: float = SETTLE_LONGEST_SECONDS
) -> bool:
    """Sessions of the template are being placed now (``stamps``: when each placement was
    noted, on the clock ``now`` reads; any order): one was placed less than ``quiet`` seconds
    ago, and the run of placements it ends (each within ``quiet`` of the one before) began less
    than ``longest`` seconds ago. While it lasts the pool creates no pod (``plan``'s ``hold``)."""
    placed = sorted(s for s in stamps if s <= now)
    if not placed or now - placed[-1] >= quiet:
        return False
    first = len(placed) - 1
    while first > 0 and placed[first] - placed[first - 1] < quiet:
        first -= 1
    return now - placed[first] < longest
