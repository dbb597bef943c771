"""Codex's own sandbox for the local runner's executors: a sandboxed command of a real ``codex
exec-server`` run as its session's own uid writes the workspace, is refused a write to /etc and
has no network; and where the host cannot give Codex its sandbox, ``check-config`` and the
worker at start say so in one line with the fix (the real /proc, in a user namespace of the
test's own whose ``user.max_user_namespaces`` is 0)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from controller.model import SandboxSpec
from controller.runners.local import LocalRunner, UidRange, session_key
from tests.support import other_uids
from tests.support.codex import codex_binary
from tests.support.listener import Listener
from tests.support.local_runner import live
from tests.support.processes import Managed, free_port, wait_for
from tests.support.redis_server import redis_server_binary
from tests.support.simulator import StartSimulator

pytestmark = pytest.mark.timeout(180)

requires_root = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="switching to the executor's uid needs root"
)
NAMESPACES_OFF = ["unshare", "-U", "-r", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" "$@"']


def free_uid_range(size: int) -> UidRange:
    """``size`` consecutive uids no user or group of this machine has (not those the local
    runner's contract tests take)."""
    return other_uids.free_uid_range(size, first=2_100_000_000)


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A directory the executor's uid can traverse (pytest's tmp_path is 0700 root), removed after."""
    with other_uids.shared_directory("sc-codex-sandbox-") as base:
        yield base


def native_codex_for_others(base: Path) -> str:
    """The native codex with its bundled bwrap, where another uid can run it: the cached npm
    install lives under root's 0700 home. Hard links (the same file system) or copies."""
    launcher = Path(codex_binary()).resolve()
    [vendor] = launcher.parents[2].glob("codex-linux-*/vendor/*")  # node_modules/@openai/codex/bin/codex.js
    target = base / "codex"
    shutil.copytree(vendor, target, copy_function=_link_or_copy)
    for directory in (target, *(p for p in target.rglob("*") if p.is_dir())):
        directory.chmod(0o755)
    return str(target / "bin" / "codex")


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _exec(base_url: str, env_id: str, argv: list[str], sandbox: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"argv": argv, **({"sandbox": sandbox} if sandbox else {})}
    response = httpx.post(f"{base_url}/admin/environments/{env_id}/exec", json=body, timeout=60)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    assert result["status"] == "completed", result
    return result


@requires_root
def test_a_sandboxed_command_works_for_an_executor_under_its_own_uid(
    shared_base: Path, start_simulator: StartSimulator
) -> None:
    """L2: with CONTROLLER_LOCAL_EXECUTOR_UIDS the executor runs as its session's uid; a command
    that asks for workspace-write runs inside Codex's sandbox (linuxSeccomp): it writes the
    workspace (as that uid), is refused a write to /etc (sandboxDenied) and cannot open a socket
    to a listener on loopback, which the same executor reaches unsandboxed."""
    binary = native_codex_for_others(shared_base)
    sim = start_simulator()
    with sim.http() as client:
        session = client.post(
            "/v1/agents/sessions", json={"environment": {"type": "self_hosted", "workspace_directory": "/workspace"}}
        ).json()
    env_id = session["environment"]["id"]
    uids = free_uid_range(4)
    runner = LocalRunner(shared_base / "state", [binary], sim.environment_key, run_as=uids)
    listener = Listener()
    outside = Path("/etc") / f"sandbox-probe-{uuid.uuid4().hex}"
    try:
        runner.ensure(SandboxSpec(session["id"], env_id, session["environment"]["remote_url"]), 1)
        wait_for(lambda: sim.environment_status(env_id) == "connected", 30, "codex to connect")
        workspace = shared_base / "state" / "sessions" / session_key(session["id"]) / "workspace"

        wrote = _exec(sim.base_url, env_id, ["sh", "-c", "id -u; echo inside > notes.txt"], "workspace-write")
        assert (wrote["exit_code"], wrote["sandbox_type"], wrote["sandbox_denied"]) == (0, "linuxSeccomp", False)
        uid = int(wrote["stdout"])
        assert uid in uids
        assert wrote["cwd"] == str(workspace)
        assert (workspace / "notes.txt").read_text() == "inside\n" and (workspace / "notes.txt").stat().st_uid == uid

        refused = _exec(sim.base_url, env_id, ["touch", str(outside)], "workspace-write")
        assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"], refused
        assert refused["sandbox_denied"] is True and not outside.exists()

        offline = _exec(sim.base_url, env_id, listener.connect_argv(), "workspace-write")
        assert offline["exit_code"] != 0 and "Operation not permitted" in offline["stderr"], offline
        assert listener.accepted == 0
        online = _exec(sim.base_url, env_id, listener.connect_argv())
        assert (online["exit_code"], online["sandbox_type"]) == (0, "none") and listener.accepted == 1
    finally:
        outside.unlink(missing_ok=True)
        listener.socket.close()
        runner.stop_all()
        wait_for(lambda: not live(runner), 15, "the executor to stop")
        for session_id in runner.workspaces():
            runner.discard(session_id)


def _namespaces_off_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*NAMESPACES_OFF, "true"], capture_output=True).returncode == 0


def _settings(tmp_path: Path, redis_url: str = "redis://127.0.0.1:1/0") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(
        {
            "CONTROLLER_REDIS_URL": redis_url,
            "CONTROLLER_WEBHOOK_SECRETS": "a-webhook-secret-of-24-bytes",
            "CONTROLLER_API_KEY": "sk-controller-0123456789",
            "CONTROLLER_EXECUTOR_KEY": "envkey-0123456789",
            "CONTROLLER_LOCAL_STATE_DIRECTORY": str(tmp_path / "state"),
            "CONTROLLER_LOCAL_EXECUTOR_SAME_USER": "true",
        }
    )
    return env


WARNING = "Codex cannot build its own sandbox for executors on this host (user.max_user_namespaces = 0)"


def test_check_config_says_in_one_line_when_the_host_cannot_give_codex_its_sandbox(tmp_path: Path) -> None:
    """Where no user namespace can be made, check-config still says every role is ready (only
    sessions that ask for Codex's sandbox need it) and adds one warning line for the worker
    with the fix; on this host as it is, no warning."""
    if not _namespaces_off_works():
        pytest.skip("unshare -U -r is not available here")
    argv = [sys.executable, "-m", "controller", "check-config"]
    here = subprocess.run(argv, env=_settings(tmp_path), capture_output=True, text=True, timeout=60)
    assert here.returncode == 0, here.stderr
    assert "warning" not in here.stderr
    off = subprocess.run([*NAMESPACES_OFF, *argv], env=_settings(tmp_path), capture_output=True, text=True, timeout=60)
    assert off.returncode == 0, off.stderr
    [line] = [x for x in off.stderr.splitlines() if "warning" in x]
    assert line.startswith(f"worker: warning: {WARNING}"), line
    assert "Fix: sysctl -w user.max_user_namespaces=15000" in line
    assert "worker: ready" in off.stderr and "scheduler: ready" in off.stderr and "serve: ready" in off.stderr


def test_the_worker_says_it_at_start(tmp_path: Path) -> None:
    """The worker starts all the same and logs one warning line with the reason and the fix."""
    if not _namespaces_off_works():
        pytest.skip("unshare -U -r is not available here")
    port = free_port()
    redis_server = Managed(
        "redis",
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        os.environ,
        tmp_path / "redis.log",
    ).start()
    worker = Managed(
        "worker",
        [*NAMESPACES_OFF, sys.executable, "-m", "controller", "worker", "--concurrency", "1"],
        _settings(tmp_path, f"redis://127.0.0.1:{port}/0"),
        tmp_path / "worker.log",
    )
    try:
        wait_for(lambda: redis_server.output().count("Ready to accept connections") > 0, 15, "redis")
        worker.start()

        def warned() -> dict[str, object] | None:
            return next((r for r in worker.log_lines() if r.get("event") == "codex sandbox unavailable"), None)

        record = wait_for(warned, 30, "the worker's warning")
        assert isinstance(record, dict) and record["level"] == "warning"
        assert str(record["reason"]).startswith(WARNING) and "Fix: sysctl" in str(record["reason"])
        assert worker.alive()
    finally:
        worker.stop()
        redis_server.stop()


# The executor as a container runs it: as an unprivileged uid, in a mount namespace whose /proc
# has a sub-mount over part of it (runtimes mask /proc/interrupts, /proc/kcore… so), where the
# kernel refuses bubblewrap a fresh /proc and Codex goes on without one.
MASKED_PROC_EXECUTOR = """#!/bin/sh
exec unshare -m --propagation private sh -c 'mount --bind /dev/null /proc/interrupts && cd "$0" && \
exec setpriv --reuid={uid} --regid={uid} --clear-groups env HOME="$0" CODEX_HOME="$0" {codex} "$@"' {workspace} "$@"
"""
ENVIRON_PROBE = (
    "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline | cut -c1-30); "
    "echo readable=$(grep -l CODEX_API_KEY= /proc/[0-9]*/environ 2>/dev/null | wc -l)"
)


@requires_root
def test_without_a_fresh_proc_a_sandboxed_command_still_cannot_read_the_executors_key(
    shared_base: Path, start_simulator: StartSimulator
) -> None:
    """L2: where /proc is masked (as in a pod without procMount Unmasked) Codex runs the command
    with the executor's own /proc (the machine's process list shows through), yet the sandboxed
    command cannot read the executor's environment — its CODEX_API_KEY — which an unsandboxed
    command of the same uid can."""
    if shutil.which("unshare") is None or shutil.which("setpriv") is None:
        pytest.skip("needs unshare and setpriv")
    binary = native_codex_for_others(shared_base)
    uid = free_uid_range(1).first
    workspace = shared_base / "workspace"
    workspace.mkdir()
    os.chown(workspace, uid, uid)
    script = shared_base / "executor.sh"
    script.write_text(MASKED_PROC_EXECUTOR.format(uid=uid, codex=binary, workspace=workspace))
    script.chmod(0o755)
    sim = start_simulator()
    with sim.http() as client:
        session = client.post(
            "/v1/agents/sessions", json={"environment": {"type": "self_hosted", "workspace_directory": "/workspace"}}
        ).json()
    env_id = session["environment"]["id"]
    executor = Managed(
        "codex",
        [str(script), "exec-server", "--remote", session["environment"]["remote_url"], "--environment-id", env_id],
        {"PATH": os.environ["PATH"], "CODEX_API_KEY": sim.environment_key},
        shared_base / "codex.log",
    ).start()
    try:
        wait_for(lambda: sim.environment_status(env_id) == "connected", 30, "codex to connect")
        sandboxed = _exec(sim.base_url, env_id, ["sh", "-c", ENVIRON_PROBE], "workspace-write")
        plain = _exec(sim.base_url, env_id, ["sh", "-c", ENVIRON_PROBE])
    finally:
        executor.stop()
    assert sandboxed["sandbox_type"] == "linuxSeccomp", sandboxed
    # No fresh /proc: the sandboxed command sees the machine's PID 1, not Codex's sandbox helper.
    pid1 = sandboxed["stdout"].splitlines()[0]
    assert pid1 == plain["stdout"].splitlines()[0] and "codex-linux-sandbox" not in pid1, (sandboxed, plain)
    assert sandboxed["stdout"].endswith("readable=0\n"), sandboxed
    assert not plain["stdout"].endswith("readable=0\n"), plain  # the same uid, unsandboxed, reads it
