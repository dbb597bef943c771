"""Typed settings, parsed once from ``CONTROLLER_*`` environment variables.

Every problem is collected and reported together (``ConfigError``). Units are in the names
(``…_SECONDS``, ``…_BYTES``); every number has a minimum and a maximum (``BOUNDS``, stated in
README's settings table). Secrets may also come from ``…_FILE`` paths (mounted Secrets, read
without ever blocking: ``files.read_small``); they are held as ``Secret`` whose ``repr``/``str``
is masked, and a credential inside any URL setting is masked too (``credentials``), so
printing settings is safe.

A new setting follows the same rules: a number goes through ``number(…, minimum, maximum)``
(and its range into README's row and values.schema.json: tests compare them); a secret through
``secret``/``secret_list`` (so ``…_FILE`` works and ``secret_values`` redacts it); a URL that
may carry a password needs nothing more (``describe``, ``repr`` and ``secret_values`` mask it
whichever field holds it); and a check a process makes at start belongs in
``wiring.preflight``, which ``check-config`` runs too.

``KEYS`` lists every variable the parser reads, recorded from a parse rather than kept by hand;
the Helm chart sets a subset of them (a test checks).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

from controller import files
from controller.credentials import mask_credentials, url_credentials, url_password
from controller.errors import ConfigError
from controller.signing import parse_secrets
from controller.trust import DEFAULT_ALLOWLIST, pattern_problem

PREFIX = "CONTROLLER_"
MAX_CA_FILE_BYTES = 16 * 1024 * 1024
"""A CA bundle is PEM text: a system's whole bundle is a few hundred KiB."""
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


class Printable:
    """``repr`` of a settings dataclass, safe to print: secrets masked, and so are the
    credentials of any URL a setting holds (``mask_credentials``), whichever field it is."""

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={_shown(getattr(self, f.name))!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{type(self).__name__}({shown})"


def _shown(value: Any) -> Any:
    if isinstance(value, str):
        return mask_credentials(value)
    if isinstance(value, tuple):
        return tuple(_shown(v) for v in value)
    return value


@dataclass(frozen=True, repr=False)
class WebhookSettings(Printable):
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


@dataclass(frozen=True, repr=False)
class ReceiverSettings(Printable):
    """Limits of the receiver's HTTP server, so slow or hostile clients stay cheap."""

    max_connections: int = 400
    """Open connections (or requests in progress, of any path); a request beyond this gets 503.
    A backstop on sockets: the body budget is ``WebhookSettings.max_in_flight``."""
    max_header_bytes: int = 16 * 1024
    """A request whose headers exceed this gets 431 and the connection is closed."""
    header_timeout_seconds: float = 10.0
    """A connection whose request headers are not complete this long after it opened (or after
    its previous response) is closed."""


@dataclass(frozen=True, repr=False)
class ApiSettings(Printable):
    base_url: str = "https://api.openai.com"
    """Agents API base (without ``/v1``)."""
    api_key: Secret | None = None
    """Key that reads sessions. Stays with the controller; never enters a sandbox (L2)."""
    timeout_seconds: float = 10.0
    max_attempts: int = 4
    """Short retries at the HTTP edge; the task retries for longer."""


@dataclass(frozen=True, repr=False)
class RoutingSettings(Printable):
    workspace_directory: str = "/workspace"
    """Only sessions whose environment.workspace_directory equals this are ours (L6)."""
    agent_ids: tuple[str, ...] = ()
    """If set, only sessions of these agents are ours."""
    metadata_key: str | None = None
    metadata_value: str | None = None
    """``CONTROLLER_ROUTE_METADATA=key=value``: only sessions carrying that metadata are ours."""


@dataclass(frozen=True, repr=False)
class QueueSettings(Printable):
    redis_url: str | None = None
    """Redis for the queue, de-duplication, leases and the session→sandbox mapping. With
    ``redis_sentinels`` it still gives the password and database; its host is the master's name
    (``redis://:PASSWORD@mymaster/0``)."""
    redis_sentinels: tuple[tuple[str, int], ...] = ()
    """Redis Sentinel addresses (``CONTROLLER_REDIS_SENTINELS``, comma-separated ``host:port``):
    every process asks them for the master and follows it through a failover."""
    redis_sentinel_master: str | None = None
    """The master's name at the sentinels (default: the host of ``redis_url``)."""
    redis_sentinel_password: Secret | None = None
    """The sentinels' own password (their ``requirepass``), if they have one."""
    redis_ca_file: str | None = None
    """CA bundle that signed the Redis server's (and the sentinels') TLS certificate, for a
    ``rediss://`` URL (default: the system's CAs)."""
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

    @property
    def redis_password_set(self) -> bool:
        """Whether connecting to Redis takes a password (in the URL's userinfo or ``?password=``)."""
        return self.redis_url is not None and url_password(self.redis_url) is not None


@dataclass(frozen=True, repr=False)
class RunnerSettings(Printable):
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
    and not group/world-writable, and unless every directory on the way is owned by root or
    the controller and writable by no one else but with the sticky bit (``runners/local.py``:
    ``state_directory_problems``), so a shared parent such as /tmp is safe."""
    local_executor_user: str = "nobody"
    """Local runner, worker running as root: the unprivileged user (name or uid) every executor
    runs as (unless ``local_executor_uids`` gives each its own)."""
    local_executor_uids: tuple[int, int] | None = None
    """Local runner, worker running as root: a range of uids (first, last), one per session
    that has a sandbox or a kept workspace, so executors are apart from each other too. None
    (the default): every executor runs as ``local_executor_user``."""
    local_executor_same_user: bool = False
    """Local runner: opt in to running executors as the worker's own uid (no separation from
    the controller's secrets; ``dev`` sets it). Required when the worker is not root."""
    local_idle_suspend: str = "stop"
    """Local runner: what the idle rule does to a sandbox (``CONTROLLER_IDLE_SUSPEND``): ``stop``
    (its processes end, its workspace stays) or ``checkpoint`` (its whole process tree is
    dumped with CRIU into the state directory and restored at the next connection request,
    ``runners/checkpoint.py``; a fresh start whenever that is impossible)."""
    criu: str = "criu"
    """The CRIU binary (``CONTROLLER_CRIU``: a path, or a name on PATH) for ``checkpoint``."""
    local_allow_redis_without_password: bool = False
    """Local runner: allow executors of another uid beside a Redis URL without a password (only
    when Redis is out of their reach: another host behind a firewall, a socket they cannot
    open). Without it such a worker refuses to start: the executors' code could otherwise use
    Redis as its admin (the queue, the leases, the mapping)."""


@dataclass(frozen=True, repr=False)
class KubernetesSettings(Printable):
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


@dataclass(frozen=True, repr=False)
class LifecycleSettings(Printable):
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
    prestart_max_sandboxes: int = 10
    """Pre-started sandboxes not yet used (no input came), at most: beyond it a creation starts
    nothing (a log line and ``controller_prestarts_skipped_total``). A session that asks for a
    connection is never held back by it."""
    deletion_confirm_seconds: float = 60.0
    """A session counts as deleted only once every read of it over this long answered 404 (at
    least three reads spread over the period, ``decide.SPREAD_READS``); until then its sandbox
    and workspace are kept. When most sessions read to confirm it answer 404 too, or there is
    none to compare with (a wrong key, project or base URL), nothing is released until an
    operator releases it (``sandbox-controller release``). 0: a 404 counts at once."""

    @property
    def prestarts(self) -> bool:
        """Whether any session may be pre-started (the receiver then enqueues creations)."""
        return bool(self.prestart_agent_ids)

    def prestarts_agent(self, agent_id: str | None) -> bool:
        return "*" in self.prestart_agent_ids or (agent_id is not None and agent_id in self.prestart_agent_ids)


@dataclass(frozen=True, repr=False)
class MetricsSettings(Printable):
    port: int = 0
    """Port of ``GET /metrics`` for workers and the scheduler (0, the default: not served; the
    Helm chart sets 9090). The receiver serves its own ``/metrics`` on its HTTP port."""


@dataclass(frozen=True, repr=False)
class Settings(Printable):
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
        """The effective settings as plain data, secrets and URL credentials masked."""
        return _describe_fields(self)

    def secret_values(self) -> list[str]:
        """Every secret's value and every credential a URL setting carries, for the log
        formatter to redact, so none can leak into a line (whichever setting holds it)."""
        return _secret_values(self)

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
IDLE_SUSPENDS = ("stop", "checkpoint")
DAY = 24 * 3600
MAX_UID = 2**32 - 2
"""The highest uid an executor may get (``2**32 - 1`` is ``(uid_t) -1``: "no change")."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser:
    """Reads variables, converting each once, collecting every problem."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.env = environ
        self.problems: list[str] = []
        self.read: set[str] = set()
        """Every variable name this parser looked up (so ``KEYS`` is what it really reads)."""
        self.bounds: dict[str, tuple[float, float]] = {}
        """Each numeric setting's (minimum, maximum), as ``number`` checks them (``BOUNDS``)."""
        self.defaults: dict[str, float | str | bool] = {}
        """Each number's, text's and flag's default, as the parser falls back to it (``DEFAULTS``)."""

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
        idle_suspend = self.text("IDLE_SUSPEND", RunnerSettings.local_idle_suspend).lower()
        if idle_suspend not in IDLE_SUSPENDS:
            self.problems.append(
                f"{PREFIX}IDLE_SUSPEND must be one of {', '.join(IDLE_SUSPENDS)}, got {idle_suspend!r}"
            )
        elif idle_suspend == "checkpoint" and runner != "local":
            self.problems.append(
                f"{PREFIX}IDLE_SUSPEND=checkpoint works with the local runner only; with {PREFIX}RUNNER={runner} "
                "an idle sandbox is stopped (docs/kubernetes.md says what checkpointing pods would need)"
            )
        level = self.text("LOG_LEVEL", "INFO").upper()
        if level not in LOG_LEVELS:
            self.problems.append(f"{PREFIX}LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        base_url = self.text("API_BASE_URL", ApiSettings.base_url).rstrip("/")
        if not base_url.startswith(("http://", "https://")):
            self.problems.append(f"{PREFIX}API_BASE_URL must start with http:// or https://")
        redis_url = self.get(PREFIX + "REDIS_URL") or None
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            self.problems.append(f"{PREFIX}REDIS_URL must be a redis://, rediss:// or unix:// URL")
        sentinels, sentinel_master, sentinel_password, ca_file = self.redis_connection(redis_url)
        settings = Settings(
            webhook=WebhookSettings(
                secrets=secrets,
                secrets_file=self.get(PREFIX + "WEBHOOK_SECRETS_FILE") or None,
                tolerance_seconds=self.number(
                    "WEBHOOK_TOLERANCE_SECONDS", WebhookSettings.tolerance_seconds, int, 1, 3600
                ),
                max_body_bytes=self.number(
                    "WEBHOOK_MAX_BODY_BYTES", WebhookSettings.max_body_bytes, int, 1024, 16 * 1024 * 1024
                ),
                dedup_ttl_seconds=self.number(
                    "WEBHOOK_DEDUP_TTL_SECONDS", WebhookSettings.dedup_ttl_seconds, int, 1, 30 * DAY
                ),
                body_timeout_seconds=self.number(
                    "WEBHOOK_BODY_TIMEOUT_SECONDS", WebhookSettings.body_timeout_seconds, float, 0.1, 300
                ),
                max_in_flight=self.number("WEBHOOK_MAX_IN_FLIGHT", WebhookSettings.max_in_flight, int, 1, 10_000),
            ),
            receiver=ReceiverSettings(
                max_connections=self.number(
                    "RECEIVER_MAX_CONNECTIONS", ReceiverSettings.max_connections, int, 1, 100_000
                ),
                max_header_bytes=self.number(
                    "RECEIVER_MAX_HEADER_BYTES", ReceiverSettings.max_header_bytes, int, 1024, 1024 * 1024
                ),
                header_timeout_seconds=self.number(
                    "RECEIVER_HEADER_TIMEOUT_SECONDS", ReceiverSettings.header_timeout_seconds, float, 0.1, 300
                ),
            ),
            api=ApiSettings(
                base_url=base_url,
                api_key=self.secret("API_KEY"),
                timeout_seconds=self.number("API_TIMEOUT_SECONDS", ApiSettings.timeout_seconds, float, 0.1, 600),
                max_attempts=self.number("API_MAX_ATTEMPTS", ApiSettings.max_attempts, int, 1, 20),
            ),
            routing=RoutingSettings(
                workspace_directory=workspace,
                agent_ids=self.words("AGENT_IDS"),
                metadata_key=metadata_key,
                metadata_value=metadata_value,
            ),
            queue=QueueSettings(
                redis_url=redis_url,
                redis_sentinels=sentinels,
                redis_sentinel_master=sentinel_master,
                redis_sentinel_password=sentinel_password,
                redis_ca_file=ca_file,
                lease_ttl_seconds=self.number("LEASE_TTL_SECONDS", QueueSettings.lease_ttl_seconds, float, 1.0, 3600),
                visibility_timeout_seconds=self.number(
                    "QUEUE_VISIBILITY_TIMEOUT_SECONDS", QueueSettings.visibility_timeout_seconds, int, 1, DAY
                ),
                task_max_retries=self.number("TASK_MAX_RETRIES", QueueSettings.task_max_retries, int, 0, 10_000),
                recovery_interval_seconds=self.number(
                    "RECOVERY_INTERVAL_SECONDS", QueueSettings.recovery_interval_seconds, float, 0.5, 3600
                ),
                recovery_after_seconds=self.number(
                    "RECOVERY_AFTER_SECONDS", QueueSettings.recovery_after_seconds, float, 1.0, DAY
                ),
            ),
            runner=RunnerSettings(
                kind=runner,
                executor_key=self.secret("EXECUTOR_KEY"),
                remote_url_allowlist=self.allowlist("REMOTE_URL_ALLOWLIST"),
                executor_command=self.command("EXECUTOR_COMMAND", RunnerSettings.executor_command),
                executor_grace_seconds=self.number(
                    "EXECUTOR_GRACE_SECONDS", RunnerSettings.executor_grace_seconds, float, 1.0, 3600
                ),
                local_state_directory=self.text("LOCAL_STATE_DIRECTORY", RunnerSettings.local_state_directory),
                local_executor_user=self.text("LOCAL_EXECUTOR_USER", RunnerSettings.local_executor_user),
                local_executor_uids=self.uid_range("LOCAL_EXECUTOR_UIDS"),
                local_executor_same_user=self.flag("LOCAL_EXECUTOR_SAME_USER", RunnerSettings.local_executor_same_user),
                local_allow_redis_without_password=self.flag(
                    "LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD", RunnerSettings.local_allow_redis_without_password
                ),
                local_idle_suspend=idle_suspend,
                criu=self.text("CRIU", RunnerSettings.criu),
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
                    "IDLE_TIMEOUT_SECONDS", LifecycleSettings.idle_timeout_seconds, float, 0.0, 30 * DAY
                ),
                workspace_retention_seconds=self.number(
                    "WORKSPACE_RETENTION_SECONDS", LifecycleSettings.workspace_retention_seconds, float, 0.0, 365 * DAY
                ),
                max_lifetime_seconds=self.number(
                    "MAX_LIFETIME_SECONDS", LifecycleSettings.max_lifetime_seconds, float, 0.0, 365 * DAY
                ),
                reconcile_interval_seconds=self.number(
                    "RECONCILE_INTERVAL_SECONDS", LifecycleSettings.reconcile_interval_seconds, float, 1.0, DAY
                ),
                full_sweep_interval_seconds=self.number(
                    "FULL_SWEEP_INTERVAL_SECONDS", LifecycleSettings.full_sweep_interval_seconds, float, 1.0, 7 * DAY
                ),
                prestart_agent_ids=self.words("PRESTART_AGENT_IDS"),
                prestart_max_sandboxes=self.number(
                    "PRESTART_MAX_SANDBOXES", LifecycleSettings.prestart_max_sandboxes, int, 0, 10_000
                ),
                deletion_confirm_seconds=self.number(
                    "DELETION_CONFIRM_SECONDS", LifecycleSettings.deletion_confirm_seconds, float, 0.0, 86_400
                ),
            ),
            metrics=self.metrics(),
            log_level=level,
        )
        self.check_credentials_differ(settings)
        self.check_executor_identity(settings.runner)
        return settings

    def text(self, name: str, default: str) -> str:
        self.defaults[PREFIX + name] = default
        value = self.get(PREFIX + name, "").strip()
        return value or default

    def command(self, name: str, default: str) -> str:
        """A command line, split as the runner splits it (``shlex``): an unbalanced quote is a
        problem here, not a crash in every task."""
        value = self.text(name, default)
        try:
            parts = shlex.split(value)
            if not parts or not parts[0]:
                raise ValueError("it names no program")
        except ValueError as exc:
            self.problems.append(f"{PREFIX}{name} is not a command line ({exc})")
        return value

    def uid_range(self, name: str) -> tuple[int, int] | None:
        """``FIRST-LAST``, inclusive: uids an executor may run as (never 0, never the ``-1``
        that means "unchanged" to the kernel)."""
        raw = self.get(PREFIX + name, "").strip()
        if not raw:
            return None
        first, dash, last = raw.partition("-")
        if not dash or not first.strip().isdigit() or not last.strip().isdigit():
            self.problems.append(f"{PREFIX}{name} must look like FIRST-LAST (e.g. 200000-299999), got {raw!r}")
            return None
        low, high = int(first), int(last)
        if not 1 <= low <= high <= MAX_UID:
            self.problems.append(f"{PREFIX}{name} must satisfy 1 <= FIRST <= LAST <= {MAX_UID}, got {raw!r}")
            return None
        return low, high

    def check_executor_identity(self, runner: RunnerSettings) -> None:
        """One way to say who executors run as."""
        if runner.local_executor_uids is None:
            return
        if runner.local_executor_same_user:
            self.problems.append(f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_SAME_USER=true, not both")
        if self.env.get(PREFIX + "LOCAL_EXECUTOR_USER", "").strip():
            self.problems.append(f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_USER, not both")

    def flag(self, name: str, default: bool) -> bool:
        self.defaults[PREFIX + name] = default
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
        return MetricsSettings(port=self.number("METRICS_PORT", MetricsSettings.port, int, 0, 65535))

    def number(self, name: str, default: T, cast: Callable[[str], T], minimum: float, maximum: float) -> T:
        """A number within ``[minimum, maximum]`` (both documented in README's settings table:
        ``BOUNDS``). Every number has a maximum: an absurd one (``1e20`` seconds) would pass
        parsing and then break at run time (a Redis expiry out of range, every delivery 503)."""
        assert minimum <= default <= maximum, name  # type: ignore[operator]  # a default out of its own range is a bug
        self.bounds[PREFIX + name] = (minimum, maximum)
        self.defaults[PREFIX + name] = default  # type: ignore[assignment]  # T is a number here
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
            self.problems.append(f"{PREFIX}{name} must be at least {number_text(minimum)}, got {raw!r}")
        elif value > maximum:  # type: ignore[operator]
            self.problems.append(f"{PREFIX}{name} must be at most {number_text(maximum)}, got {raw!r}")
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
                # Never blocks (a FIFO is refused, not waited on) and never echoes the content.
                return files.read_small(path).strip() or None
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
        where = f"{PREFIX}{name}_FILE" if self.env.get(PREFIX + name + "_FILE") else f"{PREFIX}{name}"
        self.problems += [f"{where}: {problem}" for problem in problems]
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

    def redis_connection(
        self, url: str | None
    ) -> tuple[tuple[tuple[str, int], ...], str | None, Secret | None, str | None]:
        """Sentinel addresses, the master's name, the sentinels' password and the TLS CA file."""
        sentinels = tuple(p for p in (self.address("REDIS_SENTINELS", w) for w in self.words("REDIS_SENTINELS")) if p)
        master = self.get(PREFIX + "REDIS_SENTINEL_MASTER", "").strip() or None
        password = self.secret("REDIS_SENTINEL_PASSWORD")
        ca_file = self.get(PREFIX + "REDIS_CA_FILE", "").strip() or None
        scheme = (url or "").partition("://")[0]
        host = _url_host(url or "")
        if sentinels:
            if scheme == "unix":
                self.problems.append(f"{PREFIX}REDIS_SENTINELS needs a redis:// or rediss:// {PREFIX}REDIS_URL")
            elif url and master and host and host != master:
                self.problems.append(
                    f"{PREFIX}REDIS_SENTINEL_MASTER is {master!r} but {PREFIX}REDIS_URL names {host!r}: with "
                    "sentinels the URL's host is the master's name (they must agree)"
                )
            elif url and not (master or host):
                self.problems.append(
                    f"{PREFIX}REDIS_SENTINEL_MASTER (or the host of {PREFIX}REDIS_URL) must name the master"
                )
            master = master or host or None
        elif master or password:
            self.problems.append(
                f"{PREFIX}REDIS_SENTINEL_MASTER and {PREFIX}REDIS_SENTINEL_PASSWORD need {PREFIX}REDIS_SENTINELS"
            )
        if ca_file:
            if url and scheme != "rediss":
                self.problems.append(f"{PREFIX}REDIS_CA_FILE is for TLS: {PREFIX}REDIS_URL must be a rediss:// URL")
            try:  # a regular file, read without blocking (a FIFO is refused, not waited on)
                files.read_small(ca_file, limit=MAX_CA_FILE_BYTES)
            except OSError as exc:
                self.problems.append(f"{PREFIX}REDIS_CA_FILE: cannot read {ca_file}: {exc.strerror}")
        return sentinels, master, password, ca_file

    def address(self, name: str, text: str) -> tuple[str, int] | None:
        """``host:port`` (``[v6]:port`` for an IPv6 address), or None with the problem noted."""
        host, sep, port = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            self.problems.append(f"{PREFIX}{name}: {text!r} is not host:port")
            return None
        return host, int(port)

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
    if isinstance(value, Secret):
        return str(value)
    if isinstance(value, str):
        return mask_credentials(value)  # any setting, present or future, that holds a URL
    if is_dataclass(value) and not isinstance(value, type):
        return _describe_fields(value)
    if isinstance(value, tuple):
        return [_describe(v) for v in value]
    return value


def _secret_values(value: Any) -> list[str]:
    if isinstance(value, Secret):
        return [value.reveal()]
    if isinstance(value, str):
        return url_credentials(value)
    if is_dataclass(value) and not isinstance(value, type):
        return [found for f in fields(value) for found in _secret_values(getattr(value, f.name))]
    if isinstance(value, tuple):
        return [found for item in value for found in _secret_values(item)]
    return []


def _describe_fields(value: Any) -> dict[str, Any]:
    described: dict[str, Any] = {f.name: _describe(getattr(value, f.name)) for f in fields(value)}
    return described


def number_text(value: float) -> str:
    """A bound as README writes it: ``300``, ``0.1``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _url_host(url: str) -> str:
    """The host of a URL as written (case kept: a Sentinel master's name is case-sensitive)."""
    host = urlsplit(url).netloc.rpartition("@")[2]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() and not host.endswith("]") else host


def _parse_nothing() -> _Parser:
    parser = _Parser({})
    parser.parse()
    return parser


KEYS: frozenset[str] = frozenset(_parse_nothing().read)
"""Every variable the parser reads (taken from a parse, not kept by hand)."""
BOUNDS: Mapping[str, tuple[float, float]] = dict(_parse_nothing().bounds)
"""Every numeric setting's (minimum, maximum) (taken from a parse; README states each one)."""
DEFAULTS: Mapping[str, float | str | bool] = dict(_parse_nothing().defaults)
"""Every number's, text's and flag's default (taken from a parse; README's table states each one)."""
