"""The system under chaos, from real parts on loopback (``tests/system/loop.py``'s ``Loop``):
redis-server with its append-only file, the simulator sending signed webhooks to both of 2
receivers, 2 Celery workers, 2 schedulers (one active, one standing by), the local runner with
the real ``codex exec-server`` (or the labelled stand-in when codex is not installed).

Its settings are short so that a few minutes hold many idle stops, grace periods and sweeps;
settings the controller does not know are left out (``controller.config.KEYS``), so that a
seed can be replayed against an older controller. Processes
are known by name (``worker0``, ``scheduler1``, ``receiver0``, ``redis``), killed and started
again with the same command line, or with their wall clock moved (``tests/support/faketime.py``:
a preloaded shim that shifts the wall clock and leaves the monotonic one, sleeps and timeouts
alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agents_simulator.dev import find_codex
from controller.config import KEYS
from tests.chaos.schedule import DELETION_CONFIRM_SECONDS, GRACE_SECONDS
from tests.support.processes import Managed, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer
from tests.system.loop import Loop

IDLE_TIMEOUT_SECONDS = 20.0
CHECKPOINT_IDLE_TIMEOUT_SECONDS = 10.0
"""The idle timeout of a world that checkpoints its idle sandboxes (``schedule.CHECKPOINT_FAULTS``):
shorter, so that one run holds many suspensions and restores."""
VOLUME_MIB = 768
"""The state volume of a world that checkpoints: a tmpfs of this size, so that images and
workspaces share a known room (checkpoint images capped at the default 25 %: 192 MiB)."""
API_TIMEOUT_SECONDS = 2.0
API_HOLD_SECONDS = 5.0
"""How long an ``api-timeout`` fault holds an answer: past the controller's API timeout."""
PRESTART_BUDGET = 3
PRESTART_AGENT = "agent_chaos_prestart"
TURN_SECONDS = 2.0
CONNECT_MARGIN_SECONDS = 900.0
"""The simulator's connect deadline is the run's schedule plus this (its quiet end and teardown)."""
LEASE_TTL_SECONDS = 10.0
"""A session's lease lapses after this long without renewal (invariant 10 judges from it)."""
RECONCILE_INTERVAL_SECONDS = 3.0
FULL_SWEEP_INTERVAL_SECONDS = 10.0
MARKER = "chaos-marker"
"""The file each turn's command reads and extends in the session's workspace."""

SETTINGS = {
    "CONTROLLER_EXECUTOR_GRACE_SECONDS": f"{GRACE_SECONDS:g}",
    "CONTROLLER_IDLE_TIMEOUT_SECONDS": f"{IDLE_TIMEOUT_SECONDS:g}",
    "CONTROLLER_FULL_SWEEP_INTERVAL_SECONDS": f"{FULL_SWEEP_INTERVAL_SECONDS:g}",
    "CONTROLLER_API_TIMEOUT_SECONDS": f"{API_TIMEOUT_SECONDS:g}",
    "CONTROLLER_API_MAX_ATTEMPTS": "3",
    "CONTROLLER_LEASE_TTL_SECONDS": f"{LEASE_TTL_SECONDS:g}",
    "CONTROLLER_PRESTART_AGENT_IDS": PRESTART_AGENT,
    # Issue 16's; left out when the schedule is replayed against a controller from before it.
    "CONTROLLER_DELETION_CONFIRM_SECONDS": f"{DELETION_CONFIRM_SECONDS:g}",
    "CONTROLLER_PRESTART_MAX_SANDBOXES": str(PRESTART_BUDGET),
}


def settings(criu: str | None = None, max_lifetime: float | None = None) -> tuple[dict[str, str | None], list[str]]:
    """The chaos settings the controller knows, and the names of those it does not (yet). With
    ``criu`` (a CRIU binary), idle sandboxes are checkpointed with it, at a shorter idle timeout;
    with ``max_lifetime``, every sandbox's lineage has that maximum lifetime."""
    wanted = dict(SETTINGS)
    if max_lifetime is not None:
        wanted["CONTROLLER_MAX_LIFETIME_SECONDS"] = f"{max_lifetime:g}"
    if criu is not None:
        wanted.update(
            CONTROLLER_IDLE_SUSPEND="checkpoint",
            CONTROLLER_CRIU=criu,
            CONTROLLER_IDLE_TIMEOUT_SECONDS=f"{CHECKPOINT_IDLE_TIMEOUT_SECONDS:g}",
        )
    known = {k: v for k, v in wanted.items() if k in KEYS}
    return dict(known), sorted(set(wanted) - set(known))


def executor_command() -> tuple[str, bool]:
    """The real codex when installed (``scripts/test`` caches it), else the labelled stand-in;
    and whether it is the real codex."""
    override = os.environ.get("SANDBOX_CONTROLLER_CODEX")
    codex = override if override and os.access(override, os.X_OK) else find_codex()
    return (codex or f"{sys.executable} -m agents_simulator.standin"), codex is not None


SKEW_VARIABLES = ("LD_PRELOAD", "SKEW_CLOCK_SECONDS")
"""What ``faketime.skewed`` sets (a test checks): removed when a process gets the true time back."""


def clock_offsets(env: dict[str, str]) -> tuple[float, float]:
    """How far ``time.time()`` and ``time.monotonic()`` of a Python process started with ``env``
    are from ours (it sleeps 0.1 s on the way, as a worker's loops do)."""
    before = time.time(), time.monotonic()
    output = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.1); print(time.time(), time.monotonic() - 0.1)"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    after = time.time(), time.monotonic()
    wall, monotonic = (float(x) for x in output.split())
    return wall - (before[0] + after[0]) / 2, monotonic - (before[1] + after[1]) / 2


class ChaosWorld(Loop):
    def __init__(
        self,
        directory: Path,
        executor: str,
        role_flip: bool = False,
        run_seconds: float = 0.0,
        criu: str | None = None,
        max_lifetime: float | None = None,
    ) -> None:
        """``criu``: checkpoint idle sandboxes with this CRIU binary; ``max_lifetime``: every
        sandbox's maximum lifetime (``settings``)."""
        known, self.unknown_settings = settings(criu, max_lifetime)
        self.idle_timeout_seconds = float(known.get("CONTROLLER_IDLE_TIMEOUT_SECONDS") or IDLE_TIMEOUT_SECONDS)
        self.checkpoints = criu is not None
        self.volume: Path | None = None
        """The tmpfs the state directory is on, while mounted (a world that checkpoints)."""
        self.connect_timeout_seconds = run_seconds + CONNECT_MARGIN_SECONDS
        """The simulator's connect deadline: past the whole run, so a request the controller
        lost stays pending (invariants 2 and 5) instead of turning the session "failed"."""
        self.executor_link: Path | None = None
        """A link to the executor binary the controller runs (the executor-missing fault moves
        it away for a while); None when the executor is not one file (the stand-in)."""
        if Path(executor).is_file():
            self.executor_link = directory / "bin" / Path(executor).name
            self.executor_link.parent.mkdir(parents=True, exist_ok=True)
            self.executor_link.symlink_to(executor)
            executor = str(self.executor_link)
        super().__init__(directory, executor, extra_env=known)
        self.standby: Managed | None = None
        self.replica = RedisServer(directory / "replica", replica_of=self.redis) if role_flip else None
        """A live replica of the main redis, for role flips: a failover promotes it and makes the
        main one its replica for a while, then fails back (the workers keep the main one's address)."""

    def simulator_options(self) -> list[str]:
        options = []
        for port in self.receiver_ports:  # every event reaches both receivers: concurrent copies
            options += ["--webhook-url", f"http://127.0.0.1:{port}/webhooks"]
        return [
            *options,
            "--turn-seconds",
            f"{TURN_SECONDS:g}",
            "--webhook-retry-initial-seconds",
            "0.5",
            "--webhook-retry-max-seconds",
            "2",
            "--connect-timeout-seconds",
            f"{self.connect_timeout_seconds:g}",
        ]

    def start(self) -> ChaosWorld:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.checkpoints:
            self._mount_volume()
        super().start()
        self.standby = Managed(
            "scheduler1",
            python_module("controller", "scheduler"),
            {**self.controller_env(), "CONTROLLER_RECONCILE_INTERVAL_SECONDS": f"{RECONCILE_INTERVAL_SECONDS:g}"},
            self.directory / "scheduler1.log",
        ).start()
        if self.replica is not None:
            self.replica.start()
        return self

    def stop(self) -> None:
        try:
            if self.standby is not None:
                self.standby.stop()
            if self.replica is not None:
                self.replica.stop()
        finally:
            try:
                super().stop()
            finally:
                if self.volume is not None:
                    subprocess.run(["umount", "-l", str(self.volume)], check=False, capture_output=True)
                    self.volume = None

    def _mount_volume(self) -> None:
        """The state directory on a tmpfs of ``VOLUME_MIB`` (root: a world that checkpoints is)."""
        volume = self.directory / "volume"
        volume.mkdir(exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MIB}m,mode=0700", "tmpfs", str(volume)],
            check=True,
            capture_output=True,
            text=True,
        )
        self.volume = volume
        self.state_directory = volume / "sandboxes"

    # -- processes by name -------------------------------------------------------------------

    def process(self, name: str) -> Managed:
        kind, index = name.rstrip("0123456789"), int(name[-1])
        if kind == "worker":
            return self.workers[index]
        if kind == "receiver":
            return self.receivers[index]
        if kind == "scheduler":
            found = self.scheduler if index == 0 else self.standby
            assert found is not None
            return found
        raise ValueError(f"no process named {name!r}")

    def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start a stopped (or killed) process again with its command line; ``env`` replaces
        the skew variables (none given: its clock is the true one). Returns once it is ready."""
        process = self.process(name)
        for key in SKEW_VARIABLES:
            process.env.pop(key, None)
        process.env.update(env or {})
        offset = process.log_path.stat().st_size if process.log_path.exists() else 0
        process.start()
        self.wait_ready(name, offset)

    def wait_ready(self, name: str, offset: int, timeout: float = 60.0) -> None:
        process = self.process(name)
        if name.startswith("receiver"):
            port = self.receiver_ports[int(name[-1])]
            wait_for(lambda: port_open(port), timeout, f"{name} to listen again")
        elif name.startswith("worker"):
            wait_for(lambda: "worker ready" in _after(process, offset), timeout, f"{name} to be ready again")
        else:
            wait_for(lambda: _json_lines(_after(process, offset)), timeout, f"{name} to log again")

    def first_log_time_after(self, name: str, offset: int) -> float | None:
        """The ``time`` of the process's first JSON log line after byte ``offset``."""
        lines = _json_lines(_after(self.process(name), offset))
        stamp = lines[0].get("time") if lines else None
        return float(stamp) if isinstance(stamp, int | float) else None

    def log_size(self, name: str) -> int:
        path = self.process(name).log_path
        return path.stat().st_size if path.exists() else 0

    # -- the API side --------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: object = None, timeout: float = 10.0) -> httpx.Response:
        return httpx.request(method, f"{self.simulator_url}{path}", json=body, timeout=timeout)


def _after(process: Managed, offset: int) -> str:
    try:
        with open(process.log_path, "rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except OSError:
        return ""


def _json_lines(text: str) -> list[dict[str, object]]:
    found = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            try:
                found.append(json.loads(raw))
            except ValueError:
                continue
    return found
