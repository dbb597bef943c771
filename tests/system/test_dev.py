"""The README's run command: ``sandbox-controller dev --simulate`` runs the whole loop on
embedded defaults and stops every child process when it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.codex import codex_binary
from tests.support.processes import assert_no_process_left, free_port

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


def _run_dev(tmp_path: Path, env: dict[str, str], keep_state: bool = True, exit_code: int = 0) -> str:
    state = tmp_path / "state"
    keep = ["--state-directory", str(state)] if keep_state else []
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller",
            "dev",
            "--simulate",
            "--exit-after-scenario",
            "--port",
            str(free_port()),
            "--simulator-port",
            str(free_port()),
            *keep,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    output = result.stdout + result.stderr
    assert result.returncode == exit_code, output
    assert_no_process_left(state)  # dev passes the state directory to every child it starts
    return output


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}


def test_dev_simulate_runs_the_scenario_with_the_real_executor(tmp_path: Path) -> None:
    """L1, L8: the scripted scenario (duplicates, concurrent resends, one failure) ends with
    every session idle and one registration per session, and a command run in one session's
    sandbox brings its output back; Ctrl-C-style shutdown leaves nothing."""
    env = _clean_env()
    env["CONTROLLER_EXECUTOR_COMMAND"] = codex_binary()
    output = _run_dev(tmp_path, env)
    assert "scenario ok" in output
    assert "duplicate acknowledged" in output
    assert "sandbox released" in output
    assert "executor registered" in output
    assert "STAND-IN" not in output
    # A command ran in a sandbox and its output came back, in the sandbox's workspace.
    assert "turn with a command" in output
    assert "command output" in output and "'hello'" in output and "exit 0" in output
    assert "sandbox command finished" in output
    ran_in = next(line for line in output.splitlines() if "ran in" in line)
    assert str(tmp_path / "state" / "sandboxes" / "sessions") in ran_in


def test_dev_without_codex_says_how_to_install_and_uses_the_stand_in(tmp_path: Path) -> None:
    """L8: with no codex installed the loop still runs, on a clearly labelled stand-in."""
    env = _clean_env()
    env["SANDBOX_CONTROLLER_CACHE"] = str(tmp_path / "empty-cache")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "codex").exists())
    output = _run_dev(tmp_path, env)
    assert "npm install -g @openai/codex@0.171.0" in output
    assert "STAND-IN" in output
    # The stand-in runs no commands: the scenario skips its command and says so, never sends it
    # to fail and then reports the run as fine.
    assert "command skipped" in output and "install codex" in output
    assert "command failed" not in output and "tool execution failed" not in output
    assert "scenario ok" in output and "command skipped" in output.split("scenario ok", 1)[1].splitlines()[0]


def test_dev_ends_non_zero_when_a_command_of_the_scenario_failed(tmp_path: Path) -> None:
    """An executor that registers but cannot run the command (the stand-in, named as if it were
    the real executor): the command fails, the scenario says PROBLEM, and dev exits 1."""
    env = _clean_env()
    env["CONTROLLER_EXECUTOR_COMMAND"] = f"{sys.executable} -m agents_simulator.standin"
    output = _run_dev(tmp_path, env, exit_code=1)
    assert "command failed" in output and "tool execution failed" in output
    assert "scenario PROBLEM" in output and "command FAILED" in output
    assert "scenario ok" not in output


def test_dev_removes_the_state_directory_it_made(tmp_path: Path) -> None:
    """Without --state-directory, dev's temporary directory goes when the run ends cleanly."""
    env = _clean_env()
    env["CONTROLLER_EXECUTOR_COMMAND"] = codex_binary()
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    output = _run_dev(tmp_path, env, keep_state=False)
    assert "scenario ok" in output and "state directory removed" in output
    assert list((tmp_path / "tmp").glob("sandbox-controller-dev-*")) == []
    assert_no_process_left(tmp_path / "tmp")


def test_dev_stopped_by_sigterm_leaves_no_process(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) stops dev as Ctrl-C does: it ends every process it started (the
    embedded Redis, receiver, worker, scheduler, simulator, executors) before it exits. Before,
    only Ctrl-C did: a SIGTERM ended dev alone and left all of them running."""
    state = tmp_path / "state"
    dev = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "controller",
            "dev",
            "--simulate",
            "--port",
            str(free_port()),
            "--simulator-port",
            str(free_port()),
            "--state-directory",
            str(state),
        ],
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert dev.stdout is not None
        for line in dev.stdout:  # bounded by the scenario's own timeouts (dev exits on a failure)
            if "Ctrl-C to stop" in line:
                break
        assert dev.poll() is None, "dev exited before it was running"
        dev.send_signal(signal.SIGTERM)
        dev.communicate(timeout=60)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
    assert_no_process_left(state)
