"""The Kubernetes objects the runner reads, as the project's own values, and what they say (pure).

``api`` (the one door to the API server) makes them from its answers; the runner, the placement
protocol and the pod watch read only these, never the client's models. A ``Pod`` carries what
they look at: its name and uid, its resource version, its labels and annotations (the session,
generation and pool that ``names`` defines), whether it is being deleted, and its status (phase,
a terminated container, the Ready condition, restarts, when it was scheduled and its container
started). Its properties say what those mean:
its ``health`` as the runner reports it, its ``generation``, and when it began to serve its
session (``started_at``: its claim for a warm pod, else its creation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.model import Health
from controller.runners.kubernetes import names


@dataclass(frozen=True)
class PodRef:
    """One pod, exactly: its name and its uid (a newer pod of the same name has another)."""

    name: str
    uid: str


@dataclass(frozen=True)
class Pod:
    """A pod as the controller reads it (a sandbox, or a warm pod of a pool)."""

    name: str
    uid: str
    resource_version: str = ""
    created_at: float = 0.0
    """Its creation (Unix seconds; 0 when the API server did not say)."""
    deleting: bool = False
    """It has a deletion timestamp: it is terminating, or waits for its finalizers."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    phase: str | None = None
    terminated: bool = False
    """One of its containers has terminated."""
    ready: bool = False
    """Its Ready condition is True."""
    restarts: int = 0
    """Container restarts, summed over its containers."""
    scheduled_at: float = 0.0
    """When its ``PodScheduled`` condition turned True (the API's stamp, to the second; 0: not yet)."""
    container_started_at: float = 0.0
    """When its (first) container started running (the kubelet's stamp, to the second; 0: not yet)."""

    @property
    def ref(self) -> PodRef:
        return PodRef(self.name, self.uid)

    @property
    def health(self) -> Health:
        if self.deleting:
            return Health.TERMINATING
        if self.phase in ("Failed", "Succeeded"):
            return Health.FAILED
        if self.phase == "Running":
            return Health.FAILED if self.terminated else Health.RUNNING
        return Health.STARTING

    @property
    def alive(self) -> bool:
        return self.health in (Health.STARTING, Health.RUNNING)

    @property
    def generation(self) -> int:
        try:
            return int(self.labels.get(names.GENERATION_LABEL, "0"))
        except ValueError:
            return 0

    @property
    def session_id(self) -> str:
        return self.annotations.get(names.SESSION_ID_ANNOTATION, "")

    @property
    def claimed(self) -> bool:
        """A warm pod a session has claimed."""
        return self.labels.get(names.POOL_STATE_LABEL) == names.CLAIMED

    @property
    def started_at(self) -> float:
        """When the pod began to serve its session: its claim (a warm pod), else its creation."""
        claimed = self.annotations.get(names.CLAIMED_AT_ANNOTATION)
        if claimed:
            try:
                return float(claimed)
            except ValueError:
                pass
        return self.created_at


@dataclass(frozen=True)
class Claim:
    """A workspace PersistentVolumeClaim."""

    name: str
    annotations: dict[str, str] = field(default_factory=dict)
    deleting: bool = False


def newest(live: list[Pod]) -> tuple[int, list[Pod]]:
    """The newest generation among a session's live pods, and its pods, earliest placed first."""
    generation = max((p.generation for p in live), default=0)
    return generation, sorted((p for p in live if p.generation == generation), key=lambda p: p.started_at)
