"""What is running and why, read only: ``sandbox-controller status`` and ``explain``.

``status`` lists every mapped session with its sandbox (runner, name, generation, age,
health) and the last decision a worker made about it (``LastDecision``, noted through
``Deps.on_decision``). ``explain`` observes one session the way ``lifecycle.act`` does and
asks ``decide.decide`` what it says now — it takes no lease and starts, releases, saves
and discards nothing: a sandbox found without a record is considered (as ``act`` would adopt
it) but not recorded. A unit test holds ``explain`` to what ``act`` decides.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

from controller.decide import Decision
from controller.deps import Deps
from controller.model import CannotStart, LastDecision, Record
from controller.observation import decide_observed, observe
from controller.runners.base import Runner, Suspends
from controller.store.base import SessionStore


class DecisionLog(Protocol):
    def last_decision(self, session_id: str) -> LastDecision | None: ...

    def timer(self, session_id: str) -> float | None:
        """When the session's durable timer falls due (Unix seconds), if it has one."""
        ...


@dataclass(frozen=True)
class Row:
    session_id: str
    environment_id: str
    runner: str
    sandbox: str
    generation: int
    age_seconds: float
    health: str
    last: LastDecision | None
    next_timer_in_seconds: float | None = None
    """Seconds until the session's timer falls due (negative: overdue); None without a timer."""
    suspended: dict[str, float] | None = None
    """A checkpoint kept for the session (issue 29): ``size_bytes`` and ``age_seconds``."""
    crash_loop: dict[str, float | int | None] | None = None
    """A crash loop (``crash_loop``): its restart count and the seconds until the next start."""

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "environment_id": self.environment_id,
            "runner": self.runner,
            "sandbox": self.sandbox,
            "generation": self.generation,
            "age_seconds": round(self.age_seconds, 1),
            "health": self.health,
            "last_decision": (
                {"verdict": self.last.verdict, "reason": self.last.reason, "at": self.last.at} if self.last else None
            ),
            "next_timer_in_seconds": (
                None if self.next_timer_in_seconds is None else round(self.next_timer_in_seconds, 1)
            ),
            "suspended": self.suspended,
            "crash_loop": self.crash_loop,
        }


def status(store: SessionStore, decisions: DecisionLog, runner: Runner, runner_kind: str, now: float) -> list[Row]:
    """One row per mapped session (a mapping removed meanwhile is skipped)."""
    rows = []
    for session_id in store.session_ids():
        record = store.record(session_id)
        if record is None:
            continue
        health = runner.status(record.handle).value
        suspended = checkpoint_of(runner, session_id, now)
        rows.append(
            Row(
                session_id=session_id,
                environment_id=record.environment_id,
                runner=runner_kind,
                sandbox=record.handle.name,
                generation=record.handle.generation,
                age_seconds=max(0.0, now - record.started_at),
                health="suspended" if suspended is not None and health == "gone" else health,
                last=decisions.last_decision(session_id),
                next_timer_in_seconds=_seconds_until(decisions.timer(session_id), now),
                suspended=suspended,
                crash_loop=crash_loop(record, now),
            )
        )
    return rows


def crash_loop(record: Record | None, now: float) -> dict[str, float | int | None] | None:
    """A session's crash loop as ``status`` and ``explain`` show it (Kubernetes' CrashLoopBackOff):
    ``restarts``, the exits in a row (``Record.crashes``), and ``next_start_in_seconds`` while its
    back-off runs (None once it is over); None when its executor is not crash-looping."""
    if record is None or record.crashes < 2:
        return None
    left = None if record.backoff_until is None else round(max(0.0, record.backoff_until - now), 1)
    return {"restarts": record.crashes, "next_start_in_seconds": left}


def cannot_start(found: CannotStart | None, record: Record | None, now: float) -> dict[str, Any] | None:
    """Why the sandbox cannot start, as ``explain`` shows it: ``kind``, ``reason`` (what to do),
    ``template`` and ``for_seconds`` since a worker's look first found it (None: no look has
    yet); None when its runner knows nothing against it."""
    if found is None:
        return None
    since = None if record is None else record.cannot_start_since
    return {
        "kind": found.kind,
        "reason": found.reason,
        "template": found.template,
        "for_seconds": None if since is None else round(max(0.0, now - since), 1),
    }


def checkpoint_of(runner: Runner, session_id: str, now: float) -> dict[str, float] | None:
    """The session's checkpoint, when its runner suspends sandboxes and keeps one for it."""
    if not isinstance(runner, Suspends):
        return None
    found = runner.suspended(session_id)
    if found is None:
        return None
    return {"size_bytes": found["size_bytes"], "age_seconds": round(max(0.0, now - found["suspended_at"]), 1)}


def _seconds_until(due_at: float | None, now: float) -> float | None:
    return None if due_at is None else due_at - now


def totals(rows: list[Row]) -> dict[str, Any]:
    return {
        "sessions": len(rows),
        "by_health": dict(sorted(Counter(r.health for r in rows).items())),
        "by_last_verdict": dict(sorted(Counter(r.last.verdict if r.last else "none" for r in rows).items())),
        "deletions_held": sum(1 for r in rows if r.last is not None and r.last.held),
        "checkpoint_bytes": int(sum(r.suspended["size_bytes"] for r in rows if r.suspended is not None)),
    }


HELD_NOTICE = (
    "deletions held: the sessions read to confirm a deletion answer 404 too, or there was none to compare "
    "with — a wrong CONTROLLER_API_KEY (another project's key) or CONTROLLER_API_BASE_URL? Nothing is "
    "released while this lasts."
)
"""What ``status`` says when a worker held deletions (``decide.Decision.held``)."""


@dataclass(frozen=True)
class Explanation:
    session_id: str
    decision: Decision
    observed: dict[str, Any]


def explain(session_id: str, deps: Deps) -> Explanation:
    """What ``decide`` says about the session now, from what ``act`` would observe."""
    seen = observe(session_id, deps)
    session, record, health, now = seen.session, seen.record, seen.health, seen.now
    decision = decide_observed(seen, deps)
    observed: dict[str, Any] = {
        "session": (
            None
            if session is None
            else {
                "status": session.status.value,
                "wants_connection": session.wants_connection,
                "environment_type": session.environment.type,
                "environment_id": session.environment.id,
            }
        ),
        "sandbox": (
            None
            if record is None
            else {
                "name": record.handle.name,
                "generation": record.handle.generation,
                "environment_id": record.environment_id,
                "age_seconds": round(max(0.0, now - record.started_at), 1),
                "recorded": not seen.adopted,
            }
        ),
        "health": health.value if health else None,
        "suspended": checkpoint_of(deps.runner, session_id, now),
        "executor_connected": seen.connected,
        "crash_loop": crash_loop(record, now),
        "cannot_start": cannot_start(seen.cannot_start, record, now),
        "not_found_since": seen.missing.since if seen.missing is not None else None,
        "grace_seconds": deps.grace_seconds,
        "max_lifetime_seconds": deps.max_lifetime_seconds,
    }
    return Explanation(session_id, decision, observed)
