"""A sandbox pod whose node lacks its seccomp profile, on the real node (containerd 2.3.7): the
controller reports it and keeps the pod, never replacing it in a loop (issue 39).

- A template of the operator's own names a Localhost profile the node does not have (no node
  selector steers it): the kubelet leaves the container in ``CreateContainerError`` with
  containerd's "cannot load seccomp profile … no such file or directory". The worker says so once
  (a Warning Event ``SandboxCannotStart`` on the pod naming the node and containerd's words),
  ``sandbox-controller explain`` shows it, and a look past the executor's grace period keeps the
  same pod.
- The chart's template with the installer's profile while no node carries the installer's label
  (taken off the node for the test): the scheduler leaves the pod ``Unschedulable``; the worker
  says no node has the profile and what to do. Once the node is labelled again the scheduler
  places that same pod, and its executor connects: nothing was replaced.

The same decisions against the API server alone, with these words: tests/kube/test_missing_profile.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controller.runners.kubernetes import names, seccomp
from tests.chart.test_chart import CHART
from tests.node.conftest import (
    CODEX_SANDBOX_TEMPLATE,
    CODEX_SECCOMP_PROFILE,
    MISSING_PROFILE_TEMPLATE,
    MISSING_SECCOMP_PROFILE,
    NAMESPACE,
    SANDBOX_NAMESPACE,
    Installed,
)
from tests.node.probes import pod_exec
from tests.support.processes import wait_for

pytestmark = [pytest.mark.timeout(1800)]
GRACE_SECONDS = 60  # the chart's runner.executorGraceSeconds, which the tier keeps


def _headers(installed: Installed) -> dict[str, str]:
    return {"authorization": f"Bearer {installed.api_key}", "openai-beta": "agents=v1"}


@contextlib.contextmanager
def _session(installed: Installed, template: str) -> Iterator[str]:
    """A session of ``template`` (its first turn asks for a connection); deleted afterwards, so
    the controller releases its pod once the deletion is confirmed."""
    body = {
        "agent": {"model": "node-test"},
        "environment": {"type": "self_hosted"},
        "input": "hi",
        "metadata": {"sandbox_template": template},
    }
    url = f"{installed.simulator_url}/v1/agents/sessions"
    created = httpx.post(url, json=body, headers=_headers(installed), timeout=10)
    created.raise_for_status()
    session_id: str = created.json()["id"]
    try:
        yield session_id
    finally:
        httpx.delete(f"{url}/{session_id}", headers=_headers(installed), timeout=10)


def _pods(installed: Installed, session_id: str) -> list[Any]:
    found: list[Any] = installed.core.list_namespaced_pod(
        SANDBOX_NAMESPACE, label_selector=names.session_selector(session_id)
    ).items
    return found


def _reported(installed: Installed, pod_name: str) -> list[Any]:
    """The controller's ``SandboxCannotStart`` Events on the pod."""
    events = installed.core.list_namespaced_event(
        SANDBOX_NAMESPACE, field_selector=f"involvedObject.name={pod_name}"
    ).items
    return [e for e in events if e.reason == "SandboxCannotStart"]


def _worker(installed: Installed) -> str:
    [pod, *_] = installed.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=worker").items
    return str(pod.metadata.name)


def _explain(installed: Installed, session_id: str) -> dict[str, Any]:
    """``sandbox-controller explain SID --json``, run in a worker's pod as an operator would."""
    output = pod_exec(
        installed.core, _worker(installed), NAMESPACE, ["sandbox-controller", "explain", session_id, "--json"]
    )
    explained: dict[str, Any] = json.loads(output[output.index("{") :])
    return explained


def _looks(installed: Installed, session_id: str) -> list[dict[str, Any]]:
    """The workers' "session looked up" lines about the session."""
    lines = []
    for pod in installed.core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=worker").items:
        text = installed.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if parsed.get("event") == "session looked up" and parsed.get("session_id") == session_id:
                    lines.append(parsed)
    return lines


def test_a_pod_whose_node_lacks_the_profile_file_is_reported_and_kept(installed: Installed) -> None:
    """L14 (its exception): containerd 2.3.7's own words are read as a missing profile; reported
    once (Event, explain), and the look past the grace period keeps the same pod."""
    with _session(installed, MISSING_PROFILE_TEMPLATE) as session_id:
        [pod] = wait_for(lambda: _pods(installed, session_id), 120, "the session's pod", interval=0.5)
        name = pod.metadata.name
        [event] = wait_for(lambda: _reported(installed, name), 180, "the controller's Event", interval=1)
        reported_at = time.monotonic()
        node = installed.node.name
        assert event.type == "Warning" and session_id in event.message
        assert f"the seccomp profile {MISSING_SECCOMP_PROFILE} is missing on node {node}" in event.message
        assert "failed to create containerd container: cannot load seccomp profile" in event.message
        assert f"{MISSING_SECCOMP_PROFILE}: no such file or directory" in event.message, event.message
        waiting = installed.core.read_namespaced_pod(name, SANDBOX_NAMESPACE).status.container_statuses[0]
        assert waiting.state.waiting.reason == "CreateContainerError", waiting

        explained = _explain(installed, session_id)
        assert explained["decision"]["verdict"] == "keep", explained
        cannot = explained["observed"]["cannot_start"]
        assert (cannot["kind"], cannot["template"]) == (seccomp.MISSING_ON_NODE, MISSING_PROFILE_TEMPLATE)

        def kept_past_the_grace() -> list[dict[str, Any]]:
            return [
                look
                for look in _looks(installed, session_id)
                if look["verdict"] == "keep"
                and (found := re.search(r"; for (\d+)s$", look["reason"])) is not None
                and int(found.group(1)) >= GRACE_SECONDS - 5
            ]

        wait_for(kept_past_the_grace, GRACE_SECONDS + 120, "a look a grace later that keeps the pod", interval=2)
        [still] = _pods(installed, session_id)
        assert still.metadata.uid == pod.metadata.uid and still.metadata.deletion_timestamp is None
        assert len(_reported(installed, name)) == 1
        assert all(look["verdict"] in ("start", "keep") for look in _looks(installed, session_id))
        print(f"missing profile: reported, then kept {time.monotonic() - reported_at:.0f}s past the report")


def test_a_pod_no_node_can_take_for_its_profile_is_reported_and_placed_once_a_node_has_it(
    installed: Installed,
) -> None:
    """L14 (its exception): with the installer's label off the node, the chart's profile template's
    pod is Unschedulable: reported with what to do; labelled again, the same pod is scheduled and
    its executor connects (its first turn ends idle)."""
    core, node = installed.core, installed.node.name
    digest = hashlib.sha256((CHART / "files" / "codex-sandbox-seccomp.json").read_bytes()).hexdigest()[:16]
    assert core.read_node(node).metadata.labels[seccomp.PROFILE_LABEL] == digest
    core.patch_node(node, {"metadata": {"labels": {seccomp.PROFILE_LABEL: None}}})
    try:
        with _session(installed, CODEX_SANDBOX_TEMPLATE) as session_id:
            [pod] = wait_for(lambda: _pods(installed, session_id), 120, "the session's pod", interval=0.5)
            name = pod.metadata.name
            [event] = wait_for(lambda: _reported(installed, name), 180, "the controller's Event", interval=1)
            assert event.type == "Warning"
            assert f"no node has the seccomp profile {CODEX_SECCOMP_PROFILE}" in event.message, event.message
            assert f"no node is labelled {seccomp.PROFILE_LABEL}={digest}" in event.message
            assert "sandbox.seccompInstaller" in event.message
            scheduled = installed.core.read_namespaced_pod(name, SANDBOX_NAMESPACE).status.conditions
            assert [(c.type, c.status, c.reason) for c in scheduled] == [("PodScheduled", "False", "Unschedulable")]
            assert _explain(installed, session_id)["observed"]["cannot_start"]["kind"] == seccomp.NO_NODE

            core.patch_node(node, {"metadata": {"labels": {seccomp.PROFILE_LABEL: digest}}})
            url = f"{installed.simulator_url}/v1/agents/sessions/{session_id}"

            def idle() -> bool:
                return bool(httpx.get(url, headers=_headers(installed), timeout=10).json()["status"] == "idle")

            wait_for(idle, 300, "the session's first turn to end idle (its executor connected)", interval=1)
            [ran] = _pods(installed, session_id)
            assert ran.metadata.uid == pod.metadata.uid and ran.spec.node_name == node
            assert ran.metadata.labels[names.GENERATION_LABEL] == "1"
    finally:
        core.patch_node(node, {"metadata": {"labels": {seccomp.PROFILE_LABEL: digest}}})
