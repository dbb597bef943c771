"""The real node's checkpoints (tests/node/test_checkpoint.py, bench/node_checkpoint.py): a
sandbox-like pod whose background process can be told apart from a fresh start, the kubelet's
checkpoint API, and the checkpoint image a node's containerd restores a container from.

**The pod** (``manifest``): a shell (pid 1) runs a Python process in the background that draws
a token at start and holds it in memory only (never in a file or the environment), holds a file
on the workspace claim open and prints ``token=<token> n=<counter>`` every 0.5 s (``beats``).
A restored process prints the token drawn before the checkpoint and counts on; a fresh start
would draw another and count from 1. The pods keep the default template's security context
(manifests.py), the runner's uid included, under Pod Security "restricted"
(``checkpoint_space``). CRIU reads each task's rlimits with prlimit(2), which for another uid's
process needs CAP_SYS_RESOURCE, which this machine's root lacks: the node runs the CRIU of
``scripts/criu.sh --variant proc-limits``, which reads them from /proc then. Only when neither
that CRIU is built nor root has the capability do the pods run as root (under "baseline"): a
non-root container would fail to dump with ``Can't get rlimit 0: Operation not permitted``.

**The checkpoint** (``checkpoint``): the kubelet's ``POST /checkpoint/{namespace}/{pod}/{container}``
has the runtime write a tar (CRIU's images under ``checkpoint/``, ``config.dump``,
``spec.dump``, ``status.dump``, the container's log and writable layer) under the kubelet's
checkpoint directory; the container runs on.

**The checkpoint image** (``checkpoint_image``): the archive made an OCI image by the node
agent's own writer (``controller.node_agent.images.write_checkpoint_image``, which says what
containerd 2.3 needs of it) and imported with ``ctr image import``.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from controller.node_agent.images import write_checkpoint_image
from controller.runners.kubernetes import names
from controller.runners.local.checkpoint import has_sys_resource
from tests.node.node import KUBELET_PORT, NODE_IP, RealNode, say
from tests.node.probes import claim_namespace
from tests.support.criu import proc_limits_criu
from tests.support.processes import wait_for

RUNNER_UID = 10001
CONTAINER = names.CONTAINER  # the sandbox pods' container, as the node agent checkpoints it
# The background process (see the module's docstring); BALLAST_MIB MiB of random bytes besides
# (bench/node_checkpoint.py), and, given LINK, a TCP connection to the test that it writes to
# at each beat and opens again when lost.
WORKER = r"""
import os, secrets, socket, sys, time
token = secrets.token_hex(16)
ballast = os.urandom(int(os.environ.get("BALLAST_MIB", "0")) << 20)
held = open("/workspace/beats", "a")
target = os.environ.get("LINK")
def connect():
    host, port = target.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)
link = connect() if target else None
n = 0
while True:
    n += 1
    if link is not None:
        try:
            link.sendall(b".")
        except OSError as exc:
            print(f"link lost: {exc}", flush=True)
            link = connect()
            print("link reconnected", flush=True)
    held.write(f"{n}\n")
    held.flush()
    print(f"token={token} n={n}", flush=True)
    time.sleep(0.5)
"""
BEAT = re.compile(r"^token=(\w+) n=(\d+)$", re.MULTILINE)


@contextlib.contextmanager
def checkpoint_space(node: RealNode) -> Iterator[tuple[Any, str, int]]:
    """A namespace with a bound workspace claim, its pods deleted after; the pods' uid (see the
    module's docstring)."""
    uid = RUNNER_UID if has_sys_resource() or (node.criu and node.criu == proc_limits_criu()) else 0
    say(f"checkpoint pods run as uid {uid} (CRIU {node.criu or 'none'})")
    core = client.CoreV1Api(node.api_client())
    with claim_namespace(core, "checkpoint", "restricted" if uid else "baseline") as namespace:
        try:
            yield core, namespace, uid
        finally:
            for found in core.list_namespaced_pod(namespace).items:
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(found.metadata.name, namespace, grace_period_seconds=0)
            wait_for(lambda: not core.list_namespaced_pod(namespace).items, 120, "the test's pods to go", interval=0.5)


def manifest(
    name: str, image: str, uid: int, link: str = "", criu_config: str = "", ballast_mib: int = 0
) -> dict[str, Any]:
    """A sandbox-like pod: the worker in the background of a shell (pid 1), the workspace claim,
    the default template's security context (manifests.py) but for the uid."""
    return {
        "metadata": {"name": name, "annotations": {"org.criu.config": criu_config} if criu_config else {}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": uid != 0,
                "runAsUser": uid,
                "runAsGroup": uid,
                "fsGroup": uid,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'python -c "$WORKER" & wait'],
                    "env": [
                        {"name": "WORKER", "value": WORKER},
                        {"name": "BALLAST_MIB", "value": str(ballast_mib)},
                        *([{"name": "LINK", "value": link}] if link else []),
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                }
            ],
            "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        },
    }


def run_pod(core: Any, namespace: str, pod: dict[str, Any]) -> Any:
    """Create the pod and wait until it runs: the pod. It fails as soon as the pod has failed or
    its container is stuck (a restore the runtime refused: ``CreateContainerError``,
    ``RunContainerError``), with the kubelet's message."""
    name = pod["metadata"]["name"]
    core.create_namespaced_pod(namespace, pod)

    def settled() -> Any:
        found = core.read_namespaced_pod(name, namespace)
        waiting = [s.state.waiting for s in found.status.container_statuses or [] if s.state and s.state.waiting]
        stuck = [w for w in waiting if w.reason not in ("ContainerCreating", "PodInitializing")]
        return found if found.status.phase != "Pending" or stuck else None

    found = wait_for(settled, 120, f"pod {namespace}/{name} to run", interval=0.1)
    states = [(s.name, s.state.to_dict()) for s in found.status.container_statuses or []]
    assert found.status.phase == "Running", f"pod {name}: {found.status.phase}, containers {states}"
    return found


def delete_pod(core: Any, namespace: str, name: str) -> None:
    with contextlib.suppress(client.ApiException):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool:
        return name not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items}

    wait_for(gone, 120, f"pod {namespace}/{name} to go", interval=0.5)


def beats(core: Any, namespace: str, name: str) -> list[tuple[str, int]]:
    log = core.read_namespaced_pod_log(name, namespace, container=CONTAINER)
    return [(m.group(1), int(m.group(2))) for m in BEAT.finditer(log)]


def first_beat(core: Any, namespace: str, name: str) -> tuple[str, int]:
    return wait_for(lambda: (beats(core, namespace, name) or [None])[0], 60, f"{name}'s first beat", interval=0.1)


def kubelet_checkpoint(node: RealNode, namespace: str, name: str) -> tuple[int, str]:
    """``POST /checkpoint/{namespace}/{pod}/{container}`` on the kubelet's port (the tier's kubelet
    lets anyone in: anonymous authentication, AlwaysAllow; a cluster's needs ``nodes/checkpoint``).
    Its serving certificate is its own self-signed one, trusted as such. The status and body."""
    context = ssl.create_default_context(cafile=str(node.workdir / "kubelet-pki" / "kubelet.crt"))
    context.check_hostname = False
    url = f"https://{NODE_IP}:{KUBELET_PORT}/checkpoint/{namespace}/{name}/{CONTAINER}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=300, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def checkpoint(node: RealNode, namespace: str, name: str) -> Path:
    status, body = kubelet_checkpoint(node, namespace, name)
    assert status == 200, body
    [archive] = json.loads(body)["items"]
    path = Path(archive)
    assert path.is_file() and path.parent == node.workdir / "kubelet" / "checkpoints", archive
    return path


@contextlib.contextmanager
def checkpoint_image(node: RealNode, archive: Path) -> Iterator[str]:
    """The archive as a checkpoint image in the node's containerd (removed after, with the
    archive): its reference."""
    ref = f"localhost/checkpoint-{uuid.uuid4().hex[:8]}:1"
    oci = write_checkpoint_image(archive, archive.with_suffix(".oci.tar"), ref, CONTAINER)
    try:
        node.ctr("image", "import", "--local", "--index-name", ref, str(oci))
        yield ref
    finally:
        oci.unlink(missing_ok=True)
        archive.unlink(missing_ok=True)
        node.ctr("image", "rm", ref, check=False)


def last_beat_in(archive: Path) -> int:
    """The highest counter the archive's copy of the container's log holds: the container runs on
    after the dump (the kubelet's checkpoint leaves it running) until the copy, so this is at or
    past the dumped process's own counter."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("container.log")
        assert member is not None
        return max(int(m.group(1)) for m in re.finditer(r"token=\w+ n=(\d+)", member.read().decode()))


# -- a sandbox's background process, through the controller (tests/node/test_checkpoint_suspend.py,
# bench/node_suspend.py) ---------------------------------------------------------------------------

KEEPER = (
    'setsid -f sh -c \'token=$(od -An -N8 -tx1 /dev/urandom | tr -d " \\n"); n=0; '
    'while :; do n=$((n+1)); echo "$token $n" > beat.partial && mv beat.partial beat; sleep 0.2; done\' '
    ">/dev/null 2>&1"
)
"""A command that leaves a shell in the background holding a random token in a variable only,
and writing ``token counter`` to ``beat`` in the workspace every 0.2 s."""
READ = ["sh", "-c", "cat beat; sleep 1; cat beat"]
"""A command that reads the beat twice, a second apart."""


def turn_beats(turn: dict[str, Any]) -> list[tuple[str, int]]:
    """The (token, counter) lines the turn's one command (``READ``) printed."""
    [read] = turn["commands"]
    assert (read["status"], read["exit_code"]) == ("completed", 0), read
    return [(token, int(n)) for token, n in (line.split() for line in read["stdout"].split("\n") if line)]


def link_stretches(simulator_url: str, environment_id: str) -> list[list[float | None]]:
    """Every stretch the simulator saw the environment's link up: [since, until or None]."""
    import httpx

    environments = httpx.get(f"{simulator_url}/admin/environments", timeout=10).json()["data"]
    [found] = [e for e in environments if e["id"] == environment_id]
    stretches: list[list[float | None]] = found["links"]
    return stretches
