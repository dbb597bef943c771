"""Placing a session's pod, the whole choice (one pod per session and generation, L1), its one
release, and keeping each warm pool at its size. ``runner`` (the runner protocol's adapter) asks
``Placement.ensure`` for the session's pod and ``Placement.release`` to delete it; nothing else
decides where a session's pod comes from.

The choice, in order: a live pod of the session is its pod (for a pooled template, only once
its placement record names it, ``settled``; of several, the newest generation's, ``chosen``).
Else a pod is placed for the requested generation, or for the next one above a generation that
is over: a claimed warm pod of the template's pool, else a cold pod created for it. A cold pod is
named after its session and generation, so creating it twice creates it once: a taken name
counts as "already done" only when its pod is of this generation and alive; a terminating or
finished pod's name is never reused: the next generation is placed instead (L14), at most
``MAX_GENERATION_SKIPS`` of them before the caller is asked to retry.

A template without a pool (or a session naming another working directory than warm pods mount)
gets a cold pod and nothing more. A pooled template's pod is placed by claiming a warm pod (a
JSON patch that succeeds only while the pod is unclaimed, ``manifests.claim_patch``), else by
creating a cold one. A claimed pod has no name derived from the session, so the name that makes
a cold start idempotent is carried by a **placement record** instead: a Lease named after the
session and generation (``names.placement_name``), owned by the placed pod. Whoever creates it
first decides that generation: a placement that finds it taken deletes its own pod and returns
the recorded one. The record lives exactly as long as its pod: the garbage collector deletes it
once the pod is gone (its ownerReference), and nothing deletes it while the pod lives. (An
Event, the record before, lapsed with the API server's event TTL, an hour by default, while its
pod served.) Each pod placed is also told to ``kubectl describe`` of the pod, by an Event
(``SandboxClaimed``, or ``SandboxStarted`` for a cold pod), and to ``on_placed`` (the metrics
of warm and cold starts).

A pod is claimed before its record exists, so a look that finds the session's live pods trusts
none of them, not even a lone one, until the record names it (``settled``); it writes the record
itself, for the earliest of them, when there is none yet (a placement that stopped between its
claim and its record). A record whose pod is no longer live moves the placement on to the next
generation, as a cold pod's terminating name does (once the collector has deleted the record
with its pod, that generation is free again, as a cold pod's name is). So does a cold name taken
by a pod that is dying, unless the record, read again, names a live pod (a rival's claim won
while this placement's cold pod lost). So ``ensure`` calls racing for one session (possible only
once its lease lapsed) all return the same pod. A round's ``find`` that saw no live pod stands
in for its ``ensure``'s own list moments later (``NONE_SEEN_FRESH_SECONDS``): the record and the
cold pod's name settle a rival placing in between, as they do between the list and the claim.

A claim adds no pod in its place: ``tend`` (the scheduler's leader, every few seconds) replaces
dead, misshapen and too old warm pods and fills each pool up to its size once its sessions are
no longer being placed (``pool.settling``), deleting only with the resource version it saw (a
pod claimed since is left to its session). It also refreshes each claimed pod's binding once
(``pool.binding_refresh_due``: the kubelet can miss the claim's update).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence

from controller import logs
from controller.errors import KubernetesUnavailable, RunnerRejected, Transient
from controller.model import Health, PoolState, SandboxSpec
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.manifests import (
    PodSettings,
    SandboxTemplate,
    binding_refresh_patch,
    claim_patch,
    make_pod,
    make_pvc,
    make_warm_pod,
    shape,
)
from controller.runners.kubernetes.objects import Pod, PodRef, newest
from controller.runners.kubernetes.pool import WarmPod, binding_refresh_due, census, claim_order, plan

log = logs.get(__name__)
MAX_GENERATION_SKIPS = 5
"""Generations a placement moves on by (their pods terminating) before it asks to be retried."""
_MAX_CLAIM_TRIES = 10
"""Warm pods a claim tries before it starts a cold pod: its turn begins at a pod of its own
(``claim_order``'s spread), so a burst's claims lose few races; with 3, ten at once lost three."""
_PLACEMENTS_KEPT = 1000
"""Sessions whose last placement ``Placement.last`` remembers (per process; a worker asks at once)."""
NONE_SEEN_FRESH_SECONDS = 1.0
"""How long a ``find`` that saw no live pod of a session stands in for ``ensure``'s own list of
them (once): a round looks (``find``) and then places (``ensure``) under the session's lease,
milliseconds apart; far less than the lease's time to live (10 s by default), and a rival
placing meanwhile (only possible once a lease lapsed) is settled by the placement record or
the cold pod's name, as it is between the list and the claim."""


class Placement:
    """The placement of sessions' pods in the sandbox namespace, with the warm pools of
    ``pools`` (the templates with a pool). ``on_placed(template, source, reason)`` is told of
    each pod placed for a session (``source``: ``warm``, a claimed warm pod, or ``cold``, a pod
    created for it; a cold pod's ``reason``: ``pool_empty``, its template's pool had no pod to
    claim, ``no_pool``, its template has none, or ``workspace_directory``, the session names
    another working directory than warm pods mount)."""

    def __init__(
        self,
        kube: KubeApi,
        settings: PodSettings,
        pools: Sequence[SandboxTemplate],
        on_placed: Callable[[str, str, str], None],
        on_restored: Callable[[Pod, checkpoints.Record], None] = lambda pod, record: None,
    ) -> None:
        self._kube = kube
        self._on_restored = on_restored
        self._settings = settings
        self._ns = settings.namespace
        self._pools = tuple(t for t in pools if t.pooled)
        self._on_placed = on_placed
        self._last: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._none_seen: OrderedDict[str, float] = OrderedDict()
        """Sessions whose last ``find`` saw no live pod, and when (monotonic): ``ensure`` lists once less."""

    # -- the choice ------------------------------------------------------------------------

    def ensure(
        self, spec: SandboxSpec, generation: int, template: SandboxTemplate, restore: checkpoints.Record | None = None
    ) -> Pod:
        """The session's pod: its live one, else one placed now for ``generation`` (or the next
        free generation), by this call or by a rival; a cold one restored from ``restore`` when
        given (``on_restored`` is told of it)."""
        pod = self._choose(spec, generation, template, restore)
        self._last[spec.session_id] = (template.name, "warm" if pod.claimed else "cold")
        while len(self._last) > _PLACEMENTS_KEPT:
            self._last.popitem(last=False)
        return pod

    def last(self, session_id: str) -> tuple[str, str] | None:
        """The template and source (``warm``: a claimed pod, else ``cold``) of the pod the last
        ``ensure`` for the session returned; None when this process placed none lately."""
        return self._last.get(session_id)

    def find(self, session_id: str) -> Pod | None:
        """The session's pod, only looked at (``chosen``); None when it has no live one (noted:
        the session's next ``ensure``, within ``NONE_SEEN_FRESH_SECONDS``, does not list again)."""
        self._none_seen.pop(session_id, None)
        live = live_pods(self._kube, self._ns, session_id)
        if not live:
            self._none_seen[session_id] = time.monotonic()
            while len(self._none_seen) > _PLACEMENTS_KEPT:
                self._none_seen.popitem(last=False)
        return self.chosen(session_id, live) if live else None

    def _choose(
        self, spec: SandboxSpec, generation: int, template: SandboxTemplate, restore: checkpoints.Record | None
    ) -> Pod:
        seen = self._none_seen.pop(spec.session_id, None)
        fresh = seen is not None and time.monotonic() - seen < NONE_SEEN_FRESH_SECONDS
        live = [] if fresh else live_pods(self._kube, self._ns, spec.session_id)
        if live and not template.pooled:
            return self.chosen(spec.session_id, live)
        if live:
            settled = self.settled(spec.session_id, live)
            if settled is not None:
                return settled
            generation = max(generation, newest(live)[0])  # that one is over
        # warm pods mount the routing's directory: a session naming another one gets a cold pod
        warm = template.pooled and spec.workspace_directory == self._settings.workspace_directory
        reason = "workspace_directory" if template.pooled else "no_pool"
        if template.persist_workspace:  # never pooled: the templates file refuses both
            self._kube.create_claim(self._ns, make_pvc(spec, template, self._settings))
        for gen in range(generation, generation + MAX_GENERATION_SKIPS):
            pod = self._recorded(spec, gen, template) if warm else self._started(spec, gen, template, reason, restore)
            if pod is not None:
                return pod
            # that generation is over (its name taken by a dying pod, or its record's pod gone): the next one
        raise Transient(f"pods of session {spec.session_id} are still terminating", retry_after=5)

    def _started(
        self,
        spec: SandboxSpec,
        generation: int,
        template: SandboxTemplate,
        reason: str,
        restore: checkpoints.Record | None = None,
    ) -> Pod | None:
        """The session's cold pod of exactly ``generation``, for a template placed without a
        record: created (restored from ``restore`` when given), or the one a twin created under
        that name; None when that name belongs to a terminating or finished pod."""
        cold = self._cold(spec, generation, template, restore)
        if cold is None:
            return None
        pod, created = cold
        if created:  # a twin's pod was told by the twin
            self._tell(spec.session_id, pod)
            self._on_placed(template.name, "cold", reason)
            if restore is not None:
                self._on_restored(pod, restore)
        return pod

    def _recorded(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Pod | None:
        """The session's pod of a pooled template for ``generation``: the one its placement
        record names, placed by this call (a claimed warm pod, else a cold one) or by a rival;
        None when that generation's placement is gone (or its name is taken by a dying pod)."""
        holder = self.holder(spec.session_id, generation)
        if holder is None:
            holder, mine = self._contend(spec, generation, template)
            if mine is not None:  # the pod this call placed and recorded, as its claim or create returned it
                return mine
        if holder is None:
            return None
        pod = self._kube.read_pod(self._ns, holder.name)
        return pod if pod is not None and pod.uid == holder.uid and pod.alive else None

    def _contend(
        self, spec: SandboxSpec, generation: int, template: SandboxTemplate
    ) -> tuple[PodRef | None, Pod | None]:
        """Place a pod for ``generation`` and try to record it: the pod the record names then
        (this one, or a rival's: this one is deleted when it lost), and this one when the record
        names it (as its claim's patch or its create returned it: not read again)."""
        pod = self._claim(spec, generation, template)
        warm = pod is not None
        if pod is None:
            cold = self._cold(spec, generation, template)
            if cold is None:  # the cold name is taken by a dying pod: a rival's, deleted as it lost the record?
                return self.holder(spec.session_id, generation), None
            pod = cold[0]
        holder = self.placed(spec.session_id, generation, pod)
        if holder is None or holder.uid != pod.uid:
            self._yield(spec.session_id, pod)
            return holder, None
        self._on_placed(template.name, "warm" if warm else "cold", "" if warm else "pool_empty")
        return holder, pod

    def settled(self, session_id: str, live: list[Pod]) -> Pod | None:
        """The session's pod among its live ones, as the placement record of their newest
        generation names it. When there is no record yet, this look writes it for the earliest
        contender; whoever writes it first decides, and every placement defers to it. Contenders
        it does not name are deleted (their own placements delete them too). None when the
        record names a pod that is no longer live: that generation is over."""
        contenders: list[Pod] = []
        for look in range(2):
            if look:  # the named pod may have been claimed after the first list: list again
                live = live_pods(self._kube, self._ns, session_id)
            generation, contenders = newest(live)
            if not contenders:
                return None
            holder = self.holder(session_id, generation) or self.placed(session_id, generation, contenders[0])
            named = [p for p in contenders if holder is not None and p.uid == holder.uid]
            if named:
                for pod in contenders:
                    if pod is not named[0]:
                        self._yield(session_id, pod)
                return named[0]
        for pod in contenders:
            self._yield(session_id, pod)
        return None

    def chosen(self, session_id: str, live: list[Pod]) -> Pod:
        """The session's pod among its live ones, only looked at: the newest generation's, and
        of several (racing warm placements, for moments) the one its placement record names."""
        generation, contenders = newest(live)
        if len(contenders) > 1:
            holder = self.holder(session_id, generation)
            recorded = [p for p in contenders if holder is not None and p.uid == holder.uid]
            if recorded:
                return recorded[0]
        return contenders[0]

    # -- the placement record --------------------------------------------------------------

    def holder(self, session_id: str, generation: int) -> PodRef | None:
        """The pod the session's placement record of ``generation`` names; None when there is none."""
        return self._kube.lease_owner(self._ns, names.placement_name(session_id, generation))

    def placed(self, session_id: str, generation: int, pod: Pod) -> PodRef | None:
        """The pod the placement record names once this placement of ``pod`` tried to create
        it: ``pod`` when it was first, else the pod of whoever was."""
        if self._record(session_id, generation, pod):
            return pod.ref
        return self.holder(session_id, generation)

    def _record(self, session_id: str, generation: int, pod: Pod) -> bool:
        """Create the placement record naming ``pod`` (and, for ``kubectl describe``, an Event
        on it): True when it does, False when another placement was first."""
        environment_id = pod.annotations.get(names.ENVIRONMENT_ID_ANNOTATION, "")
        record = names.placement_name(session_id, generation)
        labels = names.labels(session_id, generation)
        annotations = {names.SESSION_ID_ANNOTATION: session_id, names.ENVIRONMENT_ID_ANNOTATION: environment_id}
        if not self._kube.create_lease(self._ns, record, pod.ref, labels, annotations):
            return False
        self._tell(session_id, pod)
        return True

    def _tell(self, session_id: str, pod: Pod) -> None:
        """Tell ``kubectl describe`` of the pod whose session it now serves, by an Event."""
        environment_id = pod.annotations.get(names.ENVIRONMENT_ID_ANNOTATION, "")
        reason, what = ("SandboxClaimed", "warm sandbox claimed") if pod.claimed else ("SandboxStarted", "executor")
        self._kube.note(self._ns, pod.ref, reason, f"{what} for session {session_id}, environment {environment_id}")

    # -- the release -----------------------------------------------------------------------

    def release(self, session_id: str, pod: PodRef) -> None:
        """Delete the session's pod, exactly this one (a UID precondition: a newer pod of the
        same name is never deleted by a stale handle); nothing when it is gone already."""
        if not self._kube.delete_pod(self._ns, pod.name, pod.uid):
            return
        log.info("pod deleted", extra={"session_id": session_id, "pod": pod.name})
        self._kube.note(self._ns, pod, "SandboxReleased", f"released for session {session_id}")

    def _yield(self, session_id: str, pod: Pod) -> None:
        """Release a pod another placement won the session's record over."""
        self.release(session_id, pod.ref)
        log.info(
            "another sandbox was placed for the session first; this one is deleted",
            extra={"session_id": session_id, "pod": pod.name},
        )

    # -- the pods placed -------------------------------------------------------------------

    def _claim(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Pod | None:
        """A warm pod of the template, claimed for the session; None when none could be."""
        candidates = claim_order(
            self.warm_pods(template), self._shape(template), time.time(), template.warm_max_age_seconds, spec.session_id
        )
        for candidate in candidates[:_MAX_CLAIM_TRIES]:
            pod = self._kube.patch_pod_if(self._ns, candidate.name, claim_patch(spec, generation, time.time()))
            if pod is None:  # claimed by another session, or gone: the next one
                continue
            if pod.deleting:
                continue  # the pool was already replacing it; it is going, not ours to use
            log.info(
                "warm pod claimed", extra={"session_id": spec.session_id, "pod": pod.name, "generation": generation}
            )
            return pod
        log.info("no warm pod to claim; starting a cold one", extra={"session_id": spec.session_id})
        return None

    def _cold(
        self, spec: SandboxSpec, generation: int, template: SandboxTemplate, restore: checkpoints.Record | None = None
    ) -> tuple[Pod, bool] | None:
        """The session's cold pod of exactly ``generation`` (restored from ``restore`` when
        given), and whether this call created it (else a twin did, under that name); None when
        that name belongs to a terminating or finished pod."""
        manifest = make_pod(spec, generation, template, self._settings, restore)
        pod = self._kube.create_pod(self._ns, manifest)
        if pod is None:  # the name is taken
            existing = self._kube.read_pod(self._ns, manifest["metadata"]["name"])
            if existing is not None and existing.alive and existing.generation == generation:
                return existing, False  # already done, by us or a twin
            return None  # a terminating or finished pod's name: never reused
        log.info("pod created", extra={"session_id": spec.session_id, "pod": pod.name, "generation": generation})
        return pod, True

    # -- tending ---------------------------------------------------------------------------

    def tend(self, sizes: Mapping[str, int] | None = None, settling: Collection[str] = ()) -> list[PoolState]:
        """Keep every pool at its size (``sizes[template]`` when given, a pool sized by demand;
        else the template's ``warmPool.size``): replace dead, misshapen and too old warm pods,
        add the missing ones (none to a pool in ``settling``), remove the excess; then refresh
        the binding of each pod claimed long enough ago. Returns each pool as this tending found it."""
        found = []
        for template in self._pools:
            pods, wanted, now = self.warm_pods(template), self._shape(template), time.time()
            size = (sizes or {}).get(template.name, template.warm_pool_size)
            max_age = template.warm_max_age_seconds
            found.append(census(template.name, pods, size, wanted, now, max_age))
            todo = plan(pods, size, wanted, now, max_age, hold=template.name in settling)
            for pod in todo.delete:
                self.delete_unclaimed(pod)
            for _ in range(todo.create):
                self._add(template)
            self._refresh_bindings(template)
        return found

    def _refresh_bindings(self, template: SandboxTemplate) -> None:
        """Update each pod of the pool claimed at least ``BINDING_REFRESH_AFTER_SECONDS`` ago
        whose binding was not refreshed yet, once (``pool``: the kubelet may have missed the
        claim's update); a younger claim is left to a later tending."""
        now = time.time()
        for pod in self._kube.list_pods(self._ns, names.unrefreshed_selector(template.name)):
            if not binding_refresh_due(pod.claimed_at, pod.deleting, now):
                continue
            if self._kube.patch_pod_if(self._ns, pod.name, binding_refresh_patch(pod.uid)) is not None:
                log.info("claimed pod's binding refreshed", extra={"session_id": pod.session_id, "pod": pod.name})

    def warm_pods(self, template: SandboxTemplate) -> list[WarmPod]:
        """The template's pool as ``pool`` decides on it: its pods no session has claimed."""
        return [_warm(pod) for pod in self._kube.list_pods(self._ns, names.pool_selector(template.name))]

    def delete_unclaimed(self, pod: WarmPod) -> None:
        """Delete a warm pod only as it was seen: a claim since (a new resourceVersion) keeps it."""
        if self._kube.delete_pod(self._ns, pod.name, pod.uid, resource_version=pod.resource_version):
            log.info("warm pod deleted", extra={"pod": pod.name})

    def _add(self, template: SandboxTemplate) -> None:
        """One more warm pod (best effort: the pool's next tending adds what is missing)."""
        try:
            pod = self._kube.create_pod(self._ns, make_warm_pod(template, self._settings))
        except (KubernetesUnavailable, RunnerRejected) as exc:
            log.warning("could not add a warm pod", extra={"template": template.name, "reason": str(exc)[:300]})
            return
        if pod is None:  # a generated name taken: rare, and the next tending adds it
            log.warning("could not add a warm pod", extra={"template": template.name, "reason": "name taken"})
            return
        log.info("warm pod created", extra={"template": template.name, "pod": pod.name})

    def _shape(self, template: SandboxTemplate) -> str:
        return shape(make_warm_pod(template, self._settings)["spec"])


def live_pods(kube: KubeApi, namespace: str, session_id: str) -> list[Pod]:
    """The session's pods that are starting or running."""
    selector = f"{names.managed_selector()},{names.session_selector(session_id)}"
    return [pod for pod in kube.list_pods(namespace, selector) if pod.alive]


def _warm(pod: Pod) -> WarmPod:
    return WarmPod(
        name=pod.name,
        uid=pod.uid,
        resource_version=pod.resource_version,
        created_at=pod.created_at,
        shape=pod.annotations.get(names.SHAPE_ANNOTATION, ""),
        running=pod.health is Health.RUNNING,
        dead=pod.health is Health.FAILED,
        terminating=pod.health is Health.TERMINATING,
    )
