"""A sandbox pod whose node lacks the seccomp profile its template names, read from the pod (pure).

A template's ``seccompProfile`` gives its pods a ``Localhost`` profile: a file the kubelet reads
from its seccomp directory on the node the pod lands on. The chart's node installer
(``sandbox.seccompInstaller``) writes Codex's profile there and labels the node
``PROFILE_LABEL=<the file's digest>``; a template naming that profile selects those nodes. Two
ways such a pod cannot start, as the scheduler and the kubelet say them:

- no node has the profile: the pod's node selector asks for ``PROFILE_LABEL`` and its
  ``PodScheduled`` condition is False for ``Unschedulable`` (the scheduler: "0/1 nodes are
  available: 1 node(s) didn't match Pod's node affinity/selector…"). The scheduler places the
  pod by itself once a node has the label;
- the file is missing on the pod's node (the label without the file, or a template of the
  operator's own without the selector): the container waits in ``CreateContainerError`` with a
  message naming the seccomp profile (containerd 2.3: "failed to create containerd container:
  cannot load seccomp profile "<path>": open <path>: no such file or directory"). The kubelet
  retries the container by itself, so once the file is there it starts.

Either way a new pod would not start either: ``cannot_start`` says why, in plain words with what
to do, and the lifecycle keeps the pod and reports it instead of replacing it (``decide``).
"""

from __future__ import annotations

from controller.model import CannotStart
from controller.runners.kubernetes import names
from controller.runners.kubernetes.objects import Pod

PROFILE_LABEL = "sandbox-controller/codex-sandbox-seccomp"
"""The node label the chart's seccomp installer sets to the profile's digest (the chart's
``sandbox-controller.codexSeccompLabel``)."""
NO_NODE = "no_node_with_profile"
MISSING_ON_NODE = "profile_missing_on_node"
"""The kinds (``CannotStart.kind``, the metric's ``reason`` label)."""


def cannot_start(pod: Pod) -> CannotStart | None:
    """Why ``pod`` cannot start because of its seccomp profile, or None (it may start, or is
    held up by something else: a full node, an image being pulled)."""
    profile = pod.seccomp_profile
    if profile is None or pod.deleting or pod.phase != "Pending":
        return None
    template = pod.annotations.get(names.TEMPLATE_ANNOTATION, "")
    if pod.unschedulable is not None and PROFILE_LABEL in pod.node_selector:
        wanted = f"{PROFILE_LABEL}={pod.node_selector[PROFILE_LABEL]}"
        return CannotStart(
            NO_NODE,
            f"no node has the seccomp profile {profile} (no node is labelled {wanted}): enable the chart's "
            f"sandbox.seccompInstaller, which writes it on each node and labels the node, or put the chart's "
            f"files/codex-sandbox-seccomp.json at <kubelet root>/seccomp/{profile} on a node and label it {wanted}; "
            "the pod is scheduled once a node has it",
            template,
        )
    if pod.waiting is not None and pod.waiting[0] == "CreateContainerError" and _seccomp(pod.waiting[1]):
        return CannotStart(
            MISSING_ON_NODE,
            f"the seccomp profile {profile} is missing on node {pod.node_name or 'unknown'} "
            f"({pod.waiting[1]}): put the file there under the kubelet's seccomp directory (Codex's profile: the "
            "chart's sandbox.seccompInstaller writes it on every node it runs on); the kubelet retries the container "
            "by itself",
            template,
        )
    return None


def _seccomp(message: str) -> bool:
    """A container runtime's message about a seccomp profile it could not load."""
    lowered = message.lower()
    return "seccomp" in lowered and "profile" in lowered
