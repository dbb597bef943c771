"""The sandbox NetworkPolicy, enforced on the real node (kube-router v2, firewall only), probed
from inside pods: what a sandbox reaches and what it does not, and ``helm test`` saying so.

Each probe is tried from a sandbox pod the controller made for a session (the commands run by
the real codex over its executor link, as an agent's commands run) and, as the control, from a
pod the sandbox policy does not select (the same runner image, in the release namespace): an
address the control reaches and the sandbox does not is refused by the sandbox's policy, not
missing. The addresses in the private ranges listen inside the node's network namespace
(tests/node/node.py: nothing there routes out); ``api.openai.com`` is the simulator's TLS
listener at a public-range address.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from controller.runners.kubernetes import names
from controller.runners.kubernetes.manifests import RUNNER_UID
from tests.node.conftest import (
    API_HOST,
    NAMESPACE,
    PROXIED_TEMPLATE,
    PROXY_IP,
    PROXY_PORT,
    RELEASE,
    SANDBOX_NAMESPACE,
    Installed,
)
from tests.node.node import (
    API_PORT,
    DNS_SERVICE_IP,
    KUBELET_PORT,
    NODE_IP,
    PRIVATE_ADDRESSES,
    PUBLIC_API_IP,
)
from tests.node.probes import ConnectProxy, Listeners, Target, pod, pod_exec, results, script, table
from tests.node.test_real_node import _one_session, _pods, _registered, _running
from tests.support.processes import wait_for
from tests.support.simulator import run_turn

pytestmark = [pytest.mark.timeout(900)]

# What a sandbox may reach: the cluster's DNS pods (port 53) and public addresses on 443.
ALLOWED = {"dns via the kube-dns Service", "dns to a DNS pod", "api.openai.com 443"}
HELM_TEST = f"{RELEASE}-sandbox-controller-test-network-policy"
LISTENER_PORT = 8080
# A listener in the sandbox pod (perl-base is in the runner image's Debian base): accepts and
# closes connections for two minutes, then exits.
LISTENER = (
    "use IO::Socket::INET; alarm 120; "
    f"my $s = IO::Socket::INET->new(LocalPort => {LISTENER_PORT}, Listen => 8, ReuseAddr => 1) or die $!; "
    "while (my $c = $s->accept) { close $c }"
)


def _restricted() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": RUNNER_UID,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


@pytest.fixture(scope="module")
def listeners(installed: Installed) -> Iterator[None]:
    """Something answers on each private-range address (443, and 80 at the metadata address)
    and on the public address's port 80 (the simulator holds its 443)."""
    endpoints = [(address, 443) for address in PRIVATE_ADDRESSES.values()]
    endpoints += [("169.254.169.254", 80), (PUBLIC_API_IP, 80)]
    with Listeners(endpoints):
        yield


@pytest.fixture(scope="module")
def control(installed: Installed) -> Iterator[str]:
    """A pod no sandbox policy selects: the runner image in the release namespace, idle."""
    manifest = {
        "metadata": {"generateName": "probe-control-", "labels": {"app.kubernetes.io/name": "probe-control"}},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": installed.images["sandbox-runner"].ref,
                    "command": ["sleep", "3600"],
                    "securityContext": _restricted(),
                }
            ],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        },
    }
    with pod(installed.core, NAMESPACE, manifest) as started:
        yield started.metadata.name


def _component_pod(world: Installed, component: str) -> Any:
    selector = f"app.kubernetes.io/component={component}"
    [first, *_] = world.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return first


def _targets(world: Installed) -> list[Target]:
    core = world.core
    redis_service = core.read_namespaced_service(f"{RELEASE}-sandbox-controller-redis", NAMESPACE)
    receiver_service = core.read_namespaced_service(f"{RELEASE}-sandbox-controller-receiver", NAMESPACE)
    kubernetes = core.read_namespaced_service("kubernetes", "default")
    [dns_pod] = core.list_namespaced_pod("kube-system", label_selector="k8s-app=kube-dns").items
    targets = [
        Target("redis Service", redis_service.spec.cluster_ip, 6379),
        Target("redis pod", _component_pod(world, "redis").status.pod_ip, 6379),
        Target("kubernetes Service", kubernetes.spec.cluster_ip, 443),
        Target("API server", NODE_IP, API_PORT),
        Target("kubelet", NODE_IP, KUBELET_PORT),
        Target("receiver Service", receiver_service.spec.cluster_ip, receiver_service.spec.ports[0].port),
    ]
    for component in ("receiver", "worker", "scheduler"):
        controller_pod = _component_pod(world, component)
        for port in controller_pod.spec.containers[0].ports or []:
            targets.append(Target(f"{component} pod {port.name}", controller_pod.status.pod_ip, port.container_port))
    for cidr, address in PRIVATE_ADDRESSES.items():
        targets.append(Target(f"{cidr} ({address}) 443", address, 443))
    targets += [
        Target("169.254.169.254 80", "169.254.169.254", 80),
        Target("api.openai.com 443", PUBLIC_API_IP, 443),
        Target("public address 80", PUBLIC_API_IP, 80),
        Target("dns via the kube-dns Service", DNS_SERVICE_IP, 53, "dns"),
        Target("dns to a DNS pod", dns_pod.status.pod_ip, 53, "dns"),
        Target("dns to the node (not a DNS pod)", NODE_IP, 53, "dns"),
    ]
    return targets


class _LastLog:
    """A pod's log, read every 0.2 s in a thread while the block runs (the last text read is
    kept: a pod that helm deletes on success can be gone when the block ends)."""

    def __init__(self, core: Any, name: str, namespace: str) -> None:
        self.core, self.name, self.namespace = core, name, namespace
        self.text = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while not self._stop.wait(0.2):
            with contextlib.suppress(Exception):
                self.text = self.core.read_namespaced_pod_log(self.name, self.namespace) or self.text

    def final(self) -> str:
        """The whole log, from the pod when it is still there (a failed test pod is kept)."""
        with contextlib.suppress(Exception):
            return str(self.core.read_namespaced_pod_log(self.name, self.namespace))
        return self.text

    def __enter__(self) -> _LastLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _fail(world: Installed, session_id: str) -> None:
    httpx.post(f"{world.simulator_url}/admin/sessions/{session_id}/fail", json={"error": "node test"}, timeout=10)
    wait_for(lambda: not _pods(world, session_id), 180, "the session's pod to be deleted", interval=0.5)


def test_a_sandbox_pod_reaches_only_the_dns_pods_and_public_443(
    installed: Installed, listeners: None, control: str
) -> None:
    """The sandbox NetworkPolicy, enforced: from a sandbox pod (commands run by its codex), TCP
    to Redis (Service and pod), the API server (``kubernetes`` Service and its address), the
    kubelet, the controller's pods (receiver Service, every port of a receiver, worker and
    scheduler pod) and an address in each of 10/8, 172.16/12, 192.168/16, 100.64/10 and
    169.254.169.254 is refused; DNS answers only through the DNS pods (not from a DNS server at
    another address); 443 to the public address works (codex's own registration over TLS is
    the first proof), its port 80 does not, and api.openai.com resolves there. From the
    control pod every one of them answers, except Redis (its own policy admits only the
    controller's pods)."""
    timeline = _one_session(installed)
    session_id = timeline["session_id"]
    sandbox_pod = installed.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    ip = sandbox_pod.status.pod_ip
    wait_for(lambda: installed.node.network_policy_covers(ip), 60, "kube-router to cover the sandbox pod", 0.5)
    targets = _targets(installed)
    probe = script(targets, resolve=[API_HOST])
    turn = run_turn(
        installed.simulator_url, session_id, [{"argv": ["bash", "-c", probe], "timeout_seconds": 60}], timeout=300
    )
    [command] = turn["commands"]
    assert (command["status"], command["exit_code"]) == ("completed", 0), command
    sandbox = results(command["stdout"])
    controlled = results(pod_exec(installed.core, control, NAMESPACE, ["bash", "-c", probe]))
    print("node: NetworkPolicy probes\n" + table(("sandbox pod", sandbox), ("control pod", controlled)))
    _fail(installed, session_id)

    labels = {t.label for t in targets}
    assert set(sandbox) == set(controlled) == labels | {f"resolve {API_HOST}"}
    assert sandbox[f"resolve {API_HOST}"] == controlled[f"resolve {API_HOST}"] == PUBLIC_API_IP
    # Everything answers the control pod but Redis, whose own policy admits only the controller.
    redis = {"redis Service", "redis pod"}
    assert {label for label in labels if controlled[label] == "open"} == labels - redis, controlled
    # The sandbox pod reaches exactly the DNS pods and the public address on 443.
    assert {label for label in labels if sandbox[label] == "open"} == ALLOWED, sandbox


def test_no_pod_connects_into_a_sandbox_pod(installed: Installed, control: str) -> None:
    """L8 (nothing dials into the pod), enforced: a listener in a sandbox pod (the controller's,
    for a session) answers inside the pod, and a connection to it from another pod (the control
    pod) is refused."""
    timeline = _one_session(installed)
    session_id = timeline["session_id"]
    # A long command keeps the session busy (no idle stop) while the test probes.
    httpx.post(
        f"{installed.simulator_url}/admin/sessions/{session_id}/turns",
        json={"commands": [{"argv": ["sleep", "90"], "timeout_seconds": 120}]},
        timeout=10,
    ).raise_for_status()
    sandbox_pod = installed.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
    ip = sandbox_pod.status.pod_ip
    wait_for(lambda: installed.node.network_policy_covers(ip), 60, "kube-router to cover the sandbox pod", 0.5)
    start = f"setsid perl -e '{LISTENER}' >/dev/null 2>&1 < /dev/null & sleep 1; echo started"
    assert "started" in pod_exec(installed.core, sandbox_pod.metadata.name, SANDBOX_NAMESPACE, ["bash", "-c", start])
    inside = script([Target("loopback", "127.0.0.1", LISTENER_PORT), Target("own address", ip, LISTENER_PORT)])
    from_inside = results(
        pod_exec(installed.core, sandbox_pod.metadata.name, SANDBOX_NAMESPACE, ["bash", "-c", inside])
    )
    from_control = results(
        pod_exec(installed.core, control, NAMESPACE, ["bash", "-c", script([Target("sandbox pod", ip, LISTENER_PORT)])])
    )
    print(f"node: into a sandbox pod: from inside {from_inside}, from the control pod {from_control}")
    still = _running(installed, session_id)
    assert still is not None and still.metadata.uid == sandbox_pod.metadata.uid  # the same pod all along
    _fail(installed, session_id)
    assert from_inside == {"loopback": "open", "own address": "open"}
    assert from_control == {"sandbox pod": "closed"}


def test_a_template_with_an_https_proxy_sends_codex_through_it(installed: Installed) -> None:
    """A template's httpsProxy: the sandbox's codex registers and holds its WebSocket through a
    CONNECT proxy at a private address (which the sandbox policy opens for that port only), to
    api.openai.com:443, TLS end to end with the test's CA."""
    with ConnectProxy(PROXY_IP, PROXY_PORT, {API_HOST: PUBLIC_API_IP}) as proxy:
        timeline = _one_session(installed, template=PROXIED_TEMPLATE)
        sandbox_pod = installed.core.read_namespaced_pod(timeline["pod"], SANDBOX_NAMESPACE)
        env = {e.name: e.value for e in sandbox_pod.spec.containers[0].env}
        assert env["HTTPS_PROXY"] == env["https_proxy"] == f"http://{PROXY_IP}:{PROXY_PORT}"
        [registration] = _registered(installed, timeline["environment_id"])
        assert registration["scheme"] == "https" and registration["key_matched"] is True
        tunnels = list(proxy.tunnels)
        print(f"node: through the proxy: {tunnels}")
        _fail(installed, timeline["session_id"])
    # The registration and the WebSocket, each a tunnel from the sandbox pod to api.openai.com.
    assert tunnels.count((sandbox_pod.status.pod_ip, f"{API_HOST}:443")) >= 2, tunnels
    assert {target for _, target in tunnels} == {f"{API_HOST}:443"}


def test_helm_test_passes_where_the_policy_is_enforced_and_fails_clearly_on_a_plain_bridge(
    installed: Installed,
) -> None:
    """The chart's `helm test` proves enforcement on the user's cluster: with kube-router
    enforcing, its network-policy pod (the sandbox pods' labels and image, in the sandbox
    namespace) reaches none of Redis, the API server and the receiver, and the test passes.
    With kube-router stopped and its rules removed (a plain bridge, as a CNI that ignores
    NetworkPolicy), the same test fails, its pod saying that the cluster's network plugin does
    not enforce NetworkPolicy and what it reached. Enforcement is back afterwards."""
    import helm_python

    # Passes: its pod exited 0, which it does only when none of the three answered. (Helm reads
    # test pods' logs in the release namespace only, so `logs=True` cannot fetch this one's; and
    # it deletes a passing one at once: its log is read while it runs, for the record.)
    with _LastLog(installed.core, HELM_TEST, SANDBOX_NAMESPACE) as enforced:
        installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])
    print(f"node: helm test on the enforced node passed; its pod said:\n{enforced.text}")
    node = installed.node
    node.stop_network_policy()
    try:
        with (
            _LastLog(installed.core, HELM_TEST, SANDBOX_NAMESPACE) as bridge,
            pytest.raises(helm_python.HelmReleaseError) as failed,
        ):
            installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])
        log = bridge.final()
        print(f"node: helm test on the plain bridge failed ({failed.value}); its pod said:\n{log}")
        assert "The cluster's network plugin does not enforce NetworkPolicy" in log
        for reached in ("the bundled Redis", "the Kubernetes API server", "the receiver (a controller pod)"):
            assert f"FAIL: {reached}" in log, log
    finally:
        node.start_network_policy()
    live = installed.core.list_namespaced_pod(SANDBOX_NAMESPACE, label_selector=names.managed_selector()).items
    for sandbox_pod in live:
        if sandbox_pod.status.pod_ip and sandbox_pod.status.phase == "Running":
            ip = sandbox_pod.status.pod_ip
            wait_for(lambda ip=ip: node.network_policy_covers(ip), 60, f"kube-router to cover {ip} again", 0.5)
    installed.helm.test(RELEASE, timeout=300, include_names=[HELM_TEST])  # passes again
