"""`helm test` of Codex's own sandbox, node by node (tests.codexSandbox).

Run by the chart's test pod (templates/tests/test-codex-sandbox.yaml) in the controller image. At
test time it lists the nodes sandbox pods could run on (tests.codexSandbox.nodeSelector; not
cordoned; every NoSchedule/NoExecute taint tolerated by tests.codexSandbox.tolerations) and starts
one probe pod on each (``spec.nodeName``), all at once, in the sandbox namespace: the sandbox
image and security context with the seccomp profile a template would name. Each probe runs one
command in Codex's sandbox and judges it by what it printed and what it was refused (the
workspace written; $HOME, /etc and a socket refused), never by codex's exit code, and ends with
one line ``node <name>: yes|no: <why>``. A probe that never ran (its node lacks the seccomp
profile's file, the kubelet rejected it, it did not finish in time) gets its answer from its
pod's status instead. One JSON line per node (``sandbox``: yes, no or skipped, and why), then
a summary; the test fails unless at least one node was probed and every probed node said yes.
The probe pods are deleted at the end (and any an earlier, interrupted run left, at the start).

The functions above ``main`` are pure (tests/chart/test_codex_sandbox_check.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

CHECK_LABEL = "sandbox-controller/codex-sandbox-check"
"""The label of the probe pods (value: ``probe``), so a later run finds what an earlier one left."""
VERDICT = re.compile(r"^node (?P<node>\S+): (?P<answer>yes|no): (?P<why>.*)$")
# Waiting reasons of a container that will not start by waiting longer.
STUCK = ("CreateContainerError", "CreateContainerConfigError", "InvalidImageName")


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint`` (Kubernetes' rule)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def not_for_sandboxes(node: dict[str, Any], tolerations: list[dict[str, Any]]) -> str | None:
    """Why no sandbox pod would be placed on ``node``, or None (probe it)."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned (spec.unschedulable)"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(taint, tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            tainted = f"{taint.get('key')}{value}:{taint['effect']}"
            return f"tainted {tainted}, which tests.codexSandbox.tolerations does not tolerate"
    return None


def unlabelled(node: dict[str, Any], probe: dict[str, Any]) -> str | None:
    """Why sandbox pods of the profile's templates would not be placed on ``node`` for its labels
    (the probe's nodeSelector: with the chart's installer on, the profile's label), or None."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in ((probe.get("spec") or {}).get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return (
                f"the node is not labelled {key}={value}, so the sandboxes of a template naming the profile are not "
                "placed here: the chart's seccomp installer has not put this version of the profile on it (is "
                "its pod on this node running? kubectl get pods -l app.kubernetes.io/component=seccomp-installer "
                "in the release namespace)"
            )
    return None


def answer(pod: dict[str, Any], log: str | None) -> tuple[str, str] | None:
    """The node's answer from its probe pod and the probe's log: ("yes" or "no", why), or None
    while the probe may still run."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        verdicts = [m for m in (VERDICT.match(line) for line in (log or "").splitlines()) if m]
        if verdicts:
            last = verdicts[-1]
            said = last["answer"]
            if said == "yes" and phase != "Succeeded":  # cannot happen with the chart's probe; never a yes
                return "no", f"the probe said yes but its pod {phase.lower()}"
            return said, last["why"]
        terminated = _terminated(status)
        return "no", f"the probe pod {phase.lower()} without an answer: " + (
            terminated or _reason(status) or "no reason given"
        )
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            message = waiting.get("message") or ""
            if "seccomp" in message.lower():
                return "no", f"the pod's seccomp profile could not be loaded on this node ({message})"
            return "no", f"the probe's container could not be created: {waiting['reason']}: {message}"
    return None


def late(pod: dict[str, Any], seconds: float) -> str:
    """Why a probe that gave no answer within ``seconds`` gave none, from its pod's status."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting:
            said = ": ".join(x for x in (waiting.get("reason"), waiting.get("message")) if x)
            return f"no answer within {seconds:.0f}s: its container is waiting: {said}"
    return f"no answer within {seconds:.0f}s: the pod is {status.get('phase') or 'not started'}" + (
        f" ({_reason(status)})" if _reason(status) else ""
    )


def _terminated(status: dict[str, Any]) -> str:
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            return f"its container exited {ended.get('exitCode')} ({ended.get('reason') or ''})"
    return ""


def _reason(status: dict[str, Any]) -> str:
    return ": ".join(x for x in (status.get("reason"), status.get("message")) if x)


def probe_for(probe: dict[str, Any], node: str) -> dict[str, Any]:
    """The probe pod pinned to ``node``."""
    pod = json.loads(json.dumps(probe))
    pod["spec"]["nodeName"] = node
    pod.setdefault("metadata", {}).setdefault("labels", {})[CHECK_LABEL] = "probe"
    return pod


def _log(core: Any, name: str, namespace: str) -> str | None:
    """The probe's log, or None (a pod the kubelet rejected has none)."""
    from kubernetes import client

    try:
        text: str = core.read_namespaced_pod_log(name, namespace)
    except client.exceptions.ApiException:
        return None
    return text


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main() -> int:
    import yaml
    from kubernetes import client, config

    config.load_incluster_config()
    api = client.ApiClient()
    core = client.CoreV1Api(api)
    plain = api.sanitize_for_serialization
    namespace = os.environ["SANDBOX_NAMESPACE"]
    wait_seconds = float(os.environ.get("PROBE_SECONDS", "180"))
    with open(os.environ.get("PROBE_POD", "/check/probe-pod.yaml")) as file:
        probe = yaml.safe_load(file)
    selector = json.loads(os.environ.get("NODE_SELECTOR") or "{}")
    tolerations = (probe.get("spec") or {}).get("tolerations") or []
    probes = f"{CHECK_LABEL}=probe"
    core.delete_collection_namespaced_pod(namespace, label_selector=probes, grace_period_seconds=0)

    nodes = [plain(n) for n in core.list_node(label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items]
    answers: dict[str, tuple[str, str]] = {}
    started: dict[str, str] = {}  # node -> probe pod
    try:
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            why = not_for_sandboxes(node, tolerations)
            if why:
                answers[name] = ("skipped", why)
                continue
            why = unlabelled(node, probe)
            if why:
                answers[name] = ("no", why)
                continue
            try:
                started[name] = core.create_namespaced_pod(namespace, probe_for(probe, name)).metadata.name
            except client.exceptions.ApiException as refused:  # e.g. an admission policy's answer
                answers[name] = ("no", f"the probe pod was refused: {refused.status} {refused.reason}: {refused.body}")
        deadline = time.monotonic() + wait_seconds
        pending = dict(started)
        while pending:
            listed = core.list_namespaced_pod(namespace, label_selector=probes).items
            pods = {p.metadata.name: plain(p) for p in listed}
            for node, pod_name in list(pending.items()):
                pod = pods.get(pod_name) or {"status": {"phase": "Failed", "reason": "the probe pod is gone"}}
                log = _log(core, pod_name, namespace) if pod["status"].get("phase") in ("Succeeded", "Failed") else None
                found = answer(pod, log)
                if found is None and time.monotonic() >= deadline:
                    found = ("no", late(pod, wait_seconds))
                if found is not None:
                    answers[node] = found
                    output = log.splitlines()[-20:] if log and found[0] == "no" else None
                    say(message="codex sandbox check", node=node, sandbox=found[0], why=found[1], pod=pod_name,
                        **({"output": output} if output else {}))  # fmt: skip
                    del pending[node]
            if pending:
                time.sleep(2)
    finally:
        if started:
            core.delete_collection_namespaced_pod(namespace, label_selector=probes, grace_period_seconds=0)
    for node, (said, why) in sorted(answers.items()):
        if node not in started:
            say(message="codex sandbox check", node=node, sandbox=said, why=why)
    counts = {k: sorted(n for n, (a, _) in answers.items() if a == k) for k in ("yes", "no", "skipped")}
    if not started and not counts["no"]:
        why = "no node to probe: none matched tests.codexSandbox.nodeSelector, or every one was skipped"
        say(message="codex sandbox check done", passed=False, why=why, **counts)
        return 1
    passed = not counts["no"]
    say(message="codex sandbox check done", passed=passed, **counts)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
