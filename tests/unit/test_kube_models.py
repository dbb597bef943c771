"""The Kubernetes client's models and argument validators are built before a worker's first
claim, not inside it (``api.load_models`` and ``api.load_verbs``, called by ``wiring.worker_app``
before the pool processes fork), and each pool process connects at its start
(``ProcessDeps.on_process_init``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller import wiring
from controller.config import PREFIX, Settings
from tests.support.processes import wait_for

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter (the test process may have built the models already): the answers a
# claim reads -- a pool's pod list (a warm pod, as the API server returns it: managed fields,
# owner references, status), the patched pod, a lease, an event, a workspace claim, a status --
# deserialized by the client; prints the client's model modules that deserializing imported.
_SCRIPT = """
import json, sys
from kubernetes import client
from controller.model import SandboxSpec
from controller.runners.kubernetes import api
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate, make_pod, make_pvc, make_warm_pod

if sys.argv[1] == "load":
    api.load_models()
template, settings = SandboxTemplate(name="day", warm_pool_size=2), PodSettings(namespace="sandboxes")
spec = SandboxSpec("sess_1", "env_1", "https://api.example.test/v1", "/workspace")
stamp = "2026-12-01T22:00:00Z"
status = {
    "phase": "Running",
    "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}],
    "containerStatuses": [
        {"name": "executor", "ready": True, "restartCount": 0, "image": "i", "imageID": "d",
         "state": {"running": {"startedAt": stamp}}, "lastState": {"terminated": {"exitCode": 0}}}
    ],
}
meta = {"uid": "u", "resourceVersion": "1", "creationTimestamp": stamp,
        "managedFields": [{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {}}],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]}
pods = [make_warm_pod(template, settings), make_pod(spec, 1, template, settings)]
for pod in pods:
    pod["metadata"].update(meta, name=pod["metadata"].get("name", "warm-day-x"))
    pod["status"] = status
answers = {
    "V1PodList": {"metadata": {"resourceVersion": "1"}, "items": pods},
    "V1Pod": pods[0],
    "V1Lease": {"metadata": meta, "spec": {"holderIdentity": "p", "acquireTime": "2026-12-01T22:00:00.000000Z"}},
    "CoreV1Event": {"metadata": meta, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "r"},
    "V1PersistentVolumeClaim": {**make_pvc(spec, template, settings), "status": {"phase": "Bound"}},
    "V1Status": {"status": "Failure", "reason": "Conflict", "details": {"causes": [{"reason": "r"}]}, "code": 409},
}
before = {m for m in sys.modules if m.startswith("kubernetes.client.models.")}
reader = client.ApiClient()
for kind, answer in answers.items():
    reader.deserialize(json.dumps(answer), kind, "application/json")
print(json.dumps(sorted({m for m in sys.modules if m.startswith("kubernetes.client.models.")} - before)))
"""


def _last_line(script: str, load: bool) -> str:
    """The last line ``script`` printed, run in a fresh interpreter (its modules not yet
    imported), told ``load`` or ``lazy``."""
    found = subprocess.run(
        [sys.executable, "-c", script, "load" if load else "lazy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return found.stdout.strip().splitlines()[-1]


def _imported_by_answers(load: bool) -> list[str]:
    return list(json.loads(_last_line(_SCRIPT, load)))


def test_after_load_models_a_claims_answers_build_no_model_of_the_client() -> None:
    """Deserializing what a claim reads (pods, a lease, an event, a claim, a status) after
    ``load_models`` imports none of the client's model modules: each was built beforehand.
    Without it the same answers import dozens (the control: the test can see them)."""
    assert _imported_by_answers(load=False), "the client built its models eagerly: nothing left to load"
    assert _imported_by_answers(load=True) == []


@pytest.mark.parametrize(("runner", "loads"), [("kubernetes", True), ("local", False)])
def test_the_worker_builds_the_clients_models_before_its_processes_fork(
    runner: str, loads: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``worker_app`` (the worker's main process, before the pool forks) loads the models with
    the Kubernetes runner, and never imports the client with the local runner."""
    from controller.runners.kubernetes import api

    loaded: list[bool] = []
    monkeypatch.setattr(api, "load_models", lambda: loaded.append(True) or 0)
    monkeypatch.setattr(api, "load_verbs", lambda: loaded.append(True) or 0)
    settings = Settings.from_env(
        {
            PREFIX + "REDIS_URL": "redis://127.0.0.1:1/0",  # never dialled: clients connect lazily
            PREFIX + "WEBHOOK_SECRETS": "a-webhook-secret-of-24-bytes",
            PREFIX + "API_KEY": "sk-test-api-key",
            PREFIX + "EXECUTOR_KEY": "envkey-test",
            PREFIX + "RUNNER": runner,
            PREFIX + "LOCAL_STATE_DIRECTORY": str(tmp_path / "sandboxes"),
            PREFIX + "LOCAL_EXECUTOR_SAME_USER": "true",
        }
    )
    wiring.worker_app(settings)
    assert loaded == ([True, True] if loads else [])


# A fresh interpreter: the verbs a claim calls (and a release's delete, a cold start's create and
# read), each called once with its arguments on a client whose requests are stubbed (nothing is
# sent); prints how many argument validators of the client those calls built.
_VERBS = """
import sys
from kubernetes import client
from pydantic._internal import _validate_call
from controller.runners.kubernetes import api

if sys.argv[1] == "load":
    api.load_verbs()
built = []
real = _validate_call.ValidateCallWrapper._create_validators
def counted(self):
    built.append(self.qualname)
    real(self)
_validate_call.ValidateCallWrapper._create_validators = counted
class Unsent(Exception):
    pass
def unsent(*args, **kwargs):
    raise Unsent()
client.ApiClient.call_api = unsent
core = client.CoreV1Api(client.ApiClient())
leases = client.CoordinationV1Api(core.api_client)
calls = [
    lambda: core.list_namespaced_pod("ns", label_selector="a=b", _preload_content=False),
    lambda: core.read_namespaced_pod("p", "ns", _preload_content=False),
    lambda: core.create_namespaced_pod("ns", {"metadata": {"name": "p"}}, _preload_content=False),
    lambda: core.patch_namespaced_pod("p", "ns", [{"op": "test", "path": "/a", "value": 1}], _preload_content=False),
    lambda: core.delete_namespaced_pod("p", "ns", _preload_content=False),
    lambda: core.create_namespaced_event("ns", {"metadata": {}, "involvedObject": {}}, _preload_content=False),
    lambda: leases.read_namespaced_lease("l", "ns", _preload_content=False),
    lambda: leases.create_namespaced_lease("ns", {"metadata": {"name": "l"}}, _preload_content=False),
]
for call in calls:
    try:
        call()
    except Unsent:
        pass
print(len(built))
"""


def _validators_built(load: bool) -> int:
    return int(_last_line(_VERBS, load))


def test_after_load_verbs_a_claims_calls_build_no_argument_validator_of_the_client() -> None:
    """The verbs a worker calls on pods, events and leases build no argument validator of the
    client once ``load_verbs`` ran (the client builds one on each verb's first call: 2-5 ms of
    CPU each). Without it the same calls build eight (the control: the test can see them)."""
    assert _validators_built(load=False) == 8
    assert _validators_built(load=True) == 0


def test_a_pool_process_connects_its_runner_at_its_start() -> None:
    """``ProcessDeps.on_process_init`` (Celery's ``worker_process_init``, after the fork) builds
    the process's dependencies and connects a runner that ``Connects``, before any job (on a
    thread: the signal waits for no network)."""

    class Runner:
        connected = 0

        def connect(self) -> None:
            self.connected += 1

    runner = Runner()
    deps = wiring.ProcessDeps(lambda: SimpleNamespace(runner=runner))  # type: ignore[arg-type,return-value]
    deps.on_process_init()
    wait_for(lambda: runner.connected == 1, 10, "the runner to connect")  # on a thread of its own
    assert deps().runner is runner and runner.connected == 1  # built once, connected once
