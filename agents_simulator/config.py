"""The simulator's settings: one frozen dataclass, secrets kept out of its repr."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

DEFAULT_HOST = "127.0.0.1"
DEFAULT_CONNECT_TIMEOUT_SECONDS = 300.0
DEFAULT_TURN_SECONDS = 1.0
# OpenAI-like delivery: exponential backoff from a few seconds, capped, for up to 72 hours.
DEFAULT_RETRY_INITIAL_SECONDS = 5.0
DEFAULT_RETRY_MAX_SECONDS = 3600.0
DEFAULT_RETRY_HORIZON_SECONDS = 72 * 3600.0
DEFAULT_RETRY_MAX_ATTEMPTS = 30
DEFAULT_WEBHOOK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class TlsListener:
    """A second listener serving the same API over TLS (the node tier's ``api.openai.com:443``)."""

    host: str
    port: int
    certfile: str
    keyfile: str = field(repr=False)


@dataclass(frozen=True)
class SimulatorConfig:
    """Everything the simulator needs; build it by hand or from ``cli.build_parser``."""

    port: int
    """TCP port served; also part of every session's ``remote_url``."""

    environment_key: str = field(repr=False)
    """The key an executor must present (``CODEX_API_KEY``) to register."""

    host: str = DEFAULT_HOST
    """Address to bind. Without ``public_url``, ``remote_url`` names a loopback host (codex sends
    its key only there or to ``https`` hosts under OpenAI's domains)."""

    public_url: str | None = None
    """What sessions name as ``remote_url`` (and where executors' WebSockets go) when the
    simulator stands in for the API under its public name, e.g. ``https://api.openai.com``
    served by ``tls`` at an address that name resolves to; otherwise its own loopback URL."""

    tls: TlsListener | None = None
    """Also serve the same API over TLS there (one engine, one state, both listeners)."""

    webhook_urls: tuple[str, ...] = ()
    """Where events are POSTed; empty means no webhooks are sent."""

    webhook_secret: str | None = field(default=None, repr=False)
    """Signing secret (``whsec_<base64>`` or a plain string); needed when URLs are given."""

    api_key: str | None = field(default=None, repr=False)
    """When set, the exact bearer token ``/v1`` calls must carry; otherwise any non-empty one."""

    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT_SECONDS
    """How long a session waits for its executor before it fails."""

    turn_seconds: float = DEFAULT_TURN_SECONDS
    """How long a simulated turn stays ``in_progress``."""

    webhook_retry_initial_seconds: float = DEFAULT_RETRY_INITIAL_SECONDS
    """First delay before re-sending a failed delivery; doubles on each further failure."""

    webhook_retry_max_seconds: float = DEFAULT_RETRY_MAX_SECONDS
    """Cap on one backoff delay."""

    webhook_retry_horizon_seconds: float = DEFAULT_RETRY_HORIZON_SECONDS
    """No attempt is started later than this after the event."""

    webhook_max_attempts: int = DEFAULT_RETRY_MAX_ATTEMPTS
    """Total attempts per delivery, the first included."""

    webhook_timeout_seconds: float = DEFAULT_WEBHOOK_TIMEOUT_SECONDS
    """Per-attempt timeout; a timeout counts as a failed attempt."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.port < 65536:
            problems.append("port must be between 1 and 65535")
        if not self.environment_key:
            problems.append("an environment key is required")
        if self.webhook_urls and not self.webhook_secret:
            problems.append("a webhook secret is required when webhook URLs are given")
        for url in self.webhook_urls:
            if not url.startswith(("http://", "https://")):
                problems.append(f"webhook URL must be http(s): {url}")
        if self.api_key is not None and not self.api_key:
            problems.append("the API key, when given, must not be empty")
        for name in (
            "connect_timeout_seconds",
            "turn_seconds",
            "webhook_retry_initial_seconds",
            "webhook_retry_max_seconds",
            "webhook_timeout_seconds",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative")
        if self.webhook_max_attempts < 1:
            problems.append("webhook_max_attempts must be at least 1")
        if self.public_url is not None and (
            not self.public_url.startswith(("http://", "https://")) or self.public_url.rstrip("/").count("/") != 2
        ):
            problems.append(f"public URL must be http(s)://host[:port] with no path: {self.public_url}")
        if self.tls is not None and not 0 < self.tls.port < 65536:
            problems.append("TLS port must be between 1 and 65535")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def base_url(self) -> str:
        """The sessions' ``remote_url``: ``public_url``, else the simulator's own URL on loopback."""
        if self.public_url:
            return self.public_url.rstrip("/")
        return f"http://{_loopback_host(self.host)}:{self.port}"

    @property
    def websocket_base_url(self) -> str:
        return "ws" + self.base_url[len("http") :]


def _loopback_host(host: str) -> str:
    """``host`` when it is a loopback name or address, else ``127.0.0.1``."""
    if host == "localhost":
        return host
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return DEFAULT_HOST
    if address.is_loopback:
        return f"[{host}]" if address.version == 6 else host
    return DEFAULT_HOST
