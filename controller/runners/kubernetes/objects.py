"""The Kubernetes objects the runner reads, as the project's own values, and what they say (pure).

``api`` (the one door to the API server) makes them from its answers; the runner, the placement
protocol and the pod watch read only these, never the client's models. A ``Pod`` carries what
they look at: its name and uid, its resource version, its labels and annotations (the session,
generation and pool that ``names`` defines), whether it is being deleted, the node selector,
node and Localhost seccomp profile of its spec, the claim its ``workspace`` volume names and
its containers' images (the node agent's), and its status (phase, a terminated container,
the Ready condition, restarts, when it was scheduled and its container started, why the
scheduler could not place it, why its container waits), read from the API server's JSON
(``pod_from_json``: the client's models are never built on a claim's path). Its properties say
what those mean:
its ``health`` as the runner reports it, its ``generation``, and when it began to serve its
session (``started_at``: its claim for a warm pod, else its creation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.model import Health
from controller.runners.kubernetes import checkpoints, names


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
    node_selector: dict[str, str] = field(default_factory=dict)
    node_name: str = ""
    """The node it was bound to ("": not scheduled yet)."""
    seccomp_profile: str | None = None
    """The ``Localhost`` seccomp profile its (first) container names, else the pod's; None: none."""
    unschedulable: str | None = None
    """The scheduler's message while its ``PodScheduled`` condition is False for ``Unschedulable``."""
    waiting: tuple[str, str] | None = None
    """(reason, message) of the first container waiting with a reason (``CreateContainerError``…)."""
    workspace_claim: str | None = None
    """The claim its ``workspace`` volume names; None: no such volume, or not a claim."""
    images: tuple[str, ...] = ()
    """The images its containers (init and ephemeral ones included) name."""

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
        if self.restored and checkpoints.restore_failed(self.waiting, self.phase):
            return Health.FAILED  # its checkpoint cannot come back: the next pod starts afresh
        return Health.STARTING

    @property
    def restored(self) -> bool:
        """A pod restored from a checkpoint image (``checkpoints``)."""
        return bool(self.annotations.get(checkpoints.RESTORED_FROM))

    @property
    def lineage_started_at(self) -> float:
        """A restored pod's lineage's first start (Unix seconds); 0 for any other pod."""
        try:
            return float(self.annotations.get(checkpoints.LINEAGE_STARTED_AT, "0"))
        except ValueError:
            return 0.0

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
    def claimed_at(self) -> float | None:
        """When a session claimed this warm pod (the claiming worker's clock); None when it was
        not claimed, or its stamp is unreadable."""
        try:
            return float(self.annotations[names.CLAIMED_AT_ANNOTATION])
        except (KeyError, ValueError):
            return None

    @property
    def started_at(self) -> float:
        """When the pod began to serve its session: its claim (a warm pod), else its creation."""
        claimed = self.claimed_at
        return self.created_at if claimed is None else claimed


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


def pod_from_json(pod: Mapping[str, Any]) -> Pod:
    """The project's ``Pod`` from a pod as the API server's JSON has it (camelCase fields)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    conditions = status.get("conditions") or []
    waiting = [w for c in containers if (w := (c.get("state") or {}).get("waiting") or {}).get("reason")]
    return Pod(
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        resource_version=meta.get("resourceVersion") or "",
        created_at=_seconds(meta.get("creationTimestamp")),
        deleting=meta.get("deletionTimestamp") is not None,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        phase=status.get("phase"),
        terminated=any((c.get("state") or {}).get("terminated") is not None for c in containers),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        restarts=sum(c.get("restartCount") or 0 for c in containers),
        scheduled_at=next(
            (
                _seconds(c.get("lastTransitionTime"))
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "True"
            ),
            0.0,
        ),
        container_started_at=next(
            (
                _seconds(running.get("startedAt"))
                for c in containers
                if (running := (c.get("state") or {}).get("running")) is not None
            ),
            0.0,
        ),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_name=spec.get("nodeName") or "",
        seccomp_profile=_localhost_profile(spec),
        unschedulable=next(
            (
                c.get("message") or ""
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
            ),
            None,
        ),
        waiting=(waiting[0]["reason"], waiting[0].get("message") or "") if waiting else None,
        workspace_claim=next(
            (
                str(v["persistentVolumeClaim"].get("claimName") or "") or None
                for v in spec.get("volumes") or []
                if v.get("name") == "workspace" and v.get("persistentVolumeClaim")
            ),
            None,
        ),
        images=tuple(
            str(c["image"])
            for kind in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(kind) or []
            if c.get("image")
        ),
    )


def _localhost_profile(spec: Mapping[str, Any]) -> str | None:
    """The ``Localhost`` seccomp profile the first container names (its own security context
    wins over the pod's), or None."""
    containers = spec.get("containers") or [{}]
    for context in ((containers[0] or {}).get("securityContext"), spec.get("securityContext")):
        profile = (context or {}).get("seccompProfile") or {}
        if profile.get("type"):
            return profile.get("localhostProfile") if profile["type"] == "Localhost" else None
    return None


def _seconds(stamp: str | None) -> float:
    """An API server's time (RFC 3339: ``2026-12-01T22:00:00Z``, maybe with a fraction or an
    offset) as Unix seconds; 0 when missing or unreadable."""
    if not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
