"""``sandbox-controller check-config`` against the processes it speaks for: for each bad
configuration, it says what the real ``worker`` / ``scheduler`` / ``serve`` process then says
when started (the same checks, one code path: ``wiring.preflight``), it never prints a
credential in any form, and it refuses a number past its maximum.

Real subprocesses; none gets as far as Redis (every case is refused before it is dialled)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

API_KEY = "sk-controller-check-config-0123456789"
EXECUTOR_KEY = "envkey-check-config-0123456789"
WEBHOOK_SECRET = "a-webhook-secret-of-24-bytes"
REDIS_PASSWORD = "redis-pass-in-the-query-42"
BASIC_AUTH = "basic-auth-pass-in-userinfo-77"

requires_root = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="the executor user checks differ without root"
)


def run(*argv: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(settings)
    return subprocess.run(
        [sys.executable, "-m", "controller", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def base(tmp_path: Path, **overrides: str) -> dict[str, str]:
    settings = {
        "CONTROLLER_REDIS_URL": f"redis://:{REDIS_PASSWORD}@127.0.0.1:1/0",  # never dialled
        "CONTROLLER_WEBHOOK_SECRETS": WEBHOOK_SECRET,
        "CONTROLLER_API_KEY": API_KEY,
        "CONTROLLER_EXECUTOR_KEY": EXECUTOR_KEY,
        "CONTROLLER_LOCAL_STATE_DIRECTORY": str(tmp_path / "state"),
    }
    settings.update(overrides)
    return settings


def listed(stderr: str, role: str) -> list[str]:
    """The problems check-config lists under ``role``."""
    lines = stderr.splitlines()
    start = lines.index(f"{role}: would refuse to start (exit 2):")
    found = []
    for line in lines[start + 1 :]:
        if not line.startswith("  - "):
            break
        found.append(line.removeprefix("  - "))
    return found


def refused_with(stderr: str) -> list[str]:
    """The problems a process refusing to start printed: ``sandbox-controller: invalid
    configuration: PROBLEM`` (one), or that header and one ``  - PROBLEM`` line each."""
    assert "Traceback" not in stderr, stderr
    one = "sandbox-controller: invalid configuration: "
    lines = stderr.strip().splitlines()
    if len(lines) == 1 and lines[0].startswith(one):
        return [lines[0].removeprefix(one)]
    assert lines[0] == "sandbox-controller: invalid configuration:", stderr
    return [line.removeprefix("  - ") for line in lines[1:]]


@requires_root
@pytest.mark.parametrize(
    "case",
    ["executor user root", "executor user unknown", "unsafe state directory", "redis without password"],
)
def test_check_config_refuses_exactly_what_the_worker_refuses(tmp_path: Path, case: str) -> None:
    """check-config runs the checks each process runs at start (one code path): where it lists
    a role's problems, that process, started with the same settings, exits 2 with exactly those
    problems; it said "ready" for CONTROLLER_LOCAL_EXECUTOR_USER=root before, and the worker
    then exited 2."""
    settings = base(tmp_path)
    if case == "executor user root":
        settings["CONTROLLER_LOCAL_EXECUTOR_USER"] = "root"
    elif case == "executor user unknown":
        settings["CONTROLLER_LOCAL_EXECUTOR_USER"] = "no-such-user-here"
    elif case == "unsafe state directory":
        parent = tmp_path / "owned-by-nobody"
        parent.mkdir()
        nobody = pwd.getpwnam("nobody")
        os.chown(parent, nobody.pw_uid, nobody.pw_gid)
        settings["CONTROLLER_LOCAL_STATE_DIRECTORY"] = str(parent / "state")
    else:
        settings["CONTROLLER_REDIS_URL"] = "redis://127.0.0.1:1/0"
    checked = run("check-config", **settings)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    for role in ("worker", "scheduler"):
        problems = listed(checked.stderr, role)
        assert problems, role
        started = run(role, **settings)
        assert started.returncode == 2, started.stdout + started.stderr
        assert refused_with(started.stderr) == problems, role
    assert "serve: ready" in checked.stderr  # the receiver runs no executor


def test_an_executor_command_that_does_not_split_is_invalid_everywhere(tmp_path: Path) -> None:
    """CONTROLLER_EXECUTOR_COMMAND="'x" made check-config say "ready" and every task crash with a
    traceback: it is now an invalid setting (exit 2) for check-config and the worker alike."""
    settings = base(tmp_path, CONTROLLER_EXECUTOR_COMMAND="'x", CONTROLLER_LOCAL_EXECUTOR_SAME_USER="true")
    problem = "CONTROLLER_EXECUTOR_COMMAND is not a command line (No closing quotation)"
    for argv in (("check-config",), ("worker",)):
        done = run(*argv, **settings)
        assert done.returncode == 2, done.stdout + done.stderr
        assert refused_with(done.stderr) == [problem], argv


def test_check_config_masks_every_credential_form(tmp_path: Path) -> None:
    """L2: a Redis password given as ``?password=`` (redis-py's form for unix sockets) and
    userinfo in CONTROLLER_API_BASE_URL are printed masked, like every secret."""
    settings = base(
        tmp_path,
        CONTROLLER_REDIS_URL=f"unix:///run/redis/redis.sock?db=0&password={REDIS_PASSWORD}",
        CONTROLLER_API_BASE_URL=f"https://operator:{BASIC_AUTH}@api.internal.example",
        CONTROLLER_LOCAL_EXECUTOR_SAME_USER="true",
    )
    done = run("check-config", **settings)
    output = done.stdout + done.stderr
    assert "unix:///run/redis/redis.sock?db=0&password=***" in done.stdout
    assert "https://operator:***@api.internal.example" in done.stdout
    for secret in (REDIS_PASSWORD, BASIC_AUTH, API_KEY, EXECUTOR_KEY, WEBHOOK_SECRET):
        assert secret not in output


def test_a_number_past_its_maximum_is_refused(tmp_path: Path) -> None:
    """CONTROLLER_WEBHOOK_DEDUP_TTL_SECONDS=1e20 passed, then every delivery got 503 (a Redis
    expiry out of range): every number now has a maximum, and check-config and serve refuse it."""
    settings = base(tmp_path, CONTROLLER_WEBHOOK_DEDUP_TTL_SECONDS="100000000000000000000")
    problem = "CONTROLLER_WEBHOOK_DEDUP_TTL_SECONDS must be at most 2592000, got '100000000000000000000'"
    for argv in (("check-config",), ("serve", "--host", "127.0.0.1", "--port", "1")):
        done = run(*argv, **settings)
        assert done.returncode == 2, done.stdout + done.stderr
        assert refused_with(done.stderr) == [problem], argv
