"""The Kubernetes runner: the runner protocol (``runners.base``) over one pod per session (plus
an optional workspace PVC), as a thin adapter.

Where a session's pod comes from is ``placement.Placement``'s whole choice (its live pod, a
claimed warm pod, or a cold pod, one per session and generation, L1, never reusing a terminating
pod's name, L14), and so is its release; this adapter checks the spec (L2), picks the template,
and turns the pod placed into a ``Handle``. It reads a pod's health (and, while it starts, why it
cannot: ``seccomp``, its node lacking its seccomp profile) and start stamps, the
session's workspace PVC, and the managed pods; deletes carry a UID precondition, so a stale
handle can never delete a newer pod of the same name. A pool sized by demand is tended at the
target of its recent placements (``pool.peak``, ``pool.target``), which the workers note in a
``DemandLog``.

Every call to the API server goes through ``api.KubeApi``, the one door, which translates its
answers once: 404/409/410 come back as values (idempotency signals), 429/5xx are retried
briefly and then raised as ``KubernetesUnavailable``, 401/403 become ``RunnerRejected`` naming
the permission that is missing (or carrying admission's own message).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from controller import logs
from controller.errors import StoreUnavailable
from controller.model import CannotStart, Handle, Health, PoolState, SandboxSpec
from controller.runners.base import DemandLog, checked
from controller.runners.kubernetes import names, seccomp
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.objects import Pod, PodRef
from controller.runners.kubernetes.placement import Placement
from controller.runners.kubernetes.pool import peak, settling, target
from controller.runners.kubernetes.suspension import Suspensions

log = logs.get(__name__)


class KubernetesRunner:
    def __init__(
        self,
        kube: KubeApi,
        settings: PodSettings,
        templates: Callable[[str | None], SandboxTemplate],
        pools: Sequence[SandboxTemplate] = (),
        on_placed: Callable[[str, str, str], None] = lambda template, source, reason: None,
        demand: DemandLog | None = None,
        checkpointing: bool = False,
        checkpoint_timeout_seconds: float = 60.0,
        max_lifetime_seconds: float | None = None,
        on_resume: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        """``on_placed(template, source, reason)`` is told of each pod placed for a session
        (``placement.Placement``). ``demand``: where the pools sized by demand read their
        placements (without it such a pool keeps its ``min``). ``checkpointing``: some template
        has ``suspend: checkpoint`` (``suspension``): its idle pods are checkpointed by their node's
        agent within ``checkpoint_timeout_seconds``, and restored unless their lineage started
        ``max_lifetime_seconds`` ago; ``on_resume`` is told how each such start went."""
        self._kube = kube
        self._ns = settings.namespace
        self._templates = templates
        self._demand = demand
        self._sized = tuple(t for t in pools if t.pooled and t.sized_by_demand)
        self._pooled = tuple(t for t in pools if t.pooled)
        self._targets: dict[str, int] = {}
        self._checkpointing = checkpointing
        self._suspensions = Suspensions(
            kube, settings.namespace, checkpoint_timeout_seconds, max_lifetime_seconds, on_resume
        )
        self._placement = Placement(kube, settings, pools, on_placed, self._suspensions.restored)

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        template = self._templates(spec.template)
        restore = self._suspensions.restore_for(spec, generation) if template.checkpoint_idle else None
        pod = self._placement.ensure(spec, generation, template, restore)
        return _handle(spec.session_id, pod)

    # -- suspend with memory (``runners.base.Suspends``) -----------------------------------

    @property
    def checkpointing(self) -> bool:
        """Whether some template checkpoints its idle sandboxes (``suspend: checkpoint``)."""
        return self._checkpointing

    def suspend(self, handle: Handle) -> None:
        """Checkpoint the idle pod (its node's agent makes the image), delete it, then record
        the checkpoint on the session's claim; a pod of a template without ``suspend:
        checkpoint``, or one the agent could not checkpoint, is only deleted."""
        pod = self._kube.read_pod(self._ns, handle.name)
        if pod is None or pod.uid != handle.uid:
            return
        template = self._templates(pod.annotations.get(names.TEMPLATE_ANNOTATION))
        record = self._suspensions.take(handle, pod) if template.checkpoint_idle else None
        self._placement.release(handle.session_id, pod.ref)
        if record is not None:
            self._suspensions.keep(handle.session_id, record)

    def suspended(self, session_id: str) -> dict[str, float] | None:
        """The session's checkpoint not yet restored (``size_bytes``, ``suspended_at``), or None."""
        if not self._checkpointing:
            return None
        return self._suspensions.suspended(session_id)

    def connect(self) -> None:
        """Open the connection to the API server now (``runners.base.Connects``)."""
        self._kube.connect(self._ns, names.managed_selector())

    def placement(self, session_id: str) -> tuple[str, str] | None:
        """The template and source (``warm``: a claimed pod, else ``cold``) of the pod this
        runner's last ``ensure`` for the session returned; None when this process placed none
        lately (``runners.base.Starts``)."""
        return self._placement.last(session_id)

    def start_stamps(self, handle: Handle) -> dict[str, float]:
        """When the pod was created, scheduled and its container started (the API's and the
        kubelet's stamps, to the second), for a pod created for its session; nothing for a
        claimed warm pod (those happened before its session) or a pod that is gone."""
        pod = self._kube.read_pod(self._ns, handle.name)
        if pod is None or pod.uid != handle.uid or pod.claimed:
            return {}
        stamps = {"pod_created": pod.created_at, "scheduled": pod.scheduled_at}
        stamps["container_started"] = pod.container_started_at
        return {name: at for name, at in stamps.items() if at}

    def tend_pools(self) -> list[PoolState]:
        """Keep every warm pool at its size (the scheduler's leader calls this every few
        seconds), a pool sized by demand at its target now; returns each pool as this tending
        found it. A pool grows only once its sessions are no longer being placed."""
        return self._placement.tend({t.name: self._target(t) for t in self._sized}, self._settling())

    def _settling(self) -> set[str]:
        """The pools whose template's sessions are being placed now (``pool.settling``): their
        new pods wait. Without the placements (no ``demand``, Redis away) none waits."""
        held: set[str] = set()
        if self._demand is None:
            return held
        for template in self._pooled:
            try:
                now, stamps = self._demand.recent(template.name)
            except StoreUnavailable:
                continue
            if settling(stamps, now):
                held.add(template.name)
        return held

    def _target(self, template: SandboxTemplate) -> int:
        """The size a pool sized by demand aims at now (``pool.target`` of its recent peak). When
        the placements cannot be read (Redis away), the last target stands (at first, ``min``)."""
        last = self._targets.get(template.name, template.warm_pool_min)
        if self._demand is None:
            return last
        try:
            now, stamps = self._demand.recent(template.name)
        except StoreUnavailable as exc:
            log.warning(
                "could not read the warm pool's demand; its target stands",
                extra={"template": template.name, "target": last, "reason": str(exc)},
            )
            return last
        demand = peak(stamps, now, template.warm_interval_seconds, template.warm_window_seconds)
        aim = target(demand, template.warm_pool_min, template.warm_pool_max, template.warm_headroom_percent)
        if aim != last or template.name not in self._targets:
            log.info(
                "warm pool target set",
                extra={"template": template.name, "target": aim, "previous": last, "peak": demand},
            )
        self._targets[template.name] = aim
        return aim

    def status(self, handle: Handle) -> Health:
        return self.diagnose(handle)[0]

    def diagnose(self, handle: Handle) -> tuple[Health, CannotStart | None]:
        """The pod's health and, while it starts, why it cannot (``seccomp.cannot_start``: its
        node lacks its seccomp profile), from one read (``runners.base.Diagnoses``)."""
        pod = self._kube.read_pod(self._ns, handle.name)
        if pod is None or pod.uid != handle.uid:
            return Health.GONE, None
        if pod.restored and pod.health is Health.RUNNING:
            self._suspensions.settle(pod)  # its restore took: the record is spent
        return pod.health, seccomp.cannot_start(pod) if pod.health is Health.STARTING else None

    def tell_cannot_start(self, handle: Handle, found: CannotStart) -> None:
        """A Warning Event on the pod, for ``kubectl describe`` and ``kubectl get events``."""
        message = f"cannot start for session {handle.session_id}: {found.reason}"
        self._kube.note(self._ns, PodRef(handle.name, handle.uid), "SandboxCannotStart", message, warning=True)

    def release(self, handle: Handle) -> None:
        self._placement.release(handle.session_id, PodRef(handle.name, handle.uid))

    def discard(self, session_id: str) -> None:
        """Delete what outlives pods (the workspace PVC), once the session is released for good (L16)."""
        self._kube.delete_claim(self._ns, names.pvc_name(session_id))

    def find(self, session_id: str) -> Handle | None:
        pod = self._placement.find(session_id)
        return _handle(session_id, pod) if pod is not None else None

    def keeps_workspace(self, session_id: str) -> bool:
        """A claim being deleted (it waits for its pvc-protection finalizer) is no longer kept."""
        claim = self._kube.read_claim(self._ns, names.pvc_name(session_id))
        return claim is not None and not claim.deleting

    def workspaces(self) -> list[str]:
        claims = self._kube.list_claims(self._ns, names.managed_selector())
        return sorted(
            {
                claim.annotations[names.SESSION_ID_ANNOTATION]
                for claim in claims
                if claim.annotations.get(names.SESSION_ID_ANNOTATION) and not claim.deleting
            }
        )

    def list_managed(self) -> list[Handle]:
        pods = self._kube.list_pods(self._ns, names.managed_selector())
        return [_handle(pod.session_id, pod) for pod in pods if pod.session_id]


def _handle(session_id: str, pod: Pod) -> Handle:
    """The runner's name for the session's pod."""
    return Handle(
        session_id=session_id,
        name=pod.name,
        generation=pod.generation,
        uid=pod.uid,
        environment_id=pod.annotations.get(names.ENVIRONMENT_ID_ANNOTATION, ""),
        created_at=pod.started_at,
        lineage_started_at=pod.lineage_started_at,
    )
