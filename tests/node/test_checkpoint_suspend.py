"""Suspend with memory on the real node (issue 40): a session of the chart's template with
``suspend: checkpoint`` is checkpointed at its idle timeout by the node agent (the chart's
DaemonSet: the kubelet's checkpoint API, then a checkpoint image in the node's containerd),
its pod deleted, and restored at its next connection request with its background process's
memory, on kubelet 1.37 + containerd 2.3 + runc 1.4 + CRIU. The controller's half is shown
without a node in tests/kube/test_checkpoint_suspend.py.

The background process keeps a random token in a shell variable only, and writes ``token
counter`` to ``beat`` in the workspace every 0.2 s: a restored process goes on with the same
token and a counter past the one seen before the suspension; a fresh start could only show the
last line the old one wrote, which no longer moves."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from controller.runners.kubernetes import checkpoints, names
from tests.node.checkpoints import KEEPER, READ, link_stretches, turn_beats
from tests.node.conftest import CHECKPOINT_TEMPLATE, IDLE_TIMEOUT_SECONDS, SANDBOX_NAMESPACE, Installed
from tests.node.test_real_node import (
    _claims,
    _connected,
    _delivered_at,
    _one_session,
    _pods,
    _registered,
    _status,
    _stops,
    _worker_log_lines,
)
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

pytestmark = [pytest.mark.timeout(1200)]


@pytest.fixture
def world(installed: Installed) -> Installed:
    if not installed.node.criu:
        pytest.fail("the node runs without CRIU although scripts/criu.sh built one")
    return installed


def _lines(world: Installed, event: str, session_id: str) -> list[dict[str, Any]]:
    return [x for x in _worker_log_lines(world) if x.get("event") == event and x.get("session_id") == session_id]


def _record(world: Installed, session_id: str) -> checkpoints.Record | None:
    [claim] = _claims(world, session_id)
    return checkpoints.record_of(claim.metadata.annotations or {})


def _images(world: Installed) -> list[str]:
    listed = world.node.ctr("image", "ls", "-q").stdout.split()
    return [ref for ref in listed if ref.startswith(checkpoints.IMAGE_REPOSITORY + "/")]


def _containers_of(world: Installed, pod: str) -> list[str]:
    found = world.node.ctr("containers", "ls", "-q", f'labels."io.kubernetes.pod.name"=={pod}', check=False)
    return found.stdout.split()


def _suspended(world: Installed, session_id: str, pod_name: str) -> checkpoints.Record:
    """The session goes idle; past the timeout its pod is checkpointed and deleted."""
    wait_for(lambda: _status(world, session_id) == "idle", 120, "the turn to end idle", interval=0.5)
    wait_for(lambda: not _pods(world, session_id), IDLE_TIMEOUT_SECONDS + 180, "the idle suspension", interval=1)
    [stop] = wait_for(lambda: _stops(world, session_id), 60, "the worker to log the stop", interval=1)
    assert stop["cause"] == "idle", stop
    record = _record(world, session_id)
    assert record is not None, "no checkpoint recorded on the claim: " + json.dumps(
        _lines(world, "checkpoint failed, sandbox stopped instead", session_id)
    )
    wait_for(lambda: not _containers_of(world, pod_name), 60, "the pod's containers to be gone", interval=0.5)
    return record


def test_an_idle_sandbox_pod_is_checkpointed_and_restored_with_its_memory(world: Installed) -> None:
    """L11, L16, issue 40: turn 1 starts a background process that keeps a token only in memory;
    the session goes idle and, past the timeout, its pod is checkpointed (the image in the
    node's containerd, the kubelet's archive removed, the record on the claim) and deleted (no
    container of it left). Turn 2's connection request restores it on the node: a pod created
    from the image, on a new pod IP, whose executor reconnects on its own registration (one
    lineage: no new one) and whose background process goes on with the same token. Counted
    ``restored``; running, its record is spent. The figures (suspend, restore to connected, and
    the same session's fresh start) are printed for BENCHMARKS.md."""
    timeline = _one_session(world, template=CHECKPOINT_TEMPLATE)
    session_id, environment_id = timeline["session_id"], timeline["environment_id"]
    [first] = [p for p in _pods(world, session_id) if p.metadata.name == timeline["pod"]]
    started = run_turn(world.simulator_url, session_id, [["sh", "-c", KEEPER], READ], timeout=300)
    token, counted = turn_beats({"commands": started["commands"][1:]})[-1]

    record = _suspended(world, session_id, first.metadata.name)
    assert record.image == checkpoints.image_ref(SANDBOX_NAMESPACE, names.pvc_name(session_id), first.metadata.uid)
    assert record.node == first.spec.node_name and record.environment_id == environment_id
    assert record.image in _images(world)
    archives = list((world.node.workdir / "kubelet" / "checkpoints").glob(f"checkpoint-{first.metadata.name}_*"))
    assert archives == [], "the kubelet's archive (the sandbox's memory) was left on the node"
    [taken] = _lines(world, "checkpoint taken", session_id)
    wait_for(lambda: not _connected(world, environment_id), 60, "the executor's link to drop", interval=0.5)

    asked_at = time.time()
    resumed = run_turn(world.simulator_url, session_id, [READ], timeout=600)
    beats = turn_beats(resumed)
    assert {t for t, _ in beats} == {token}, f"a new background process answered: {beats}"
    assert beats[0][1] > counted and beats[-1][1] > beats[0][1], beats
    [restored] = [p for p in _pods(world, session_id) if p.metadata.name != first.metadata.name]
    assert restored.metadata.annotations[checkpoints.RESTORED_FROM] == record.image
    assert restored.spec.containers[0].image == record.image
    assert restored.status.pod_ip != first.status.pod_ip
    assert len(_registered(world, environment_id)) == 1  # its own registration: one lineage
    assert _lines(world, "sandbox restored", session_id)
    assert not _lines(world, "restore impossible, starting a fresh executor", session_id)
    wait_for(lambda: _record(world, session_id) is None, 60, "the restored pod's record to be spent", interval=1)

    links = link_stretches(world.simulator_url, environment_id)
    second = next(since for since, _ in links if since is not None and since > asked_at)
    delivered = wait_for(lambda: _delivered_at(world, session_id), 10, "the first delivery")
    print(
        f"\nFIGURE node checkpoint (codex exec-server + a shell keeper): agent {taken['seconds']:.2f}s, "
        f"image {taken['size_bytes'] / 1e6:.1f} MB; turn posted -> restored executor connected "
        f"{second - asked_at:.2f}s; this session's fresh start: webhook delivered -> executor registered "
        f"{timeline['registered_at'] - delivered:.2f}s"
    )


def test_a_checkpoint_image_gone_from_the_node_means_a_fresh_start_on_the_same_workspace(world: Installed) -> None:
    """Issue 40: the checkpoint image is removed from the node's containerd while the session is
    suspended: the restored pod cannot start (``ErrImageNeverPull``), and the session's next pod
    is a fresh executor on the same claim (a new registration; the background process is gone,
    its last beat still in the workspace), logged and counted as a fresh start."""
    timeline = _one_session(world, template=CHECKPOINT_TEMPLATE)
    session_id, environment_id = timeline["session_id"], timeline["environment_id"]
    [first] = [p for p in _pods(world, session_id) if p.metadata.name == timeline["pod"]]
    run_turn(world.simulator_url, session_id, [["sh", "-c", KEEPER]], timeout=300)
    record = _suspended(world, session_id, first.metadata.name)
    world.node.ctr("image", "rm", record.image)

    resumed = run_turn(world.simulator_url, session_id, [["sh", "-c", "sleep 1; cat beat; sleep 1; cat beat"]], 600)
    [read] = resumed["commands"]
    beats = [line.split() for line in read["stdout"].split("\n") if line]
    assert len(beats) == 2 and beats[0] == beats[1], f"the old background process is not gone: {beats}"
    [impossible] = wait_for(
        lambda: _lines(world, "restore impossible, starting a fresh executor", session_id), 60, "the fresh start's line"
    )
    assert "did not take" in impossible["reason"], impossible
    assert len(_registered(world, environment_id)) == 2  # a fresh executor registered
    assert _record(world, session_id) is None
