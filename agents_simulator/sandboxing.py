"""A command's request for Codex's own sandbox, and how ``process/start`` carries it.

The API asks the executor for a sandboxed process (sessions with automatic review run their
commands so) by adding a ``sandbox`` object to ``process/start``; the executor wraps the
command in its Linux sandbox (bubblewrap namespaces, a read-only ``/``, seccomp), answers
``sandboxType: "linuxSeccomp"`` instead of ``"none"``, and says in ``process/exited`` whether
it took the failure for a sandbox denial (``sandboxDenied``). The wire shape below is the one
codex 0.171.0 accepts (docs/executor-protocol.md, "Sandboxed processes"):

- ``permissions``: a managed permission profile, ``{"type": "managed", "file_system":
  {"type": "restricted", "entries": [...]}, "network": "restricted" | "enabled"}``; an entry
  is ``{"path": {"type": "special", "value": {"kind": "root" | "project_roots" | "slash_tmp"
  | "tmpdir"}}, "access": "read" | "write"}``;
- ``cwd`` and ``workspaceRoots``: ``file://`` URIs; ``project_roots`` resolves to the latter;
- ``windowsSandboxLevel``: required even on Linux (``"disabled"``).

``workspace-write`` is what Codex itself builds for that mode: everything readable, the
workspace, ``/tmp`` and ``$TMPDIR`` writable. ``read-only``: everything readable, nothing
writable.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agents_simulator.errors import bad_request


class SandboxMode(StrEnum):
    WORKSPACE_WRITE = "workspace-write"
    READ_ONLY = "read-only"


@dataclass(frozen=True)
class SandboxRequest:
    mode: SandboxMode
    network: bool = False  # outbound network inside the sandbox

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "network": self.network}


def _special(kind: str, access: str) -> dict[str, Any]:
    return {"path": {"type": "special", "value": {"kind": kind}}, "access": access}


def process_sandbox(request: SandboxRequest, workspace_uri: str) -> dict[str, Any]:
    """The ``sandbox`` parameter of ``process/start`` for ``request``, rooted at the workspace."""
    entries = [_special("root", "read")]
    if request.mode is SandboxMode.WORKSPACE_WRITE:
        entries += [_special("project_roots", "write"), _special("slash_tmp", "write"), _special("tmpdir", "write")]
    return {
        "permissions": {
            "type": "managed",
            "file_system": {"type": "restricted", "entries": entries},
            "network": "enabled" if request.network else "restricted",
        },
        "cwd": workspace_uri,
        "workspaceRoots": [workspace_uri],
        "windowsSandboxLevel": "disabled",
    }


def parse_sandbox(value: Any) -> SandboxRequest | None:
    """``null`` | ``"workspace-write"`` | ``"read-only"`` | ``{"mode": …, "network": bool}``."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"mode": value}
    if not isinstance(value, dict):
        raise bad_request("'sandbox' must be a mode or an object with 'mode'.", "commands.sandbox")
    modes = [m.value for m in SandboxMode]
    if value.get("mode") not in modes:
        raise bad_request(f"'sandbox.mode' must be one of {', '.join(modes)}.", "commands.sandbox.mode")
    network = value.get("network", False)
    if not isinstance(network, bool):
        raise bad_request("'sandbox.network' must be true or false.", "commands.sandbox.network")
    return SandboxRequest(SandboxMode(value["mode"]), network)
