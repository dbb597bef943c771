"""The one door to Kubernetes (``runners/kubernetes/api.py``) translates the API server's answers
once: idempotency signals come back as values, 429/5xx and a lost connection are retried
briefly and then raised as ``KubernetesUnavailable``, 401/403 name the permission to grant (or
carry admission's own message), and any other answer is ``KubernetesError``. Here the client's
``CoreV1Api`` is a stub raising the client's own exceptions (the kube tier runs every verb
against a real API server); and no product module but the door imports the client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError

from controller.errors import KubernetesError, KubernetesUnavailable, RunnerRejected
from controller.runners.kubernetes.api import KubeApi
from controller.runners.kubernetes.objects import PodRef

NS = "sandboxes"


def _refusal(status: int, message: str = "", reason: str = "") -> ApiException:
    """An ``ApiException`` as the client raises it for an HTTP answer (a Status object body)."""
    exc = ApiException(status=status, reason=reason or {400: "Bad Request", 403: "Forbidden"}.get(status, "Error"))
    exc.body = json.dumps({"kind": "Status", "code": status, "message": message})
    return exc


class _Core:
    """A ``CoreV1Api`` whose every call first raises what ``failures`` holds, one per call, then
    answers ``answer``; ``calls`` counts them."""

    def __init__(self, *failures: BaseException, answer: Any = None) -> None:
        self.failures = list(failures)
        self.answer = answer if answer is not None else _Pods()
        self.calls = 0
        self.api_client = None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.failures:
                raise self.failures.pop(0)
            return self.answer

        return call


class _Pods:
    """An empty list, as a model (``items``) and as the raw answer the door reads for pods,
    leases and events (``data``: asked for with ``_preload_content=False``)."""

    items: list[Any] = []
    data = b'{"items": []}'


def _kube(core: _Core) -> KubeApi:
    return KubeApi(core, leases=core)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("verb", "status"),
    [
        (lambda kube: kube.read_pod(NS, "p"), 404),
        (lambda kube: kube.read_pod(NS, "p"), 410),
        (lambda kube: kube.create_pod(NS, {"metadata": {"name": "p"}}), 409),
        (lambda kube: kube.patch_pod_if(NS, "p", []), 422),
        (lambda kube: kube.patch_pod_if(NS, "p", []), 409),
        (lambda kube: kube.read_claim(NS, "c"), 404),
        (lambda kube: kube.lease_owner(NS, "l"), 404),
        (lambda kube: kube.read_secret(NS, "s"), 404),
    ],
)
def test_an_idempotency_signal_is_answered_as_none_at_once(verb: Callable[[KubeApi], Any], status: int) -> None:
    """L1: 404/409/410 (and a claim's failed test, 422) mean "not there", "taken" or "not as
    seen": answered as None, never raised, never retried."""
    core = _Core(_refusal(status))
    assert verb(_kube(core)) is None
    assert core.calls == 1


@pytest.mark.parametrize("status", [404, 409, 410])
def test_a_delete_that_misses_is_false(status: int) -> None:
    """L14: a delete whose pod is gone, or is another pod now (its uid or resourceVersion
    precondition failed), deletes nothing and says so."""
    core = _Core(_refusal(status))
    assert _kube(core).delete_pod(NS, "p", "uid-1") is False
    assert _kube(_Core()).delete_pod(NS, "p", "uid-1") is True


def test_a_lease_or_claim_of_a_taken_name_is_false() -> None:
    """L1: creating a placement record (or a workspace claim) that exists already is no error:
    another placement was first (the claim is there already)."""
    assert _kube(_Core(_refusal(409))).create_lease(NS, "l", PodRef("p", "u"), {}, {}) is False
    assert _kube(_Core()).create_lease(NS, "l", PodRef("p", "u"), {}, {}) is True
    assert _kube(_Core(_refusal(409))).create_claim(NS, {"metadata": {"name": "ws-1"}}) is False


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_blip_of_429_or_5xx_is_retried_and_passes(status: int) -> None:
    """A 1 s blip: one 429/5xx answer, then the API server answers; the call succeeds."""
    core = _Core(_refusal(status))
    assert _kube(core).list_pods(NS, "a=b") == []
    assert core.calls == 2


@pytest.mark.parametrize(
    "failure", [_refusal(503), _refusal(429), ProtocolError("reset"), MaxRetryError(None, "/", "refused"), OSError()]
)
def test_an_api_server_that_stays_away_is_kubernetes_unavailable_after_three_tries(failure: BaseException) -> None:
    """429/5xx and a connection that fails are retried briefly (three attempts), then raised
    as ``KubernetesUnavailable`` (Transient: the task retries later)."""
    core = _Core(failure, failure, failure, failure)
    with pytest.raises(KubernetesUnavailable, match="to list pods"):
        _kube(core).list_pods(NS, "a=b")
    assert core.calls == 3


def test_rbac_refusals_name_the_permission_and_admission_refusals_carry_its_message() -> None:
    """L2: a 403 from RBAC names the verb, resource and namespace to grant (and to whom); a 403
    from admission carries the API server's own message; neither is retried."""
    rbac = _refusal(403, 'pods is forbidden: User "system:serviceaccount:r:sa" cannot list resource "pods"')
    core = _Core(rbac)
    with pytest.raises(RunnerRejected, match="grant the controller's service account 'list' on 'pods' in namespace"):
        _kube(core).list_pods(NS, "a=b")
    assert core.calls == 1
    leases = _Core(_refusal(403, 'leases.coordination.k8s.io is forbidden: User "u" cannot create resource'))
    with pytest.raises(RunnerRejected, match=r"'create' on 'leases\.coordination\.k8s\.io' in namespace sandboxes"):
        _kube(leases).create_lease(NS, "l", PodRef("p", "u"), {}, {})
    unauthorized = _Core(_refusal(401, "Unauthorized"))
    cli = KubeApi(unauthorized, grantee="the credentials in use", leases=unauthorized)  # type: ignore[arg-type]
    with pytest.raises(RunnerRejected, match="grant the credentials in use 'get' on 'secrets'"):
        cli.read_secret(NS, "s")
    admission = _refusal(403, 'pods "p" is forbidden: violates PodSecurity "restricted:latest": seccompProfile')
    with pytest.raises(RunnerRejected, match=r'admission refused to create pods: .*violates PodSecurity "restricted'):
        _kube(_Core(admission)).create_pod(NS, {"metadata": {"name": "p"}})


def test_any_other_answer_is_a_kubernetes_error_and_a_refused_pod_is_runner_rejected() -> None:
    """An answer no caller expects (400 to a list) is ``KubernetesError`` with its status; a pod
    or a claim the API server will not create (400, 422) is ``RunnerRejected``: the template is
    wrong, and retrying will not help."""
    with pytest.raises(KubernetesError, match="answered 400 to list pods: bad selector") as raised:
        _kube(_Core(_refusal(400, "bad selector"))).list_pods(NS, "a=b")
    assert raised.value.status == 400
    with pytest.raises(RunnerRejected, match="Kubernetes refused pod sbx-1: Unprocessable Entity"):
        _kube(_Core(_refusal(422, "invalid", "Unprocessable Entity"))).create_pod(NS, {"metadata": {"name": "sbx-1"}})
    with pytest.raises(RunnerRejected, match="Kubernetes refused persistentvolumeclaims ws-1"):
        _kube(_Core(_refusal(422, "invalid"))).create_claim(NS, {"metadata": {"name": "ws-1"}})


def test_a_note_for_kubectl_describe_never_fails_the_caller() -> None:
    """A pod's Event is best effort: refused or unreachable, it is logged and tried once."""
    for failure in (_refusal(403, "cannot create resource events"), _refusal(503), OSError()):
        core = _Core(failure)
        _kube(core).note(NS, PodRef("p", "u"), "SandboxStarted", "executor for session s")
        assert core.calls == 1


def test_only_the_door_imports_the_kubernetes_client() -> None:
    """The client takes about half a second to import: the receiver, the worker, the scheduler
    and the CLI's modules never import it; only building the Kubernetes runner or the pod watch
    (``runners.kubernetes.api``) does."""
    probe = (
        "import sys\n"
        "import controller.cli, controller.endpoint, controller.worker, controller.scheduler, controller.wiring\n"
        "import controller.webhook_cli, controller.runners.kubernetes.templates\n"
        "assert 'kubernetes' not in sys.modules and 'urllib3' not in sys.modules, 'imported too early'\n"
        "import controller.runners.kubernetes.runner\n"
        "assert 'kubernetes' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
