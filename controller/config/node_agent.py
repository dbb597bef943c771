"""The node agent's section (``sandbox-controller node-agent``, one per sandbox node: the chart's
DaemonSet): which node it serves, how it reaches that node's kubelet and containerd, and how
often it looks (``controller.node_agent``). Only that process reads these; the node name and the
kubelet's URL are required there (``Settings.require("node-agent")``)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable
from controller.config.reader import DAY, PREFIX, Reader


@dataclass(frozen=True, repr=False)
class NodeAgentSettings(Printable):
    node_name: str = ""
    """The node this agent serves (the chart gives ``spec.nodeName``): it checkpoints only the
    sandbox pods bound to it."""
    kubelet_url: str = ""
    """The node's kubelet, e.g. ``https://10.0.0.5:10250`` (its checkpoint API)."""
    kubelet_ca_file: str = "/var/lib/kubelet/pki/kubelet.crt"
    """The kubelet's serving certificate or its CA (PEM): the chain is verified; the host name
    is not (the agent dials the node's address)."""
    kubelet_token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    """A bearer token for the kubelet (sent when the file exists; a cluster's kubelet authorizes
    ``nodes/checkpoint`` with it)."""
    checkpoint_directory: str = "/var/lib/kubelet/checkpoints"
    """Where the kubelet's checkpoints directory is mounted in the agent."""
    containerd_address: str = "/run/containerd/containerd.sock"
    """The node's containerd socket (checkpoint images are imported into its ``k8s.io`` namespace)."""
    ctr: str = "/usr/local/bin/ctr"
    """containerd's ``ctr`` binary (the node's own, mounted)."""
    poll_seconds: float = 1.0
    """How often the agent lists its node's sandbox pods for a checkpoint request."""
    image_grace_seconds: float = 60.0
    """A checkpoint image that nothing names (no claim's record, no pod's answer or image) is
    deleted once it was unnamed at two looks at least this far apart (and stray archives older
    than this are removed)."""


def node_agent(r: Reader) -> NodeAgentSettings:
    s = NodeAgentSettings
    kubelet_url = (r.get(PREFIX + "NODE_AGENT_KUBELET_URL") or "").strip()
    if kubelet_url and not kubelet_url.startswith("https://"):
        r.problems.append(f"{PREFIX}NODE_AGENT_KUBELET_URL must be an https:// URL, got {kubelet_url!r}")
    return NodeAgentSettings(
        node_name=(r.get(PREFIX + "NODE_AGENT_NODE_NAME") or "").strip(),
        kubelet_url=kubelet_url.rstrip("/"),
        kubelet_ca_file=r.text("NODE_AGENT_KUBELET_CA_FILE", s.kubelet_ca_file),
        kubelet_token_file=r.text("NODE_AGENT_KUBELET_TOKEN_FILE", s.kubelet_token_file),
        checkpoint_directory=r.text("NODE_AGENT_CHECKPOINT_DIRECTORY", s.checkpoint_directory),
        containerd_address=r.text("NODE_AGENT_CONTAINERD_ADDRESS", s.containerd_address),
        ctr=r.text("NODE_AGENT_CTR", s.ctr),
        poll_seconds=r.number("NODE_AGENT_POLL_SECONDS", s.poll_seconds, float, 0.1, 60.0),
        image_grace_seconds=r.number("NODE_AGENT_IMAGE_GRACE_SECONDS", s.image_grace_seconds, float, 1.0, DAY),
    )
