"""The warm pool's sizing on many days, as a model: a pool sized by demand against a fixed pool
of its mean, with the product's own decisions and none of the node.

``bench/bursty_day.py`` measures one day on a real node (about ten minutes a pool). This bench
replays days in memory instead, with the very functions the scheduler's leader and the workers
decide with (``controller.runners.kubernetes.pool``: ``peak``, ``target``, ``settling``, ``plan``,
``claim_order``), every ``scheduler.POOL_TEND_SECONDS``. What it leaves out is time on the node: a
pod created starts ``--start-seconds`` later (any claim finds it, as ``claim_order`` lets a
session claim a pod still starting; it is warm all the same), and a placement is noted at its
session's arrival; no pod grows too old (``maxAgeSeconds``: a replacement costs no pod-second).
So it counts what the sizing decides -- which sessions find a pod to claim,
and the pod-seconds the unclaimed pods wait -- not how fast anything starts.

    .venv/bin/python bench/pool_sizing.py               # the real node's day, then 100 days of each kind
    .venv/bin/python bench/pool_sizing.py --days 300 --seed 7

First the real node's day (``bursty_day.DAY`` with its pool, ``bursty_day.DEMAND_POOL``): the
model's figures beside the node's, to check the model (``tests/unit/test_pool_sizing_model.py``
holds it to them), at its headroom and two bigger ones. Then random days of two kinds, at the
product's defaults (``min 0``, a 600 s window, 10 s intervals, 25 % headroom; ``max`` has no
default: 20 here, as on the node) and at a few headrooms, a minimum and a window an operator
might pick; each day brings bursts of 2-20 sessions at once and trickles of 3-12 (one every
5-60 s):

- even days: four hours alike, quiet spells of 1-30 minutes between events (nothing in a
  day's past says what comes next);
- office days: 24 hours, an event every 1-10 minutes from 09:00 to 17:00 and one every 1-3
  hours outside them.

For each setting: sessions warm and pod-seconds against the fixed pool of the demand pool's
mean (rounded up, as on the node), the days where it serves more sessions warm for fewer
pod-seconds, and warm sessions per 1,000 pod-seconds.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bursty_day import DAY, DEMAND_POOL
from controller.runners.kubernetes.pool import (
    SETTLE_LONGEST_SECONDS,
    WarmPod,
    claim_order,
    peak,
    plan,
    settling,
    target,
)
from controller.scheduler import POOL_TEND_SECONDS

SHAPE = "model"
NEVER_OLD = float("inf")


@dataclass(frozen=True)
class Sizing:
    """A pool as a template configures it: ``size`` (a fixed pool), else sized by demand."""

    size: int = 0
    minimum: int = 0
    maximum: int = 20
    window: float = 600.0
    interval: float = 10.0
    headroom: int = 25

    @property
    def fixed(self) -> bool:
        return self.size > 0


@dataclass
class Outcome:
    sessions: int = 0
    warm: int = 0
    pod_seconds: float = 0.0
    seconds: float = 0.0
    warm_by_phase: dict[str, int] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return self.pod_seconds / self.seconds if self.seconds else 0.0


def replay(arrivals: list[tuple[float, str]], sizing: Sizing, seconds: float, start_seconds: float) -> Outcome:
    """One day: ``arrivals`` as (second of the day, phase), sorted; the pool tended every
    ``POOL_TEND_SECONDS`` as the scheduler's leader does. A fixed pool starts full (as the node's
    bench waits for it), one sized by demand empty (its target is ``min`` until demand comes)."""
    pods: list[WarmPod] = []
    ready_at: dict[str, float] = {}
    stamps: list[float] = []
    made = 0

    def add(now: float, already_running: bool = False) -> None:
        nonlocal made
        made += 1
        name = f"pod-{made}"
        pods.append(WarmPod(name, name, "1", now, SHAPE, running=already_running))
        ready_at[name] = now if already_running else now + start_seconds

    for _ in range(sizing.size):
        add(0.0, already_running=True)
    outcome = Outcome(seconds=seconds)
    tendings = [i * POOL_TEND_SECONDS for i in range(math.ceil(seconds / POOL_TEND_SECONDS))]
    events = sorted([(at, 0, phase) for at, phase in arrivals] + [(at, 1, "") for at in tendings])
    keep = max(sizing.window, SETTLE_LONGEST_SECONDS)
    last = 0.0
    for now, kind, phase in events:  # at one instant, its arrivals before its tending
        outcome.pod_seconds += len(pods) * (now - last)
        last = now
        if not all(p.running for p in pods):
            pods[:] = [replace(p, running=ready_at[p.name] <= now) for p in pods]
        if kind == 0:
            outcome.sessions += 1
            outcome.warm_by_phase.setdefault(phase, 0)
            order = claim_order(pods, SHAPE, now, NEVER_OLD)
            if order:
                pods.remove(order[0])
                outcome.warm += 1
                outcome.warm_by_phase[phase] += 1
            stamps.append(now)  # a placement, warm or cold: what the workers note (in time order)
            continue
        recent = stamps[bisect.bisect_left(stamps, now - keep) :]
        size = sizing.size if sizing.fixed else sizing.minimum
        if not recent and len(pods) == size and all(p.running for p in pods):
            continue  # a quiet pool at its size: the tending changes nothing (a shortcut, not a decision)
        if not sizing.fixed:
            size = target(
                peak(recent, now, sizing.interval, sizing.window), sizing.minimum, sizing.maximum, sizing.headroom
            )
        todo = plan(pods, size, SHAPE, now, NEVER_OLD, hold=settling(recent, now))
        for pod in todo.delete:
            pods.remove(pod)
        for _ in range(todo.create):
            add(now)
    outcome.pod_seconds += len(pods) * (seconds - last)
    return outcome


def node_day() -> tuple[list[tuple[float, str]], float]:
    """``bursty_day.DAY`` as arrivals: each phase's sessions, then its quiet spell."""
    arrivals, now = [], 0.0
    for phase, count, spacing, quiet in DAY:
        for i in range(count):
            arrivals.append((now + i * spacing, phase))
        now += max(0, count - 1) * spacing + quiet
    return arrivals, now


def event(rng: random.Random, now: float, arrivals: list[tuple[float, str]]) -> float:
    """A burst (2-20 sessions at once) or a trickle (3-12, one every 5-60 s) from ``now``: when it ends."""
    if rng.random() < 0.5:
        arrivals += [(now, "burst")] * rng.randint(2, 20)
        return now
    spacing, count = rng.uniform(5, 60), rng.randint(3, 12)
    arrivals += [(now + i * spacing, "trickle") for i in range(count)]
    return now + (count - 1) * spacing


def even_day(rng: random.Random) -> tuple[list[tuple[float, str]], float]:
    """Four hours alike: quiet spells of 1-30 minutes, each followed by a burst or a trickle.
    Nothing in its past says when the next comes or how big: the day a fixed pool suits."""
    arrivals: list[tuple[float, str]] = []
    now, end = 0.0, 4 * 3600.0
    while True:
        now += rng.uniform(60, 1800)
        if now >= end:
            return sorted(arrivals), end
        now = event(rng, now, arrivals)


def office_day(rng: random.Random) -> tuple[list[tuple[float, str]], float]:
    """24 hours with working hours: from 09:00 to 17:00 a burst or a trickle every 1-10 minutes;
    the rest of the day one every 1-3 hours. Its recent past says much about the next hour."""
    arrivals: list[tuple[float, str]] = []
    now, end = 0.0, 24 * 3600.0
    opens, closes = 9 * 3600.0, 17 * 3600.0
    while True:
        step = rng.uniform(60, 600) if opens <= now < closes else rng.uniform(3600, 3 * 3600)
        if now < opens < now + step:  # the night ends at opening time: the first event comes 1-10 minutes after it
            step = opens - now + rng.uniform(60, 600)
        now += step
        if now >= end:
            return sorted(arrivals), end
        now = event(rng, now, arrivals)


def against_fixed(
    arrivals: list[tuple[float, str]], seconds: float, sizing: Sizing, start_seconds: float
) -> tuple[Outcome, Outcome, int]:
    """The pool sized by demand, and the fixed pool of its mean (rounded up, at least 1)."""
    demand = replay(arrivals, sizing, seconds, start_seconds)
    size = max(1, math.ceil(demand.mean))
    return demand, replay(arrivals, Sizing(size=size), seconds, start_seconds), size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start-seconds", type=float, default=4.0, help="a new warm pod's start (default 4 s)")
    args = parser.parse_args()

    print("The real node's day (bench/bursty_day.py's DAY and pool), in the model:")
    arrivals, seconds = node_day()
    pool = DEMAND_POOL
    sizing = Sizing(
        minimum=pool["min"],
        maximum=pool["max"],
        window=pool["windowSeconds"],
        interval=pool["intervalSeconds"],
        headroom=pool["headroomPercent"],
    )
    for headroom in (sizing.headroom, 50, 100):
        demand, fixed, size = against_fixed(arrivals, seconds, replace(sizing, headroom=headroom), args.start_seconds)
        print(
            f"  headroom {headroom:>3}%: demand {demand.warm}/{demand.sessions} warm {demand.warm_by_phase}, "
            f"{demand.pod_seconds:.0f} pod-s (mean {demand.mean:.2f}); fixed ({size}) {fixed.warm}/{fixed.sessions} "
            f"{fixed.warm_by_phase}, {fixed.pod_seconds:.0f} pod-s; more warm for fewer pod-seconds: "
            f"{'yes' if demand.warm > fixed.warm and demand.pod_seconds < fixed.pod_seconds else 'no'}"
        )

    for name, make in (("even days of 4 hours", even_day), ("office days of 24 hours", office_day)):
        rng = random.Random(args.seed)
        days = [make(rng) for _ in range(args.days)]
        what = " ".join((make.__doc__ or "").split(".")[0].lower().split())
        print(f"\n{args.days} {name} (seed {args.seed}; {what}):")
        table(days, args.start_seconds)
    return 0


def table(days: list[tuple[list[tuple[float, str]], float]], start_seconds: float) -> None:
    """Each setting's pool sized by demand against the fixed pool of its mean, over ``days``."""
    print(
        "| setting | warm, demand | warm, fixed | pod-s demand / fixed | days demand wins "
        "| warm per 1,000 pod-s, demand / fixed |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    defaults = Sizing()
    for label, setting in (
        ("defaults (min 0, headroom 25%)", defaults),
        ("headroom 50%", replace(defaults, headroom=50)),
        ("headroom 100%", replace(defaults, headroom=100)),
        ("min 2", replace(defaults, minimum=2)),
        ("window 30 minutes", replace(defaults, window=1800.0)),
    ):
        rows = [against_fixed(a, s, setting, start_seconds) for a, s in days]
        sessions = sum(d.sessions for d, _, _ in rows)
        warm_d, warm_f = sum(d.warm for d, _, _ in rows), sum(f.warm for _, f, _ in rows)
        pods_d, pods_f = sum(d.pod_seconds for d, _, _ in rows), sum(f.pod_seconds for _, f, _ in rows)
        wins = sum(1 for d, f, _ in rows if d.warm > f.warm and d.pod_seconds < f.pod_seconds)
        per = 1000 * warm_d / pods_d
        per_f = 1000 * warm_f / pods_f
        print(
            f"| {label} | {warm_d / sessions:.0%} | {warm_f / sessions:.0%} | x{pods_d / pods_f:.2f} | "
            f"{wins}/{len(rows)} | {per:.2f} / {per_f:.2f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
