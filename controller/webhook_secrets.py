"""Where ``sandbox-controller webhook`` keeps the signing secrets the receiver reads.

The value is the one ``CONTROLLER_WEBHOOK_SECRETS`` takes: comma-separated, newest first, two
entries during a rotation's overlap. ``SecretFile`` writes it to a file mode 0600 whatever the
umask (a missing directory is created 0700), written beside it, flushed and renamed into place,
so a reader never sees half a value (``files.write_private``). ``KubeSecret`` writes it under
one key of a Kubernetes Secret (the chart's receiver mounts ``webhook.existingSecret`` /
``webhook.existingSecretKey``, default key ``webhook-secrets``), keeping the Secret's other keys.
Neither ever logs or prints a value.

``prepare()`` proves, before the API is asked for a secret, that ``write`` will succeed (the
directory made and a file created and removed in it; the Secret written with a server-side dry
run): a secret the API shows only once must not be lost to a destination that cannot take it.
Every problem is a ``UsageError`` (fix the place) or ``KubernetesUnavailable`` (try again), in
one line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from controller import files
from controller.config import Secret
from controller.errors import KubernetesUnavailable, Permanent, UsageError

DEFAULT_SECRET_KEY = "webhook-secrets"


class SecretStore(Protocol):
    def read(self) -> list[Secret]: ...

    def prepare(self) -> None:
        """Prove that ``write`` would succeed, changing nothing the receiver reads."""
        ...

    def write(self, secrets: Sequence[Secret]) -> None: ...

    def describe(self) -> str: ...


def join(secrets: Sequence[Secret]) -> str:
    return ",".join(s.reveal() for s in secrets)


def split(value: str) -> list[Secret]:
    return [Secret(item.strip()) for item in value.replace("\n", ",").split(",") if item.strip()]


class SecretFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def describe(self) -> str:
        return f"file {self.path}"

    def read(self) -> list[Secret]:
        """The secrets in the file (none when it does not exist); never blocks on a FIFO."""
        try:
            return split(files.read_small(self.path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise UsageError(f"cannot read the secrets {self.describe()}: {_reason(exc)}") from exc

    def prepare(self) -> None:
        try:
            files.prove_writable(self.path)
        except OSError as exc:
            raise UsageError(f"cannot write the secrets {self.describe()}: {_reason(exc)}") from exc

    def write(self, secrets: Sequence[Secret]) -> None:
        try:
            files.write_private(self.path, join(secrets) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write the secrets {self.describe()}: {_reason(exc)}") from exc


class KubeSecret:
    """One key of a Secret; ``api`` is a ``kubernetes.client.CoreV1Api``."""

    def __init__(self, api: Any, namespace: str, name: str, key: str = DEFAULT_SECRET_KEY) -> None:
        self._api = api
        self.namespace, self.name, self.key = namespace, name, key

    def describe(self) -> str:
        return f"Secret {self.namespace}/{self.name} (key {self.key})"

    def read(self) -> list[Secret]:
        import base64

        found = self._read()
        if found is None:
            return []
        encoded = (found.data or {}).get(self.key)
        return split(base64.b64decode(encoded).decode("utf-8")) if encoded else []

    def prepare(self) -> None:
        """A server-side dry run of the very write (RBAC, the namespace, admission), storing nothing."""
        self._write([Secret("dry-run")], dry_run=True)

    def write(self, secrets: Sequence[Secret]) -> None:
        self._write(secrets, dry_run=False)

    def _write(self, secrets: Sequence[Secret], dry_run: bool) -> None:
        import base64

        from kubernetes import client

        encoded = base64.b64encode(join(secrets).encode()).decode()
        extra = {"dry_run": "All"} if dry_run else {}
        doing = f"{'checking that it may write' if dry_run else 'writing'} {self.describe()}"
        try:
            if self._read() is None:
                body = client.V1Secret(
                    metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    type="Opaque",
                    data={self.key: encoded},
                )
                self._api.create_namespaced_secret(self.namespace, body, **extra)
            else:
                self._api.patch_namespaced_secret(self.name, self.namespace, {"data": {self.key: encoded}}, **extra)
        except client.ApiException as exc:
            raise _translate(exc, doing) from exc
        except _unreachable() as exc:
            raise KubernetesUnavailable(f"could not reach the API server {doing}") from exc

    def _read(self) -> Any:
        from kubernetes import client

        try:
            return self._api.read_namespaced_secret(self.name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise _translate(exc, f"reading {self.describe()}") from exc
        except _unreachable() as exc:
            raise KubernetesUnavailable(f"could not reach the API server reading {self.describe()}") from exc


def kube_core_api() -> Any:
    """A ``CoreV1Api`` from in-cluster credentials, else ``$KUBECONFIG`` (as the runner loads
    them); no credentials at all is a ``UsageError`` (one line), not a traceback."""
    from kubernetes import client, config

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config()  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = "in-cluster credentials" if os.environ.get("KUBERNETES_SERVICE_HOST") else "a kubeconfig"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(
            f"--kube-secret needs {where} ($KUBECONFIG or ~/.kube/config) and found none usable: {reason}"
        ) from exc
    return client.CoreV1Api()


def _unreachable() -> tuple[type[BaseException], ...]:
    """What the Kubernetes client raises when it cannot reach the API server (evaluated only
    when something was raised: the client's libraries are imported on first use)."""
    import urllib3

    return (OSError, urllib3.exceptions.HTTPError)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _translate(exc: Any, what: str) -> Exception:
    status = getattr(exc, "status", None) or 0
    if status == 429 or status >= 500:
        return KubernetesUnavailable(f"the API server answered {status} {what}")
    return Permanent(f"the API server answered {status} {what}")
