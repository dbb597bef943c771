"""The checkpoint protocol between the Kubernetes runner and the node agent (issue 40): its
annotations, the suspension's record, and the choice between a restore and a fresh start."""

from __future__ import annotations

import json

import pytest

from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.checkpoints import Answer, Record, restore_choice
from controller.runners.kubernetes.objects import Pod

NOW = 1_700_001_000.0
RECORD = Record(
    image=checkpoints.image_ref("sandboxes", "ws-sess-1-8ac3c66d", "0b1c2d3e-4f50-6789-abcd-ef0123456789"),
    node="node-a",
    environment_id="env_1",
    suspended_at=NOW - 100,
    lineage_started_at=NOW - 1000,
    size_bytes=5_400_000,
)


def test_image_names_are_bound_to_their_claim_and_read_back() -> None:
    assert RECORD.image == "localhost/sandbox-checkpoint/sandboxes/ws-sess-1-8ac3c66d:0b1c2d3e4f50"
    assert checkpoints.image_claim(RECORD.image) == "ws-sess-1-8ac3c66d"
    assert checkpoints.image_namespace(RECORD.image) == "sandboxes"
    for other in (
        "localhost/sandbox-checkpoint/sandboxes/../x:1",
        "localhost/sandbox-checkpoint/sandboxes/ws:1/extra",
        "localhost/sandbox-checkpoint/ws:1",
        "localhost/sandbox-checkpoint/a/b/ws:1",
        "docker.example/sandbox-checkpoint/sandboxes/ws:1",
        "localhost/sandbox-checkpoint/sandboxes/ws",
        "localhost/sandbox-checkpoint/sandboxes/WS:1",
    ):
        assert checkpoints.image_claim(other) is None and checkpoints.image_namespace(other) is None, other


def test_a_record_reads_back_as_written_and_an_unreadable_one_is_none() -> None:
    annotations = {checkpoints.CHECKPOINT_RECORD: RECORD.encode()}
    assert checkpoints.record_of(annotations) == RECORD
    assert checkpoints.record_of({checkpoints.CHECKPOINT_RECORD: "{not json"}) is None
    assert checkpoints.record_of({checkpoints.CHECKPOINT_RECORD: json.dumps({"image": "x"})}) is None
    assert checkpoints.record_of({}) is None


def test_the_agent_answers_only_the_request_asked_and_a_garbled_answer_is_an_error() -> None:
    asked = {checkpoints.CHECKPOINT_REQUEST: "r2"}
    assert checkpoints.pending_request(asked) == "r2"
    stale = {**asked, checkpoints.CHECKPOINT_ANSWER: Answer("r1", image=RECORD.image).encode()}
    assert checkpoints.pending_request(stale) == "r2"  # an answer to an earlier request is no answer
    assert checkpoints.answer_of(stale, "r2") is None
    done = {**asked, checkpoints.CHECKPOINT_ANSWER: Answer("r2", image=RECORD.image, size_bytes=7).encode()}
    assert checkpoints.pending_request(done) is None
    answer = checkpoints.answer_of(done, "r2")
    assert answer is not None and answer.ok and answer.size_bytes == 7
    failed = checkpoints.answer_of({checkpoints.CHECKPOINT_ANSWER: Answer("r2", error="500").encode()}, "r2")
    assert failed is not None and not failed.ok
    garbled = checkpoints.answer_of({checkpoints.CHECKPOINT_ANSWER: "]["}, "r2")
    assert garbled is not None and not garbled.ok and "unreadable" in garbled.error
    assert checkpoints.pending_request({}) is None


def test_a_checkpoint_is_restored_once_into_the_generation_it_was_first_tried_in() -> None:
    """Issue 40: a record is restored into the next generation (and again into that same one: a
    retried start finds the pod it created); a later generation finding it tried knows that restore
    did not take, and starts afresh."""
    assert restore_choice(RECORD, 3, "env_1", NOW, None) == (True, "")
    tried = Record(**{**RECORD.__dict__, "restore_generation": 3})
    assert restore_choice(tried, 3, "env_1", NOW, None) == (True, "")
    restore, why = restore_choice(tried, 4, "env_1", NOW, None)
    assert not restore and "did not take" in why


def test_no_restore_of_another_environment_or_past_the_lifetime_or_without_a_record() -> None:
    assert restore_choice(None, 2, "env_1", NOW, None) == (False, "")
    restore, why = restore_choice(RECORD, 2, "env_2", NOW, None)
    assert not restore and "another environment" in why
    restore, why = restore_choice(RECORD, 2, "env_1", NOW, 1000)
    assert not restore and "maximum lifetime" in why
    assert restore_choice(RECORD, 2, "env_1", NOW, 1001) == (True, "")
    foreign = Record(**{**RECORD.__dict__, "image": "docker.example/evil:1"})
    restore, why = restore_choice(foreign, 2, "env_1", NOW, None)
    assert not restore and "no checkpoint image" in why


@pytest.mark.parametrize(
    ("waiting", "phase", "health"),
    [
        (("ErrImageNeverPull", "image gone"), "Pending", "failed"),
        (("CreateContainerError", "restore via CreateContainer is disabled"), "Pending", "failed"),
        (None, "Failed", "failed"),
        (("ContainerCreating", ""), "Pending", "starting"),
        (None, "Running", "running"),
    ],
)
def test_a_restored_pod_whose_restore_did_not_take_has_failed(
    waiting: tuple[str, str] | None, phase: str, health: str
) -> None:
    """Issue 40: a restored pod stuck on its checkpoint image (gone from the node, or refused by
    the runtime) is failed, so the session's next pod starts afresh; an ordinary pod with the same
    wait is still starting (a missing seccomp profile is reported and kept, not replaced)."""
    restored = Pod("p", "u", phase=phase, waiting=waiting, annotations={checkpoints.RESTORED_FROM: RECORD.image})
    assert restored.health.value == health
    ordinary = Pod("p", "u", phase=phase, waiting=waiting)
    assert ordinary.health.value == ("failed" if phase == "Failed" else "running" if phase == "Running" else "starting")


def test_a_restored_pods_lineage_is_read_from_its_annotation() -> None:
    pod = Pod("p", "u", annotations={checkpoints.LINEAGE_STARTED_AT: "1700000000.250"})
    assert pod.lineage_started_at == 1_700_000_000.25
    assert Pod("p", "u").lineage_started_at == 0.0
    assert Pod("p", "u", annotations={checkpoints.LINEAGE_STARTED_AT: "soon"}).lineage_started_at == 0.0


def test_patches_guard_what_they_change() -> None:
    """The request and the answer land only on the pod meant (its uid); marking or dropping a
    record only on the record as read."""
    request = checkpoints.request_patch("uid-1", "r1")
    assert request[0] == {"op": "test", "path": "/metadata/uid", "value": "uid-1"}
    assert request[1]["path"] == "/metadata/annotations/sandbox-controller.dev~1checkpoint-request"
    found = RECORD.encode()
    mark = checkpoints.mark_patch(found, RECORD, 5)
    assert mark[0] == {"op": "test", "path": "/metadata/annotations/sandbox-controller.dev~1checkpoint", "value": found}
    assert checkpoints.record_of({checkpoints.CHECKPOINT_RECORD: mark[1]["value"]}) == Record(
        **{**RECORD.__dict__, "restore_generation": 5}
    )
    assert checkpoints.drop_patch(found)[1] == {"op": "remove", "path": mark[0]["path"]}
    assert names.PREFIX in checkpoints.CHECKPOINT_RECORD
