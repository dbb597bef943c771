"""Which sandbox changes ask for a fresh look at the session (``controller.sandbox_changes``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.model import Health
from controller.sandbox_changes import Sighting, look_again, look_again_after_list

RUNNING = Sighting("sess_1", "uid-1", Health.RUNNING, ready=True)
STARTING = Sighting("sess_1", "uid-1", Health.STARTING)


def test_a_deleted_sandbox_asks_for_a_look() -> None:
    """L14, L17: a pod that is gone (deleted by anyone) has its session looked at again."""
    assert look_again(RUNNING, None) == "sess_1"
    assert look_again(replace(RUNNING, health=Health.TERMINATING), None) == "sess_1"


@pytest.mark.parametrize("before", [RUNNING, STARTING, None], ids=["running", "starting", "first-sight"])
def test_a_sandbox_that_failed_asks_for_a_look_once(before: Sighting | None) -> None:
    """L14: a pod whose phase turned Failed/Succeeded or whose container terminated (FAILED) has
    its session looked at again, also when first seen failed (a list after the watch was away);
    the same failure seen again asks for nothing more."""
    failed = replace(RUNNING, health=Health.FAILED, ready=False)
    assert look_again(before, failed) == "sess_1"
    assert look_again(failed, replace(failed, ready=False)) is None


def test_a_restart_and_becoming_ready_ask_for_a_look() -> None:
    """L14: a container restart and a sandbox becoming Ready each ask for a look."""
    assert look_again(RUNNING, replace(RUNNING, restarts=1)) == "sess_1"
    assert look_again(STARTING, replace(STARTING, health=Health.RUNNING, ready=True)) == "sess_1"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, STARTING),  # a pod just created (by a worker's start)
        (None, RUNNING),  # first sight of a healthy pod: nothing happened to it
        (STARTING, replace(STARTING, health=Health.RUNNING)),  # running, not yet Ready
        (RUNNING, RUNNING),  # a label, a timestamp: nothing the lifecycle reads
        (RUNNING, replace(RUNNING, ready=False)),  # lost readiness: not a failure by itself
        (RUNNING, replace(RUNNING, health=Health.TERMINATING)),  # deletion begun: its DELETED follows
    ],
    ids=["created", "first-sight-healthy", "running-not-ready", "no-change", "not-ready", "terminating"],
)
def test_other_changes_ask_for_nothing(before: Sighting | None, after: Sighting) -> None:
    assert look_again(before, after) is None


def test_a_sandbox_without_a_session_id_is_never_looked_at() -> None:
    nameless = replace(RUNNING, session_id="")
    assert look_again(None, replace(nameless, health=Health.FAILED)) is None
    assert look_again(nameless, None) is None


def test_after_a_new_list_gone_and_changed_sandboxes_ask_for_a_look() -> None:
    """L14, L17: after the watch had to list again (410 Gone), a pod it knew that the list lacks
    was deleted meanwhile and a pod that failed meanwhile is noticed; unchanged and new healthy
    pods ask for nothing. Each session once, sorted."""
    known = {
        "u-gone": Sighting("sess_gone", "u-gone", Health.RUNNING, ready=True),
        "u-failed": Sighting("sess_failed", "u-failed", Health.RUNNING, ready=True),
        "u-same": Sighting("sess_same", "u-same", Health.RUNNING, ready=True),
        "u-old": Sighting("sess_twice", "u-old", Health.RUNNING, ready=True),
    }
    listed = [
        Sighting("sess_failed", "u-failed", Health.FAILED),
        Sighting("sess_same", "u-same", Health.RUNNING, ready=True),
        Sighting("sess_new", "u-new", Health.STARTING),
        Sighting("sess_twice", "u-new2", Health.FAILED),  # the old pod went and its successor failed
    ]
    assert look_again_after_list(known, listed) == ["sess_failed", "sess_gone", "sess_twice"]
    assert look_again_after_list({}, listed) == ["sess_failed", "sess_twice"]
    assert look_again_after_list(known, [known[uid] for uid in known]) == []


def test_a_pod_is_seen_as_the_lifecycle_reads_it() -> None:
    """The watch's view of a pod: its session id annotation, uid, health (as the runner's
    ``status`` reports it), Ready condition and restarts summed over its containers."""
    from kubernetes import client

    from controller.runners.kubernetes import names
    from controller.runners.kubernetes.watch import sighting
    from tests.support.pods import pod_of

    def pod(phase: str, ready: str, restarts: int, terminated: bool = False) -> client.V1Pod:
        state = client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(exit_code=1) if terminated else None
        )
        return client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="sbx-1", uid="uid-1", annotations={names.SESSION_ID_ANNOTATION: "sess_1"}
            ),
            status=client.V1PodStatus(
                phase=phase,
                conditions=[client.V1PodCondition(type="Ready", status=ready)],
                container_statuses=[
                    client.V1ContainerStatus(
                        name="executor",
                        image="i",
                        image_id="",
                        ready=ready == "True",
                        restart_count=restarts,
                        state=state,
                    )
                ],
            ),
        )

    assert sighting(pod_of(pod("Running", "True", 2))) == Sighting(
        "sess_1", "uid-1", Health.RUNNING, ready=True, restarts=2
    )
    assert sighting(pod_of(pod("Pending", "False", 0))) == Sighting("sess_1", "uid-1", Health.STARTING)
    assert sighting(pod_of(pod("Running", "False", 0, terminated=True))).health is Health.FAILED
    assert sighting(pod_of(pod("Failed", "False", 0))).health is Health.FAILED
    unannotated = client.V1Pod(
        metadata=client.V1ObjectMeta(name="x", uid="u"), status=client.V1PodStatus(phase="Running")
    )
    assert sighting(pod_of(unannotated)) == Sighting("", "u", Health.RUNNING)
