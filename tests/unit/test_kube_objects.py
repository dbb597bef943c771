"""A pod as the API server's JSON has it, read into the project's ``Pod`` (``pod_from_json``),
the way the Kubernetes runner reads every pod answer (no model of the client is built)."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.model import Health
from controller.runners.kubernetes import names
from controller.runners.kubernetes.objects import pod_from_json


def _at(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


def _pod(**status: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "warm-day-x",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-12-01T22:00:00Z",
            "labels": {names.GENERATION_LABEL: "3", names.POOL_STATE_LABEL: names.CLAIMED},
            "annotations": {names.SESSION_ID_ANNOTATION: "sess_1", names.CLAIMED_AT_ANNOTATION: "1764626405.5"},
            "managedFields": [{"manager": "m", "operation": "Update", "fieldsV1": {}}],
        },
        "spec": {"containers": [{"name": "executor", "image": "i"}]},
        "status": status,
    }


def test_a_running_pod_is_read_with_its_stamps_labels_and_health() -> None:
    pod = pod_from_json(
        _pod(
            phase="Running",
            conditions=[
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T22:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T22:00:03Z"},
            ],
            containerStatuses=[
                {
                    "name": "executor",
                    "restartCount": 2,
                    "state": {"running": {"startedAt": "2026-12-01T22:00:02Z"}},
                    "lastState": {"terminated": {"exitCode": 1}},
                }
            ],
        )
    )
    assert (pod.name, pod.uid, pod.resource_version) == ("warm-day-x", "u-1", "42")
    assert pod.created_at == _at("2026-12-01T22:00:00")
    assert pod.scheduled_at == _at("2026-12-01T22:00:01")
    assert pod.container_started_at == _at("2026-12-01T22:00:02")
    assert pod.ready and pod.restarts == 2 and not pod.terminated and not pod.deleting
    assert pod.health is Health.RUNNING and pod.alive
    assert pod.generation == 3 and pod.claimed and pod.session_id == "sess_1"
    assert pod.started_at == 1764626405.5


def test_a_terminated_deleting_or_bare_pod_says_so() -> None:
    terminated = pod_from_json(
        _pod(phase="Running", containerStatuses=[{"name": "executor", "state": {"terminated": {"exitCode": 1}}}])
    )
    assert terminated.terminated and terminated.health is Health.FAILED
    deleting = _pod(phase="Running")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T22:01:00Z"  # type: ignore[index]
    assert pod_from_json(deleting).health is Health.TERMINATING
    bare = pod_from_json({"metadata": {"name": "p", "uid": "u"}})
    assert (bare.created_at, bare.scheduled_at, bare.container_started_at, bare.phase) == (0.0, 0.0, 0.0, None)
    assert bare.health is Health.STARTING and bare.labels == {} and bare.restarts == 0
    fraction = pod_from_json({"metadata": {"creationTimestamp": "2026-12-01T22:00:00.250000+00:00"}})
    assert fraction.created_at == _at("2026-12-01T22:00:00") + 0.25
