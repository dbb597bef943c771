"""The real-node world: images built without a registry, a real node in a network namespace
(NetworkPolicy enforced by kube-router), the chart installed on it with Helm's own engine, and
the Agents API simulator inside the namespace, serving its API to the controller on the node's
address and, as production does, to the sandboxes over TLS on 443 at a public-range address
under the name ``api.openai.com`` (the node's DNS answers it; the sandbox pods trust the test's
CA through the chart's ``sandbox.caBundle``). See tests/node/node.py for the node itself."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.node.node import (
    NODE_IP,
    PRIVATE_ADDRESSES,
    PUBLIC_API_IP,
    ROOT,
    Daemon,
    Image,
    RealNode,
    load_images,
    real_node,
    say,
)
from tests.support.criu import criu_binary, proc_limits_criu
from tests.support.processes import wait_for
from tests.support.tls import TestCA

RELEASE = "demo"
NAMESPACE = "scc"
SANDBOX_NAMESPACE = f"{NAMESPACE}-sandboxes"
SIM_PORT = 8090
# What sessions name as remote_url, served by the simulator's TLS listener at PUBLIC_API_IP:443.
API_HOST = "api.openai.com"
PUBLIC_URL = f"https://{API_HOST}"
NODE_DNS_NAMES = {API_HOST: PUBLIC_API_IP}
SIMULATOR_ENV = "SANDBOX_CONTROLLER_SIMULATOR_"
PERSISTENT_TEMPLATE = "persistent-workspace"
WARM_TEMPLATE = "warm"
# A template whose sandboxes send their HTTPS through a CONNECT proxy at a private address the
# sandbox NetworkPolicy opens for that port only (tests/node/test_network_policy.py runs it).
PROXIED_TEMPLATE = "proxied"
PROXY_IP = PRIVATE_ADDRESSES["172.16.0.0/12"]
PROXY_PORT = 3128
# A template whose sandboxes get the chart's Localhost seccomp profile, which lets Codex build its
# own sandbox within "restricted" (tests/node/test_codex_sandbox.py); the chart's node installer
# (sandbox.seccompInstaller) puts the profile where the node's kubelet reads Localhost profiles.
CODEX_SANDBOX_TEMPLATE = "codex-sandbox"
CODEX_SECCOMP_PROFILE = "sandbox-controller/codex-sandbox.json"
# A template of the operator's own naming a Localhost profile no node has (no installer puts it
# there, and no node selector steers it): its pods cannot start (tests/node/test_missing_profile.py).
MISSING_PROFILE_TEMPLATE = "missing-profile"
MISSING_SECCOMP_PROFILE = "sandbox-controller/not-installed.json"
# A template whose sandboxes run in their own user namespace (hostUsers: false), with a workspace
# volume (tests/node/test_user_namespaces.py).
USER_NAMESPACE_TEMPLATE = "own-user-namespace"
CHECKPOINT_TEMPLATE = "checkpointed"
WARM_POOL_SIZE = 2
# Short, so that the tier sees an idle stop (L11/L16) within a test; long enough that no other
# test's sandbox is stopped under it (each checks its pod within seconds of the executor connecting).
IDLE_TIMEOUT_SECONDS = 30
SANDBOX_RESOURCES = {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "2Gi"}}


def _require_node_tier() -> None:
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    if not os.path.isdir("/sys/fs/cgroup/memory"):
        missing.append("cgroup v1 memory hierarchy")
    if missing:
        message = f"the real-node tier needs {', '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def images() -> list[Image]:
    _require_node_tier()
    return load_images()


@pytest.fixture(scope="session")
def node(images: list[Image]) -> Iterator[RealNode]:
    with real_node(images, dns_names=NODE_DNS_NAMES, criu=_criu()) as started:
        yield started


@pytest.fixture(scope="module")
def checkpoint_namespace(node: RealNode) -> Iterator[tuple[Any, str, int]]:
    """A namespace with a bound workspace claim for tests/node/checkpoints.py's pods, and their
    uid (``checkpoint_space``); skips (fails under CI=true) when this host cannot checkpoint."""
    from tests.node.checkpoints import checkpoint_space

    criu_binary()
    if not node.criu:
        pytest.fail("the node runs without CRIU although scripts/criu.sh built one")
    with checkpoint_space(node) as found:
        yield found


def _criu() -> str:
    """The CRIU for the node's checkpoints (tests/node/test_checkpoint.py skips without one): the
    proc-limits variant ``scripts/criu.sh --variant proc-limits`` built, which dumps non-root pods
    on this machine (whose root lacks CAP_SYS_RESOURCE), else the plain one ``scripts/criu.sh``
    built, else "" when there is none."""
    patched = proc_limits_criu()
    if patched:
        return patched
    printed = subprocess.run([str(ROOT / "scripts" / "criu.sh"), "--print"], capture_output=True, text=True)
    binary = printed.stdout.strip()
    return binary if binary and os.access(binary, os.X_OK) else ""


@dataclass
class Installed:
    node: RealNode
    api: Any
    core: Any
    simulator: Daemon
    api_key: str
    environment_key: str
    webhook_secret: str
    receiver_url: str
    install_seconds: float
    ca: TestCA
    helm: Any
    """The ``helm_python.Config`` the release was installed with (``helm test``)."""
    images: dict[str, Image] = field(default_factory=dict)

    @property
    def simulator_url(self) -> str:
        return f"http://{NODE_IP}:{SIM_PORT}"


def _values(
    world_images: dict[str, Image], api_key: str, environment_key: str, webhook_secret: str, ca: TestCA
) -> dict[str, Any]:
    def repo_tag(name: str) -> dict[str, str]:
        repository, _, tag = world_images[name].ref.rpartition(":")
        return {"repository": repository, "tag": tag}

    return {
        # The three credentials.
        "webhook": {"signingSecrets": [webhook_secret]},
        "apiKey": {"value": api_key},
        "sandbox": {
            "executorKey": {"value": environment_key},
            "image": repo_tag("sandbox-runner"),
            # Sessions that ask for it (metadata sandbox_template) get a workspace volume (a PVC,
            # bound to one of the node's hostPath PersistentVolumes).
            "templates": {
                # The node has 2 CPUs: the default request (250m) fits six sandboxes beside the
                # controller; the tier runs ten at once.
                "default": {"resources": SANDBOX_RESOURCES},
                PERSISTENT_TEMPLATE: {
                    "resources": SANDBOX_RESOURCES,
                    "workspacePersistence": {"enabled": True, "size": "1Gi"},
                },
                # Sessions that ask for it are served from a warm pool (pods started and waiting).
                WARM_TEMPLATE: {"resources": SANDBOX_RESOURCES, "warmPool": {"size": WARM_POOL_SIZE}},
                PROXIED_TEMPLATE: {"resources": SANDBOX_RESOURCES, "httpsProxy": f"http://{PROXY_IP}:{PROXY_PORT}"},
                CODEX_SANDBOX_TEMPLATE: {"resources": SANDBOX_RESOURCES, "seccompProfile": CODEX_SECCOMP_PROFILE},
                MISSING_PROFILE_TEMPLATE: {"resources": SANDBOX_RESOURCES, "seccompProfile": MISSING_SECCOMP_PROFILE},
                USER_NAMESPACE_TEMPLATE: {
                    "resources": SANDBOX_RESOURCES,
                    "hostUsers": False,
                    "workspacePersistence": {"enabled": True, "size": "1Gi"},
                },
            },
            # The proxy's address and port, and nothing else of its range.
            "networkPolicy": {"egress": {"allow": [{"cidr": f"{PROXY_IP}/32", "ports": [{"port": PROXY_PORT}]}]}},
            # The test's CA, which issued the simulator's certificate for api.openai.com.
            "caBundle": {"pem": ca.pem},
            # The runner image kept on the node by the pre-puller's DaemonSet (its pause container
            # runs the node's own pause image).
            "prePuller": {"enabled": True, "pause": repo_tag("pause")},
        },
        # The locally built images (imported into containerd; nothing is pulled).
        "image": repo_tag("sandbox-controller"),
        "redis": {"image": repo_tag("redis")},
        # Idle sessions' sandboxes stop quickly here (see IDLE_TIMEOUT_SECONDS).
        "lifecycle": {"idleTimeoutSeconds": IDLE_TIMEOUT_SECONDS},
        # The Agents API stand-in as the controller reads it: on the node's address. Sessions name
        # https://api.openai.com as remote_url (the default allowlist), served over TLS.
        "api": {"baseUrl": f"http://{NODE_IP}:{SIM_PORT}"},
        # `helm test` of Codex's own sandbox, with the profile the node has (tests/node/test_codex_sandbox.py).
        "tests": {"codexSandbox": {"enabled": True, "seccompProfile": CODEX_SECCOMP_PROFILE}},
    }


@pytest.fixture(scope="session")
def installed(node: RealNode, images: list[Image]) -> Iterator[Installed]:
    with install(node, images) as world:
        yield world


@contextlib.contextmanager
def install(node: RealNode, images: list[Image], overrides: dict[str, Any] | None = None) -> Iterator[Installed]:
    """The chart installed on ``node`` and the simulator started beside it (bench/ uses it too);
    ``overrides`` are merged into the tier's values (a key set to None removes the tier's)."""
    import helm_python as helm  # loaded only now: its threads start inside the namespace
    from kubernetes import client

    from tests.chart.test_chart import CHART

    by_name = {image.name: image for image in images}
    api_key = f"sk-node-{secrets.token_hex(16)}"
    environment_key = f"envkey-node-{secrets.token_hex(16)}"
    webhook_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    api = node.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    ca = TestCA("sandbox-controller real-node test CA")
    certificate = ca.issue(node.workdir / "simulator-tls", [API_HOST])
    values = _values(by_name, api_key, environment_key, webhook_secret, ca)
    # Codex's profile is put on the node by the chart's own installer, into this kubelet's root.
    values["sandbox"]["seccompInstaller"] = {"enabled": True, "kubeletRootDir": str(node.workdir / "kubelet")}
    if node.criu:
        values = _merged(values, _checkpoint_values(node))
    values = _merged(values, overrides or {})
    say("helm install (Helm's own engine), waiting for the release's pods")
    start = time.monotonic()
    with helm.Chart.load(str(CHART)) as chart, helm.Config(kubeconfig_path=node.kubeconfig, namespace=NAMESPACE) as cfg:
        release = cfg.install(chart, RELEASE, values, namespace=NAMESPACE, wait="watcher", timeout=600)
        assert release["status"] == "deployed", release
        install_seconds = time.monotonic() - start
        say(f"chart deployed in {install_seconds:.0f}s")
        service = core.read_namespaced_service(f"{RELEASE}-sandbox-controller-receiver", NAMESPACE)
        receiver_url = f"http://{service.spec.cluster_ip}:{service.spec.ports[0].port}/webhooks"
        simulator = node.spawn(
            "simulator",
            [
                sys.executable, "-m", "agents_simulator", "--host", NODE_IP, "--port", str(SIM_PORT),
                "--public-url", PUBLIC_URL, "--tls-listen", f"{PUBLIC_API_IP}:443",
                "--tls-cert", str(certificate.certfile), "--tls-key", str(certificate.keyfile),
                "--webhook-url", receiver_url, "--turn-seconds", "1",
                "--webhook-retry-initial-seconds", "1", "--webhook-retry-max-seconds", "5",
            ],
            env={
                SIMULATOR_ENV + "WEBHOOK_SECRET": webhook_secret,
                SIMULATOR_ENV + "ENVIRONMENT_KEY": environment_key,
                SIMULATOR_ENV + "API_KEY": api_key,
                "PYTHONPATH": str(CHART.parents[1]),
            },
        )  # fmt: skip

        def healthy() -> bool:
            simulator.check()
            import httpx

            plain = httpx.get(f"http://{NODE_IP}:{SIM_PORT}/healthz", timeout=2).status_code == 200
            return plain and _tls_answers(ca)

        wait_for(healthy, 30, "the simulator to answer inside the namespace (and over TLS)", interval=0.5)
        world = Installed(
            node, api, core, simulator, api_key, environment_key, webhook_secret, receiver_url, install_seconds,
            ca, cfg, by_name,
        )  # fmt: skip
        try:
            yield world
        finally:
            simulator.stop()
            cfg.uninstall(RELEASE, wait="watcher", timeout=300, ignore_not_found=True)
            api.close()


CRIU_RUNC_CONF = "tcp-close\nirmap-scan-path /home/codex\n"
"""What a node's ``/etc/criu/runc.conf`` needs for sandbox pods (docs/kubernetes.md): the
executor's link closed at the dump and found closed at the restore; and where to look for the
directory codex watches in the image (its ``CODEX_HOME``, ``/home/codex/.codex``), whose inotify
watch CRIU otherwise cannot dump (an overlayfs file handle does not open again: ``fsnotify:
Can't dump that handle``)."""


def _checkpoint_values(node: RealNode) -> dict[str, Any]:
    """Suspend with memory (issue 40): a template with ``suspend: checkpoint``, and the chart's
    node agent given this node's paths (its containerd's socket and ``ctr``, its kubelet's root
    and serving certificate). The template's pods carry ``org.criu.config``, a CRIU configuration
    (``CRIU_RUNC_CONF``): a real node has it as ``/etc/criu/runc.conf``, which the tier must not
    write on this machine; its containerd passes that annotation on to runc for test nodes only
    (``RealNode.criu``)."""
    criu_config = node.workdir / "criu-runc.conf"
    criu_config.write_text(CRIU_RUNC_CONF)
    template = {
        "resources": SANDBOX_RESOURCES,
        "workspacePersistence": {"enabled": True, "size": "1Gi"},
        "suspend": "checkpoint",
        "annotations": {"org.criu.config": str(criu_config)},
    }
    agent = {
        "enabled": True,
        "containerdSocket": str(node.containerd_socket),
        "ctr": str(node.bin_dir / "ctr"),
        "kubeletRootDir": str(node.workdir / "kubelet"),
        "kubeletCAFile": str(node.workdir / "kubelet-pki" / "kubelet.crt"),
    }
    return {"sandbox": {"templates": {CHECKPOINT_TEMPLATE: template}, "checkpoints": agent}}


def seccomp_profile_path(node: RealNode) -> Path:
    """Where the node's kubelet reads the chart's Codex seccomp profile (a Localhost profile)."""
    return node.workdir / "kubelet" / "seccomp" / CODEX_SECCOMP_PROFILE


def _merged(values: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _tls_answers(ca: TestCA) -> bool:
    """A TLS handshake with the simulator at PUBLIC_API_IP:443 for the name api.openai.com,
    verified against the test's CA."""
    import socket
    import ssl

    context = ssl.create_default_context(cadata=ca.pem)
    try:
        with (
            socket.create_connection((PUBLIC_API_IP, 443), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname=API_HOST),
        ):
            return True
    except OSError:
        return False
