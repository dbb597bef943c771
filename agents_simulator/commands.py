"""Commands a simulated turn runs in the sandbox, and what came back.

The real API's turns are driven by a model that calls tools; the simulator's are scripted: a
turn may carry commands (``POST /admin/sessions/{id}/turns``), which it runs one after the
other over the executor's link (``harness.py``) in the session's workspace, recording stdout,
stderr, exit code and timing. A command that cannot run because the sandbox is not there
fails (``tool execution failed: …``) and the turn goes on, as the API's tool calls do; a
command whose link drops while it runs is marked ``interrupted`` and never started again. A
command may ask for Codex's own sandbox (``"sandbox": "workspace-write"`` or ``{"mode":
"read-only", "network": true}``, ``sandboxing.py``), as the API does for sessions with
automatic review; its result says what the executor reported (``sandbox_type``,
``sandbox_denied``).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agents_simulator.errors import bad_request
from agents_simulator.sandboxing import SandboxRequest, parse_sandbox
from agents_simulator.state import new_id

MAX_COMMANDS_PER_TURN = 20
MAX_KEPT_OUTPUT = 1024 * 1024  # bytes of stdout/stderr kept per command


class CommandStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"  # it ran; see exit_code
    FAILED = "failed"  # the tool call failed: no sandbox to run it in, or the executor refused
    INTERRUPTED = "interrupted"  # the link dropped while it ran: not run again
    CANCELLED = "cancelled"  # the turn was cancelled before it started


@dataclass(frozen=True)
class CommandSpec:
    argv: list[str]
    cwd: str | None = None  # default: the sandbox's workspace (the executor's working directory)
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 120.0
    sandbox: SandboxRequest | None = None  # None: unsandboxed, as process/start without "sandbox"


@dataclass
class CommandRun:
    spec: CommandSpec
    status: CommandStatus = CommandStatus.PENDING
    cwd: str | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_total: int = 0  # bytes that came back; at most MAX_KEPT_OUTPUT of them are kept
    stderr_total: int = 0
    exit_code: int | None = None
    sandbox_type: str | None = None  # as the executor reported it ("none": codex's own sandbox not used)
    sandbox_denied: bool | None = None  # the executor took the failure for a sandbox denial
    error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        duration = None
        if self.started_at is not None and self.finished_at is not None:
            duration = round(self.finished_at - self.started_at, 6)
        return {
            "argv": self.spec.argv,
            "status": self.status.value,
            "cwd": self.cwd,
            "stdout": self.stdout.decode(errors="replace"),
            "stderr": self.stderr.decode(errors="replace"),
            "stdout_base64": base64.b64encode(self.stdout).decode(),
            "stdout_bytes": self.stdout_total,
            "stderr_bytes": self.stderr_total,
            "output_truncated": self.stdout_total > len(self.stdout) or self.stderr_total > len(self.stderr),
            "exit_code": self.exit_code,
            "sandbox": self.spec.sandbox.to_json() if self.spec.sandbox else None,
            "sandbox_type": self.sandbox_type,
            "sandbox_denied": self.sandbox_denied,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_seconds": duration,
        }


@dataclass
class Turn:
    id: str
    session_id: str
    commands: list[CommandRun]
    created_at: float = field(default_factory=time.time)

    @property
    def finished(self) -> bool:
        return all(c.status not in (CommandStatus.PENDING, CommandStatus.RUNNING) for c in self.commands)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "simulator.turn",
            "session_id": self.session_id,
            "status": "finished" if self.finished else "pending",
            "created_at": self.created_at,
            "commands": [c.to_json() for c in self.commands],
        }


class TurnLog:
    """Scripted turns by session, in the order they were asked for."""

    def __init__(self) -> None:
        self._turns: dict[str, list[Turn]] = {}

    def add(self, session_id: str, specs: list[CommandSpec]) -> Turn:
        turn = Turn(new_id("turn"), session_id, [CommandRun(spec) for spec in specs])
        self._turns.setdefault(session_id, []).append(turn)
        return turn

    def of(self, session_id: str) -> list[Turn]:
        return list(self._turns.get(session_id, []))

    def pending(self, session_id: str) -> list[CommandRun]:
        """Commands not yet started, oldest turn first."""
        return [c for t in self._turns.get(session_id, []) for c in t.commands if c.status is CommandStatus.PENDING]

    def cancel(self, session_id: str) -> None:
        for command in self.pending(session_id):
            command.status = CommandStatus.CANCELLED
            command.error = "the turn was cancelled before the command started"

    def fail_pending(self, session_id: str, why: str) -> None:
        for command in self.pending(session_id):
            command.status = CommandStatus.FAILED
            command.error = f"tool execution failed: {why}"

    def forget(self, session_id: str) -> None:
        self._turns.pop(session_id, None)


def parse_commands(body: Any) -> list[CommandSpec]:
    """``{"commands": [{"argv": [...], "cwd"?, "env"?, "timeout_seconds"?, "sandbox"?} | [...argv]]}``."""
    raw = body.get("commands") if isinstance(body, dict) else None
    if not isinstance(raw, list) or not raw:
        raise bad_request("'commands' must be a non-empty list.", "commands")
    if len(raw) > MAX_COMMANDS_PER_TURN:
        raise bad_request(f"A turn may carry at most {MAX_COMMANDS_PER_TURN} commands.", "commands")
    return [parse_command(item) for item in raw]


def parse_command(item: Any) -> CommandSpec:
    if isinstance(item, list):
        item = {"argv": item}
    if not isinstance(item, dict):
        raise bad_request("Each command must be an argv list or an object with 'argv'.", "commands")
    argv = item.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise bad_request("'argv' must be a non-empty list of strings.", "commands.argv")
    cwd = item.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise bad_request("'cwd' must be an absolute path.", "commands.cwd")
    env = item.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise bad_request("'env' must map strings to strings.", "commands.env")
    timeout = item.get("timeout_seconds", 120.0)
    if not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise bad_request("'timeout_seconds' must be between 0 and 3600.", "commands.timeout_seconds")
    sandbox = parse_sandbox(item.get("sandbox"))
    return CommandSpec(argv=list(argv), cwd=cwd, env=dict(env), timeout_seconds=float(timeout), sandbox=sandbox)


def keep(output: bytes) -> bytes:
    return output[:MAX_KEPT_OUTPUT]
