"""Typed settings, parsed once from ``CONTROLLER_*`` environment variables.

Every problem is collected and reported together (``ConfigError``). Units are in the names
(``…_SECONDS``, ``…_BYTES``). Secrets may also come from ``…_FILE`` paths (mounted Secrets);
they are held as ``Secret`` whose ``repr``/``str`` is masked, so printing settings is safe.

``KEYS`` lists every variable read here; the Helm chart sets a subset of them (a test checks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from controller.errors import ConfigError

PREFIX = "CONTROLLER_"
T = TypeVar("T")


class Secret:
    """A secret string: masked wherever it is printed, revealed only on purpose."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class WebhookSettings:
    secrets: tuple[Secret, ...] = ()
    """Signing secrets (comma-separated; several during rotation). ``whsec_`` ones are base64."""
    tolerance_seconds: int = 300
    """Replay window, both ways."""
    max_body_bytes: int = 256 * 1024
    """Deliveries above this get 413."""
    dedup_ttl_seconds: int = 73 * 3600
    """How long a ``webhook-id`` is remembered: beyond the sender's 72-hour retry horizon."""


@dataclass(frozen=True)
class ApiSettings:
    base_url: str = "https://api.openai.com"
    """Agents API base (without ``/v1``)."""
    api_key: Secret | None = None
    """Key that reads sessions. Stays with the controller; never enters a sandbox (L2)."""
    timeout_seconds: float = 10.0
    max_attempts: int = 4
    """Short retries at the HTTP edge; the task retries for longer."""


@dataclass(frozen=True)
class RoutingSettings:
    workspace_directory: str = "/workspace"
    """Only sessions whose environment.workspace_directory equals this are ours (L6)."""
    agent_ids: tuple[str, ...] = ()
    """If set, only sessions of these agents are ours."""
    metadata_key: str | None = None
    metadata_value: str | None = None
    """``CONTROLLER_ROUTE_METADATA=key=value``: only sessions carrying that metadata are ours."""


@dataclass(frozen=True)
class QueueSettings:
    redis_url: str | None = field(default=None, repr=False)  # may carry a password: kept out of repr
    """Redis for the queue, de-duplication, leases and the session→sandbox mapping."""
    lease_ttl_seconds: float = 60.0
    """A worker's hold on one session; a dead worker's lease expires after this."""
    visibility_timeout_seconds: int = 300
    """Unacknowledged jobs of a dead worker process are redelivered after this."""
    task_max_retries: int = 50


@dataclass(frozen=True)
class RunnerSettings:
    kind: str = "local"
    """``local`` (child processes) or ``kubernetes`` (pods)."""
    executor_key: Secret | None = None
    """The environment key given to the executor as CODEX_API_KEY (L2)."""
    executor_command: str = "codex"
    """The executor binary; run as ``<command> exec-server --remote … --environment-id …``."""
    executor_grace_seconds: float = 60.0
    """A running sandbox whose executor has not connected after this is replaced (L14)."""
    local_state_directory: str = "/tmp/sandbox-controller"
    """Local runner: per-session workspaces, pid files and logs live under here. Created 0700
    (0711 when executors run as another user); refused unless owned by the controller's uid
    and not group/world-writable, so a shared parent such as /tmp is safe."""
    local_executor_user: str = "nobody"
    """Local runner, worker running as root: the unprivileged user (name or uid) executors run as."""
    local_executor_same_user: bool = False
    """Local runner: opt in to running executors as the worker's own uid (no separation from
    the controller's secrets; ``dev`` sets it). Required when the worker is not root."""


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "sandboxes"
    """Namespace the sandbox pods run in (labelled to enforce Pod Security "restricted")."""
    image: str = "sandbox-controller-runner:0.1.0"
    """The runner image (runner_image/) of the default template."""
    executor_key_secret: str = "sandbox-executor-key"
    """Secret in the sandbox namespace holding the environment key under ``executor-key`` (L2)."""
    templates_file: str | None = None
    """JSON file of named sandbox templates (see templates.py)."""
    runtime_class: str | None = None
    """RuntimeClass of the default template, e.g. gvisor."""


@dataclass(frozen=True)
class LifecycleSettings:
    idle_timeout_seconds: float = 600.0
    """Stop a sandbox this long after its session went idle (L11). Parsed and validated, but
    idle shutdown is not implemented yet: sandboxes are kept warm between turns."""
    max_lifetime_seconds: float = 0.0
    """Release any sandbox older than this (0: no limit) (L17)."""
    reconcile_interval_seconds: float = 300.0
    """How often the scheduler sweeps every mapped session and managed sandbox (L17)."""


@dataclass(frozen=True)
class Settings:
    webhook: WebhookSettings = WebhookSettings()
    api: ApiSettings = ApiSettings()
    routing: RoutingSettings = RoutingSettings()
    queue: QueueSettings = QueueSettings()
    runner: RunnerSettings = RunnerSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return _Parser(environ).settings()

    def describe(self) -> dict[str, Any]:
        """The effective settings as plain data, secrets masked."""
        return _describe_fields(self)

    def require(self, role: str) -> None:
        """Check what a given process role needs; raise ConfigError listing every gap."""
        problems = []
        needs = {
            "serve": ["redis", "secrets"],
            "worker": ["redis", "api_key", "executor_key"],
            "scheduler": ["redis", "executor_key"],
            "dev": ["secrets", "api_key", "executor_key"],
        }[role]
        if "redis" in needs and not self.queue.redis_url:
            problems.append(f"{PREFIX}REDIS_URL is required for `{role}`")
        if "secrets" in needs and not self.webhook.secrets:
            problems.append(f"{PREFIX}WEBHOOK_SECRETS (or {PREFIX}WEBHOOK_SECRETS_FILE) is required for `{role}`")
        if "api_key" in needs and self.api.api_key is None:
            problems.append(f"{PREFIX}API_KEY (or {PREFIX}API_KEY_FILE) is required for `{role}`")
        # The Kubernetes runner hands the key to pods through a Secret; the controller never holds it.
        if "executor_key" in needs and self.runner.kind == "local" and self.runner.executor_key is None:
            problems.append(f"{PREFIX}EXECUTOR_KEY (or {PREFIX}EXECUTOR_KEY_FILE) is required for `{role}`")
        if problems:
            raise ConfigError(problems)


KEYS: frozenset[str] = frozenset(
    PREFIX + name
    for name in (
        "REDIS_URL",
        "WEBHOOK_SECRETS",
        "WEBHOOK_SECRETS_FILE",
        "WEBHOOK_TOLERANCE_SECONDS",
        "WEBHOOK_MAX_BODY_BYTES",
        "WEBHOOK_DEDUP_TTL_SECONDS",
        "API_KEY",
        "API_KEY_FILE",
        "API_BASE_URL",
        "API_TIMEOUT_SECONDS",
        "API_MAX_ATTEMPTS",
        "EXECUTOR_KEY",
        "EXECUTOR_KEY_FILE",
        "EXECUTOR_COMMAND",
        "EXECUTOR_GRACE_SECONDS",
        "RUNNER",
        "LOCAL_STATE_DIRECTORY",
        "LOCAL_EXECUTOR_USER",
        "LOCAL_EXECUTOR_SAME_USER",
        "WORKSPACE_DIRECTORY",
        "AGENT_IDS",
        "ROUTE_METADATA",
        "IDLE_TIMEOUT_SECONDS",
        "LEASE_TTL_SECONDS",
        "QUEUE_VISIBILITY_TIMEOUT_SECONDS",
        "TASK_MAX_RETRIES",
        "LOG_LEVEL",
        "MAX_LIFETIME_SECONDS",
        "RECONCILE_INTERVAL_SECONDS",
        "KUBERNETES_NAMESPACE",
        "KUBERNETES_IMAGE",
        "KUBERNETES_EXECUTOR_KEY_SECRET",
        "KUBERNETES_TEMPLATES_FILE",
        "KUBERNETES_RUNTIME_CLASS",
    )
)

RUNNERS = ("local", "kubernetes")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser:
    """Reads variables, converting each once, collecting every problem."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.problems: list[str] = []

    def settings(self) -> Settings:
        unknown = sorted(k for k in self.env if k.startswith(PREFIX) and k not in KEYS)
        for key in unknown:
            self.problems.append(f"{key} is not a known setting (typo?)")
        secrets = self.secret_list("WEBHOOK_SECRETS")
        metadata_key, metadata_value = self.metadata_route()
        workspace = self.text("WORKSPACE_DIRECTORY", RoutingSettings.workspace_directory)
        if not workspace.startswith("/"):
            self.problems.append(f"{PREFIX}WORKSPACE_DIRECTORY must be an absolute path, got {workspace!r}")
        runner = self.text("RUNNER", RunnerSettings.kind).lower()
        if runner not in RUNNERS:
            self.problems.append(f"{PREFIX}RUNNER must be one of {', '.join(RUNNERS)}, got {runner!r}")
        level = self.text("LOG_LEVEL", "INFO").upper()
        if level not in LOG_LEVELS:
            self.problems.append(f"{PREFIX}LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        base_url = self.text("API_BASE_URL", ApiSettings.base_url).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            self.problems.append(f"{PREFIX}API_BASE_URL must start with http:// or https://")
        redis_url = self.env.get(PREFIX + "REDIS_URL") or None
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            self.problems.append(f"{PREFIX}REDIS_URL must be a redis://, rediss:// or unix:// URL")
        settings = Settings(
            webhook=WebhookSettings(
                secrets=secrets,
                tolerance_seconds=self.number("WEBHOOK_TOLERANCE_SECONDS", WebhookSettings.tolerance_seconds, int, 1),
                max_body_bytes=self.number("WEBHOOK_MAX_BODY_BYTES", WebhookSettings.max_body_bytes, int, 1024),
                dedup_ttl_seconds=self.number("WEBHOOK_DEDUP_TTL_SECONDS", WebhookSettings.dedup_ttl_seconds, int, 1),
            ),
            api=ApiSettings(
                base_url=base_url,
                api_key=self.secret("API_KEY"),
                timeout_seconds=self.number("API_TIMEOUT_SECONDS", ApiSettings.timeout_seconds, float, 0.1),
                max_attempts=self.number("API_MAX_ATTEMPTS", ApiSettings.max_attempts, int, 1),
            ),
            routing=RoutingSettings(
                workspace_directory=workspace,
                agent_ids=self.words("AGENT_IDS"),
                metadata_key=metadata_key,
                metadata_value=metadata_value,
            ),
            queue=QueueSettings(
                redis_url=redis_url,
                lease_ttl_seconds=self.number("LEASE_TTL_SECONDS", QueueSettings.lease_ttl_seconds, float, 1.0),
                visibility_timeout_seconds=self.number(
                    "QUEUE_VISIBILITY_TIMEOUT_SECONDS", QueueSettings.visibility_timeout_seconds, int, 1
                ),
                task_max_retries=self.number("TASK_MAX_RETRIES", QueueSettings.task_max_retries, int, 0),
            ),
            runner=RunnerSettings(
                kind=runner,
                executor_key=self.secret("EXECUTOR_KEY"),
                executor_command=self.text("EXECUTOR_COMMAND", RunnerSettings.executor_command),
                executor_grace_seconds=self.number(
                    "EXECUTOR_GRACE_SECONDS", RunnerSettings.executor_grace_seconds, float, 1.0
                ),
                local_state_directory=self.text("LOCAL_STATE_DIRECTORY", RunnerSettings.local_state_directory),
                local_executor_user=self.text("LOCAL_EXECUTOR_USER", RunnerSettings.local_executor_user),
                local_executor_same_user=self.flag("LOCAL_EXECUTOR_SAME_USER", RunnerSettings.local_executor_same_user),
            ),
            kubernetes=KubernetesSettings(
                namespace=self.text("KUBERNETES_NAMESPACE", KubernetesSettings.namespace),
                image=self.text("KUBERNETES_IMAGE", KubernetesSettings.image),
                executor_key_secret=self.text("KUBERNETES_EXECUTOR_KEY_SECRET", KubernetesSettings.executor_key_secret),
                templates_file=self.env.get(PREFIX + "KUBERNETES_TEMPLATES_FILE") or None,
                runtime_class=self.env.get(PREFIX + "KUBERNETES_RUNTIME_CLASS") or None,
            ),
            lifecycle=LifecycleSettings(
                idle_timeout_seconds=self.number(
                    "IDLE_TIMEOUT_SECONDS", LifecycleSettings.idle_timeout_seconds, float, 0.0
                ),
                max_lifetime_seconds=self.number(
                    "MAX_LIFETIME_SECONDS", LifecycleSettings.max_lifetime_seconds, float, 0.0
                ),
                reconcile_interval_seconds=self.number(
                    "RECONCILE_INTERVAL_SECONDS", LifecycleSettings.reconcile_interval_seconds, float, 1.0
                ),
            ),
            log_level=level,
        )
        self.check_credentials_differ(settings)
        if self.problems:
            raise ConfigError(self.problems)
        return settings

    def text(self, name: str, default: str) -> str:
        value = self.env.get(PREFIX + name, "").strip()
        return value or default

    def flag(self, name: str, default: bool) -> bool:
        raw = self.env.get(PREFIX + name, "").strip().lower()
        if not raw:
            return default
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no"):
            return False
        self.problems.append(f"{PREFIX}{name} must be true or false, got {raw!r}")
        return default

    def words(self, name: str) -> tuple[str, ...]:
        return tuple(w.strip() for w in self.env.get(PREFIX + name, "").split(",") if w.strip())

    def number(self, name: str, default: T, cast: Callable[[str], T], minimum: float) -> T:
        raw = self.env.get(PREFIX + name, "").strip()
        if not raw:
            return default
        try:
            value = cast(raw)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(raw)  # nan/inf would pass the minimum check and break at run time
        except ValueError:
            self.problems.append(f"{PREFIX}{name} must be a{'n integer' if cast is int else ' number'}, got {raw!r}")
            return default
        if value < minimum:  # type: ignore[operator]
            self.problems.append(f"{PREFIX}{name} must be at least {minimum}, got {raw!r}")
        return value

    def raw_secret(self, name: str) -> str | None:
        """A secret from NAME or from the file NAME_FILE names (not both)."""
        direct = self.env.get(PREFIX + name)
        path = self.env.get(PREFIX + name + "_FILE")
        if direct and path:
            self.problems.append(f"set {PREFIX}{name} or {PREFIX}{name}_FILE, not both")
            return None
        if path:
            try:
                return Path(path).read_text(encoding="utf-8").strip() or None
            except OSError as exc:
                self.problems.append(f"{PREFIX}{name}_FILE: cannot read {path}: {exc.strerror}")
                return None
        return direct.strip() if direct and direct.strip() else None

    def secret(self, name: str) -> Secret | None:
        value = self.raw_secret(name)
        return Secret(value) if value else None

    def secret_list(self, name: str) -> tuple[Secret, ...]:
        from controller.signing import secret_key

        value = self.raw_secret(name)
        if not value:
            return ()
        secrets = []
        for position, item in enumerate((s.strip() for s in value.replace("\n", ",").split(",")), start=1):
            if not item:
                continue
            try:
                secret_key(item)
            except ValueError:
                self.problems.append(f"{PREFIX}{name}: secret #{position} starts with whsec_ but is not base64")
                continue
            secrets.append(Secret(item))
        return tuple(secrets)

    def metadata_route(self) -> tuple[str | None, str | None]:
        raw = self.env.get(PREFIX + "ROUTE_METADATA", "").strip()
        if not raw:
            return None, None
        key, sep, value = raw.partition("=")
        if not sep or not key.strip():
            self.problems.append(f"{PREFIX}ROUTE_METADATA must look like key=value, got {raw!r}")
            return None, None
        return key.strip(), value.strip()

    def check_credentials_differ(self, settings: Settings) -> None:
        """L2: the executor's key must not be the controller's own API key."""
        api_key, executor_key = settings.api.api_key, settings.runner.executor_key
        if api_key is not None and executor_key is not None and api_key == executor_key:
            self.problems.append(f"{PREFIX}EXECUTOR_KEY must be a separate, restricted key, not {PREFIX}API_KEY (L2)")


def _describe(value: Any) -> Any:
    if isinstance(value, QueueSettings) and value.redis_url:
        return {**_describe_fields(value), "redis_url": mask_url(value.redis_url)}
    if isinstance(value, Secret):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return _describe_fields(value)
    if isinstance(value, tuple):
        return [_describe(v) for v in value]
    return value


def _describe_fields(value: Any) -> dict[str, Any]:
    described: dict[str, Any] = {f.name: _describe(getattr(value, f.name)) for f in fields(value)}
    return described


def mask_url(url: str) -> str:
    """A URL with any password replaced, safe to print (``redis://:pw@host`` → ``redis://:***@host``)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
