"""The Agents API sections: how the controller reads sessions (``ApiSettings``) and which
sessions are its own (``RoutingSettings``, L6)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable, Secret
from controller.config.reader import PREFIX, Reader


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


def base_url(r: Reader) -> str:
    url = r.text("API_BASE_URL", ApiSettings.base_url).rstrip("/")
    if not url.startswith(("http://", "https://")):
        r.problems.append(f"{PREFIX}API_BASE_URL must start with http:// or https://")
    return url


def api(r: Reader, url: str) -> ApiSettings:
    return ApiSettings(
        base_url=url,
        api_key=r.secret("API_KEY"),
        timeout_seconds=r.number("API_TIMEOUT_SECONDS", ApiSettings.timeout_seconds, float, 0.1, 600),
        max_attempts=r.number("API_MAX_ATTEMPTS", ApiSettings.max_attempts, int, 1, 20),
    )


def metadata_route(r: Reader) -> tuple[str | None, str | None]:
    raw = r.get(PREFIX + "ROUTE_METADATA", "").strip()
    if not raw:
        return None, None
    key, sep, value = raw.partition("=")
    if not sep or not key.strip():
        r.problems.append(f"{PREFIX}ROUTE_METADATA must look like key=value, got {raw!r}")
        return None, None
    return key.strip(), value.strip()


def workspace_directory(r: Reader) -> str:
    workspace = r.text("WORKSPACE_DIRECTORY", RoutingSettings.workspace_directory)
    if not workspace.startswith("/"):
        r.problems.append(f"{PREFIX}WORKSPACE_DIRECTORY must be an absolute path, got {workspace!r}")
    return workspace


def routing(r: Reader, workspace: str, metadata: tuple[str | None, str | None]) -> RoutingSettings:
    return RoutingSettings(
        workspace_directory=workspace,
        agent_ids=r.words("AGENT_IDS"),
        metadata_key=metadata[0],
        metadata_value=metadata[1],
    )
