"""Find the pinned ``codex`` binary (npm package ``@openai/codex``) for tests that run it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents_simulator.dev import CODEX_VERSION
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
