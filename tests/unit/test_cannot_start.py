"""A sandbox that cannot start because its node lacks its seccomp profile (issue 39): what a
pod's status says (``objects.pod_from_json``, ``seccomp.cannot_start``, with the scheduler's and
containerd 2.3.7's own words from the real node), what ``decide`` makes of it (kept and
reported, never replaced while it lasts; a whole grace once it clears), and how ``work``
reports it (one warning line, an Event through the runner, one count) and ``explain`` shows it.
The same against a real API server: tests/kube/test_missing_profile.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from controller import fleet
from controller.decide import FIRST_LOOK_SECONDS, Verdict, decide
from controller.lifecycle import Routing
from controller.model import CannotStart, Handle, Health, Record
from controller.runners.base import Diagnoses
from controller.runners.kubernetes import names, seccomp
from controller.runners.kubernetes.objects import pod_from_json
from tests.support.fakes import GRACE, T0, FakeRunner, World, make_session

PROFILE = "sandbox-controller/codex-sandbox.json"
DIGEST = "0123456789abcdef"
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling."
)
NOT_LOADED = (
    'failed to create containerd container: cannot load seccomp profile "/var/lib/kubelet/seccomp/'
    f'{PROFILE}": open /var/lib/kubelet/seccomp/{PROFILE}: no such file or directory'
)


def _pod(
    status: dict[str, Any],
    selector: dict[str, str] | None = None,
    container_seccomp: dict[str, str] | None = None,
    pod_seccomp: dict[str, str] | None = None,
    node: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "executor", "image": "i", "securityContext": {}}
    if container_seccomp is not None:
        container["securityContext"]["seccompProfile"] = container_seccomp
    spec: dict[str, Any] = {"containers": [container], "securityContext": {}}
    if pod_seccomp is not None:
        spec["securityContext"]["seccompProfile"] = pod_seccomp
    if selector is not None:
        spec["nodeSelector"] = selector
    if node is not None:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": "sbx-a-g1", "uid": "u-1", "annotations": {names.TEMPLATE_ANNOTATION: "codex"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T09:00:00Z"
    return {"metadata": meta, "spec": spec, "status": status}


LOCALHOST = {"type": "Localhost", "localhostProfile": PROFILE}
SELECTOR = {seccomp.PROFILE_LABEL: DIGEST, "pool": "fast"}


def _unschedulable(message: str = UNSCHEDULABLE) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    return {"phase": "Pending", "conditions": [condition]}


def _waiting(reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "executor", "state": {"waiting": {"reason": reason, "message": message}}}],
    }


# --- what the pod says --------------------------------------------------------------------------


def test_a_pod_is_read_with_its_selector_node_profile_and_why_it_waits() -> None:
    pod = pod_from_json(_pod(_waiting("CreateContainerError", NOT_LOADED), SELECTOR, LOCALHOST, node="node-a"))
    assert (pod.node_selector, pod.node_name, pod.seccomp_profile) == (SELECTOR, "node-a", PROFILE)
    assert pod.waiting == ("CreateContainerError", NOT_LOADED) and pod.unschedulable is None
    pending = pod_from_json(_pod(_unschedulable(), SELECTOR, pod_seccomp=LOCALHOST))
    assert pending.unschedulable == UNSCHEDULABLE and pending.waiting is None and pending.node_name == ""
    assert pending.seccomp_profile == PROFILE  # the pod's profile, when its container names none
    overridden = pod_from_json(_pod({}, container_seccomp={"type": "RuntimeDefault"}, pod_seccomp=LOCALHOST))
    assert overridden.seccomp_profile is None  # the container's own wins
    bare = pod_from_json({"metadata": {"name": "p"}})
    assert (bare.node_selector, bare.seccomp_profile, bare.unschedulable, bare.waiting) == ({}, None, None, None)


def test_no_node_with_the_profiles_label_is_read_from_the_schedulers_words() -> None:
    found = seccomp.cannot_start(pod_from_json(_pod(_unschedulable(), SELECTOR, LOCALHOST)))
    assert found is not None and (found.kind, found.template) == (seccomp.NO_NODE, "codex")
    assert found.reason == (
        f"no node has the seccomp profile {PROFILE} (no node is labelled {seccomp.PROFILE_LABEL}={DIGEST}): enable "
        "the chart's sandbox.seccompInstaller, which writes it on each node and labels the node, or put the chart's "
        f"files/codex-sandbox-seccomp.json at <kubelet root>/seccomp/{PROFILE} on a node and label it "
        f"{seccomp.PROFILE_LABEL}={DIGEST}; the pod is scheduled once a node has it"
    )


def test_a_profile_missing_on_the_pods_node_is_read_from_the_kubelets_words() -> None:
    status = _waiting("CreateContainerError", NOT_LOADED)
    found = seccomp.cannot_start(pod_from_json(_pod(status, None, LOCALHOST, node="node-a")))
    assert found is not None and found.kind == seccomp.MISSING_ON_NODE
    assert found.reason.startswith(f"the seccomp profile {PROFILE} is missing on node node-a ({NOT_LOADED}): ")
    assert found.reason.endswith("the kubelet retries the container by itself")


@pytest.mark.parametrize(
    "pod",
    [
        _pod(_unschedulable(), SELECTOR),  # no Localhost profile
        _pod(_unschedulable("0/1 nodes are available: 1 Insufficient cpu."), {"pool": "fast"}, LOCALHOST),
        _pod(_waiting("CreateContainerError", 'mount "/x": permission denied'), None, LOCALHOST),
        _pod(_waiting("ImagePullBackOff", "seccomp profile image not found"), None, LOCALHOST),
        _pod(_waiting("ContainerCreating", ""), SELECTOR, LOCALHOST),
        _pod(_unschedulable(), SELECTOR, LOCALHOST, deleting=True),
        _pod({**_waiting("CreateContainerError", NOT_LOADED), "phase": "Running"}, None, LOCALHOST),
    ],
    ids=["no-profile", "other-selector", "other-error", "pulling", "creating", "deleting", "running"],
)
def test_anything_else_is_not_a_missing_profile(pod: dict[str, Any]) -> None:
    """A pod held up by something else (a full node, another selector, an image, another
    runtime error) or past starting is not said to lack its profile."""
    assert seccomp.cannot_start(pod_from_json(pod)) is None


# --- what decide makes of it ------------------------------------------------------------------

FOUND = CannotStart(seccomp.NO_NODE, "no node has the seccomp profile x", "codex")


def _record() -> Record:
    handle = Handle(session_id="sess_1", name="sandbox-g1", generation=1, uid="u1")
    return Record("sess_1", "env_1", handle, started_at=T0, disconnected_at=T0)


def _decide(rec: Record, now: float, found: CannotStart | None, health: Health = Health.STARTING) -> Any:
    return decide(make_session(), rec, health, False, now, GRACE, Routing(), cannot_start=found)


def test_a_sandbox_that_cannot_start_is_kept_past_its_grace_and_reported_once() -> None:
    """L14's exception: past the grace period a sandbox whose executor never connected is
    replaced — unless it cannot start (a new one could not either): kept, reported by the look
    that first finds it, looked at again a grace later."""
    now = T0 + GRACE + 5
    assert _decide(_record(), now, None).verdict is Verdict.REPLACE
    first = _decide(_record(), now, FOUND)
    assert first.verdict is Verdict.KEEP and first.cannot_start == FOUND
    assert first.reason.startswith("sandbox cannot start: no node has the seccomp profile x; kept, not replaced")
    assert first.update == replace(_record(), cannot_start_since=now) and first.recheck_at == now + GRACE
    later = _decide(first.update, now + 10 * GRACE, FOUND)
    assert later.verdict is Verdict.KEEP and later.cannot_start is None and later.update is None
    assert later.reason.endswith(f"; for {10 * GRACE:.0f}s")


def test_only_a_starting_sandbox_is_kept_for_it() -> None:
    """A sandbox that runs, failed or is gone is decided as before, whatever was said of it."""
    now = T0 + GRACE + 5
    assert _decide(_record(), now, FOUND, Health.FAILED).verdict is Verdict.REPLACE
    assert _decide(_record(), now, FOUND, Health.RUNNING).verdict is Verdict.REPLACE


def test_past_its_lifetime_a_sandbox_that_cannot_start_is_replaced_still() -> None:
    now = T0 + 100
    decided = decide(
        make_session(), _record(), Health.STARTING, False, now, GRACE, Routing(), max_lifetime_seconds=50,
        cannot_start=FOUND,
    )  # fmt: skip
    assert decided.verdict is Verdict.REPLACE


def test_once_it_can_start_its_executor_gets_a_whole_grace_from_that_look() -> None:
    stuck = replace(_record(), cannot_start_since=T0 + 5)
    seen = T0 + 10 * GRACE
    cleared = _decide(stuck, seen, None)
    assert cleared.verdict is Verdict.KEEP
    assert cleared.update == replace(stuck, cannot_start_since=None, disconnected_at=seen)
    assert cleared.recheck_at == seen + GRACE + 1.0
    assert _decide(cleared.update, seen + GRACE, None).verdict is Verdict.KEEP
    assert _decide(cleared.update, seen + GRACE + FIRST_LOOK_SECONDS + 1, None).verdict is Verdict.REPLACE


# --- work reports it; explain shows it ----------------------------------------------------------


@dataclass
class DiagnosingRunner(FakeRunner):
    """``FakeRunner`` that ``Diagnoses``: ``stuck`` says why a sandbox cannot start, by uid."""

    stuck: dict[str, CannotStart] = field(default_factory=dict)
    told: list[tuple[str, str]] = field(default_factory=list)

    def diagnose(self, handle: Handle) -> tuple[Health, CannotStart | None]:
        health = self.status(handle)
        return health, self.stuck.get(handle.uid) if health is Health.STARTING else None

    def tell_cannot_start(self, handle: Handle, found: CannotStart) -> None:
        self.told.append((handle.name, found.kind))


def test_work_reports_a_sandbox_that_cannot_start_once_and_never_replaces_it(caplog: pytest.LogCaptureFixture) -> None:
    """L14's exception, L1: one "sandbox cannot start" warning naming the sandbox, its template
    and the reason; an Event through the runner; one count; then looks every grace period, each
    keeping the same sandbox; ``explain`` shows it, how long, and decides as ``work`` does."""
    world = World()
    counted: list[str] = []
    world.deps.on_cannot_start = counted.append
    runner = DiagnosingRunner()
    world.runner = runner
    world.deps.runner = runner
    assert isinstance(runner, Diagnoses)
    world.sessions.put(make_session())
    world.sessions.connected["env_1"] = False
    world.deliver()
    saved = world.store.record("sess_1")
    assert saved is not None
    runner.set_health(saved.handle, Health.STARTING)
    runner.stuck[saved.handle.uid] = FOUND
    world.clock.advance(GRACE + 5)
    for _ in range(4):
        [decision] = world.deliver()
        assert decision.verdict is Verdict.KEEP
        world.clock.advance(GRACE)
    assert counted == [seccomp.NO_NODE] and runner.told == [(saved.handle.name, seccomp.NO_NODE)]
    [line] = [r for r in caplog.records if r.getMessage() == "sandbox cannot start"]
    assert (line.sandbox, line.template, line.kind, line.reason) == (
        saved.handle.name,
        "codex",
        FOUND.kind,
        FOUND.reason,
    )
    assert [c[0] for c in runner.calls] == ["ensure"] and runner.max_live["sess_1"] == 1
    explained = fleet.explain("sess_1", world.deps)
    assert explained.decision.verdict is Verdict.KEEP and FOUND.reason in explained.decision.reason
    assert explained.observed["cannot_start"] == {
        "kind": seccomp.NO_NODE,
        "reason": FOUND.reason,
        "template": "codex",
        "for_seconds": 4 * GRACE,
    }
    assert [c[0] for c in runner.calls] == ["ensure"]
