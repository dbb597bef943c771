"""Run a real etcd + kube-apiserver on loopback for tests.

What runs: etcd (one member, temp data dir, ``--unsafe-no-fsync``) and
kube-apiserver on ``127.0.0.1`` with random free ports. There is NO
kube-controller-manager, scheduler or kubelet, so:

* pods are admitted and stored but stay ``Pending`` forever (no node); tests
  that need a "running" pod must patch its status themselves;
* no ``default`` ServiceAccount is created in new namespaces (the
  ServiceAccount admission plugin is ON and rejects a pod whose service
  account does not exist, *even* with ``automountServiceAccountToken: false``):
  use :meth:`KubeAPIServer.create_namespace`, which creates it;
* deleting a namespace leaves it ``Terminating`` forever (no namespace
  controller) and ownerReference cascades never happen (no garbage
  collector): use unique namespace names per test;
* no ``kube-root-ca.crt`` ConfigMaps are published.

Auth: a static admin token (user ``envtest-admin`` in ``system:masters``) via
``--token-auth-file``; RBAC authorization; ServiceAccount tokens are signed
with an RSA key generated at start-up, so the TokenRequest API works
(:meth:`KubeAPIServer.service_account_token`). Admission: the default plugin
set (which includes ``PodSecurity``, ``ServiceAccount`` and ``ValidatingAdmissionPolicy``)
plus an explicit ``--enable-admission-plugins=PodSecurity,ValidatingAdmissionPolicy``.

Serving: HTTPS with the self-signed certificate that kube-apiserver writes into
``--cert-dir``; :attr:`KubeAPIServer.ca_file` is that bundle (valid for
``127.0.0.1`` and ``localhost``), so clients verify TLS for real.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.processes import free_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "envtest-admin"


class ClusterStartError(RuntimeError):
    pass


class _ProcessExited(ClusterStartError):
    """A process died during start-up (e.g. its port was taken): retryable."""


def bin_dir_from_build_script() -> Path:
    """Where build.sh puts (or would put) the binaries."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _write_rsa_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


class KubeAPIServer:
    """etcd + kube-apiserver processes. Use as a context manager or call
    :meth:`start` / :meth:`stop`.

    Attributes after :meth:`start`: ``server_url`` (``https://127.0.0.1:PORT``),
    ``admin_token``, ``ca_file``, ``kubeconfig`` (path of a kubeconfig with the
    admin token), ``etcd_url``, ``workdir``.
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 120.0,
        extra_apiserver_args: list[str] | None = None,
        keep_workdir: bool = False,
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else bin_dir_from_build_script()
        self.startup_timeout = startup_timeout
        self.extra_apiserver_args = list(extra_apiserver_args or [])
        self.keep_workdir = keep_workdir or os.environ.get("ENVTEST_KEEP_WORKDIR") == "1"

        self.workdir: Path | None = None
        self.server_url: str = ""
        self.etcd_url: str = ""
        self.admin_token: str = ""
        self.ca_file: str = ""
        self.kubeconfig: str = ""
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._atexit_registered = False

    # ------------------------------------------------------------------ life

    def __enter__(self) -> KubeAPIServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, attempts: int = 3) -> None:
        for name in ("etcd", "kube-apiserver"):
            if not os.access(self.bin_dir / name, os.X_OK):
                raise ClusterStartError(f"{self.bin_dir / name} missing; run tests/envtest/build.sh")
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        last: Exception | None = None
        for _ in range(attempts):  # retry: a "free" port may be taken meanwhile
            try:
                self._start_once()
                return
            except _ProcessExited as e:
                last = e
                self.stop()
            except BaseException:
                self.stop()
                raise
        assert last is not None
        raise last

    def _start_once(self) -> None:
        self.server_url = self.etcd_url = self.ca_file = self.kubeconfig = ""
        self.workdir = Path(tempfile.mkdtemp(prefix="envtest-"))
        wd = self.workdir
        (wd / "certs").mkdir()
        deadline = time.monotonic() + self.startup_timeout

        # ---- etcd
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd_log = wd / "etcd.log"
        self._etcd = self._spawn(
            [
                str(self.bin_dir / "etcd"),
                "--name=envtest",
                f"--data-dir={wd / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=envtest={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                "--logger=zap",
            ],
            etcd_log,
        )
        self._wait_http(
            f"{self.etcd_url}/health",
            deadline,
            self._etcd,
            etcd_log,
            "etcd",
            ok=lambda body: b'"health":"true"' in body,
        )

        # ---- credentials
        self.admin_token = secrets.token_hex(24)
        tokens = wd / "tokens.csv"
        tokens.write_text(f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        sa_key = wd / "sa.key"
        _write_rsa_key(sa_key)

        # ---- kube-apiserver
        port = free_port()
        self.server_url = f"https://127.0.0.1:{port}"
        api_log = wd / "kube-apiserver.log"
        self._apiserver = self._spawn(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={wd / 'certs'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=RBAC",
                # Both are on by default in 1.37; named so a change of defaults cannot drop them
                # (the chart's sandbox pod policy is a ValidatingAdmissionPolicy).
                "--enable-admission-plugins=PodSecurity,ValidatingAdmissionPolicy",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                "--service-cluster-ip-range=10.0.0.0/24",
                # 127.0.0.1 is refused as a "public IP" by the default (lease)
                # endpoint reconciler; nothing here needs the kubernetes
                # Service endpoints anyway.
                "--endpoint-reconciler-type=none",
                # As on kubeadm clusters: privileged pods are valid, so only
                # PodSecurity admission stands between them and the store.
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.extra_apiserver_args,
            ],
            api_log,
        )
        # The self-signed serving cert appears once the server is configured.
        cert = wd / "certs" / "apiserver.crt"
        while not cert.exists():
            self._check_alive(self._apiserver, api_log, "kube-apiserver")
            if time.monotonic() > deadline:
                raise ClusterStartError(f"kube-apiserver wrote no certificate in time:\n{_tail(api_log)}")
            time.sleep(0.1)
        self.ca_file = str(cert)
        self._wait_http(
            f"{self.server_url}/readyz",
            deadline,
            self._apiserver,
            api_log,
            "kube-apiserver",
            ok=lambda body: body.strip() == b"ok",
            headers={"Authorization": f"Bearer {self.admin_token}"},
        )
        self.kubeconfig = str(wd / "kubeconfig")
        self._write_kubeconfig(Path(self.kubeconfig), self.admin_token, ADMIN_USER)

    def stop(self) -> None:
        """Terminate kube-apiserver then etcd (SIGTERM, wait, SIGKILL) and
        remove the temp dir. Idempotent."""
        for attr in ("_apiserver", "_etcd"):
            proc = getattr(self, attr)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
            setattr(self, attr, None)
        if self.workdir is not None:
            if self.keep_workdir:
                print(f"envtest: kept {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # --------------------------------------------------------------- helpers

    @staticmethod
    def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as fh:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                # Own process group: a Ctrl-C aimed at pytest doesn't reach it
                # before stop() gets to terminate it in order.
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("KUBE")},
            )

    @staticmethod
    def _check_alive(proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        if proc.poll() is not None:
            raise _ProcessExited(f"{name} exited with {proc.returncode} during start-up:\n{_tail(log)}")

    def _ssl_context(self, url: str) -> ssl.SSLContext | None:
        if not url.startswith("https:"):
            return None
        return ssl.create_default_context(cafile=self.ca_file)

    def _wait_http(
        self,
        url: str,
        deadline: float,
        proc: subprocess.Popen[bytes],
        log: Path,
        name: str,
        ok: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        last = ""
        while True:
            self._check_alive(proc, log, name)
            try:
                req = urllib.request.Request(url, headers=headers or {})
                with urllib.request.urlopen(req, timeout=2, context=self._ssl_context(url)) as r:
                    body = r.read()
                    if ok(body):
                        return
                    last = body.decode(errors="replace")
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:2000].decode(errors='replace')}"
            except (OSError, ssl.SSLError) as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise ClusterStartError(f"{name} not ready at {url} in time (last: {last}):\n{_tail(log)}")
            time.sleep(0.2)

    def _write_kubeconfig(self, path: Path, token: str, user: str) -> None:
        # JSON is valid YAML; every kubeconfig loader accepts it.
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority": self.ca_file,
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
            "current-context": "envtest",
        }
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)

    def write_kubeconfig(self, path: str | os.PathLike[str], token: str, user: str = "user") -> str:
        """Write a kubeconfig for this server using ``token`` (e.g. a
        ServiceAccount token from :meth:`service_account_token`)."""
        self._write_kubeconfig(Path(path), token, user)
        return str(path)

    # ------------------------------------------------ kubernetes client glue

    def api_client(self, token: str | None = None):
        """A ``kubernetes.client.ApiClient`` for this server, authenticating
        with ``token`` (default: the admin token). TLS is verified."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.server_url
        cfg.ssl_ca_cert = self.ca_file
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(cfg)

    def create_namespace(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        *,
        default_service_account: bool = True,
    ) -> None:
        """Create a namespace and (since no controller-manager runs) its
        ``default`` ServiceAccount, which the ServiceAccount admission plugin
        requires for every pod that doesn't name another one."""
        from kubernetes import client

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels or {})))
            if default_service_account:
                core.create_namespaced_service_account(
                    name,
                    client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")),
                )

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        expiration_seconds: int = 3600,
        audiences: list[str] | None = None,
    ) -> str:
        """Mint a token for an existing ServiceAccount via the TokenRequest
        API (``POST .../serviceaccounts/NAME/token``)."""
        from kubernetes import client

        with self.api_client() as api:
            resp = client.CoreV1Api(api).create_namespaced_service_account_token(
                name,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(
                        audiences=audiences or [],
                        expiration_seconds=expiration_seconds,
                    )
                ),
            )
        return resp.status.token
