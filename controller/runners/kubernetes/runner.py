"""The Kubernetes runner: one pod per session (plus an optional workspace PVC).

Idempotent by construction (L1): ``ensure`` first looks for a live pod of the session (by
its session-hash label) and returns it; only when there is none does it create the pod of
the requested generation. ``AlreadyExists`` counts as "already done" only when the pod of
that name is of this generation and alive; a terminating or finished pod is never reused:
the next generation is created instead (L14). Deletes carry a UID precondition, so a stale
handle can never delete a newer pod of the same name.

Warm pools (``pool.py``): for a template with a pool, ``ensure`` claims a warm pod (a JSON
patch that succeeds only while the pod is unclaimed) and falls back to a cold pod when none is
left. A claimed pod has no name derived from the session, so the name that makes a cold start
idempotent is carried by a placement record instead: an Event on the placed pod named after
the session and generation (``names.placement_name``). Whoever creates it first decides that
generation: a placement that finds it taken deletes its own pod and returns the recorded one.
A pod is claimed before its record exists, so an ``ensure`` that finds the session's pods
trusts none of them, not even a lone one, until the record names it; it writes the record
itself when there is none yet (``_settled``). A record whose pod is gone moves on to the next
generation, as a terminating name does. So ``ensure`` calls racing for one session (possible
only once its lease lapsed) all return the same pod. A claim then adds one warm pod in its
place; ``tend_pools`` (the scheduler's leader) keeps each pool at its size.

Kubernetes API errors are translated here, once: 404/409/410 are idempotency signals,
429/5xx are retried briefly and then raised as ``Transient``, 401/403 become
``RunnerRejected`` naming the permission that is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import tenacity
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from controller import logs
from controller.errors import KubernetesUnavailable, RunnerRejected, Transient
from controller.model import Handle, Health, PoolState, SandboxSpec
from controller.runners.base import checked
from controller.runners.kubernetes import names
from controller.runners.kubernetes.manifests import (
    PodSettings,
    SandboxTemplate,
    claim_patch,
    make_pod,
    make_pvc,
    make_warm_pod,
    shape,
)
from controller.runners.kubernetes.pool import WarmPod, census, claim_order, plan

log = logs.get(__name__)
T = TypeVar("T")
_MAX_GENERATION_SKIPS = 5
_MAX_CLAIM_TRIES = 3


@contextmanager
def _translated(verb: str, resource: str) -> Iterator[None]:
    try:
        yield
    except ApiException as exc:
        if exc.status == 403 and not _is_rbac_denial(exc):
            raise RunnerRejected(f"Kubernetes admission refused to {verb} {resource}: {_message(exc)}") from exc
        if exc.status in (401, 403):
            raise RunnerRejected(
                f"Kubernetes refused to {verb} {resource} (HTTP {exc.status}): grant the controller's "
                f"service account '{verb}' on '{resource}' in the sandbox namespace"
            ) from exc
        if exc.status == 429 or (exc.status or 0) >= 500:
            raise KubernetesUnavailable(
                f"Kubernetes answered {exc.status} to {verb} {resource}", retry_after=1
            ) from exc
        raise
    except (Urllib3Error, OSError) as exc:
        raise KubernetesUnavailable(f"cannot reach Kubernetes to {verb} {resource}", retry_after=2) from exc


def _message(exc: ApiException) -> str:
    """The API server's own explanation (a Status object's message), else the reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or "")[:500]


def _is_rbac_denial(exc: ApiException) -> bool:
    """RBAC says '... is forbidden: User "…" cannot <verb> resource …'; admission says otherwise."""
    return "cannot " in _message(exc)


def _retrying(call: Callable[[], T]) -> T:
    retry = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(KubernetesUnavailable),
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=2),
        reraise=True,
    )
    return retry(call)


def _read_or_none(verb: str, resource: str, read: Callable[[], T]) -> T | None:
    """``read()`` (translated, retried briefly), or None when the object is not there (404/410)."""

    def translated() -> T:
        with _translated(verb, resource):
            return read()

    try:
        return _retrying(translated)
    except ApiException as exc:
        if exc.status in (404, 410):
            return None
        raise


def _status(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


class KubernetesRunner:
    def __init__(
        self,
        api: k8s.CoreV1Api,
        settings: PodSettings,
        templates: Callable[[str | None], SandboxTemplate],
        pools: Sequence[SandboxTemplate] = (),
        on_placed: Callable[[str, str], None] = lambda template, source: None,
    ) -> None:
        """``on_placed(template, source)`` is told of each pod this runner placed for a session
        (``source``: ``warm``, a claimed warm pod, or ``cold``, a pod created for it)."""
        self._api = api
        self._settings = settings
        self._templates = templates
        self._ns = settings.namespace
        self._pools = tuple(t for t in pools if t.pooled)
        self._on_placed = on_placed

    # -- protocol -------------------------------------------------------------------------

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        spec = checked(spec)  # L2: no unsafe id or URL reaches argv, a path or a manifest
        live = self._live_pods(spec.session_id)
        template = self._templates(spec.template)
        if live and not template.pooled:
            return _handle(spec.session_id, self._chosen(spec.session_id, live))
        if live:
            settled = self._settled(spec.session_id, live)
            if settled is not None:
                return _handle(spec.session_id, settled)
            generation = max(generation, _newest(live)[0])  # that one is over
        if template.pooled and spec.workspace_directory == self._settings.workspace_directory:
            return self._place(spec, generation, template)  # warm pods mount the routing's directory
        return _handle(spec.session_id, self._create_cold(spec, generation, template))

    def _create_cold(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Any:
        """The session's pod of ``generation`` (or the next free one): created, or the one a twin
        created under that name."""
        if template.persist_workspace:
            self._create_quietly(make_pvc(spec, template, self._settings), "persistentvolumeclaims")
        for attempt in range(_MAX_GENERATION_SKIPS):
            manifest = make_pod(spec, generation + attempt, template, self._settings)
            try:
                pod = self._create_pod(manifest)
            except ApiException as exc:
                if exc.status != 409:
                    raise RunnerRejected(
                        f"Kubernetes refused pod {manifest['metadata']['name']}: {exc.reason}"
                    ) from exc
                existing = self._read_pod(manifest["metadata"]["name"])
                if existing is not None and _alive(existing) and _generation_of(existing) == generation + attempt:
                    return existing  # already done, by us or a twin
                continue  # that name belongs to a terminating or finished pod: never reuse it
            log.info(
                "pod created",
                extra={"session_id": spec.session_id, "pod": pod.metadata.name, "generation": generation + attempt},
            )
            self._event(
                pod.metadata.name,
                pod.metadata.uid,
                "SandboxStarted",
                f"executor for session {spec.session_id}, environment {spec.environment_id}",
            )
            self._on_placed(template.name, "cold")
            return pod
        raise Transient(f"pods of session {spec.session_id} are still terminating", retry_after=5)

    # -- warm pools -----------------------------------------------------------------------

    def _place(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Handle:
        """A warm pod claimed for the session, else a cold one, kept only if the session's
        placement record for that generation names it (L1; see the module docstring)."""
        for attempt in range(_MAX_GENERATION_SKIPS):
            gen = generation + attempt
            record = names.placement_name(spec.session_id, gen)
            holder = self._placement(record)
            if holder is None:
                pod = self._claim(spec, gen, template)
                warm = pod is not None
                if pod is None:
                    pod = self._create_cold_of(spec, gen, template)
                if pod is not None:
                    holder = self._placed(record, spec.session_id, pod)
                    if holder is None or holder[1] != pod.metadata.uid:
                        self._yield(spec.session_id, pod)
                    else:
                        self._on_placed(template.name, "warm" if warm else "cold")
                        if warm:
                            self._add_warm(template)  # refilled as it is claimed
                else:  # the cold name is taken by a dying pod: a rival's, deleted as it lost the record?
                    holder = self._placement(record)
            if holder is not None:
                existing = self._read_pod(holder[0])
                if existing is not None and existing.metadata.uid == holder[1] and _alive(existing):
                    return _handle(spec.session_id, existing)
            # that generation's placement is gone (or its name is taken by a dying pod): the next one
        raise Transient(f"sandboxes of session {spec.session_id} are still terminating", retry_after=5)

    def _settled(self, session_id: str, live: list[Any]) -> Any | None:
        """The session's pod among its live ones, as the placement record of their newest
        generation names it (pooled templates). A pod is claimed before its record is written, so
        even a lone pod may yet lose: the record decides. When there is none yet, this look writes
        it for the earliest contender; whoever writes it first decides, and every placement defers
        to it. Contenders it does not name are deleted (their own placements delete them too).
        None when the record names a pod that is no longer live: that generation is over."""
        contenders: list[Any] = []
        for look in range(2):
            if look:  # the named pod may have been claimed after the first list: list again
                live = self._live_pods(session_id)
            newest, contenders = _newest(live)
            if not contenders:
                return None
            record = names.placement_name(session_id, newest)
            holder = self._placement(record) or self._placed(record, session_id, contenders[0])
            named = [p for p in contenders if holder is not None and p.metadata.uid == holder[1]]
            if named:
                for pod in contenders:
                    if pod is not named[0]:
                        self._yield(session_id, pod)
                return named[0]
        for pod in contenders:
            self._yield(session_id, pod)
        return None

    def _yield(self, session_id: str, pod: Any) -> None:
        """Delete a pod another placement won the session's record over."""
        self.release(_handle(session_id, pod))
        log.info(
            "another sandbox was placed for the session first; this one is deleted",
            extra={"session_id": session_id, "pod": pod.metadata.name},
        )

    def _create_cold_of(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Any | None:
        """The session's cold pod of exactly ``generation`` (created, or a twin's); None when that
        name belongs to a terminating or finished pod."""
        if template.persist_workspace:
            self._create_quietly(make_pvc(spec, template, self._settings), "persistentvolumeclaims")
        manifest = make_pod(spec, generation, template, self._settings)
        try:
            pod = self._create_pod(manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise RunnerRejected(f"Kubernetes refused pod {manifest['metadata']['name']}: {exc.reason}") from exc
            existing = self._read_pod(manifest["metadata"]["name"])
            if existing is not None and _alive(existing) and _generation_of(existing) == generation:
                return existing
            return None
        log.info(
            "pod created", extra={"session_id": spec.session_id, "pod": pod.metadata.name, "generation": generation}
        )
        return pod

    def _placed(self, record: str, session_id: str, pod: Any) -> tuple[str, str] | None:
        """The pod (name, uid) the placement record names once this placement of ``pod`` tried
        to create it: ``pod`` when it was first, else the pod of whoever was."""
        if self._record_placement(record, session_id, pod):
            return str(pod.metadata.name), str(pod.metadata.uid)
        return self._placement(record)

    def _record_placement(self, record: str, session_id: str, pod: Any) -> bool:
        """Create the placement record (an Event on the pod, named after the session and
        generation): True when it names ``pod``, False when another placement was first."""
        now = datetime.now(UTC)
        warm = (pod.metadata.labels or {}).get(names.POOL_STATE_LABEL) == names.CLAIMED
        environment_id = (pod.metadata.annotations or {}).get(names.ENVIRONMENT_ID_ANNOTATION, "")
        what = "warm sandbox claimed" if warm else "executor"
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=record),
            involved_object=k8s.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, namespace=self._ns, uid=pod.metadata.uid
            ),
            reason="SandboxClaimed" if warm else "SandboxStarted",
            message=f"{what} for session {session_id}, environment {environment_id}",
            type="Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component="sandbox-controller"),
        )

        def create() -> None:
            with _translated("create", "events"):
                self._api.create_namespaced_event(self._ns, event)

        try:
            _retrying(create)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _placement(self, record: str) -> tuple[str, str] | None:
        """The pod (name, uid) a placement record names, or None when there is none."""

        event = _read_or_none("get", "events", lambda: self._api.read_namespaced_event(record, self._ns))
        if event is None:
            return None
        return str(event.involved_object.name), str(event.involved_object.uid)

    def _claim(self, spec: SandboxSpec, generation: int, template: SandboxTemplate) -> Any | None:
        """A warm pod of the template, claimed for the session; None when none could be."""
        wanted = self._shape(template)
        candidates = claim_order(self._warm_pods(template), wanted, time.time(), template.warm_max_age_seconds)
        for candidate in candidates[:_MAX_CLAIM_TRIES]:
            body = claim_patch(spec, generation, time.time())

            def patch(name: str = candidate.name, body: list[dict[str, Any]] = body) -> Any:
                with _translated("patch", "pods"):
                    return self._api.patch_namespaced_pod(name, self._ns, body)

            try:
                pod = _retrying(patch)
            except ApiException as exc:
                if exc.status in (404, 409, 410, 422):  # claimed by another session, or gone: the next one
                    continue
                raise
            if pod.metadata.deletion_timestamp is not None:
                continue  # the pool was already replacing it; it is going, not ours to use
            log.info(
                "warm pod claimed",
                extra={"session_id": spec.session_id, "pod": pod.metadata.name, "generation": generation},
            )
            return pod
        log.info("no warm pod to claim; starting a cold one", extra={"session_id": spec.session_id})
        return None

    def tend_pools(self) -> list[PoolState]:
        """Keep every pool at its size: replace dead, misshapen and too old warm pods, add the
        missing ones, remove the excess (the scheduler's leader calls this every few seconds).
        Returns each pool as this tending found it."""
        found = []
        for template in self._pools:
            pods, shape, now = self._warm_pods(template), self._shape(template), time.time()
            size, max_age = template.warm_pool_size, template.warm_max_age_seconds
            found.append(census(template.name, pods, size, shape, now, max_age))
            todo = plan(pods, size, shape, now, max_age)
            for pod in todo.delete:
                self._delete_unclaimed(pod)
            for _ in range(todo.create):
                self._add_warm(template)
        return found

    def _shape(self, template: SandboxTemplate) -> str:
        return shape(make_warm_pod(template, self._settings)["spec"])

    def _add_warm(self, template: SandboxTemplate) -> None:
        """One more warm pod (best effort: the pool's next tending adds what is missing)."""
        try:
            pod = self._create_pod(make_warm_pod(template, self._settings))
        except (ApiException, KubernetesUnavailable, RunnerRejected) as exc:
            log.warning("could not add a warm pod", extra={"template": template.name, "reason": str(exc)[:300]})
            return
        log.info("warm pod created", extra={"template": template.name, "pod": pod.metadata.name})

    def _delete_unclaimed(self, pod: WarmPod) -> None:
        """Delete a warm pod only as it was seen: a claim since (a new resourceVersion) keeps it."""
        if self._delete_pod(pod.name, k8s.V1Preconditions(uid=pod.uid, resource_version=pod.resource_version)):
            log.info("warm pod deleted", extra={"pod": pod.name})

    def _delete_pod(self, name: str, preconditions: k8s.V1Preconditions) -> bool:
        """Delete the pod ``name`` if it still meets ``preconditions``; False when it is gone or
        no longer the pod meant (404/409/410: a newer pod of that name, or a claimed warm pod)."""
        body = k8s.V1DeleteOptions(preconditions=preconditions, propagation_policy="Background")

        def delete() -> None:
            with _translated("delete", "pods"):
                self._api.delete_namespaced_pod(name, self._ns, body=body)

        try:
            _retrying(delete)
        except ApiException as exc:
            if exc.status not in (404, 409, 410):
                raise
            return False
        return True

    def _warm_pods(self, template: SandboxTemplate) -> list[WarmPod]:
        def pods() -> list[Any]:
            with _translated("list", "pods"):
                selector = names.pool_selector(template.name)
                return list(self._api.list_namespaced_pod(self._ns, label_selector=selector).items)

        return [_warm(pod) for pod in _retrying(pods)]

    def status(self, handle: Handle) -> Health:
        pod = self._read_pod(handle.name)
        if pod is None or pod.metadata.uid != handle.uid:
            return Health.GONE
        return health_of(pod)

    def release(self, handle: Handle) -> None:
        if not self._delete_pod(handle.name, k8s.V1Preconditions(uid=handle.uid)):
            return
        log.info("pod deleted", extra={"session_id": handle.session_id, "pod": handle.name})
        self._event(handle.name, handle.uid, "SandboxReleased", f"released for session {handle.session_id}")

    def discard(self, session_id: str) -> None:
        """Delete what outlives pods (the workspace PVC), once the session is released for good (L16)."""

        def delete() -> None:
            with _translated("delete", "persistentvolumeclaims"):
                self._api.delete_namespaced_persistent_volume_claim(names.pvc_name(session_id), self._ns)

        try:
            _retrying(delete)
        except ApiException as exc:
            if exc.status not in (404, 410):
                raise

    def find(self, session_id: str) -> Handle | None:
        live = self._live_pods(session_id)
        return _handle(session_id, self._chosen(session_id, live)) if live else None

    def _chosen(self, session_id: str, live: list[Any]) -> Any:
        """The session's pod among its live ones, only looked at: the newest generation's, and
        of several (racing warm placements, for moments) the one its placement record names."""
        newest, contenders = _newest(live)
        if len(contenders) > 1:
            holder = self._placement(names.placement_name(session_id, newest))
            recorded = [p for p in contenders if holder is not None and p.metadata.uid == holder[1]]
            if recorded:
                return recorded[0]
        return contenders[0]

    def keeps_workspace(self, session_id: str) -> bool:
        """A claim being deleted (it waits for its pvc-protection finalizer) is no longer kept."""

        claim: Any = _read_or_none(
            "get",
            "persistentvolumeclaims",
            lambda: self._api.read_namespaced_persistent_volume_claim(names.pvc_name(session_id), self._ns),
        )
        return claim is not None and claim.metadata.deletion_timestamp is None

    def workspaces(self) -> list[str]:
        def claims() -> list[Any]:
            with _translated("list", "persistentvolumeclaims"):
                selector = names.managed_selector()
                return list(self._api.list_namespaced_persistent_volume_claim(self._ns, label_selector=selector).items)

        return sorted(
            {
                claim.metadata.annotations[names.SESSION_ID_ANNOTATION]
                for claim in _retrying(claims)
                if (claim.metadata.annotations or {}).get(names.SESSION_ID_ANNOTATION)
                and claim.metadata.deletion_timestamp is None
            }
        )

    def list_managed(self) -> list[Handle]:
        def pods() -> list[Any]:
            with _translated("list", "pods"):
                return list(self._api.list_namespaced_pod(self._ns, label_selector=names.managed_selector()).items)

        return [
            _handle(pod.metadata.annotations.get(names.SESSION_ID_ANNOTATION, ""), pod)
            for pod in _retrying(pods)
            if (pod.metadata.annotations or {}).get(names.SESSION_ID_ANNOTATION)
        ]

    # -- helpers --------------------------------------------------------------------------

    def _event(self, pod_name: str, uid: str, reason: str, message: str) -> None:
        """Best effort: an Event on the pod for `kubectl describe` (ids only, never a secret)."""
        now = datetime.now(UTC)
        event = k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(generate_name=f"{pod_name}."),
            involved_object=k8s.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod_name, namespace=self._ns, uid=uid
            ),
            reason=reason,
            message=message,
            type="Normal",
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component="sandbox-controller"),
        )
        try:
            self._api.create_namespaced_event(self._ns, event)
        except (ApiException, Urllib3Error, OSError) as exc:
            log.info("could not record a pod event", extra={"pod": pod_name, "reason": type(exc).__name__})

    def _create_pod(self, manifest: dict[str, Any]) -> Any:
        def create() -> Any:
            with _translated("create", "pods"):
                return self._api.create_namespaced_pod(self._ns, manifest)  # type: ignore[arg-type]

        return _retrying(create)

    def _create_quietly(self, manifest: dict[str, Any], resource: str) -> None:
        def create() -> None:
            with _translated("create", resource):
                self._api.create_namespaced_persistent_volume_claim(self._ns, manifest)  # type: ignore[arg-type]

        try:
            _retrying(create)
        except ApiException as exc:
            if exc.status != 409:
                raise RunnerRejected(f"Kubernetes refused {resource} {manifest['metadata']['name']}") from exc

    def _read_pod(self, name: str) -> Any | None:
        return _read_or_none("get", "pods", lambda: self._api.read_namespaced_pod(name, self._ns))

    def _live_pods(self, session_id: str) -> list[Any]:
        def pods() -> list[Any]:
            with _translated("list", "pods"):
                selector = f"{names.managed_selector()},{names.session_selector(session_id)}"
                return list(self._api.list_namespaced_pod(self._ns, label_selector=selector).items)

        return [pod for pod in _retrying(pods) if _alive(pod)]


def health_of(pod: Any) -> Health:
    if pod.metadata.deletion_timestamp is not None:
        return Health.TERMINATING
    phase = pod.status.phase if pod.status else None
    if phase in ("Failed", "Succeeded"):
        return Health.FAILED
    if phase == "Running":
        for state in pod.status.container_statuses or []:
            if state.state and state.state.terminated is not None:
                return Health.FAILED
        return Health.RUNNING
    return Health.STARTING


def _alive(pod: Any) -> bool:
    return health_of(pod) in (Health.STARTING, Health.RUNNING)


def _generation_of(pod: Any) -> int:
    try:
        return int((pod.metadata.labels or {}).get(names.GENERATION_LABEL, "0"))
    except ValueError:
        return 0


def _newest(live: list[Any]) -> tuple[int, list[Any]]:
    """The newest generation among a session's live pods, and its pods, earliest placed first."""
    newest = max((_generation_of(p) for p in live), default=0)
    return newest, sorted((p for p in live if _generation_of(p) == newest), key=_started_at)


def _warm(pod: Any) -> WarmPod:
    health = health_of(pod)
    return WarmPod(
        name=pod.metadata.name,
        uid=pod.metadata.uid,
        resource_version=pod.metadata.resource_version,
        created_at=pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else 0.0,
        shape=(pod.metadata.annotations or {}).get(names.SHAPE_ANNOTATION, ""),
        running=health is Health.RUNNING,
        dead=health is Health.FAILED,
        terminating=health is Health.TERMINATING,
    )


def _started_at(pod: Any) -> float:
    """When the pod began to serve its session: its claim (a warm pod), else its creation."""
    claimed = (pod.metadata.annotations or {}).get(names.CLAIMED_AT_ANNOTATION)
    if claimed:
        try:
            return float(claimed)
        except ValueError:
            pass
    return pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else 0.0


def _handle(session_id: str, pod: Any) -> Handle:
    return Handle(
        session_id=session_id,
        name=pod.metadata.name,
        generation=_generation_of(pod),
        uid=pod.metadata.uid,
        environment_id=(pod.metadata.annotations or {}).get(names.ENVIRONMENT_ID_ANNOTATION, ""),
        created_at=_started_at(pod),
    )
