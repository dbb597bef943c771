"""Shared by the benchmark scripts: percentiles, the executor a loop on loopback runs, a
receiver process, and a runner that only lists (what a sweep asks of one)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from agents_simulator.dev import find_codex
from controller.model import Handle, Health
from tests.support.processes import Managed, python_module


def percentile(values: list[float], q: float) -> float:
    """The value at rank ``q`` (0..1) of ``values``, the nearest rank between first and last."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def executor() -> tuple[str, bool]:
    """The executor command: the real codex when installed (``scripts/test`` caches it), else
    the labelled stand-in; and whether it is the real codex."""
    codex = find_codex()
    return (codex or f"{sys.executable} -m agents_simulator.standin"), codex is not None


class Listing:
    """A runner as a sweep sees it: its sandboxes (all alive) and its kept workspaces, one
    listing each; the sweep asks nothing per sandbox."""

    def __init__(self, handles: Sequence[Handle] = (), workspaces: Sequence[str] = ()) -> None:
        self._handles, self._workspaces = list(handles), list(workspaces)

    def list_managed(self) -> list[Handle]:
        return list(self._handles)

    def workspaces(self) -> list[str]:
        return list(self._workspaces)

    def status(self, handle: Handle) -> Health:
        return Health.RUNNING if handle in self._handles else Health.GONE


def start_receiver(directory: Path, redis_url: str, secret: str, port: int) -> tuple[Managed, dict[str, str]]:
    """``sandbox-controller serve`` on 127.0.0.1:``port`` with Redis and one signing secret,
    logging warnings only (started), and the environment it was given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(CONTROLLER_REDIS_URL=redis_url, CONTROLLER_WEBHOOK_SECRETS=secret, CONTROLLER_LOG_LEVEL="WARNING")
    argv = python_module("controller", "serve", "--host", "127.0.0.1", "--port", str(port))
    return Managed("receiver", argv, env, directory / "receiver.log").start(), env
