"""Find the pinned ``codex`` binary (npm package ``@openai/codex``) for tests that run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agents_simulator.codex_install import CODEX_VERSION
from agents_simulator.dev import codex_install_prefix as install_prefix

CODEX_PACKAGE = f"@openai/codex@{CODEX_VERSION}"


def install_command() -> str:
    return f"npm install --prefix {install_prefix()} {CODEX_PACKAGE}"


def codex_binary() -> str:
    """Path of the codex binary; skips the test (fails it under ``CI=true``) when missing."""
    override = os.environ.get("SANDBOX_CONTROLLER_CODEX")
    path = Path(override) if override else install_prefix() / "node_modules" / ".bin" / "codex"
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    source = "SANDBOX_CONTROLLER_CODEX" if override else "the cache"
    message = f"codex {CODEX_VERSION} not found at {path} (from {source}); install it with: {install_command()}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def start_exec_server(
    binary: str, remote_url: str, environment_id: str, key: str, directory: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """``codex exec-server`` in its own process group, the key only in its environment, its output
    in ``directory/codex-<environment>.log``; ``cwd`` is its working directory (a sandbox's
    workspace). The caller ends the whole group."""
    home = directory / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE")}
    env.update({"CODEX_API_KEY": key, "CODEX_HOME": str(home)})
    log = open(directory / f"codex-{environment_id}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [binary, "exec-server", "--remote", remote_url, "--environment-id", environment_id],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )
    finally:
        log.close()
