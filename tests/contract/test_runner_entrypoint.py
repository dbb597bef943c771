"""The sandbox image's entrypoint (``runner_image/entrypoint.sh``) run directly, with the real
npm-installed ``codex exec-server``, against the simulator on loopback.

No container engine runs here, so the entrypoint is what can be proven: it retries registration
failures itself (no crash loop), stops cleanly on SIGTERM, and refuses to start without its
environment, never printing the key.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.codex import codex_binary
from tests.support.processes import wait_for
from tests.support.simulator import SimulatorProcess, StartSimulator

pytestmark = pytest.mark.timeout(90)

ENTRYPOINT = Path(__file__).resolve().parents[2] / "runner_image" / "entrypoint.sh"
SELF_HOSTED = {"type": "self_hosted", "workspace_directory": "/workspace"}
FAST_RETRIES = {"RETRY_INITIAL_SECONDS": "0.2", "RETRY_MAX_SECONDS": "1"}


class Entrypoint:
    """One run of the entrypoint in its own process group, output captured to a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["bash", str(ENTRYPOINT)],
                env=env,
                stdin=subprocess.DEVNULL,  # a pod's default; the executor must not exit on it
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill_group(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # codex's native child, if left behind


@pytest.fixture
def run_entrypoint(tmp_path: Path) -> Iterator[Callable[..., Entrypoint]]:
    """Start entrypoint runs; every one (and its process group) is gone at the end of the test."""
    runs: list[Entrypoint] = []

    def run(**env: str) -> Entrypoint:
        home = tmp_path / "home"
        (home / ".codex").mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "SSL_CERT_FILE")}
        base.update({"HOME": str(home), "CODEX_HOME": str(home / ".codex")})
        entry = Entrypoint({**base, **env}, tmp_path / f"entrypoint-{len(runs)}.log")
        runs.append(entry)
        return entry

    yield run
    for entry in runs:
        entry.kill_group()


def _session(sim: SimulatorProcess) -> tuple[str, str]:
    session = sim.openai().beta.agents.sessions.create(environment=SELF_HOSTED, input="hello")
    return session.environment.remote_url, session.environment.id


def test_registration_failures_are_retried_in_place(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint]
) -> None:
    """L8: two failed registrations (503), then success: connected within seconds, no crash loop."""
    binary = codex_binary()
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    sim.admin("POST", "/admin/faults", {"target": "register", "status": 503, "count": 2})

    started = time.monotonic()
    entry = run_entrypoint(
        CODEX_BIN=binary,
        REMOTE_URL=remote_url,
        ENVIRONMENT_ID=env_id,
        CODEX_API_KEY=sim.environment_key,
        **FAST_RETRIES,
    )
    wait_for(
        lambda: [r["status_code"] for r in sim.registrations(env_id)] == [503, 503, 200],
        20,
        "two failed registrations, then one that succeeds",
    )
    wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")
    assert time.monotonic() - started < 20
    assert entry.process.poll() is None, entry.output()

    time.sleep(1.5)  # still one executor, connected, no further registrations
    assert entry.process.poll() is None
    assert [r["status_code"] for r in sim.registrations(env_id)] == [503, 503, 200]
    assert sim.environment_status(env_id) == "connected"

    output = entry.output()
    assert output.count("registration failed") == 2
    assert sim.environment_key not in output


def test_sigterm_stops_the_executor_and_exits_0(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint]
) -> None:
    """L8: SIGTERM (pod deletion) reaches the connected executor; the entrypoint exits 0 promptly."""
    binary = codex_binary()
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    entry = run_entrypoint(
        CODEX_BIN=binary, REMOTE_URL=remote_url, ENVIRONMENT_ID=env_id, CODEX_API_KEY=sim.environment_key
    )
    wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")

    started = time.monotonic()
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    wait_for(lambda: sim.environment_status(env_id) == "disconnected", 10, "the environment to be disconnected")
    with pytest.raises(ProcessLookupError):
        os.killpg(entry.process.pid, 0)  # nothing of the group is left running
    assert sim.environment_key not in entry.output()


def test_sigterm_during_backoff_exits_0(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint]
) -> None:
    """L8: a SIGTERM that arrives while waiting to retry a failed registration ends it at once, status 0."""
    binary = codex_binary()
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    sim.admin("POST", "/admin/faults", {"target": "register", "status": 503, "count": 5})
    entry = run_entrypoint(
        CODEX_BIN=binary,
        REMOTE_URL=remote_url,
        ENVIRONMENT_ID=env_id,
        CODEX_API_KEY=sim.environment_key,
        RETRY_INITIAL_SECONDS="30",
        RETRY_MAX_SECONDS="30",
    )
    wait_for(lambda: "registration failed" in entry.output(), 20, "the first failure and its backoff")

    started = time.monotonic()
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert len(sim.registrations(env_id)) == 1


def test_usage_errors_are_not_retried(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint]
) -> None:
    """L8: a usage error (status 2) is not a registration failure: the entrypoint exits with it."""
    binary = codex_binary()
    sim = start_simulator()
    entry = run_entrypoint(
        CODEX_BIN=binary,
        REMOTE_URL=sim.base_url,
        ENVIRONMENT_ID="--not-an-id",  # taken as an unknown flag by the executor's parser
        CODEX_API_KEY=sim.environment_key,
        **FAST_RETRIES,
    )
    assert entry.process.wait(timeout=20) == 2, entry.output()
    assert "registration failed" not in entry.output()


@pytest.mark.parametrize("missing", ["REMOTE_URL", "ENVIRONMENT_ID", "CODEX_API_KEY"])
def test_missing_environment_is_named_and_the_key_never_printed(
    missing: str, run_entrypoint: Callable[..., Entrypoint]
) -> None:
    """L2: without its environment the entrypoint exits 64 naming the variable, never printing the key."""
    key = "envkey-must-not-appear-0123456789"
    env = {
        "CODEX_BIN": "/bin/false",
        "REMOTE_URL": "http://127.0.0.1:9",
        "ENVIRONMENT_ID": "env_123",
        "CODEX_API_KEY": key,
    }
    del env[missing]
    entry = run_entrypoint(**env)
    assert entry.process.wait(timeout=10) == 64
    output = entry.output()
    assert missing in output
    assert key not in output


def _bind(directory: Path, environment_id: str, remote_url: str) -> None:
    """What the kubelet does when a session claims a warm pod: the downward-API files appear."""
    for name, value in (("environment-id", environment_id), ("remote-url", remote_url)):
        partial = directory / f".{name}.tmp"
        partial.write_text(value)
        partial.replace(directory / name)


def test_a_warm_runner_waits_for_its_binding_then_registers(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint], tmp_path: Path
) -> None:
    """L8, L2: a warm runner (no REMOTE_URL, no ENVIRONMENT_ID, BINDING_DIRECTORY set) starts no
    executor until its binding appears; then the executor registers with that environment id and
    the key from CODEX_API_KEY, which is never printed."""
    binary = codex_binary()
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    binding = tmp_path / "binding"
    binding.mkdir()
    (binding / "environment-id").write_text("")  # an annotation not set yet: an empty file
    (binding / "remote-url").write_text("")
    entry = run_entrypoint(
        CODEX_BIN=binary, BINDING_DIRECTORY=str(binding), CODEX_API_KEY=sim.environment_key, **FAST_RETRIES
    )
    wait_for(lambda: "waiting for a session" in entry.output(), 10, "the runner to wait warm")
    time.sleep(1)  # warm: nothing registers while no session has claimed it
    assert entry.process.poll() is None, entry.output()
    assert sim.registrations(env_id) == []

    _bind(binding, env_id, remote_url)
    wait_for(lambda: sim.environment_status(env_id) == "connected", 20, "the claimed runner to connect")
    assert [r["status_code"] for r in sim.registrations(env_id)] == [200]
    assert sim.environment_key not in entry.output()


def test_sigterm_while_warm_exits_0(run_entrypoint: Callable[..., Entrypoint], tmp_path: Path) -> None:
    """L8: a warm runner that is deleted before any session claims it (pool shrink, age) exits 0."""
    binding = tmp_path / "binding"
    binding.mkdir()
    entry = run_entrypoint(CODEX_BIN="/bin/false", BINDING_DIRECTORY=str(binding), CODEX_API_KEY="envkey-x")
    wait_for(lambda: "waiting for a session" in entry.output(), 10, "the runner to wait warm")
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0
    assert "stopped by signal while warm" in entry.output()


SELF_TEST = "codex sandbox self-test"


def _self_test_lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{") and SELF_TEST in line]


def _stand_in(tmp_path: Path, sandbox: str) -> str:
    """A codex whose `sandbox` subcommand does ``sandbox`` (a shell snippet); the executor
    (`exec-server`) is the real one."""
    script = tmp_path / "codex-stand-in"
    script.write_text(f'#!/bin/bash\nif [ "$1" = sandbox ]; then\n{sandbox}\nfi\nexec {codex_binary()} "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_the_startup_self_test_says_codexs_sandbox_works_and_leaves_nothing(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint], tmp_path: Path
) -> None:
    """As the runner starts, one command runs in the real `codex sandbox` and one JSON line says
    Codex's sandbox works here (it wrote its working directory and was refused a write beside it
    and a socket); the executor registers as before, and the self-test leaves nothing of its own
    in $TMPDIR or $HOME."""
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    entry = run_entrypoint(
        CODEX_BIN=codex_binary(),
        REMOTE_URL=remote_url,
        ENVIRONMENT_ID=env_id,
        CODEX_API_KEY=sim.environment_key,
        TMPDIR=str(tmp),
    )
    wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")
    [line] = wait_for(lambda: _self_test_lines(entry.output()), 30, "the self-test's line")
    assert line["sandbox"] == "works", entry.output()
    assert line["why"] == (
        "the sandboxed command wrote its working directory and was refused a write outside it and a socket"
    )
    assert isinstance(line["seconds"], float)
    print(f"self-test took {line['seconds']}s")
    # Only codex's own per-uid directory, which any sandboxed command of codex makes there.
    assert [p.name for p in tmp.iterdir()] == [f"codex-bwrap-synthetic-mount-targets-{os.getuid()}"]
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [".codex"]


def test_the_self_test_judges_what_ran_not_codexs_exit_code(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint], tmp_path: Path
) -> None:
    """A `codex sandbox` that exits 0 having run nothing (as codex has in hardened containers)
    makes the self-test say the sandbox is unavailable; the executor still starts and connects."""
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    entry = run_entrypoint(
        CODEX_BIN=_stand_in(tmp_path, "exit 0"),
        REMOTE_URL=remote_url,
        ENVIRONMENT_ID=env_id,
        CODEX_API_KEY=sim.environment_key,
    )
    wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")
    [line] = wait_for(lambda: _self_test_lines(entry.output()), 30, "the self-test's line")
    assert (line["sandbox"], line["why"]) == ("unavailable", "nothing ran in Codex's sandbox: codex printed nothing")

    (tmp_path / "unconfined").mkdir()
    unconfined = _stand_in(tmp_path / "unconfined", 'while [ "$1" != -- ]; do shift; done; shift; exec "$@"')
    entry = run_entrypoint(CODEX_BIN=unconfined, REMOTE_URL=remote_url, ENVIRONMENT_ID="env_x", CODEX_API_KEY="k")
    [line] = wait_for(lambda: _self_test_lines(entry.output()), 30, "the self-test's line")
    assert line["sandbox"] == "unavailable", entry.output()
    assert line["why"] == "the sandboxed command wrote outside its working directory: the file system is not confined"


def test_a_hung_self_test_never_holds_the_executor_and_is_bounded(
    start_simulator: StartSimulator, run_entrypoint: Callable[..., Entrypoint], tmp_path: Path
) -> None:
    """A `codex sandbox` that never returns: the executor starts and connects while the
    self-test is still waiting (it runs beside it), the self-test gives up after
    SANDBOX_SELF_TEST_SECONDS saying so, and SIGTERM still ends the runner with status 0."""
    sim = start_simulator()
    remote_url, env_id = _session(sim)
    (tmp_path / "hung").mkdir()
    entry = run_entrypoint(
        CODEX_BIN=_stand_in(tmp_path / "hung", "exec sleep 600"),
        REMOTE_URL=remote_url,
        ENVIRONMENT_ID=env_id,
        CODEX_API_KEY=sim.environment_key,
        SANDBOX_SELF_TEST_SECONDS="20",
    )
    wait_for(lambda: sim.environment_status(env_id) == "connected", 15, "the environment to be connected")
    assert _self_test_lines(entry.output()) == []  # connected before the self-test answered
    [line] = wait_for(lambda: _self_test_lines(entry.output()), 60, "the self-test to give up")
    assert (line["sandbox"], line["why"]) == ("unavailable", "codex sandbox gave no answer within 20s")
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0


def test_the_self_test_can_be_turned_off(run_entrypoint: Callable[..., Entrypoint], tmp_path: Path) -> None:
    """SANDBOX_SELF_TEST_SECONDS=0: no self-test (here a warm runner, which would run it first)."""
    binding = tmp_path / "binding"
    binding.mkdir()
    marker = tmp_path / "sandbox-was-run"
    codex = tmp_path / "codex-stand-in"
    codex.write_text(f"#!/bin/sh\ntouch {marker}\n")
    codex.chmod(0o755)
    entry = run_entrypoint(
        CODEX_BIN=str(codex), BINDING_DIRECTORY=str(binding), CODEX_API_KEY="envkey-x", SANDBOX_SELF_TEST_SECONDS="0"
    )
    wait_for(lambda: "waiting for a session" in entry.output(), 10, "the runner to wait warm")
    time.sleep(1)
    assert not marker.exists() and _self_test_lines(entry.output()) == []
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0


def test_sigterm_ends_a_hung_self_test_with_the_runner(
    run_entrypoint: Callable[..., Entrypoint], tmp_path: Path
) -> None:
    """L8: a runner stopped while its self-test is still waiting on `codex sandbox` exits 0 at
    once, and the hung command ends with it (not when the self-test's bound runs out)."""
    binding = tmp_path / "binding"
    binding.mkdir()
    pid_file = tmp_path / "sandbox.pid"
    codex = _stand_in(tmp_path, f"echo $$ > {pid_file}; exec sleep 600")
    entry = run_entrypoint(
        CODEX_BIN=codex, BINDING_DIRECTORY=str(binding), CODEX_API_KEY="envkey-x", SANDBOX_SELF_TEST_SECONDS="600"
    )
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 10, "the self-test's codex sandbox to start")
    hung = int(pid_file.read_text())
    entry.process.send_signal(signal.SIGTERM)
    assert entry.process.wait(timeout=10) == 0

    def gone() -> bool:
        try:
            os.kill(hung, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{hung}/stat").read_text().split(")")[-1].split()[0] == "Z"

    wait_for(gone, 10, "the hung codex sandbox to end with the runner")
    assert _self_test_lines(entry.output()) == []
