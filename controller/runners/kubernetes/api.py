"""The one door to the Kubernetes API server: the only module that imports the ``kubernetes``
client (an import contract in ``.importlinter`` says so).

``connect()`` builds the client, here alone: in-cluster credentials, else ``$KUBECONFIG`` (or
``~/.kube/config``); none usable is a ``UsageError`` in one line. The runner and the scheduler's
pod watch (``wiring``) and ``webhook register|rotate --kube-secret`` (``webhook_secrets``) each
get a ``KubeApi`` from it. Importing this module imports the client, which takes about half a
second: its callers import it only when they build one, so receivers and the workers of the
local runner never pay for it.

``KubeApi`` speaks the project's own values (``objects``: ``Pod``, ``Claim``, ``PodRef``) through
a small set of verbs on pods, workspace claims, events, leases and secrets, and the pod watch's
list and stream. It translates the API server's answers here, once:

- 404, 409 and 410 are idempotency signals, answered as values (``None`` or ``False``: not
  there, the name is taken, a precondition failed), never raised. So is 422 for a patch that
  its ``test`` operations guard (``patch_pod_if``: a warm pod claimed by another session).
- 429, 5xx and a connection that fails are retried briefly (3 attempts, jittered, a few seconds
  at most), then raised as ``KubernetesUnavailable`` (try again later).
- 401 and 403 from RBAC are ``RunnerRejected`` naming the permission to grant; a 403 from
  admission (Pod Security, an admission policy) is ``RunnerRejected`` with the API server's
  own message. A pod or a claim the API server refuses to create for any other reason is
  ``RunnerRejected`` too: the template or the settings are wrong.
- Any other answer is ``KubernetesError``: a request the caller did not expect to be refused.

The pod watch's list and stream are not retried here (the watch backs off by itself), and a
stream whose resource version has expired raises ``Expired`` (410 Gone: list again).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import tenacity
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from controller import logs
from controller.errors import KubernetesError, KubernetesUnavailable, RunnerRejected, UsageError
from controller.runners.kubernetes.objects import Claim, Pod, PodRef, pod_from_json

log = logs.get(__name__)
T = TypeVar("T")
CONTROLLER = "the controller's service account"
"""Whom a refusal asks to be granted the permission, by default (the chart's ServiceAccount)."""
LEASES = "leases.coordination.k8s.io"


class Expired(Exception):
    """A watch's resource version has expired (410 Gone): list again, then watch from there."""


def connect(needed_by: str = "the Kubernetes runner", grantee: str = CONTROLLER) -> KubeApi:
    """A ``KubeApi`` with its own connection pool, from in-cluster credentials (when
    ``KUBERNETES_SERVICE_HOST`` is set) else a kubeconfig; none usable is a ``UsageError`` that
    says what ``needed_by`` them. ``grantee`` is whom a refusal asks to grant a permission."""
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
    except (k8s_config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = "in-cluster credentials" if in_cluster else "a kubeconfig"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(
            f"{needed_by} needs {where} ($KUBECONFIG or ~/.kube/config) and found none usable: {reason}"
        ) from exc
    return KubeApi(k8s.CoreV1Api(k8s.ApiClient()), grantee)


class KubeApi:
    """The API server, as the controller uses it (every verb names its namespace)."""

    def __init__(
        self, core: k8s.CoreV1Api, grantee: str = CONTROLLER, leases: k8s.CoordinationV1Api | None = None
    ) -> None:
        """``core`` and ``leases`` (by default on ``core``'s own ``ApiClient``) make the requests;
        ``grantee`` is whom a refusal asks to grant a missing permission."""
        self._core = core
        self._leases = leases if leases is not None else k8s.CoordinationV1Api(core.api_client)
        self._grantee = grantee

    def connect(self, namespace: str, selector: str) -> None:
        """Open the connection to the API server now, with one list of at most one pod (tried
        once; a failure is logged, never raised): a TLS handshake on each side. A worker pool
        process makes it at its start, not inside its first claim (on the 2-core node, ten
        fresh processes' first claims at once)."""
        try:
            _json(self._core.list_namespaced_pod(namespace, label_selector=selector, limit=1, _preload_content=False))
        except (ApiException, Urllib3Error, OSError, ValueError) as exc:
            log.warning("could not connect to Kubernetes ahead of a placement", extra={"reason": type(exc).__name__})

    # -- pods -------------------------------------------------------------------------------

    def list_pods(self, namespace: str, selector: str, node: str | None = None) -> list[Pod]:
        """The pods of ``selector`` (a label selector; "": any), only those bound to ``node`` when
        given (a field selector on ``spec.nodeName``: what a node agent looks at)."""
        fields = None if node is None else f"spec.nodeName={node}"
        found = self._call(
            "list",
            "pods",
            namespace,
            lambda: _json(
                self._core.list_namespaced_pod(
                    namespace, label_selector=selector, field_selector=fields, _preload_content=False
                )
            ),
        )
        return [pod_from_json(item) for item in found.get("items") or []]

    def read_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod ``name``, or None when there is none."""
        found = self._unless(
            "get",
            "pods",
            namespace,
            lambda: _json(self._core.read_namespaced_pod(name, namespace, _preload_content=False)),
            signals=(404, 410),
        )
        return None if found is None else pod_from_json(found)

    def create_pod(self, namespace: str, manifest: dict[str, Any]) -> Pod | None:
        """The pod created from ``manifest``, or None when its name is taken (409)."""
        try:
            created = self._unless(
                "create",
                "pods",
                namespace,
                lambda: _json(self._core.create_namespaced_pod(namespace, manifest, _preload_content=False)),  # type: ignore[arg-type]
                signals=(409,),
            )
        except KubernetesError as exc:
            raise RunnerRejected(f"Kubernetes refused pod {_named(manifest)}: {exc.reason}") from exc
        return None if created is None else pod_from_json(created)

    def patch_pod_if(self, namespace: str, name: str, json_patch: list[dict[str, Any]]) -> Pod | None:
        """The pod after a JSON patch whose ``test`` operations guard it; None when they failed
        (409/422) or the pod is gone (404/410)."""
        patched = self._unless(
            "patch",
            "pods",
            namespace,
            lambda: _json(self._core.patch_namespaced_pod(name, namespace, json_patch, _preload_content=False)),
            signals=(404, 409, 410, 422),
        )
        return None if patched is None else pod_from_json(patched)

    def delete_pod(self, namespace: str, name: str, uid: str, resource_version: str | None = None) -> bool:
        """Delete the pod ``name`` if it still has ``uid`` (and ``resource_version``, when given);
        False when it is gone or no longer the pod meant (404/409/410: a newer pod of that name,
        or one that changed since it was seen)."""
        preconditions = k8s.V1Preconditions(uid=uid, resource_version=resource_version)
        body = k8s.V1DeleteOptions(preconditions=preconditions, propagation_policy="Background")
        deleted = self._unless(
            "delete",
            "pods",
            namespace,
            lambda: _json(self._core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False)),
            signals=(404, 409, 410),
        )
        return deleted is not None

    # -- workspace claims (PersistentVolumeClaims) -----------------------------------------

    def create_claim(self, namespace: str, manifest: dict[str, Any]) -> bool:
        """Create the claim; False when one of its name exists already (409)."""
        try:
            created = self._unless(
                "create",
                "persistentvolumeclaims",
                namespace,
                lambda: self._core.create_namespaced_persistent_volume_claim(namespace, manifest),  # type: ignore[arg-type]
                signals=(409,),
            )
        except KubernetesError as exc:
            raise RunnerRejected(f"Kubernetes refused persistentvolumeclaims {_named(manifest)}") from exc
        return created is not None

    def read_claim(self, namespace: str, name: str) -> Claim | None:
        found = self._unless(
            "get",
            "persistentvolumeclaims",
            namespace,
            lambda: self._core.read_namespaced_persistent_volume_claim(name, namespace),
            signals=(404, 410),
        )
        return None if found is None else _claim(found)

    def patch_claim_if(self, namespace: str, name: str, json_patch: list[dict[str, Any]]) -> bool:
        """Apply a JSON patch to the claim; False when its ``test`` operations failed (409/422) or
        the claim is gone (404/410)."""
        patched = self._unless(
            "patch",
            "persistentvolumeclaims",
            namespace,
            lambda: _json(
                self._core.patch_namespaced_persistent_volume_claim(name, namespace, json_patch, _preload_content=False)
            ),
            signals=(404, 409, 410, 422),
        )
        return patched is not None

    def list_claims(self, namespace: str, selector: str) -> list[Claim]:
        found = self._call(
            "list",
            "persistentvolumeclaims",
            namespace,
            lambda: self._core.list_namespaced_persistent_volume_claim(namespace, label_selector=selector),
        )
        return [_claim(item) for item in found.items]

    def delete_claim(self, namespace: str, name: str) -> bool:
        """Delete the claim ``name``; False when there is none."""
        deleted = self._unless(
            "delete",
            "persistentvolumeclaims",
            namespace,
            lambda: self._core.delete_namespaced_persistent_volume_claim(name, namespace),
            signals=(404, 410),
        )
        return deleted is not None

    # -- events ----------------------------------------------------------------------------

    def note(self, namespace: str, pod: PodRef, reason: str, message: str, warning: bool = False) -> None:
        """Best effort, tried once: an Event on the pod for ``kubectl describe`` (ids only,
        never a secret; a ``Warning`` when ``warning``). A failure is logged, never raised."""
        now = _stamp(datetime.now(UTC))
        event = {
            "metadata": {"generateName": f"{pod.name}."},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "sandbox-controller"},
        }
        try:
            _json(self._core.create_namespaced_event(namespace, event, _preload_content=False))  # type: ignore[arg-type]
        except (ApiException, Urllib3Error, OSError) as exc:
            log.info("could not record a pod event", extra={"pod": pod.name, "reason": type(exc).__name__})

    # -- leases ----------------------------------------------------------------------------

    def create_lease(
        self, namespace: str, name: str, owner: PodRef, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> bool:
        """Create the Lease ``name``, held by ``owner`` and owned by it (the garbage collector
        deletes it once the pod is gone); False when a Lease of that name exists (409)."""
        lease = {
            "metadata": {
                "name": name,
                "labels": dict(labels),
                "annotations": dict(annotations),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid}],
            },
            "spec": {"holderIdentity": owner.name, "acquireTime": _stamp(datetime.now(UTC), micro=True)},
        }
        created = self._unless(
            "create",
            LEASES,
            namespace,
            lambda: _json(self._leases.create_namespaced_lease(namespace, lease, _preload_content=False)),  # type: ignore[arg-type]
            signals=(409,),
        )
        return created is not None

    def lease_owner(self, namespace: str, name: str) -> PodRef | None:
        """The pod that owns the Lease ``name``, or None when there is no such Lease."""
        found = self._unless(
            "get",
            LEASES,
            namespace,
            lambda: _json(self._leases.read_namespaced_lease(name, namespace, _preload_content=False)),
            signals=(404, 410),
        )
        if found is None:
            return None
        owners = [o for o in (found.get("metadata") or {}).get("ownerReferences") or [] if o.get("kind") == "Pod"]
        return PodRef(str(owners[0].get("name", "")), str(owners[0].get("uid", ""))) if owners else None

    # -- secrets (``webhook --kube-secret``) ------------------------------------------------

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        """The Secret's data, decoded; None when there is no such Secret."""
        found = self._unless(
            "get", "secrets", namespace, lambda: self._core.read_namespaced_secret(name, namespace), signals=(404,)
        )
        if found is None:
            return None
        return {key: base64.b64decode(value) for key, value in (found.data or {}).items()}

    def create_secret(self, namespace: str, name: str, data: Mapping[str, bytes], dry_run: bool = False) -> None:
        """Create an Opaque Secret (``dry_run``: a server-side dry run that stores nothing)."""
        body = k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace), type="Opaque", data=_encoded(data)
        )
        dry = "All" if dry_run else None
        self._call(
            "create", "secrets", namespace, lambda: self._core.create_namespaced_secret(namespace, body, dry_run=dry)
        )

    def patch_secret(self, namespace: str, name: str, data: Mapping[str, bytes], dry_run: bool = False) -> None:
        """Set these keys of the Secret, keeping its others (``dry_run``: store nothing)."""
        dry = "All" if dry_run else None
        self._call(
            "patch",
            "secrets",
            namespace,
            lambda: self._core.patch_namespaced_secret(name, namespace, {"data": _encoded(data)}, dry_run=dry),
        )

    # -- the pod watch ---------------------------------------------------------------------

    def list_pods_at(self, namespace: str, selector: str, timeout_seconds: float) -> tuple[list[Pod], str | None]:
        """The pods, and the resource version to watch them from (tried once)."""
        found = self._call(
            "list",
            "pods",
            namespace,
            lambda: _json(
                self._core.list_namespaced_pod(
                    namespace, label_selector=selector, _request_timeout=timeout_seconds, _preload_content=False
                )
            ),
            retry=False,
        )
        items = [pod_from_json(item) for item in found.get("items") or []]
        return items, (found.get("metadata") or {}).get("resourceVersion")

    def watch_pods(
        self, namespace: str, selector: str, resource_version: str | None, timeout_seconds: int
    ) -> PodStream:
        """The pods' changes from ``resource_version``; the server ends the stream after
        ``timeout_seconds``, and a connection silent for 30 s longer is given up."""
        return PodStream(self._core, self.refusal, namespace, selector, resource_version, timeout_seconds)

    # -- the translation ---------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        resource: str,
        namespace: str,
        request: Callable[[], T],
        retry: bool = True,
        signals: Collection[int] = (),
    ) -> T:
        """``request()``'s answer; a refusal translated (``refusal``), 429/5xx and a failed
        connection retried briefly first (unless ``retry`` is False); ``_Signal`` for one of
        ``signals``."""

        def attempt() -> T:
            try:
                return request()
            except ApiException as exc:
                if exc.status in signals:
                    raise _Signal from exc
                raise self.refusal(exc, verb, resource, namespace) from exc
            except (Urllib3Error, OSError) as exc:
                raise KubernetesUnavailable(f"cannot reach Kubernetes to {verb} {resource}", retry_after=2) from exc

        if not retry:
            return attempt()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(KubernetesUnavailable),
            stop=tenacity.stop_after_attempt(3),
            wait=tenacity.wait_random_exponential(multiplier=0.2, max=2),
            reraise=True,
        )
        return retrying(attempt)

    def _unless(
        self, verb: str, resource: str, namespace: str, request: Callable[[], T], signals: Collection[int]
    ) -> T | None:
        """As ``_call``, but None when the API server answered one of ``signals`` (idempotency
        signals: never retried, never raised)."""
        try:
            return self._call(verb, resource, namespace, request, signals=signals)
        except _Signal:
            return None

    def refusal(self, exc: ApiException, verb: str, resource: str, namespace: str) -> Exception:
        """What an ``ApiException`` that is no idempotency signal means to the caller."""
        status = exc.status or 0
        message = _message(exc)
        if status == 403 and "cannot " not in message:  # RBAC says '… cannot <verb> resource …'
            return RunnerRejected(f"Kubernetes admission refused to {verb} {resource}: {message}")
        if status in (401, 403):
            return RunnerRejected(
                f"Kubernetes refused to {verb} {resource} (HTTP {status}): grant {self._grantee} "
                f"'{verb}' on '{resource}' in namespace {namespace}"
            )
        if status == 429 or status >= 500:
            return KubernetesUnavailable(f"Kubernetes answered {status} to {verb} {resource}", retry_after=1)
        return KubernetesError(
            f"Kubernetes answered {status} to {verb} {resource}: {message}", status, str(exc.reason or "")
        )


class _Signal(Exception):
    """The API server answered an idempotency signal the caller expects (``_unless``)."""


class PodStream:
    """One watch request on pods: iterate for ``(type, pod)`` (``pod`` is None for a BOOKMARK,
    which only moves ``resource_version``); ``stop()``, from any thread, cuts the request."""

    def __init__(
        self,
        core: k8s.CoreV1Api,
        refusal: Callable[[ApiException, str, str, str], Exception],
        namespace: str,
        selector: str,
        resource_version: str | None,
        timeout_seconds: int,
    ) -> None:
        self._core = core
        self._refusal = refusal
        self._namespace = namespace
        self._selector = selector
        self._timeout = timeout_seconds
        self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        self._watch.resource_version = resource_version

    @property
    def resource_version(self) -> str | None:
        """Where a watch resumes after the last change seen (bookmarks included)."""
        version: str | None = self._watch.resource_version
        return version

    def stop(self) -> None:
        self._watch.stop()  # type: ignore[no-untyped-call]

    def __iter__(self) -> Iterator[tuple[str, Pod | None]]:
        stream = self._watch.stream(  # type: ignore[no-untyped-call]
            self._core.list_namespaced_pod,
            self._namespace,
            label_selector=self._selector,
            resource_version=self._watch.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._timeout,
            _request_timeout=self._timeout + 30,  # a connection that went silent is given up
        )
        try:
            for event in stream:
                kind = str(event["type"])
                yield kind, (None if kind == "BOOKMARK" else pod_from_json(event["raw_object"]))
        except ApiException as exc:
            if exc.status == 410:
                raise Expired(f"the pods' resource version expired: {exc.reason}") from exc
            raise self._refusal(exc, "watch", "pods", self._namespace) from exc
        except (Urllib3Error, OSError) as exc:
            raise KubernetesUnavailable("cannot reach Kubernetes to watch pods", retry_after=2) from exc


def _json(answer: Any) -> Any:
    """An answer asked for with ``_preload_content=False`` (the client builds no model of it),
    read and parsed here, inside ``_call``'s attempt: a connection lost while its body is read
    is retried as a failed request is."""
    body = answer.data
    return json.loads(body) if body else {}


def _stamp(at: datetime, micro: bool = False) -> str:
    """A time as the API server writes it: RFC 3339 in UTC, to the second (an Event's
    ``firstTimestamp``) or the microsecond (a Lease's ``acquireTime``, a ``MicroTime``)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _claim(claim: Any) -> Claim:
    meta = claim.metadata
    return Claim(name=meta.name, annotations=dict(meta.annotations or {}), deleting=meta.deletion_timestamp is not None)


def _message(exc: ApiException) -> str:
    """The API server's own explanation (a Status object's message), else the reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("message") or exc.reason or "")[:500]


def _named(manifest: Mapping[str, Any]) -> str:
    meta = manifest.get("metadata", {})
    return str(meta.get("name") or meta.get("generateName", "") + "…")


def _encoded(data: Mapping[str, bytes]) -> dict[str, bytes | str]:
    return {key: base64.b64encode(value).decode() for key, value in data.items()}


ANSWERS_READ = (
    "V1PodList",
    "V1Pod",
    "V1Lease",
    "CoreV1Event",
    "V1PersistentVolumeClaim",
    "V1PersistentVolumeClaimList",
    "V1Status",
)
"""The client's models of the answers a worker reads: pods, leases, events, workspace claims."""


def load_models(roots: Collection[str] = ANSWERS_READ) -> int:
    """Build now the client's model classes of ``roots`` and of everything they are made of;
    returns how many. The client (v37) builds a model class only when an answer first needs
    it: a pod list's first time in a process cost about 0.2 s of CPU (on this project's CI
    machine; 2 ms after), which a worker process paid inside its first claim -- ten processes
    at once in a burst on the 2-core node. The worker calls this before its pool processes
    fork, so each inherits them built (``wiring.worker_app``)."""
    done: set[str] = set()
    todo = list(roots)
    while todo:
        name = _model_name(todo.pop())
        if name is None or name in done:
            continue
        done.add(name)
        todo += getattr(k8s.models, name).openapi_types.values()
    return len(done)


def load_verbs() -> int:
    """Build now the client's argument validators of the verbs a worker uses on pods, events
    and leases; returns how many. The client (v37) checks each call's arguments with a
    validator it builds on the verb's first call: 2-5 ms of CPU each, about 16 ms for a claim's
    five, paid inside a process's first claim. Each verb is called here with no arguments,
    which its validator refuses before any request is made (each needs its namespace). The
    worker calls this before its pool processes fork, as it does ``load_models``."""
    with k8s.ApiClient() as unused:  # never sends: no call below passes its validator
        core, leases = k8s.CoreV1Api(unused), k8s.CoordinationV1Api(unused)
        verbs = (
            core.list_namespaced_pod,
            core.read_namespaced_pod,
            core.create_namespaced_pod,
            core.patch_namespaced_pod,
            core.delete_namespaced_pod,
            core.create_namespaced_event,
            leases.read_namespaced_lease,
            leases.create_namespaced_lease,
        )
        for verb in verbs:
            try:
                verb()  # type: ignore[call-arg]
            except ValueError:  # the validator's refusal (pydantic's ValidationError)
                pass
    return len(verbs)


def _model_name(kind: str) -> str | None:
    """The model class a type of the client's ``openapi_types`` names (inside ``List[...]``,
    ``Dict[str, ...]``, ``Optional[...]``); None for a plain type (str, datetime, object)."""
    inner = re.fullmatch(r"(?:List|Optional|Dict)\[(?:[^,\[\]]*, )?(.*)\]", kind.strip())
    if inner:
        return _model_name(inner.group(1))
    return kind.strip() if hasattr(k8s.models, kind.strip()) else None
