"""All the sections together (``Settings``), what each process role needs of them, and the
parser that reads them in one pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.config import api, kubernetes, lifecycle, metrics, node_agent, queue, receiver, runner
from controller.config.api import ApiSettings, RoutingSettings
from controller.config.kubernetes import KubernetesSettings
from controller.config.lifecycle import LifecycleSettings
from controller.config.masked import Printable, describe_fields, secret_values
from controller.config.metrics import MetricsSettings
from controller.config.node_agent import NodeAgentSettings
from controller.config.queue import QueueSettings
from controller.config.reader import PREFIX, Reader
from controller.config.receiver import ReceiverSettings, WebhookSettings
from controller.config.runner import RunnerSettings
from controller.errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True, repr=False)
class Settings(Printable):
    webhook: WebhookSettings = field(default_factory=WebhookSettings)
    receiver: ReceiverSettings = field(default_factory=ReceiverSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    node_agent: NodeAgentSettings = field(default_factory=NodeAgentSettings)
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return _Parser(environ).settings()

    def describe(self) -> dict[str, Any]:
        """The effective settings as plain data, secrets and URL credentials masked."""
        return describe_fields(self)

    def secret_values(self) -> list[str]:
        """Every secret's value and every credential a URL setting carries, for the log
        formatter to redact, so none can leak into a line (whichever setting holds it)."""
        return secret_values(self)

    def require(self, role: str) -> None:
        """Check what a given process role needs; raise ConfigError listing every gap."""
        problems = []
        needs = {
            "serve": ["redis", "secrets"],
            "worker": ["redis", "api_key", "executor_key"],
            "scheduler": ["redis", "executor_key"],
            "dev": ["secrets", "api_key", "executor_key"],
            "webhook": ["api_key"],
            "node-agent": ["node"],
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
        if "node" in needs and not self.node_agent.node_name:
            problems.append(f"{PREFIX}NODE_AGENT_NODE_NAME is required for `{role}` (the chart gives spec.nodeName)")
        if "node" in needs and not self.node_agent.kubelet_url:
            problems.append(f"{PREFIX}NODE_AGENT_KUBELET_URL is required for `{role}` (https://<node address>:10250)")
        if problems:
            raise ConfigError(problems)


class _Parser(Reader):
    """Reads every section, collecting every problem; ``settings`` raises them together."""

    def settings(self) -> Settings:
        settings = self.parse()
        # The parser reads every name whatever the environment holds: any other one is unknown.
        unknown = sorted(k for k in self.env if k.startswith(PREFIX) and k not in KEYS | self.read)
        self.problems[:0] = [f"{key} is not a known setting (typo?)" for key in unknown]
        if self.problems:
            raise ConfigError(self.problems)
        return settings

    def parse(self) -> Settings:
        # The order of the reads is the order problems are reported in (tests state it): first
        # the values other checks depend on or that name a choice, then section by section.
        secrets = receiver.signing_secrets(self)
        metadata = api.metadata_route(self)
        workspace = api.workspace_directory(self)
        kind = runner.kind(self)
        idle_suspend = runner.idle_suspend(self, kind)
        level = self.text("LOG_LEVEL", "INFO").upper()
        if level not in LOG_LEVELS:
            self.problems.append(f"{PREFIX}LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        base_url = api.base_url(self)
        redis_url = queue.redis_url(self)
        connection = queue.redis_connection(self, redis_url)
        settings = Settings(
            webhook=receiver.webhook(self, secrets),
            receiver=receiver.receiver(self),
            api=api.api(self, base_url),
            routing=api.routing(self, workspace, metadata),
            queue=queue.queue(self, redis_url, connection),
            runner=runner.runner(self, kind, idle_suspend),
            kubernetes=kubernetes.kubernetes(self),
            lifecycle=lifecycle.lifecycle(self),
            metrics=metrics.metrics(self),
            node_agent=node_agent.node_agent(self),
            log_level=level,
        )
        runner.check_keys_differ(self, settings.api.api_key, settings.runner.executor_key)
        runner.check_executor_identity(self, settings.runner)
        return settings


def _parse(environ: Mapping[str, str]) -> _Parser:
    parser = _Parser(environ)
    parser.parse()
    return parser


def read_by(environ: Mapping[str, str]) -> frozenset[str]:
    """The variables a parse of ``environ`` reads: whatever it holds, the same names (``KEYS``)."""
    return frozenset(_parse(environ).read)


KEYS: frozenset[str] = read_by({})
"""Every variable the parser reads (taken from a parse, not kept by hand)."""
BOUNDS: Mapping[str, tuple[float, float]] = dict(_parse({}).bounds)
"""Every numeric setting's (minimum, maximum) (taken from a parse; README states each one)."""
DEFAULTS: Mapping[str, float | str | bool] = dict(_parse({}).defaults)
"""Every number's, text's and flag's default (taken from a parse; README's table states each one)."""
