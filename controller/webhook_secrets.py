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
Every problem is one line: a ``UsageError`` or ``Permanent`` (fix the place; a missing
permission is ``RunnerRejected``, naming it) or ``KubernetesUnavailable`` (try again).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from controller import files
from controller.config import Secret
from controller.errors import KubernetesError, Permanent, UsageError

if TYPE_CHECKING:
    from controller.runners.kubernetes.api import KubeApi

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
    """One key of a Secret, through ``kube`` (``runners.kubernetes.api.KubeApi``, the one door
    to the API server, which translates its errors: 429/5xx and no connection are
    ``KubernetesUnavailable``, a missing permission ``RunnerRejected`` naming it)."""

    def __init__(self, kube: KubeApi, namespace: str, name: str, key: str = DEFAULT_SECRET_KEY) -> None:
        self._kube = kube
        self.namespace, self.name, self.key = namespace, name, key

    def describe(self) -> str:
        return f"Secret {self.namespace}/{self.name} (key {self.key})"

    def read(self) -> list[Secret]:
        found = self._read(f"reading {self.describe()}")
        value = (found or {}).get(self.key)
        return split(value.decode("utf-8")) if value else []

    def prepare(self) -> None:
        """A server-side dry run of the very write (RBAC, the namespace, admission), storing nothing."""
        self._write([Secret("dry-run")], dry_run=True)

    def write(self, secrets: Sequence[Secret]) -> None:
        self._write(secrets, dry_run=False)

    def _write(self, secrets: Sequence[Secret], dry_run: bool) -> None:
        doing = f"{'checking that it may write' if dry_run else 'writing'} {self.describe()}"
        data = {self.key: join(secrets).encode()}
        exists = self._read(doing) is not None
        try:
            if exists:
                self._kube.patch_secret(self.namespace, self.name, data, dry_run=dry_run)
            else:
                self._kube.create_secret(self.namespace, self.name, data, dry_run=dry_run)
        except KubernetesError as exc:  # the namespace is missing, the name is invalid …
            raise Permanent(f"the API server answered {exc.status} {doing}") from exc

    def _read(self, doing: str) -> dict[str, bytes] | None:
        try:
            return self._kube.read_secret(self.namespace, self.name)
        except KubernetesError as exc:
            raise Permanent(f"the API server answered {exc.status} {doing}") from exc


def kube_api() -> KubeApi:
    """The API server, from in-cluster credentials, else ``$KUBECONFIG`` (as the runner loads
    them); no credentials at all is a ``UsageError`` (one line), not a traceback. The client is
    imported here, on first use: the other ``webhook`` commands never pay for it."""
    from controller.runners.kubernetes import api

    return api.connect(needed_by="--kube-secret", grantee="the credentials in use")


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__
