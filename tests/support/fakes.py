"""In-memory fakes that honour the controller's protocols (no mocks), and the ``World`` harness.

``FakeSessions``, ``FakeStore``, ``FakeRunner`` and ``FakeInbox`` each honour their protocol's
semantics (``Sessions``, ``SessionStore``, ``Runner``, ``Inbox``), so the lifecycle loop and the
receiver can be driven without Redis, HTTP or processes. Hooks (``on_get``, ``on_ensure``) let
a test act in the middle of a round: bump ``want``, lose a lease. ``World`` wires them into
``lifecycle.Deps`` with a fake clock, as the lifecycle tests use them.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from controller import reconcile
from controller.config import LifecycleSettings
from controller.decide import Decision, Verdict
from controller.errors import ApiUnavailable, Fenced, QueueUnavailable
from controller.inbox import Job, Outcome
from controller.lifecycle import Deps, work
from controller.model import (
    ENVIRONMENT_CONNECTION,
    Environment,
    Handle,
    Health,
    Link,
    NotFound,
    Record,
    RequiredAction,
    SandboxSpec,
    Session,
    SessionStatus,
)
from controller.store.base import Busy, Lease
from controller.trust import DEFAULT_POLICY, Policy
from tests.support.clock import FakeClock


def make_session(
    session_id: str = "sess_1",
    *,
    status: SessionStatus = SessionStatus.REQUIRES_ACTION,
    env_type: str = "self_hosted",
    env_id: str | None = "env_1",
    remote_url: str | None = "https://api.openai.com/v1/agents/env",
    workspace: str = "/workspace",
    actions: tuple[str, ...] = (ENVIRONMENT_CONNECTION,),
    agent_id: str | None = "agent_1",
    metadata: dict[str, str] | None = None,
    created_at: int = 0,
    last_active_at: int | None = None,
) -> Session:
    """A session as ``parse_session`` would build it; by default one asking for a connection."""
    return Session(
        id=session_id,
        status=status,
        environment=Environment(type=env_type, id=env_id, remote_url=remote_url, workspace_directory=workspace),
        required_actions=tuple(RequiredAction(type=a, environment_id=env_id) for a in actions),
        agent_id=agent_id,
        metadata=dict(metadata or {}),
        created_at=created_at,
        last_active_at=last_active_at,
    )


class FakeSessions:
    """``Sessions`` in memory: a dict of sessions (absent = deleted) and each environment's link."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.connected: dict[str, bool] = {}
        self.dropped: set[str] = set()
        """Environments whose link, when not connected, the API reports ``disconnected`` (held, then lost)."""
        self.unavailable = False
        self.gets = 0
        self.on_get: Callable[[str], None] | None = None

    def put(self, session: Session) -> Session:
        self.sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        self.gets += 1
        if self.on_get is not None:
            self.on_get(session_id)
        if self.unavailable:
            raise ApiUnavailable(f"fake Agents API is down reading session {session_id}")
        return self.sessions.get(session_id)

    def environment_link(self, environment_id: str) -> Link | None:
        connected = None if self.unavailable else self.connected.get(environment_id)
        if connected is None:
            return None
        if connected:
            return Link.UP
        return Link.DROPPED if environment_id in self.dropped else Link.NOT_YET


@dataclass
class _State:
    want: int = 0
    done: int = 0
    fence: int = 0
    holder: int | None = None


class FakeStore:
    """``SessionStore`` in memory with the Redis store's semantics.

    ``want``/``done`` counters coalesce work; a lease carries a strictly increasing fencing
    token; every write by a token that no longer holds the lease raises ``Fenced``.
    ``expire(session_id)`` drops the holder, as a lapsed TTL would.
    """

    BUSY_RETRY_SECONDS = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, _State] = {}
        self.records: dict[str, Record] = {}
        self.abandoned: list[Lease] = []
        self.timers: dict[str, float] = {}
        self.missing: dict[str, float] = {}
        self.missing_reads: dict[str, tuple[int, float]] = {}
        self.releases: dict[str, float] = {}
        self.prestarted: set[str] = set()
        """Pre-start reservations (the Redis store also drops stale ones; here ``save`` and
        ``forget`` keep the set exact)."""

    def _s(self, session_id: str) -> _State:
        return self._state.setdefault(session_id, _State())

    def counters(self, session_id: str) -> tuple[int, int]:
        """(want, done) for a session."""
        with self._lock:
            s = self._s(session_id)
            return s.want, s.done

    def holder(self, session_id: str) -> int | None:
        with self._lock:
            return self._s(session_id).holder

    def expire(self, session_id: str) -> None:
        with self._lock:
            self._s(session_id).holder = None

    def want(self, session_id: str) -> int:
        with self._lock:
            s = self._s(session_id)
            s.want += 1
            return s.want

    def want_many(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            self.want(session_id)

    def acquire(self, session_id: str) -> Lease | Busy | None:
        with self._lock:
            s = self._s(session_id)
            if s.want <= s.done:
                return None
            if s.holder is not None:
                return Busy(retry_after=self.BUSY_RETRY_SECONDS)
            s.fence += 1
            s.holder = s.fence
            return Lease(session_id=session_id, token=s.fence, wanted=s.want)

    def _held(self, lease: Lease) -> _State:
        s = self._s(lease.session_id)
        if s.holder != lease.token:
            raise Fenced(f"lease of session {lease.session_id} is no longer held")
        return s

    def complete(self, lease: Lease) -> Lease | None:
        with self._lock:
            s = self._held(lease)
            s.done = max(s.done, lease.wanted)
            if s.want > lease.wanted:
                return Lease(session_id=lease.session_id, token=lease.token, wanted=s.want)
            s.holder = None
            return None

    def abandon(self, lease: Lease) -> None:
        with self._lock:
            self.abandoned.append(lease)
            s = self._s(lease.session_id)
            if s.holder == lease.token:
                s.holder = None

    def check(self, lease: Lease) -> None:
        with self._lock:
            self._held(lease)

    def record(self, session_id: str) -> Record | None:
        with self._lock:
            return self.records.get(session_id)

    def save(self, lease: Lease, record: Record) -> None:
        with self._lock:
            self._held(lease)
            self.records[lease.session_id] = record
            if not record.prestarted:
                self.prestarted.discard(lease.session_id)

    def forget(self, lease: Lease) -> None:
        with self._lock:
            self._held(lease)
            self.records.pop(lease.session_id, None)
            self.prestarted.discard(lease.session_id)

    def session_ids(self) -> list[str]:
        with self._lock:
            return sorted(self.records)

    def arm(
        self,
        lease: Lease,
        due_at: float | None,
        missing_since: float | None = None,
        missing_reads: tuple[int, float] | None = None,
    ) -> None:
        with self._lock:
            self._held(lease)
            if due_at is None:
                self.timers.pop(lease.session_id, None)
            else:
                self.timers[lease.session_id] = due_at
            if missing_since is None:
                self.missing.pop(lease.session_id, None)
                self.missing_reads.pop(lease.session_id, None)
                self.releases.pop(lease.session_id, None)
            else:
                self.missing.setdefault(lease.session_id, missing_since)
                if missing_reads is not None:
                    self.missing_reads[lease.session_id] = missing_reads

    def found(self, lease: Lease) -> None:
        with self._lock:
            self._held(lease)
            self.missing.pop(lease.session_id, None)
            self.missing_reads.pop(lease.session_id, None)
            self.releases.pop(lease.session_id, None)

    def missing_since(self, session_id: str) -> float | None:
        with self._lock:
            return self.missing.get(session_id)

    def not_found(self, session_id: str) -> NotFound | None:
        with self._lock:
            if session_id not in self.missing:
                return None
            reads, last = self.missing_reads.get(session_id, (1, None))
            return NotFound(self.missing[session_id], reads, last, self.releases.get(session_id))

    def ask_release(self, session_id: str, at: float) -> bool:
        with self._lock:
            if session_id not in self.missing:
                return False
            self.releases[session_id] = at
            return True

    def others_to_compare(self, session_id: str, count: int) -> list[str]:
        """The Redis store picks at random; here in order (the same preference)."""
        with self._lock:
            others = [sid for sid in sorted(self.records) if sid != session_id]
            answering = [sid for sid in others if sid not in self.missing]
            return (answering or [sid for sid in others if sid in self.missing])[:count]

    def reserve_prestart(self, lease: Lease, limit: int) -> bool:
        with self._lock:
            self._held(lease)
            if lease.session_id in self.prestarted:
                return True
            if len(self.prestarted) >= limit:
                return False
            self.prestarted.add(lease.session_id)
            return True

    def timer(self, session_id: str) -> float | None:
        with self._lock:
            return self.timers.get(session_id)

    def armed(self) -> set[str]:
        with self._lock:
            return set(self.timers)

    def take_due_at(self, now: float, limit: int = 500) -> list[str]:
        """``timers.Due.take_due`` at a given time (the Redis one reads Redis's clock)."""
        with self._lock:
            due = sorted((t, sid) for sid, t in self.timers.items() if t <= now)[:limit]
            for _, sid in due:
                del self.timers[sid]
                self._s(sid).want += 1
            return [sid for _, sid in due]


@dataclass
class _Sandbox:
    handle: Handle
    spec: SandboxSpec
    health: Health = Health.RUNNING


@dataclass
class FakeRunner:
    """``Runner`` in memory: records every call, keeps one entry per live sandbox.

    Like the real runners, ``ensure`` returns the session's live sandbox when there is one
    and starts one otherwise; ``release`` stops only the sandbox whose uid the handle names.
    ``max_live`` remembers the most sandboxes one session ever had at once (L1: must stay 1).
    """

    calls: list[tuple[str, str, int]] = field(default_factory=list)
    live: dict[str, _Sandbox] = field(default_factory=dict)
    max_live: dict[str, int] = field(default_factory=dict)
    on_ensure: Callable[[SandboxSpec, int], None] | None = None
    fail_ensure: Exception | None = None
    _uids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _sandboxes: dict[str, _Sandbox] = field(default_factory=dict)  # by uid, released ones too
    kept_workspaces: set[str] = field(default_factory=set)  # sessions whose workspace outlives sandboxes

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        self.calls.append(("ensure", spec.session_id, generation))
        if self.on_ensure is not None:
            self.on_ensure(spec, generation)
        if self.fail_ensure is not None:
            raise self.fail_ensure
        current = self.live.get(spec.session_id)
        if current is not None and current.health in (Health.RUNNING, Health.STARTING):
            return current.handle
        if current is not None:  # a failed or terminating one still counts as live until released
            self.max_live[spec.session_id] = max(self.max_live.get(spec.session_id, 1), 2)
        handle = Handle(
            session_id=spec.session_id,
            name=f"sandbox-{spec.session_id}-g{generation}",
            generation=generation,
            uid=f"uid-{next(self._uids)}",
            environment_id=spec.environment_id,
        )
        sandbox = _Sandbox(handle=handle, spec=spec)
        self.kept_workspaces.add(spec.session_id)
        self.live[spec.session_id] = sandbox
        self._sandboxes[handle.uid] = sandbox
        self.max_live.setdefault(spec.session_id, 1)
        return handle

    def status(self, handle: Handle) -> Health:
        current = self.live.get(handle.session_id)
        if current is None or current.handle.uid != handle.uid:
            return Health.GONE
        return current.health

    def release(self, handle: Handle) -> None:
        self.calls.append(("release", handle.session_id, handle.generation))
        current = self.live.get(handle.session_id)
        if current is not None and current.handle.uid == handle.uid:
            del self.live[handle.session_id]

    def find(self, session_id: str) -> Handle | None:
        current = self.live.get(session_id)
        if current is None or current.health not in (Health.RUNNING, Health.STARTING):
            return None
        return current.handle

    def discard(self, session_id: str) -> None:
        self.calls.append(("discard", session_id, 0))
        self.kept_workspaces.discard(session_id)

    def list_managed(self) -> list[Handle]:
        return [s.handle for s in self.live.values()]

    def workspaces(self) -> list[str]:
        return sorted(self.kept_workspaces)

    def keeps_workspace(self, session_id: str) -> bool:
        return session_id in self.kept_workspaces

    # -- test helpers --------------------------------------------------------------------

    def set_health(self, handle: Handle, health: Health) -> None:
        self._sandboxes[handle.uid].health = health

    def spec_of(self, session_id: str) -> SandboxSpec:
        return self.live[session_id].spec

    def runner_calls(self) -> list[tuple[str, str, int]]:
        return list(self.calls)


class FakeInbox:
    """An ``Inbox`` in memory: de-duplicates on ``webhook_id``, remembering an id only
    after its job was queued (so a failed submit is processed on retry, L5).

    Set ``unavailable = True`` to make ``submit`` raise ``QueueUnavailable`` (with
    ``retry_after``) and ``ready`` answer False, as a broker outage would.
    """

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.attempts = 0
        self.unavailable = False
        self.retry_after: float | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    async def submit(self, job: Job) -> Outcome:
        with self._lock:
            self.attempts += 1
            if self.unavailable:
                raise QueueUnavailable("fake broker is down", retry_after=self.retry_after)
            if job.webhook_id in self._seen:
                return Outcome.DUPLICATE
            self.jobs.append(job)
            self._seen.add(job.webhook_id)
            return Outcome.ENQUEUED

    async def ready(self) -> bool:
        return not self.unavailable


# --- World: lifecycle.work over the fakes ---------------------------------------------------

GRACE = 60.0
T0 = 1_700_000_000.0
REMOTE = "https://api.openai.com/v1/agents/env"


def verdicts(result: list[Decision] | Busy) -> list[Verdict]:
    """The verdicts of one ``work`` call (which must not have been Busy)."""
    assert isinstance(result, list), result
    return [d.verdict for d in result]


class World:
    """Sessions, store, runner and a clock at ``T0``, wired into ``Deps``; every decision is kept
    in ``decisions`` (and also handed to ``on_decision`` when given)."""

    def __init__(
        self,
        max_lifetime: float | None = None,
        on_decision: Callable[[str, Decision], None] | None = None,
        idle_timeout: float = 0.0,
        retention: float = 0.0,
        prestart_agent_ids: tuple[str, ...] = (),
        prestart_max: int = 10,
        deletion_confirm: float = 0.0,
        trust_policy: Policy = DEFAULT_POLICY,
    ) -> None:
        self.clock = FakeClock(T0)
        self.sessions = FakeSessions()
        self.store = FakeStore()
        self.runner = FakeRunner()
        self.decisions: list[tuple[str, Decision]] = []
        self.published: list[str] = []
        self.stopped: list[str] = []
        self.held = 0
        """Deletions held (``Deps.on_held``)."""
        self.prestarts_skipped = 0
        """Creations that started nothing for want of pre-start budget (``Deps.on_prestart_skipped``)."""
        self.crash_loops = 0
        """Crash-loop back-offs begun (``Deps.on_crash_loop``)."""
        self.refusals: Counter[str] = Counter()
        """Sessions refused a sandbox, by kind (``Deps.on_refusal``)."""

        def decided(session_id: str, decision: Decision) -> None:
            self.decisions.append((session_id, decision))
            if on_decision is not None:
                on_decision(session_id, decision)

        self.deps = Deps(
            sessions=self.sessions,
            store=self.store,
            runner=self.runner,
            clock=self.clock,
            grace_seconds=GRACE,
            max_lifetime_seconds=max_lifetime,
            on_decision=decided,
            idle_timeout_seconds=idle_timeout,
            retention_seconds=retention,
            on_stop=self.stopped.append,
            prestarts_agent=LifecycleSettings(prestart_agent_ids=prestart_agent_ids).prestarts_agent,
            prestart_max_sandboxes=prestart_max,
            on_prestart_skipped=self._prestart_skipped,
            deletion_confirm_seconds=deletion_confirm,
            on_held=self._held,
            trust_policy=trust_policy,
            on_refusal=self._refused,
            on_crash_loop=self._crash_loop,
        )

    def _crash_loop(self) -> None:
        self.crash_loops += 1

    def _held(self) -> None:
        self.held += 1

    def _refused(self, kind: str) -> None:
        self.refusals[kind] += 1

    def _prestart_skipped(self) -> None:
        self.prestarts_skipped += 1

    def deliver(self, session_id: str = "sess_1") -> list[Decision] | Busy:
        """A delivery: want more work, then work it."""
        self.store.want(session_id)
        return work(session_id, self.deps)

    def orphan(self, session_id: str = "sess_1", generation: int = 1) -> Handle:
        """A live sandbox nobody recorded (its worker died between ensure and save)."""
        handle = self.runner.ensure(SandboxSpec(session_id, "env_1", REMOTE), generation)
        self.runner.calls.clear()
        return handle

    def mapped(self, session_id: str = "sess_1") -> Handle:
        """A sandbox started and recorded by a worker."""
        handle = self.runner.ensure(SandboxSpec(session_id, "env_1", REMOTE), 1)
        self.runner.calls.clear()
        self.store.records[session_id] = Record(session_id, "env_1", handle, self.clock.now())
        return handle

    def sweep(self) -> reconcile.Sweep:
        return reconcile.sweep(self.store, self.runner, self.published.extend)

    def work_published(self) -> dict[str, list[Verdict]]:
        """Work every session the sweep published, as the queue would."""
        done = {sid: verdicts(work(sid, self.deps)) for sid in self.published}
        self.published.clear()
        return done

    def fire_timers(self) -> dict[str, list[Verdict]]:
        """What the active scheduler does each second: fire due timers, then work each session."""
        due = self.store.take_due_at(self.clock.now())
        return {sid: verdicts(work(sid, self.deps)) for sid in due}

    def count(self, call: str, session_id: str = "sess_1") -> int:
        """How often the runner saw ``call`` for a session."""
        return sum(1 for c in self.runner.calls if c[0] == call and c[1] == session_id)


def new_session(agent_id: str = "agent_1", age: float = 2.0, **more: object) -> Session:
    """A self-hosted session created ``age`` seconds before ``T0``, asking for nothing yet."""
    fields: dict[str, object] = {"status": SessionStatus.IDLE, "actions": (), "agent_id": agent_id, **more}
    return make_session(created_at=int(T0 - age), **fields)  # type: ignore[arg-type]


def idle_since(at: float, status: SessionStatus = SessionStatus.IDLE, actions: tuple[str, ...] = ()) -> Session:
    return replace(make_session(status=status, actions=actions), last_active_at=int(at))
