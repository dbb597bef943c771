"""Plain data the rest of the controller speaks: sessions, sandbox specs, handles, records.

No I/O here. Adapters build these from the wire (``sessions.py``) or from storage
(``store/``); decisions (``lifecycle.py``) read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ENVIRONMENT_CONNECTION = "environment_connection"
DEFAULT_WORKSPACE = "/workspace"


class SessionStatus(StrEnum):
    IDLE = "idle"
    IN_PROGRESS = "in_progress"
    REQUIRES_ACTION = "requires_action"
    FAILED = "failed"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, value: object) -> SessionStatus:
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class RequiredAction:
    type: str
    environment_id: str | None = None


@dataclass(frozen=True)
class Environment:
    type: str  # "none" | "openai_hosted" | "self_hosted"
    id: str | None = None
    remote_url: str | None = None
    workspace_directory: str = DEFAULT_WORKSPACE

    @property
    def self_hosted(self) -> bool:
        return self.type == "self_hosted"


@dataclass(frozen=True)
class Session:
    """The fields of an Agents API session the controller uses."""

    id: str
    status: SessionStatus
    environment: Environment
    required_actions: tuple[RequiredAction, ...] = ()
    agent_id: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: int = 0
    last_active_at: int | None = None
    error: Any = None

    @property
    def wants_connection(self) -> bool:
        """A self-hosted session that still lists an environment_connection action (L7)."""
        return self.environment.self_hosted and any(a.type == ENVIRONMENT_CONNECTION for a in self.required_actions)


@dataclass(frozen=True)
class SandboxSpec:
    """What a runner needs to start one session's executor (L8)."""

    session_id: str
    environment_id: str
    remote_url: str
    workspace_directory: str = DEFAULT_WORKSPACE
    template: str | None = None


class Health(StrEnum):
    """How a runner sees one sandbox."""

    STARTING = "starting"  # created, executor not up yet
    RUNNING = "running"  # process/pod alive
    TERMINATING = "terminating"  # being deleted; never reuse
    FAILED = "failed"  # exited or failed
    GONE = "gone"  # nothing there


class Link(StrEnum):
    """An environment's link as the Agents API reports it (its ``status``)."""

    UP = "up"  # ``connected``: an executor holds it
    DROPPED = "dropped"  # ``disconnected``: an executor held it and lost it
    NOT_YET = "not_yet"  # any other status (``pending``, ``ready``, …): no executor has held it


@dataclass(frozen=True)
class NotFound:
    """What the store keeps of a session whose reads answer 404, until its deletion is confirmed
    or it is found again (``decide.Missing``)."""

    since: float
    """When its reads began answering 404 (Unix seconds, Redis's clock)."""
    reads: int = 1
    """404 reads counted toward the confirmation (``decide.counted``)."""
    last_read: float | None = None
    """When the last counted one was made (None: at ``since``)."""
    release_asked: float | None = None
    """When an operator asked for its release (``sandbox-controller release``), or None."""


@dataclass(frozen=True)
class Handle:
    """A runner's name for one sandbox: stable, storable, enough to find it again."""

    session_id: str
    name: str
    generation: int
    uid: str = ""  # pod UID or process id: distinguishes two sandboxes of one name
    environment_id: str = ""  # the environment its executor serves
    created_at: float = 0.0  # when the sandbox was created (Unix seconds; 0 when unknown)
    lineage_started_at: float = 0.0
    """A sandbox restored from a checkpoint: when the first sandbox of its lineage started (Unix
    seconds), its maximum lifetime's start; 0: this sandbox started its lineage."""


@dataclass(frozen=True)
class CannotStart:
    """Why a sandbox that is starting cannot start, as its runner reads it (a Kubernetes pod
    whose node lacks the seccomp profile its template names): a replacement would not start
    either, so it is reported and kept, not replaced (``decide``)."""

    kind: str
    """A fixed word (the ``reason`` label of ``controller_sandboxes_cannot_start_total``)."""
    reason: str
    """In plain words, with what to do about it (ids only, never a secret)."""
    template: str = ""
    """The template the sandbox was made from ("": unknown)."""


@dataclass(frozen=True)
class PoolState:
    """One warm pool as its tending found it (before adding or deleting any pod)."""

    template: str
    size: int
    """The pods the template asks to keep waiting."""
    ready: int
    """Usable unclaimed pods whose container runs: a claim of one connects at once."""
    starting: int
    """Usable unclaimed pods still starting (scheduled, pulling, creating)."""


@dataclass(frozen=True)
class Record:
    """The stored session→sandbox mapping (L1).

    Its states: active (``stopped_at`` is None: the handle names a sandbox that should be
    running) → stopped (the sandbox was stopped; the workspace is kept for the next one, L16)
    → gone (the workspace was discarded and the mapping removed).
    """

    session_id: str
    environment_id: str
    handle: Handle
    started_at: float
    stopped_at: float | None = None
    """When the sandbox was stopped with its workspace kept; None while it is active."""
    disconnected_at: float | None = None
    """When the grace clock started: the first look that saw the executor without its link (for
    a new sandbox, its start); None while it is seen connected. A replacement for a link that is
    down counts the grace period from here (L14)."""
    seen_connected: bool = False
    """Whether a look ever saw this sandbox's executor connected, or found its link dropped (the
    API's ``disconnected``: held, then lost). Until then the sandbox is looked at again soon
    after its start (``decide.FIRST_LOOK_SECONDS``), so that a link that comes up and then drops
    is timed from the drop, not from the start."""
    prestarted: bool = False
    """Started at the session's creation, before anything asked for it (L9's pre-start), and not
    used since; these count against ``CONTROLLER_PRESTART_MAX_SANDBOXES``."""
    link_unknown: bool = False
    """A look could not read the link (the API failed) while the grace clock ran: the next look
    that sees it down starts the clock again (``decide._looked``)."""
    link_looked_at: float | None = None
    lineage_started_at: float | None = None
    """A sandbox restored from a checkpoint (``Handle.lineage_started_at``): when its lineage's
    first sandbox started; its maximum lifetime counts from there, not from this restore. None:
    from ``started_at``."""
    """When the last look that saw the link down while the grace clock ran was made: a look
    that comes much later than the looks' cadence (its reads retried past an API incident, say)
    may have missed the link coming back, so it starts the clock again (``decide._looked``)."""
    down_since: float | None = None
    """When the first look that saw this outage's link down was made (an executor that had
    connected): unlike ``disconnected_at``, a blind spot does not move it, only a look that sees
    the link up clears it; it bounds how long blind spots can delay a replacement
    (``decide.BLIND_SPOT_GRACES``). None: no outage, or a record from before it was kept."""
    crashes: int = 0
    """Consecutive sandboxes of the session whose executor exited (or whose sandbox was gone)
    before it had stayed up and connected for ``decide.CRASH_LOOP_RESET_SECONDS``: the
    crash loop's restart count, carried from each sandbox to its replacement."""
    backoff_until: float | None = None
    """While a crash loop backs off: when the exited sandbox may be replaced (``decide``'s
    crash-loop back-off); None otherwise."""
    cannot_start_since: float | None = None
    """When a look first found this sandbox unable to start (``CannotStart``: reported then, kept
    and not replaced while it lasts); None otherwise. The first look that finds it able to start
    again starts its grace clock afresh."""

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    @property
    def lifetime_started_at(self) -> float:
        """When its maximum lifetime counts from: its lineage's first start (restored), or its own."""
        return self.started_at if self.lineage_started_at is None else self.lineage_started_at


@dataclass(frozen=True)
class LastDecision:
    """The latest decision a worker made about a session, as ``status`` and ``explain`` show it."""

    verdict: str
    reason: str
    at: float
    """When it was made (Unix seconds, Redis's clock)."""
    held: bool = False
    """A deletion it held because most sessions read answer 404 (``decide.Decision.held``)."""
