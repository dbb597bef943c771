"""The Kubernetes runner: one pod per session (plus an optional workspace PVC).

Idempotent by construction (L1): ``ensure`` first looks for a live pod of the session (by
its session-hash label) and returns it; only when there is none does it place the pod of
the requested generation. A cold pod is named after its session and generation, so creating
it twice creates it once: ``AlreadyExists`` counts as "already done" only when the pod of that
name is of this generation and alive; a terminating or finished pod is never reused: the next
generation is created instead (L14). Deletes carry a UID precondition, so a stale handle can
never delete a newer pod of the same name.

A template with a warm pool is placed by ``placement.WarmPools`` instead: a claimed warm pod,
else a cold one, kept only when the session's placement record (a Lease owned by the pod) names
it. Its look at the session's live pods goes through that record too (``settled``). A pool
sized by demand is tended at the target of its recent placements (``pool.peak``,
``pool.target``), which the workers note in a ``DemandLog``.

Every call to the API server goes through ``api.KubeApi``, the one door, which translates its
answers once: 404/409/410 come back as values (idempotency signals), 429/5xx are retried
briefly and then raised as ``KubernetesUnavailable``, 401/403 become ``RunnerRejected`` naming
the permission that is missing (or carrying admission's own message).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

from controller import logs
from controller.errors import StoreUnavailable, Transient
from controller.model import Handle, Health, PoolState, SandboxSpec
from controller.runners.base import DemandLog, checked
from controller.runners.kubernetes import names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, make_pod, make_pvc
from controller.runners.kubernetes.objects import Pod, PodRef, newest
from controller.runners.kubernetes.placement import MAX_GENERATION_SKIPS, WarmPools, live_pods
from controller.runners.kubernetes.pool import peak, settling, target

log = logs.get(__name__)
_PLACEMENTS_KEPT = 1000
"""Sessions whose last placement ``placement`` remembers (per process; a worker asks at once)."""


class KubernetesRunner:
    def __init__(
        self,
        kube: KubeApi,
        settings: PodSettings,
        templates: Callable[[str | None], SandboxTemplate],
        pools: Sequence[SandboxTemplate] = (),
        on_placed: Callable[[str, str, str], None] = lambda template, source, reason: None,
        demand: DemandLog | None = None,
    ) -> None:
        """``on_placed(template, source, reason)`` is told of each pod this runner placed for a
        session (``source``: ``warm``, a claimed warm pod, or ``cold``, a pod created for it;
        a cold pod's ``reason``: ``pool_empty``, its template's pool had no pod to claim,
        ``no_pool``, its template has none, or ``workspace_directory``, the session names
        another working directory than warm pods mount). ``demand``: where the pools sized by
        demand read their placements (without it such a pool keeps its ``min``)."""
        self._kube = kube
        self._settings = settings
        self._templates = templates
        self._ns = settings.namespace
        self._on_placed = on_placed
        self._demand = demand
        self._sized = tuple(t for t in pools if t.pooled and t.sized_by_demand)
        self._pooled = tuple(t for t in pools if t.pooled)
        self._targets: dict[str, int] = {}
        self._placed: OrderedDict[str, tuple[str, str]] = OrderedDict()

        def placed_from_pool(template: str, source: str) -> None:
            on_placed(template, source, "pool_empty" if source == "cold" else "")

        self._warm = WarmPools(kube, settings, pools, placed_from_pool)

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        template = self._templates(spec.template)
        pod = self._ensure(spec, generation, template)
        self._placed[spec.session_id] = (template.name, "warm" if pod.claimed else "cold")
        while len(self._placed) > _PLACEMENTS_KEPT:
            self._placed.popitem(last=False)
        return _handle(spec.session_id, pod)

    def _ensure(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Pod:
        live = live_pods(self._kube, self._ns, spec.session_id)
        if live and not template.pooled:
            return self._warm.chosen(spec.session_id, live)
        if live:
            settled = self._warm.settled(spec.session_id, live)
            if settled is not None:
                return settled
            generation = max(generation, newest(live)[0])  # that one is over
        if template.pooled and spec.workspace_directory == self._settings.workspace_directory:
            # warm pods mount the routing's directory
            return self._warm.place(spec, generation, template)
        reason = "workspace_directory" if template.pooled else "no_pool"
        return self._create_cold(spec, generation, template, reason)

    def placement(self, session_id: str) -> tuple[str, str] | None:
        """The template and source (``warm``: a claimed pod, else ``cold``) of the pod this
        runner's last ``ensure`` for the session returned; None when this process placed none
        lately (``runners.base.Starts``)."""
        return self._placed.get(session_id)

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

    def _create_cold(self, spec: SandboxSpec, generation: int, template: SandboxTemplate, reason: str) -> Pod:
        """The session's pod of ``generation`` (or the next free one): created, or the one a twin
        created under that name."""
        if template.persist_workspace:
            self._kube.create_claim(self._ns, make_pvc(spec, template, self._settings))
        for attempt in range(MAX_GENERATION_SKIPS):
            manifest = make_pod(spec, generation + attempt, template, self._settings)
            pod = self._kube.create_pod(self._ns, manifest)
            if pod is None:  # the name is taken
                existing = self._kube.read_pod(self._ns, manifest["metadata"]["name"])
                if existing is not None and existing.alive and existing.generation == generation + attempt:
                    return existing  # already done, by us or a twin
                continue  # that name belongs to a terminating or finished pod: never reuse it
            log.info(
                "pod created",
                extra={"session_id": spec.session_id, "pod": pod.name, "generation": generation + attempt},
            )
            message = f"executor for session {spec.session_id}, environment {spec.environment_id}"
            self._kube.note(self._ns, pod.ref, "SandboxStarted", message)
            self._on_placed(template.name, "cold", reason)
            return pod
        raise Transient(f"pods of session {spec.session_id} are still terminating", retry_after=5)

    def tend_pools(self) -> list[PoolState]:
        """Keep every warm pool at its size (the scheduler's leader calls this every few
        seconds), a pool sized by demand at its target now; returns each pool as this tending
        found it. A pool grows only once its sessions are no longer being placed."""
        return self._warm.tend({t.name: self._target(t) for t in self._sized}, self._settling())

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
        pod = self._kube.read_pod(self._ns, handle.name)
        if pod is None or pod.uid != handle.uid:
            return Health.GONE
        return pod.health

    def release(self, handle: Handle) -> None:
        if not self._kube.delete_pod(self._ns, handle.name, handle.uid):
            return
        log.info("pod deleted", extra={"session_id": handle.session_id, "pod": handle.name})
        self._kube.note(
            self._ns, PodRef(handle.name, handle.uid), "SandboxReleased", f"released for session {handle.session_id}"
        )

    def discard(self, session_id: str) -> None:
        """Delete what outlives pods (the workspace PVC), once the session is released for good (L16)."""
        self._kube.delete_claim(self._ns, names.pvc_name(session_id))

    def find(self, session_id: str) -> Handle | None:
        live = live_pods(self._kube, self._ns, session_id)
        return _handle(session_id, self._warm.chosen(session_id, live)) if live else None

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
    )
