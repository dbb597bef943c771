"""The node agent's decisions (controller/node_agent/): which request it serves, which file a
kubelet's answer names, what an answer says, which checkpoint images it deletes and which
archives are a crashed agent's; and its settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.config import PREFIX, Settings
from controller.errors import ConfigError
from controller.node_agent import archives, collection, pending
from controller.node_agent.agent import MAX_BACKOFF_SECONDS, backoff
from controller.runners.kubernetes import checkpoints, names
from controller.runners.kubernetes.objects import Claim, Pod, pod_from_json

NODE = "node-a"
NS = "sandboxes"
STAMP = "2026-12-06T16:10:03Z"
IMAGE = checkpoints.image_ref(NS, "ws-s1-0123abcd", "5f0c2a1e-aaaa-bbbb-cccc-000000000001")
OTHER = checkpoints.image_ref(NS, "ws-s2-89abcdef", "77777777-aaaa-bbbb-cccc-000000000002")


def pod(
    name: str = "sbx-s1-g1",
    request: str | None = "nonce-1",
    node: str = NODE,
    labels: dict[str, str] | None = None,
    created_at: float = 100.0,
    deleting: bool = False,
    answer: str | None = None,
    images: tuple[str, ...] = ("runner:1",),
) -> Pod:
    annotations = {names.SESSION_ID_ANNOTATION: "s1"}
    if request is not None:
        annotations[checkpoints.CHECKPOINT_REQUEST] = request
    if answer is not None:
        annotations[checkpoints.CHECKPOINT_ANSWER] = answer
    return Pod(
        name=name,
        uid=f"uid-{name}",
        created_at=created_at,
        deleting=deleting,
        labels=names.labels("s1", 1) if labels is None else labels,
        annotations=annotations,
        node_name=node,
        workspace_claim="ws-s1-0123abcd",
        images=images,
    )


# -- request picking ------------------------------------------------------------------------


def test_the_agent_serves_the_oldest_pending_request_of_a_managed_pod_on_its_node() -> None:
    found = pending.next_request([pod("b", created_at=200), pod("a", request="r-a", created_at=150)], NODE)
    assert found is not None and (found[0].name, found[1]) == ("a", "r-a")


@pytest.mark.parametrize(
    "candidate",
    [
        pod(labels={}),  # not managed: never checkpointed, whatever it asks
        pod(labels={"app.kubernetes.io/managed-by": "someone-else", "app.kubernetes.io/component": "sandbox"}),
        pod(node="node-b"),  # another node's
        pod(deleting=True),  # its worker gave up waiting
        pod(request=None),  # nothing asked
        pod(answer=checkpoints.Answer(request="nonce-1", error="no").encode()),  # answered already
    ],
    ids=["unmanaged", "another manager", "another node", "deleting", "no request", "answered"],
)
def test_the_agent_leaves_a_pod_alone_unless_it_is_a_managed_pod_of_its_node_asking(candidate: Pod) -> None:
    assert pending.next_request([candidate], NODE) is None


def test_a_new_request_after_an_answered_one_is_served() -> None:
    answered = checkpoints.Answer(request="nonce-0", image=IMAGE).encode()
    found = pending.next_request([pod(request="nonce-1", answer=answered)], NODE)
    assert found is not None and found[1] == "nonce-1"


# -- answers --------------------------------------------------------------------------------


def test_an_answer_is_read_back_by_the_controller_as_it_was_taken() -> None:
    taken = pending.taken("nonce-1", IMAGE, 5_400_000, 2.34567)
    answer = checkpoints.answer_of({checkpoints.CHECKPOINT_ANSWER: taken}, "nonce-1")
    assert answer == checkpoints.Answer(request="nonce-1", image=IMAGE, size_bytes=5_400_000, seconds=2.346)
    assert answer.ok


def test_a_failure_answers_with_its_reason_on_one_trimmed_line() -> None:
    body = "checkpointing failed:\n" + "x" * 2000
    failed = checkpoints.answer_of({checkpoints.CHECKPOINT_ANSWER: pending.failed("nonce-1", body)}, "nonce-1")
    assert failed is not None and not failed.ok
    assert failed.error.startswith("checkpointing failed: xxx") and "\n" not in failed.error
    assert len(failed.error) == pending.REASON_LIMIT and failed.error.endswith("…")
    assert checkpoints.answer_of({checkpoints.CHECKPOINT_ANSWER: pending.failed("r", "")}, "r").error == "failed"  # type: ignore[union-attr]


def test_the_answer_is_patched_onto_that_very_pod() -> None:
    patch = pending.answer_patch(pod(), "{}")
    assert patch[0] == {"op": "test", "path": "/metadata/uid", "value": "uid-sbx-s1-g1"}
    assert patch[1] == {
        "op": "add",
        "path": "/metadata/annotations/sandbox-controller.dev~1checkpoint-answer",
        "value": "{}",
    }


# -- the kubelet's archive ------------------------------------------------------------------


def answer_naming(*items: object) -> str:
    return json.dumps({"items": list(items)})


def test_the_archive_is_the_answers_file_name_inside_the_agents_mount(tmp_path: Path) -> None:
    host = f"/var/lib/kubelet/checkpoints/checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar"
    found = archives.archive_path(tmp_path, answer_naming(host), "sbx-s1-g1", NS, checkpoints.CONTAINER)
    assert found == tmp_path / f"checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar"
    other_root = f"/srv/k/checkpoints/checkpoint-sbx-s1-g1_{NS}-executor-2026-12-06T17:10:03+01:00.tar"
    assert (
        archives.archive_path(tmp_path, answer_naming(other_root), "sbx-s1-g1", NS, checkpoints.CONTAINER).parent
        == tmp_path
    )
    assert archives.oci_path(found) == tmp_path / f"{found.name}.oci.tar"


@pytest.mark.parametrize(
    "answer",
    [
        "not json",
        json.dumps({"items": []}),
        json.dumps({"items": "x"}),
        answer_naming(
            f"/c/checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar", f"/c/checkpoint-b_{NS}-executor-{STAMP}.tar"
        ),
        answer_naming("/etc/shadow"),
        answer_naming(f"/c/checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar/.."),
        answer_naming(f"/c/checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar/../../../etc/passwd"),
        answer_naming(".."),
        answer_naming(f"/c/checkpoint-another-pod_{NS}-executor-{STAMP}.tar"),
        answer_naming(f"/c/checkpoint-sbx-s1-g1_other-executor-{STAMP}.tar"),
        answer_naming(f"/c/checkpoint-sbx-s1-g1_{NS}-sidecar-{STAMP}.tar"),
        answer_naming(f"/c/checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar.oci.tar"),
    ],
    ids=[
        "no json", "no item", "not a list", "two", "another file", "dot-dot after", "escape", "dot-dot",
        "another pod", "another namespace", "another container", "not the archive",
    ],
)  # fmt: skip
def test_an_answer_naming_anything_but_one_archive_of_that_pod_is_refused(tmp_path: Path, answer: str) -> None:
    with pytest.raises(archives.ArchiveRefused):
        archives.archive_path(tmp_path, answer, "sbx-s1-g1", NS, checkpoints.CONTAINER)


def test_stray_archives_are_only_the_sandbox_namespaces_older_than_the_grace() -> None:
    now, grace = 1000.0, 60.0
    old, young = now - 61, now - 10
    files = [
        (f"checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar", old),  # a crashed agent's
        (f"checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar.oci.tar", old),  # its OCI archive
        (f"checkpoint-sbx-s2-g3_{NS}-executor-{STAMP}.tar", young),  # being written or served now
        (f"checkpoint-web-1_default-executor-{STAMP}.tar", old),  # another namespace's
        (f"checkpoint-web-1_{NS}-x-executor-{STAMP}.tar", old),  # namespace sandboxes-x's
        (f"checkpoint-sbx-s1-g1_{NS}-sidecar-{STAMP}.tar", old),  # not the sandbox container
        ("notes.txt", old),
        (f"checkpoint-sbx-s1-g1_{NS}-executor-{STAMP}.tar.partial", old),
    ]
    assert archives.strays(files, NS, checkpoints.CONTAINER, now, grace) == sorted(files[i][0] for i in (0, 1))


# -- collection -----------------------------------------------------------------------------


def record(image: str) -> dict[str, str]:
    made = checkpoints.Record(image=image, node=NODE, environment_id="env", suspended_at=1.0, lineage_started_at=1.0)
    return {checkpoints.CHECKPOINT_RECORD: made.encode()}


def test_an_image_is_named_by_a_claims_record_a_pods_answer_or_a_pods_container() -> None:
    by_answer = pod("a", answer=checkpoints.Answer(request="n", image=IMAGE).encode())
    by_container = pod("b", images=("runner:1", OTHER))
    assert collection.named_images([by_answer], []) == {IMAGE, "runner:1"}
    assert collection.named_images([by_container], []) == {"runner:1", OTHER}
    assert collection.named_images([], [Claim("ws-s1-0123abcd", record(IMAGE))]) == {IMAGE}
    unreadable = pod("c", answer="{not json")
    assert collection.named_images([unreadable], [Claim("c", {checkpoints.CHECKPOINT_RECORD: "?"})]) == {"runner:1"}


def test_an_unnamed_image_is_deleted_only_at_a_look_at_least_the_grace_after_the_first_that_saw_it_unnamed() -> None:
    images = [IMAGE, OTHER, "localhost/sandbox-controller:node", "docker.io/library/redis:7"]
    first = collection.sweep(images, {OTHER}, {}, now=100.0, grace_seconds=60.0)
    assert first == collection.Sweep(delete=(), unnamed={IMAGE: 100.0})  # other images are never the agent's
    early = collection.sweep(images, {OTHER}, first.unnamed, now=159.0, grace_seconds=60.0)
    assert early == collection.Sweep(delete=(), unnamed={IMAGE: 100.0})
    due = collection.sweep(images, {OTHER}, early.unnamed, now=160.0, grace_seconds=60.0)
    assert due == collection.Sweep(delete=(IMAGE,), unnamed={})


def test_a_name_seen_at_any_look_starts_the_grace_over() -> None:
    first = collection.sweep([IMAGE], set(), {}, now=100.0, grace_seconds=60.0)
    named = collection.sweep([IMAGE], {IMAGE}, first.unnamed, now=130.0, grace_seconds=60.0)
    assert named.unnamed == {}
    again = collection.sweep([IMAGE], set(), named.unnamed, now=170.0, grace_seconds=60.0)
    assert again == collection.Sweep(delete=(), unnamed={IMAGE: 170.0})


def test_an_image_gone_from_the_node_is_forgotten() -> None:
    assert collection.sweep([], set(), {IMAGE: 1.0}, now=100.0, grace_seconds=60.0) == collection.Sweep((), {})


# -- the loop's back-off ---------------------------------------------------------------------


def test_failed_steps_back_off_doubling_up_to_a_limit() -> None:
    assert backoff(1.0, 0) == 1.0
    assert [backoff(1.0, n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert backoff(1.0, 50) == MAX_BACKOFF_SECONDS


# -- what the agent reads of a pod ------------------------------------------------------------


def test_a_pod_names_its_workspace_claim_and_every_containers_image() -> None:
    found = pod_from_json(
        {
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "initContainers": [{"name": "i", "image": "init:1"}],
                "containers": [{"name": checkpoints.CONTAINER, "image": IMAGE}],
                "volumes": [
                    {"name": "home", "emptyDir": {}},
                    {"name": "workspace", "persistentVolumeClaim": {"claimName": "ws-s1-0123abcd"}},
                ],
            },
        }
    )
    assert (found.workspace_claim, found.images) == ("ws-s1-0123abcd", ("init:1", IMAGE))
    empty = pod_from_json({"metadata": {"name": "p"}, "spec": {"volumes": [{"name": "workspace", "emptyDir": {}}]}})
    assert (empty.workspace_claim, empty.images) == (None, ())


# -- settings --------------------------------------------------------------------------------


def test_the_node_agent_needs_its_node_and_kubelet() -> None:
    settings = Settings.from_env({})
    with pytest.raises(ConfigError) as refused:
        settings.require("node-agent")
    assert [p.split(" is required")[0] for p in refused.value.problems] == [
        f"{PREFIX}NODE_AGENT_NODE_NAME",
        f"{PREFIX}NODE_AGENT_KUBELET_URL",
    ]
    ready = Settings.from_env(
        {f"{PREFIX}NODE_AGENT_NODE_NAME": NODE, f"{PREFIX}NODE_AGENT_KUBELET_URL": "https://10.0.0.5:10250/"}
    )
    ready.require("node-agent")
    agent = ready.node_agent
    assert (agent.node_name, agent.kubelet_url, agent.poll_seconds, agent.image_grace_seconds) == (
        NODE,
        "https://10.0.0.5:10250",
        1.0,
        60.0,
    )
    assert agent.checkpoint_directory == "/var/lib/kubelet/checkpoints" and agent.ctr == "/usr/local/bin/ctr"


def test_the_kubelet_is_reached_over_https_only() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({f"{PREFIX}NODE_AGENT_KUBELET_URL": "http://10.0.0.5:10255"})
    assert refused.value.problems == [
        f"{PREFIX}NODE_AGENT_KUBELET_URL must be an https:// URL, got 'http://10.0.0.5:10255'"
    ]
