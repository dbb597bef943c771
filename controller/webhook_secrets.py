"""Where ``sandbox-controller webhook`` keeps the signing secrets the receiver reads.

The value is the one ``CONTROLLER_WEBHOOK_SECRETS`` takes: comma-separated, newest first, two
entries during a rotation's overlap. ``SecretFile`` writes it to a file created with mode 0600
(written beside it and renamed into place, so a reader never sees half a value).
``KubeSecret`` writes it under one key of a Kubernetes Secret (the chart's receiver mounts
``webhook.existingSecret`` / ``webhook.existingSecretKey``, default key ``webhook-secrets``),
keeping the Secret's other keys. Neither ever logs or prints a value.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from controller.config import Secret
from controller.errors import KubernetesUnavailable, Permanent

DEFAULT_SECRET_KEY = "webhook-secrets"


class SecretStore(Protocol):
    def read(self) -> list[Secret]: ...

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
        try:
            return split(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []

    def write(self, secrets: Sequence[Secret]) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{self.path.name}.")  # created 0600
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(join(secrets) + "\n")
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


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

    def write(self, secrets: Sequence[Secret]) -> None:
        import base64

        from kubernetes import client

        encoded = base64.b64encode(join(secrets).encode()).decode()
        try:
            if self._read() is None:
                body = client.V1Secret(
                    metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    type="Opaque",
                    data={self.key: encoded},
                )
                self._api.create_namespaced_secret(self.namespace, body)
            else:
                self._api.patch_namespaced_secret(self.name, self.namespace, {"data": {self.key: encoded}})
        except client.ApiException as exc:
            raise _translate(exc, f"writing {self.describe()}") from exc
        except OSError as exc:
            raise KubernetesUnavailable(f"could not reach the API server writing {self.describe()}") from exc

    def _read(self) -> Any:
        from kubernetes import client

        try:
            return self._api.read_namespaced_secret(self.name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise _translate(exc, f"reading {self.describe()}") from exc
        except OSError as exc:
            raise KubernetesUnavailable(f"could not reach the API server reading {self.describe()}") from exc


def kube_core_api() -> Any:
    """A ``CoreV1Api`` from in-cluster credentials, else ``$KUBECONFIG`` (as the runner loads them)."""
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.CoreV1Api()


def _translate(exc: Any, what: str) -> Exception:
    status = getattr(exc, "status", None) or 0
    if status == 429 or status >= 500:
        return KubernetesUnavailable(f"the API server answered {status} {what}")
    return Permanent(f"the API server answered {status} {what}")
