"""A real Kubernetes node for tests, inside a network namespace the test creates.

What runs (all started through ``nsenter --net=/var/run/netns/<name>``, each in its own process
group, logs in the node's work directory):

* containerd 2.3 with runc 1.4, both built from Go modules (``tests/envtest/build.sh --node``,
  run from the bin dir: the ``containerd`` and ``runc`` on PATH are not used), overlayfs, the
  CNI ``bridge`` + ``host-local`` plugins (and ``loopback``, which containerd sets up itself)
  from Debian's ``/usr/lib/cni``; pod sandboxes use ``localhost/pause:1``; images are imported
  with ``ctr -n k8s.io image import`` (no registry); given a CRIU (:attr:`RealNode.criu`), the
  kubelet's checkpoints and restores from checkpoint images;
* etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy (iptables mode) and
  the real kubelet v1.37, built from Go modules (``tests/envtest/build.sh --node``);
* kube-router v2 in firewall-only mode (iptables + ipset), built from Go modules too, which
  enforces NetworkPolicy (the bridge plugin does not); :meth:`RealNode.stop_network_policy`
  takes it away (a plain bridge again) and :meth:`RealNode.start_network_policy` brings it back;
* a small cluster DNS (:mod:`tests.node.dns`) for ``<service>.<namespace>.svc.cluster.local`` and
  the fixed names the test gives (``dns_names``), reached by pods through DNS pods in
  kube-system (``k8s-app: kube-dns``, the ``kube-dns`` Service at ``DNS_SERVICE_IP``), as on a
  real cluster;
* hostPath PersistentVolumes (no storage class) so PersistentVolumeClaims bind.

Network: the namespace has a loopback and a port-less bridge holding the node's address
(``NODE_IP``) and the test's extra addresses: ``PUBLIC_API_IP`` (in TEST-NET-1, a public-range
address never routed on the Internet: the test serves ``api.openai.com`` there) and one address
in each range the sandbox NetworkPolicy excepts (``PRIVATE_ADDRESSES``). Pods live on a bridge
in ``POD_CIDR`` with routes to the node, the Service range and those addresses only: no default
route, no NAT. Nothing leaves the machine. The test process itself enters the namespace
(``setns`` on its own network namespace only), so its clients reach the API server and the pods
directly; :meth:`RealNode.stop` returns it to where it was.

The kubelet changes global sysctls (``vm.overcommit_memory``, ``kernel.panic``,
``kernel.panic_on_oops``): they are saved first (also to ``SAVED_SYSCTLS``, so that the run after
one that was killed before its teardown restores the machine's own values, not the kubelet's)
and restored on teardown. Teardown order: pods,
kubelet, kube-proxy, scheduler, controller-manager, containerd (and any shim left), the API
server, etcd; then the mounts under the work directory, the cgroup directories, the network
namespace and (when this node mounted it) ``/run/netns``. :meth:`RealNode.leftovers` lists any
process still running that belongs to the node; the fixture asserts it is empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import wait_for

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tests" / "envtest" / "build.sh"
IMAGES_SCRIPT = ROOT / "tests" / "node" / "images.sh"

NODE_IP = "10.87.0.1"
NODE_CIDR = "10.87.0.0/24"
POD_CIDR = "10.88.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
DNS_SERVICE_IP = "10.96.0.10"
API_PORT = 6443
KUBELET_PORT = 10250
KUBE_ROUTER_HEALTH_PORT = 20244
# What kube-router's firewall adds to the filter table, and its ipsets.
KUBE_ROUTER_CHAINS = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
KUBE_ROUTER_IPSETS = ("KUBE-SRC-", "KUBE-DST-")
# Inside the namespace only (on its bridge; pods get a route to each, nothing beyond).
PUBLIC_API_IP = "192.0.2.10"
PUBLIC_CIDR = "192.0.2.0/24"
# One address in each range the sandbox NetworkPolicy excepts from its public egress.
PRIVATE_ADDRESSES = {
    "10.0.0.0/8": "10.200.0.10",
    "172.16.0.0/12": "172.16.0.10",
    "192.168.0.0/16": "192.168.0.10",
    "100.64.0.0/10": "100.64.0.10",
    "169.254.0.0/16": "169.254.169.254",
}
CNI_BIN_DIR = "/usr/lib/cni"
# The tier's kubelet periods (the kubelet's defaults: 1m, 1m and 10s); RealNode.kubelet_defaults
# leaves them out.
KUBELET_PERIODS = {"syncFrequency": "10s", "fileCheckFrequency": "10s", "nodeStatusUpdateFrequency": "5s"}
GLOBAL_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
SAVED_SYSCTLS = Path("/run/sandbox-controller-node/sysctls.json")
"""The machine's own values of ``GLOBAL_SYSCTLS`` while a node runs (``/run``: gone at a reboot,
as the kubelet's values are); removed once they are restored."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
ADMIN_USER = "node-admin"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class NodeError(RuntimeError):
    pass


def say(message: str) -> None:
    """Progress on the terminal (pytest -s) and in CI logs: the node takes a while to start."""
    print(f"node: {message}", flush=True)


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 120, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    stdin = None if input_text is not None else subprocess.DEVNULL
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=stdin, input=input_text)
    if check and result.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise NodeError(f"{self.name} exited with {self.proc.returncode}:\n{_tail(self.log)}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Anything left in its process group (it was the group leader).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class Image:
    name: str
    ref: str
    archive: str
    size_bytes: int
    build_seconds: int


@dataclass
class RealNode:
    """Start with :meth:`start`, always :meth:`stop` (idempotent)."""

    images: list[Image] = field(default_factory=list)
    persistent_volumes: int = 40
    dns_image: str = ""
    """Image with ``python`` for the DNS pods (the controller image)."""
    dns_names: dict[str, str] = field(default_factory=dict)
    """Fixed names the cluster DNS answers (e.g. ``api.openai.com`` → ``PUBLIC_API_IP``)."""
    enforce_network_policy: bool = True
    kubelet_defaults: bool = False
    """Run the kubelet with its own periods (``syncFrequency`` and ``fileCheckFrequency`` 1 minute,
    ``nodeStatusUpdateFrequency`` 10 s), as users' nodes do; else the tier's shorter ones
    (``KUBELET_PERIODS``). bench/warm_pool.py measures warm claims both ways."""
    criu: str = ""
    """A CRIU binary (``scripts/criu.sh``) for container checkpoints (tests/node/test_checkpoint.py):
    its directory comes first on containerd's PATH (the CRI plugin, the shims and runc look
    ``criu`` up there); the CRI plugin creates a container from a checkpoint image
    (``enable_experimental_restore_via_create``, off by default); and runc is handed a pod's
    ``org.criu.config`` annotation (the runtime's ``pod_annotations``), a CRIU configuration file
    on the node for that pod's checkpoints (``tcp-close``), which stands in for the node-wide
    ``/etc/criu/runc.conf`` a real node would have, since the test must not write this machine's
    /etc. (A cluster must not pass that annotation: its file may name scripts CRIU runs as root.)
    Empty: none of it (the distribution's CRIU, if any, and no restore)."""
    name: str = field(default_factory=lambda: f"scc-node-{uuid.uuid4().hex[:6]}")
    workdir: Path = field(init=False)
    bin_dir: Path = field(init=False)
    admin_token: str = field(init=False, default="")
    ca_file: str = field(init=False, default="")
    kubeconfig: str = field(init=False, default="")
    timings: dict[str, float] = field(default_factory=dict)
    _daemons: list[Daemon] = field(default_factory=list)
    _sysctls: dict[str, str] = field(default_factory=dict)
    _host_netns_fd: int | None = None
    _mounted_run_netns: bool = False
    _netns_before: set[str] = field(default_factory=set)
    _dns: Any = None
    _dns_api: Any = None
    _cgroups: list[Path] = field(default_factory=list)

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.name)

    @property
    def server_url(self) -> str:
        return f"https://{NODE_IP}:{API_PORT}"

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd.sock"

    # ------------------------------------------------------------------ start

    def start(self) -> RealNode:
        if os.geteuid() != 0:
            raise NodeError("the real-node tier needs root (namespaces, mounts, cgroups)")
        self.workdir = Path(tempfile.mkdtemp(prefix="scc-node-", dir="/tmp"))
        # Traversable (not listable) by any uid, as /run/containerd is: a pod with its own user
        # namespace (hostUsers: false) reaches its root filesystem under containerd's state dir
        # as a mapped, unprivileged uid of the node (else runc's remount: permission denied).
        for directory in (self.workdir, self.workdir / "containerd"):
            directory.mkdir(exist_ok=True)
            directory.chmod(0o711)
        started = time.monotonic()
        try:
            self._start(started)
        except BaseException:
            for daemon in self._daemons:
                say(f"--- {daemon.name} (last lines of {daemon.log.name})\n{_tail(daemon.log, 15)}")
            self.stop()
            left = self.leftovers()
            assert not left, f"processes of the node left running: {left}"
            raise
        return self

    def _start(self, started: float) -> None:
        self.bin_dir = Path(_run(["bash", str(BUILD_SCRIPT), "--print"]).stdout.strip())
        binaries = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"]
        binaries += ["containerd", "ctr", "containerd-shim-runc-v2", "runc"]
        if self.enforce_network_policy:
            binaries.append("kube-router")
        for binary in binaries:
            if not os.access(self.bin_dir / binary, os.X_OK):
                raise NodeError(f"{self.bin_dir / binary} missing: run tests/envtest/build.sh --node")
        self._sysctls.update(_machine_sysctls())
        self._make_netns()
        self._make_cgroups()
        self._start_containerd()
        self._import_images()
        self.timings["containerd_and_images"] = time.monotonic() - started
        self._start_control_plane()
        self._start_kubelet_and_proxy()
        if self.enforce_network_policy:
            self.start_network_policy()
        self._start_dns()
        self._create_persistent_volumes()
        self.timings["node_ready"] = time.monotonic() - started
        say(f"node {self.name} Ready after {self.timings['node_ready']:.0f}s")

    def _in_netns(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net={self.netns_path}", *argv]

    def _make_netns(self) -> None:
        self._mounted_run_netns = not (NETNS_DIR.exists() and os.path.ismount(NETNS_DIR))
        self._netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.exists() else set()
        _run(["ip", "netns", "add", self.name])
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "link", "add", "scc0", "type", "bridge"],
            ["ip", "addr", "add", f"{NODE_IP}/24", "dev", "scc0"],
            ["ip", "link", "set", "scc0", "up"],
            # The node's own connections to Service addresses (the simulator's webhooks) need a
            # route before kube-proxy's OUTPUT rules rewrite them to a pod.
            ["ip", "route", "add", SERVICE_CIDR, "dev", "scc0"],
            # The test's public-range and private-range addresses, local to the namespace.
            *(["ip", "addr", "add", f"{a}/32", "dev", "scc0"] for a in (PUBLIC_API_IP, *PRIVATE_ADDRESSES.values())),
            ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
        ):
            _run(self._in_netns(*argv))
        # Service traffic between pods on one bridge passes iptables only with this (per namespace).
        _run(self._in_netns("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"), check=False)
        self._host_netns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        _setns(self.netns_path)
        say(f"network namespace {self.name}: node {NODE_IP}, pods {POD_CIDR}, Services {SERVICE_CIDR}")

    def _make_cgroups(self) -> None:
        """The kubelet's cgroupRoot, pre-created in every v1 hierarchy (cgroupfs driver)."""
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            if hierarchy.name == "unified" or not hierarchy.is_dir() or hierarchy.is_symlink():
                continue
            path = hierarchy / self.name
            path.mkdir(exist_ok=True)
            self._cgroups.append(path)
            if hierarchy.name == "cpuset":
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((hierarchy / knob).read_text())

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Daemon:
        log = self.workdir / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self._in_netns(*argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**base, **(env or {})},
            )
        daemon = Daemon(name, proc, log)
        self._daemons.append(daemon)
        return daemon

    def _wait(self, daemon: Daemon, condition: Callable[[], object], what: str, timeout: float = 120) -> None:
        def ready() -> object:
            daemon.check()
            return condition()

        wait_for(ready, timeout, what, interval=0.5)

    def _start_containerd(self) -> None:
        w = self.workdir
        cni = w / "cni"
        cni.mkdir()
        conflist = {
            "cniVersion": "0.4.0",
            "name": "scc-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(w / "cni-ipam"),
                        "ranges": [[{"subnet": POD_CIDR}]],
                        # The node, the Service range and the test's addresses only: no default route.
                        "routes": [{"dst": d} for d in (NODE_CIDR, SERVICE_CIDR, PUBLIC_CIDR, *_routes_to_private())],
                    },
                }
            ],
        }
        (cni / "10-scc-node.conflist").write_text(json.dumps(conflist, indent=2))
        b = self.bin_dir
        # Restoring a container from a checkpoint image (CreateContainer given one) is off by
        # default since containerd 2.3.4 (and gone in 2.4).
        restore = "  enable_experimental_restore_via_create = true\n" if self.criu else ""
        # A pod's CRIU configuration file (see ``criu``): test nodes only.
        criu_annotation = '      pod_annotations = ["org.criu.config"]\n' if self.criu else ""
        # containerd 2.3's configuration version 4 (version 3, containerd 2.0's, is migrated at
        # every start, with a warning): the sockets are server plugins' settings, each named (an
        # unnamed ttrpc socket would go to /run/containerd); the CRI plugin is split into its
        # images and its runtime parts (the sandbox image is a pinned image), the CRI gRPC
        # plugin keeps only the streaming settings. NRI is off (its socket is under /var/run/nri).
        config = f"""
version = 4
root = "{w}/containerd/root"
state = "{w}/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri"]
[plugins.'io.containerd.server.v1.grpc']
  address = "{self.containerd_socket}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{w}/containerd-ttrpc.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/pause:1"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
{restore}  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{b / "containerd-shim-runc-v2"}"
{criu_annotation}      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{b / "runc"}"
        SystemdCgroup = false
        Root = "{w}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{cni}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"""
        (w / "containerd.toml").write_text(config)
        env = {"PATH": f"{Path(self.criu).parent}:{os.environ.get('PATH', '')}"} if self.criu else None
        daemon = self._spawn("containerd", [str(b / "containerd"), "--config", str(w / "containerd.toml")], env)
        self._wait(daemon, lambda: self.ctr("version", check=False).returncode == 0, "containerd to answer")
        say("containerd up")

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bin_dir / "ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io", *args]
        return _run(argv, check=check, timeout=timeout)

    def _import_images(self) -> None:
        for image in self.images:
            start = time.monotonic()
            # --local: the client-side import, as containerd 1.x did it (containerd 2's ctr goes
            # through the transfer service by default, which names the archive's images by its
            # own rules and left every image but the last without its reference here).
            self.ctr("image", "import", "--local", "--no-unpack", "--index-name", image.ref, image.archive)
            say(f"imported {image.ref} in {time.monotonic() - start:.1f}s")
        listed = self.ctr("image", "ls", "-q").stdout.split()
        missing = [i.ref for i in self.images if i.ref not in listed and f"{i.ref}" not in listed]
        if missing:
            raise NodeError(f"images not in containerd after import: {missing} (have {listed})")

    def _start_control_plane(self) -> None:
        w, b = self.workdir, self.bin_dir
        etcd = self._spawn(
            "etcd",
            [
                str(b / "etcd"),
                "--name=node",
                f"--data-dir={w / 'etcd'}",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=node=http://127.0.0.1:2380",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait(etcd, lambda: _http_ok("http://127.0.0.1:2379/health"), "etcd")
        self.admin_token = secrets.token_hex(24)
        tokens = w / "tokens.csv"
        tokens.write_text(f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        sa_key = w / "sa.key"
        _run(["openssl", "genrsa", "-out", str(sa_key), "2048"])
        (w / "certs").mkdir()
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(b / "kube-apiserver"),
                "--etcd-servers=http://127.0.0.1:2379",
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
                f"--cert-dir={w / 'certs'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=PodSecurity,ValidatingAdmissionPolicy",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        cert = w / "certs" / "apiserver.crt"
        self._wait(apiserver, cert.exists, "kube-apiserver's certificate")
        self.ca_file = str(cert)
        self._wait(apiserver, lambda: _http_ok(f"{self.server_url}/readyz", self.ca_file, self.admin_token), "readyz")
        self.kubeconfig = self._kubeconfig("admin", self.admin_token)
        say("etcd and kube-apiserver up")
        self._spawn(
            "kube-controller-manager",
            [
                str(b / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={cert}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [str(b / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--v=1"],
        )  # fmt: skip

    def _kubeconfig(self, user: str, token: str) -> str:
        path = self.workdir / f"{user}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "node", "cluster": {"server": self.server_url, "certificate-authority": self.ca_file}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": user}}],
            "current-context": "node",
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return str(path)

    def _start_kubelet_and_proxy(self) -> None:
        w, b = self.workdir, self.bin_dir
        (w / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This machine has cgroup v1 (hybrid); 1.35+ refuses it unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.name}",
            "failSwapOn": False,
            "resolvConf": str(w / "resolv.conf"),
            # The containers' logs in the work directory, removed with it (the default,
            # /var/log/pods, kept a directory of every pod still there at teardown).
            "podLogsDir": str(w / "pod-logs"),
            "podCIDR": POD_CIDR,
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": "cluster.local",
            "address": NODE_IP,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            **({} if self.kubelet_defaults else KUBELET_PERIODS),
        }  # fmt: skip
        (w / "kubelet.yaml").write_text(json.dumps(kubelet_config, indent=2))
        kubelet = self._spawn(
            "kubelet",
            [
                str(b / "kubelet"),
                f"--config={w / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={w / 'kubelet'}",
                f"--cert-dir={w / 'kubelet-pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={NODE_IP}",
                "--v=1",
            ],
        )
        proxy_config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": self.name,
            "clientConnection": {"kubeconfig": self.kubeconfig},
            "bindAddress": NODE_IP,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Leave the machine's conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (w / "kube-proxy.yaml").write_text(json.dumps(proxy_config, indent=2))
        self._spawn("kube-proxy", [str(b / "kube-proxy"), f"--config={w / 'kube-proxy.yaml'}", "--v=1"])
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)

            def ready() -> bool:
                node = core.read_node(self.name)
                return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

            self._wait(kubelet, ready, f"node {self.name} to be Ready", timeout=180)

            def default_account() -> object:
                return core.read_namespaced_service_account("default", "default")

            wait_for(default_account, 60, "the controller-manager to create default/default", interval=0.5)

    def _start_dns(self) -> None:
        from kubernetes import client

        from tests.node.dns import ClusterDNS

        api = self.api_client()
        core = client.CoreV1Api(api)

        def lookup(service: str, namespace: str) -> str | None:
            try:
                found = core.read_namespaced_service(service, namespace)
            except client.ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            ip = found.spec.cluster_ip
            return ip if ip and ip != "None" else None

        self._dns = ClusterDNS(NODE_IP, lookup, self.dns_names).start()
        self._dns_api = api
        self._start_dns_pods(core)

    def _start_dns_pods(self, core: Any) -> None:
        """The DNS pods that pods reach (kube-system, ``k8s-app: kube-dns``): relays to the test's
        server, behind the ``kube-dns`` Service at ``DNS_SERVICE_IP`` (the kubelet's clusterDNS)."""
        from tests.node.dns import RELAY

        if not self.dns_image:
            raise NodeError("RealNode needs dns_image (an image with python) for its DNS pods")
        labels = {"k8s-app": "kube-dns"}
        core.create_namespaced_service(
            "kube-system",
            {
                "metadata": {"name": "kube-dns", "labels": labels},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "selector": labels,
                    "ports": [{"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"}],
                },
            },
        )
        core.create_namespaced_pod(
            "kube-system",
            {
                "metadata": {"name": "dns-relay", "labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "relay",
                            "image": self.dns_image,
                            "command": ["python", "-c", RELAY, NODE_IP],
                            # CoreDNS's own requests (its Deployment's): a BestEffort DNS pod gets
                            # the least CPU of the node (cpu.shares 2) and, while sandboxes start
                            # in numbers, answered seconds late: the pods' lookups waited on it.
                            "resources": {"requests": {"cpu": "100m", "memory": "70Mi"}, "limits": {"memory": "170Mi"}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                                "readOnlyRootFilesystem": True,
                            },
                        }
                    ],
                    # Port 53 without root or a capability (a "safe" sysctl, namespaced per pod).
                    "securityContext": {
                        "runAsNonRoot": True,
                        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"}],
                    },
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                },
            },
        )

        def answers() -> bool:
            return resolve("kubernetes.default.svc.cluster.local", DNS_SERVICE_IP) is not None

        wait_for(answers, 120, "the DNS pods to answer through the kube-dns Service", interval=0.5)
        say(f"DNS pods answer at {DNS_SERVICE_IP}")

    # ------------------------------------------------------------ NetworkPolicy

    def start_network_policy(self) -> None:
        """kube-router in firewall-only mode: NetworkPolicy enforced with iptables and ipsets in
        the node's namespace (a pod's rules follow within moments of its IP: see
        :meth:`network_policy_covers`)."""
        started = time.monotonic()
        daemon = self._spawn(
            "kube-router",
            [
                str(self.bin_dir / "kube-router"),
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.name}",
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                "--enable-cni=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--health-port={KUBE_ROUTER_HEALTH_PORT}",
                "--metrics-port=0",
                "--v=1",
            ],
        )
        self._wait(
            daemon,
            lambda: (
                _http_ok(f"http://127.0.0.1:{KUBE_ROUTER_HEALTH_PORT}/healthz")
                and "KUBE-ROUTER-FORWARD" in self.iptables()
            ),
            "kube-router's NetworkPolicy chains",
        )
        self.timings["kube_router_ready"] = time.monotonic() - started
        say(f"kube-router enforces NetworkPolicy ({self.timings['kube_router_ready']:.1f}s)")

    def stop_network_policy(self) -> None:
        """Stop kube-router and remove its rules and ipsets: NetworkPolicy is then not enforced,
        as on a cluster whose CNI ignores it. (v2.1.0's ``--cleanup-config`` removes nothing of
        the firewall's and then crashes, so the filter table is rewritten without its chains.)"""
        for daemon in [d for d in self._daemons if d.name == "kube-router"]:
            daemon.stop()
            self._daemons.remove(daemon)
        saved = _run(self._in_netns("iptables-save", "-t", "filter")).stdout
        kept = [line for line in saved.splitlines() if not any(c in line for c in KUBE_ROUTER_CHAINS)]
        _run(self._in_netns("iptables-restore"), input_text="\n".join(kept) + "\n")
        for name in _run(self._in_netns("ipset", "list", "-n")).stdout.split():
            if name.removeprefix("inet6:").startswith(KUBE_ROUTER_IPSETS):
                _run(self._in_netns("ipset", "destroy", name))
        left = [line for line in self.iptables().splitlines() if any(c in line for c in KUBE_ROUTER_CHAINS)]
        if left:
            raise NodeError(f"kube-router's rules are still there: {left[:5]}")
        say("kube-router stopped and its rules and ipsets removed: NetworkPolicy is not enforced")

    def iptables(self) -> str:
        """The namespace's iptables rules (``iptables-save``)."""
        return _run(self._in_netns("iptables-save"), timeout=30).stdout

    def network_policy_covers(self, pod_ip: str) -> bool:
        """Whether kube-router has put the pod at ``pod_ip`` under its firewall chains."""
        return any(f"{pod_ip}/32" in line and "KUBE-POD-FW" in line for line in self.iptables().splitlines())

    def _create_persistent_volumes(self) -> None:
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for i in range(self.persistent_volumes):
                path = self.workdir / "volumes" / f"pv-{i}"
                path.mkdir(parents=True)
                path.chmod(0o777)  # hostPath ignores fsGroup: any pod user may write
                core.create_persistent_volume(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": f"pv-{i}", "labels": {"scc-node": self.name}},
                        "spec": {
                            "capacity": {"storage": "20Gi"},
                            "accessModes": ["ReadWriteOnce"],
                            "persistentVolumeReclaimPolicy": "Retain",
                            "hostPath": {"path": str(path), "type": "Directory"},
                        },
                    }
                )

    # --------------------------------------------------------------- clients

    def api_client(self, token: str | None = None) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.server_url
        cfg.ssl_ca_cert = self.ca_file
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(cfg)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Daemon:
        """Run a process of the test (the simulator) inside the namespace; stopped by :meth:`stop`."""
        return self._spawn(name, argv, env)

    # ------------------------------------------------------------------ stop

    def stop(self) -> None:
        """Tear everything down in order; idempotent; best effort at each step."""
        if not hasattr(self, "workdir"):
            return
        errors: list[str] = []

        def step(what: str, action: Callable[[], None]) -> None:
            try:
                action()
            except Exception as exc:  # keep tearing down; report at the end
                errors.append(f"{what}: {exc!r}")

        step("delete pods", self._delete_pods)
        by_name = {d.name: d for d in self._daemons}
        for name in ("kubelet", "kube-router", "kube-proxy", "kube-scheduler", "kube-controller-manager"):
            if name in by_name:
                step(f"stop {name}", by_name[name].stop)
        step("remove containers", self._remove_containers)
        if "containerd" in by_name:
            step("stop containerd", by_name["containerd"].stop)
        step("kill shims", self._kill_shims)
        for d in self._daemons:
            if d.name not in ("kube-apiserver", "etcd"):
                step(f"stop {d.name}", d.stop)
        for name in ("kube-apiserver", "etcd"):
            if name in by_name:
                step(f"stop {name}", by_name[name].stop)
        if self._dns is not None:
            step("stop dns", self._dns.stop)
            self._dns = None
            step("close dns client", self._dns_api.close)
        step("unmount", self._unmount)
        step("kill cgroup processes", self._kill_cgroup_processes)
        step("remove cgroups", self._remove_cgroups)
        step("leave netns", self._leave_netns)
        step("delete netns", self._delete_netns)
        step("restore sysctls", self._restore_sysctls)
        if not errors:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._daemons = []
        if errors:
            raise NodeError("teardown: " + "; ".join(errors))

    def _delete_pods(self) -> None:
        if not self.admin_token or not any(d.name == "kubelet" and d.proc.poll() is None for d in self._daemons):
            return
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for pod in core.list_pod_for_all_namespaces().items:
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)

        def no_containers() -> bool:
            return not self.ctr("task", "ls", "-q", check=False).stdout.split()

        with contextlib.suppress(AssertionError):
            wait_for(no_containers, 60, "the kubelet to stop every container", interval=1.0)

    def _remove_containers(self) -> None:
        if not self.containerd_socket.exists():
            return
        for task in self.ctr("task", "ls", "-q", check=False).stdout.split():
            self.ctr("task", "kill", "-s", "SIGKILL", task, check=False)
            self.ctr("task", "delete", "-f", task, check=False)
        for container in self.ctr("container", "ls", "-q", check=False).stdout.split():
            self.ctr("container", "delete", container, check=False)

    def _processes(self) -> list[tuple[int, str]]:
        """Processes of this node: its command line names the work directory (containerd shims
        and the daemons) or it runs in one of its cgroups (the containers)."""
        needle = str(self.workdir).encode()
        found: dict[int, str] = {}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid() or not _alive(int(proc.name)):
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes()
                if needle in cmdline:
                    found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
        for cgroup in self._cgroups:
            for procs in cgroup.rglob("cgroup.procs") if cgroup.exists() else []:
                with contextlib.suppress(OSError):
                    for pid in procs.read_text().split():
                        if _alive(int(pid)):
                            found.setdefault(int(pid), f"(in {procs.parent})")
        for d in self._daemons:
            if d.proc.poll() is None:
                found.setdefault(d.proc.pid, d.name)
        return sorted(found.items())

    def processes(self) -> list[tuple[int, str]]:
        """Every process of the node now: (pid, its command line, or "(in <cgroup>)" for a
        process of a container); bench/cold_burst.py adds up their CPU."""
        return self._processes()

    def leftovers(self) -> list[str]:
        return [f"{pid}: {what}" for pid, what in self.processes()]

    def _kill_shims(self) -> None:
        """Kill what containerd left (shims, container processes), not the daemons still to be
        stopped in order (the API server and etcd)."""
        daemons = {d.proc.pid for d in self._daemons if d.proc.poll() is None}
        for pid, _ in self._processes():
            if pid not in daemons:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    _kill_cgroup_processes = _kill_shims

    def _unmount(self) -> None:
        prefix = str(self.workdir) + "/"
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                mounts.append(point)
        for point in sorted(set(mounts), key=len, reverse=True):
            if _run(["umount", point], check=False).returncode != 0:
                _run(["umount", "-l", point], check=False)
        # Pod network namespaces containerd made and did not remove (a killed sandbox).
        if NETNS_DIR.exists():
            for entry in set(os.listdir(NETNS_DIR)) - self._netns_before - {self.name}:
                if entry.startswith("cni-"):
                    _run(["umount", str(NETNS_DIR / entry)], check=False)
                    with contextlib.suppress(OSError):
                        (NETNS_DIR / entry).unlink()

    def _remove_cgroups(self) -> None:
        for top in self._cgroups:
            if not top.exists():
                continue
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    path.rmdir()
            top.rmdir()
        self._cgroups = []

    def _leave_netns(self) -> None:
        if self._host_netns_fd is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(self._host_netns_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the host network namespace")
            os.close(self._host_netns_fd)
            self._host_netns_fd = None

    def _delete_netns(self) -> None:
        if Path(self.netns_path).exists():
            _run(["ip", "netns", "delete", self.name])
        if self._mounted_run_netns and NETNS_DIR.exists() and os.path.ismount(NETNS_DIR) and not os.listdir(NETNS_DIR):
            _run(["umount", str(NETNS_DIR)], check=False)

    def _restore_sysctls(self) -> None:
        for path, value in self._sysctls.items():
            target = Path("/proc/sys", path)
            if target.read_text().strip() != value:
                target.write_text(value)
        SAVED_SYSCTLS.unlink(missing_ok=True)


def runtime_pins(script: Path = BUILD_SCRIPT) -> dict[str, str]:
    """The node's container runtime as ``tests/envtest/build.sh`` pins it: ``containerd`` and
    ``runc`` → their versions (``v2.3.7``)."""
    pins = {}
    for line in script.read_text().splitlines():
        for name in ("containerd", "runc"):
            if line.startswith(f"{name.upper()}_VERSION="):
                pins[name] = line.split("=", 1)[1].strip()
    return pins


def _machine_sysctls(proc: Path = Path("/proc/sys"), saved_at: Path = SAVED_SYSCTLS) -> dict[str, str]:
    """The machine's own values of ``GLOBAL_SYSCTLS``: those a run killed before its teardown
    saved (the kubelet's are in /proc/sys then), else /proc/sys's, saved now."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        saved = json.loads(saved_at.read_text())
        if isinstance(saved, dict) and set(saved) == set(GLOBAL_SYSCTLS):
            return {str(k): str(v) for k, v in saved.items()}
    values = {path: (proc / path).read_text().strip() for path in GLOBAL_SYSCTLS}
    saved_at.parent.mkdir(mode=0o700, exist_ok=True)
    partial = saved_at.with_suffix(".partial")
    partial.write_text(json.dumps(values))
    partial.replace(saved_at)
    return values


def _http_ok(url: str, ca_file: str | None = None, token: str | None = None) -> bool:
    import ssl
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _routes_to_private() -> list[str]:
    """Pod routes to the test's private-range addresses (each /32: nothing else of the range)."""
    return [f"{address}/32" for address in PRIVATE_ADDRESSES.values()]


def resolve(name: str, server: str, timeout: float = 2.0) -> str | None:
    """The A record ``server`` answers for ``name`` (one UDP query), or None."""
    import socket
    import struct

    query = struct.pack("!HHHHHH", 0x5C5C, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    query += struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query, (server, 53))
            reply = sock.recv(4096)
        except OSError:
            return None
    if len(reply) < len(query) + 16 or struct.unpack("!H", reply[6:8])[0] == 0:
        return None
    return socket.inet_ntoa(reply[-4:])


def load_images() -> list[Image]:
    """Build (or find in the cache) the images; one JSON line per image from images.sh."""
    say("images: tests/node/images.sh (cached by a hash of their inputs)")
    result = subprocess.run(
        ["bash", str(IMAGES_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=True, timeout=3000
    )
    return [Image(**json.loads(line)) for line in result.stdout.splitlines() if line.startswith("{")]


@contextlib.contextmanager
def real_node(
    images: list[Image], dns_names: dict[str, str] | None = None, kubelet_defaults: bool = False, criu: str = ""
) -> Iterator[RealNode]:
    """A started node; its DNS pods run the controller image."""
    [controller] = [i.ref for i in images if i.name == "sandbox-controller"]
    node = RealNode(
        images=images,
        dns_image=controller,
        dns_names=dict(dns_names or {}),
        kubelet_defaults=kubelet_defaults,
        criu=criu,
    ).start()
    try:
        yield node
    finally:
        node.stop()
        left = node.leftovers() if hasattr(node, "workdir") else []
        assert not left, f"processes of the node left running: {left}"
