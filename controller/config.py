"""Typed settings, parsed once from ``CONTROLLER_*`` environment variables.

Every problem is collected and reported together (``ConfigError``). Units are in the names
(``…_SECONDS``, ``…_BYTES``). Secrets may also come from ``…_FILE`` paths (mounted Secrets);
they are held as ``Secret`` whose ``repr``/``str`` is masked, so printing settings is safe.

``KEYS`` lists every variable the parser reads, recorded from a parse rather than kept by hand;
the Helm chart sets a subset of them (a test checks).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from controller.errors import ConfigError
from controller.signing import parse_secrets
from controller.trust import DEFAULT_ALLOWLIST, pattern_problem

PREFIX = "CONTROLLER_"
T = TypeVar("T")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


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
    secrets_file: str | None = None
    """Where ``secrets`` were read from (``…_WEBHOOK_SECRETS_FILE``): the receiver reads it again
    once it changes (a rotation, no restart)."""
    tolerance_seconds: int = 300
    """Replay window, both ways."""
    max_body_bytes: int = 256 * 1024
    """Deliveries above this get 413."""
    dedup_ttl_seconds: int = 73 * 3600
    """How long a ``webhook-id`` is remembered: beyond the sender's 72-hour retry horizon."""
    body_timeout_seconds: float = 10.0
    """A delivery's whole body must arrive within this once its headers are in (408 otherwise)."""
    max_in_flight: int = 100
    """Deliveries one receiver process reads or handles at once; beyond this a new one gets 503
    (the sender retries) before its body is read. Each may buffer up to ``max_body_bytes``."""


@dataclass(frozen=True)
class ReceiverSettings:
    """Limits of the receiver's HTTP server, so slow or hostile clients stay cheap."""

    max_connections: int = 400
    """Open connections (or requests in progress, of any path); a request beyond this gets 503.
    A backstop on sockets: the body budget is ``WebhookSettings.max_in_flight``."""
    max_header_bytes: int = 16 * 1024
    """A request whose headers exceed this gets 431 and the connection is closed."""
    header_timeout_seconds: float = 10.0
    """A connection whose request headers are not complete this long after it opened (or after
    its previous response) is closed."""


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
    lease_ttl_seconds: float = 10.0
    """A worker's hold on one session, renewed every third of it while the work runs; a dead
    worker's sessions are free again after this."""
    visibility_timeout_seconds: int = 300
    """Unacknowledged jobs of a dead worker process are redelivered after this."""
    task_max_retries: int = 50
    recovery_interval_seconds: float = 5.0
    """How often the active scheduler re-enqueues wanted work that no job is going to do."""
    recovery_after_seconds: float = 15.0
    """A session enqueued this long ago whose lease was never taken counts as lost and is
    enqueued again (a job merely waiting in the queue is not duplicated before that)."""


@dataclass(frozen=True)
class RunnerSettings:
    kind: str = "local"
    """``local`` (child processes) or ``kubernetes`` (pods)."""
    executor_key: Secret | None = None
    """The environment key given to the executor as CODEX_API_KEY (L2)."""
    remote_url_allowlist: tuple[str, ...] = DEFAULT_ALLOWLIST
    """Host patterns a session's remote_url must match before the executor key goes there (L2;
    ``controller/trust.py``): https only, plain http to a loopback host only."""
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
    image: str = "sandbox-controller/sandbox-runner:0.171.0"
    """The runner image (runner_image/) of the default template."""
    executor_key_secret: str = "sandbox-executor-key"
    """Secret in the sandbox namespace holding the environment key under ``executor-key`` (L2)."""
    templates_file: str | None = None
    """JSON file of named sandbox templates (see runners/kubernetes/templates.py)."""
    runtime_class: str | None = None
    """RuntimeClass of the default template, e.g. gvisor."""
    watch_pods: bool = True
    """The active scheduler watches the sandbox pods and has the session of a pod that was
    deleted, failed, restarted or became Ready looked at at once; partial sweeps then leave
    sessions whose pod is watched to the watch. Needs ``watch`` on pods (the chart's Role)."""
    ca_bundle_configmap: str | None = None
    """ConfigMap in the sandbox namespace whose ``ca-bundle.crt`` (PEM) every sandbox pod mounts
    read-only, with ``SSL_CERT_FILE`` pointing at it: the CAs the executor trusts (for example a
    TLS-inspecting proxy's). None: the image's own CA list."""


@dataclass(frozen=True)
class LifecycleSettings:
    idle_timeout_seconds: float = 1800.0
    """Stop a sandbox once its session has been idle this long (L11, L12): the worker re-reads
    the session and stops only an ``idle`` one with no pending environment_connection action
    whose ``last_active_at`` is at least this old; the workspace is kept. 0: keep warm."""
    workspace_retention_seconds: float = 7 * 24 * 3600.0
    """Discard a stopped session's workspace this long after its sandbox stopped (L16).
    0: keep it until the session is deleted or fails."""
    max_lifetime_seconds: float = 0.0
    """Stop any sandbox older than this, or replace it while a connection is requested
    (0: no limit) (L17)."""
    reconcile_interval_seconds: float = 300.0
    """How often the scheduler sweeps every mapped session and managed sandbox (L17)."""
    full_sweep_interval_seconds: float = 3600.0
    """How often a sweep is full: it works every mapped session, even one whose timer or pod
    watch would bring it back (the safety net for a session deleted while its sandbox is quiet:
    deleting a session sends no webhook, L17). The first sweep after a scheduler starts is full."""
    prestart_agent_ids: tuple[str, ...] = ()
    """Agents whose sessions get their sandbox when they are created (``agent.session.created``,
    L9's eager mode), before any connection is asked for; ``*``: every agent this controller
    serves. Empty (the default): a sandbox starts only on an ``environment_connection`` action.
    A pre-started sandbox nobody uses is stopped by the idle timeout like any other."""

    @property
    def prestarts(self) -> bool:
        """Whether any session may be pre-started (the receiver then enqueues creations)."""
        return bool(self.prestart_agent_ids)

    def prestarts_agent(self, agent_id: str | None) -> bool:
        return "*" in self.prestart_agent_ids or (agent_id is not None and agent_id in self.prestart_agent_ids)


@dataclass(frozen=True)
class MetricsSettings:
    port: int = 0
    """Port of ``GET /metrics`` for workers and the scheduler (0, the default: not served; the
    Helm chart sets 9090). The receiver serves its own ``/metrics`` on its HTTP port."""


@dataclass(frozen=True)
class Settings:
    webhook: WebhookSettings = WebhookSettings()
    receiver: ReceiverSettings = ReceiverSettings()
    api: ApiSettings = ApiSettings()
    routing: RoutingSettings = RoutingSettings()
    queue: QueueSettings = QueueSettings()
    runner: RunnerSettings = RunnerSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    metrics: MetricsSettings = MetricsSettings()
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
            "webhook": ["api_key"],
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


RUNNERS = ("local", "kubernetes")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser:
    """Reads variables, converting each once, collecting every problem."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.problems: list[str] = []
        self.read: set[str] = set()
        """Every variable name this parser looked up (so ``KEYS`` is what it really reads)."""

    @overload
    def get(self, key: str) -> str | None: ...

    @overload
    def get(self, key: str, default: str) -> str: ...

    def get(self, key: str, default: str | None = None) -> str | None:
        """``environ.get``, remembering the name."""
        self.read.add(key)
        return self.env.get(key, default)

    def settings(self) -> Settings:
        settings = self.parse()
        # The parser reads every name whatever the environment holds: any other one is unknown.
        unknown = sorted(k for k in self.env if k.startswith(PREFIX) and k not in KEYS | self.read)
        self.problems[:0] = [f"{key} is not a known setting (typo?)" for key in unknown]
        if self.problems:
            raise ConfigError(self.problems)
        return settings

    def parse(self) -> Settings:
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
        redis_url = self.get(PREFIX + "REDIS_URL") or None
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            self.problems.append(f"{PREFIX}REDIS_URL must be a redis://, rediss:// or unix:// URL")
        settings = Settings(
            webhook=WebhookSettings(
                secrets=secrets,
                secrets_file=self.get(PREFIX + "WEBHOOK_SECRETS_FILE") or None,
                tolerance_seconds=self.number("WEBHOOK_TOLERANCE_SECONDS", WebhookSettings.tolerance_seconds, int, 1),
                max_body_bytes=self.number("WEBHOOK_MAX_BODY_BYTES", WebhookSettings.max_body_bytes, int, 1024),
                dedup_ttl_seconds=self.number("WEBHOOK_DEDUP_TTL_SECONDS", WebhookSettings.dedup_ttl_seconds, int, 1),
                body_timeout_seconds=self.number(
                    "WEBHOOK_BODY_TIMEOUT_SECONDS", WebhookSettings.body_timeout_seconds, float, 0.1
                ),
                max_in_flight=self.number("WEBHOOK_MAX_IN_FLIGHT", WebhookSettings.max_in_flight, int, 1),
            ),
            receiver=ReceiverSettings(
                max_connections=self.number("RECEIVER_MAX_CONNECTIONS", ReceiverSettings.max_connections, int, 1),
                max_header_bytes=self.number("RECEIVER_MAX_HEADER_BYTES", ReceiverSettings.max_header_bytes, int, 1024),
                header_timeout_seconds=self.number(
                    "RECEIVER_HEADER_TIMEOUT_SECONDS", ReceiverSettings.header_timeout_seconds, float, 0.1
                ),
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
                recovery_interval_seconds=self.number(
                    "RECOVERY_INTERVAL_SECONDS", QueueSettings.recovery_interval_seconds, float, 0.5
                ),
                recovery_after_seconds=self.number(
                    "RECOVERY_AFTER_SECONDS", QueueSettings.recovery_after_seconds, float, 1.0
                ),
            ),
            runner=RunnerSettings(
                kind=runner,
                executor_key=self.secret("EXECUTOR_KEY"),
                remote_url_allowlist=self.allowlist("REMOTE_URL_ALLOWLIST"),
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
                templates_file=self.get(PREFIX + "KUBERNETES_TEMPLATES_FILE") or None,
                runtime_class=self.get(PREFIX + "KUBERNETES_RUNTIME_CLASS") or None,
                watch_pods=self.flag("KUBERNETES_WATCH_PODS", KubernetesSettings.watch_pods),
                ca_bundle_configmap=self.object_name("KUBERNETES_CA_BUNDLE_CONFIGMAP"),
            ),
            lifecycle=LifecycleSettings(
                idle_timeout_seconds=self.number(
                    "IDLE_TIMEOUT_SECONDS", LifecycleSettings.idle_timeout_seconds, float, 0.0
                ),
                workspace_retention_seconds=self.number(
                    "WORKSPACE_RETENTION_SECONDS", LifecycleSettings.workspace_retention_seconds, float, 0.0
                ),
                max_lifetime_seconds=self.number(
                    "MAX_LIFETIME_SECONDS", LifecycleSettings.max_lifetime_seconds, float, 0.0
                ),
                reconcile_interval_seconds=self.number(
                    "RECONCILE_INTERVAL_SECONDS", LifecycleSettings.reconcile_interval_seconds, float, 1.0
                ),
                full_sweep_interval_seconds=self.number(
                    "FULL_SWEEP_INTERVAL_SECONDS", LifecycleSettings.full_sweep_interval_seconds, float, 1.0
                ),
                prestart_agent_ids=self.words("PRESTART_AGENT_IDS"),
            ),
            metrics=self.metrics(),
            log_level=level,
        )
        self.check_credentials_differ(settings)
        return settings

    def text(self, name: str, default: str) -> str:
        value = self.get(PREFIX + name, "").strip()
        return value or default

    def flag(self, name: str, default: bool) -> bool:
        raw = self.get(PREFIX + name, "").strip().lower()
        if not raw:
            return default
        if raw in ("true", "1", "yes"):
            return True
        if raw in ("false", "0", "no"):
            return False
        self.problems.append(f"{PREFIX}{name} must be true or false, got {raw!r}")
        return default

    def object_name(self, name: str) -> str | None:
        """A Kubernetes object name (a DNS-1123 subdomain), or None when unset."""
        value = self.get(PREFIX + name, "").strip()
        if not value:
            return None
        if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
            self.problems.append(
                f"{PREFIX}{name} must be a Kubernetes object name (lower-case letters, digits, '-', '.'), got {value!r}"
            )
            return None
        return value

    def words(self, name: str) -> tuple[str, ...]:
        return tuple(w.strip() for w in self.get(PREFIX + name, "").split(",") if w.strip())

    def metrics(self) -> MetricsSettings:
        port = self.number("METRICS_PORT", MetricsSettings.port, int, 0)
        if port > 65535:
            self.problems.append(f"{PREFIX}METRICS_PORT must be at most 65535, got {port}")
        return MetricsSettings(port=port)

    def number(self, name: str, default: T, cast: Callable[[str], T], minimum: float) -> T:
        raw = self.get(PREFIX + name, "").strip()
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
        direct = self.get(PREFIX + name)
        path = self.get(PREFIX + name + "_FILE")
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
        value = self.raw_secret(name)
        if not value:
            return ()
        secrets, problems = parse_secrets(value)
        self.problems += [f"{PREFIX}{name}: {problem}" for problem in problems]
        return tuple(Secret(s) for s in secrets)

    def allowlist(self, name: str) -> tuple[str, ...]:
        """Host patterns (``trust.pattern_problem``), lower-cased; unset means the default."""
        patterns = tuple(p.lower() for p in self.words(name))
        if not patterns:
            if self.env.get(PREFIX + name, "").strip():
                self.problems.append(f"{PREFIX}{name} lists no host pattern")
            return DEFAULT_ALLOWLIST
        for pattern in patterns:
            problem = pattern_problem(pattern)
            if problem is not None:
                self.problems.append(f"{PREFIX}{name}: {problem}")
        return patterns

    def metadata_route(self) -> tuple[str | None, str | None]:
        raw = self.get(PREFIX + "ROUTE_METADATA", "").strip()
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


def _names_read() -> frozenset[str]:
    parser = _Parser({})
    parser.parse()
    return frozenset(parser.read)


KEYS: frozenset[str] = _names_read()
"""Every variable the parser reads (taken from a parse, not kept by hand)."""
