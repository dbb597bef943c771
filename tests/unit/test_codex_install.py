"""scripts/dev's codex install: the pinned package from npm into the cache scripts/test uses,
checked against runner_image/codex.lock; without npm, the stand-in (said so).

npm itself is a stand-in script here (the real download is ~420 MB); the layout it writes is
the one npm writes, which the last test checks against the real install when it is cached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents_simulator import codex_install
from agents_simulator.codex_install import Outcome, ensure_codex, installed_integrity, npm_platform, pinned_integrity

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "runner_image" / "codex.lock"
PINNED = pinned_integrity(LOCK, codex_install.CODEX_VERSION, "linux-x64")

FAKE_NPM = """#!/bin/sh
# npm install --no-audit --no-fund --loglevel=error --prefix PREFIX PACKAGE, as a stand-in
while [ $# -gt 0 ]; do [ "$1" = --prefix ] && prefix=$2; shift; done
echo "$prefix" >> "$FAKE_NPM_CALLS"
if [ "${FAKE_NPM_EXIT:-0}" != 0 ]; then echo "npm ERR! network unreachable" >&2; exit "$FAKE_NPM_EXIT"; fi
mkdir -p "$prefix/node_modules/.bin" "$prefix/node_modules/@openai/codex-linux-x64"
head -c 3145728 /dev/zero > "$prefix/node_modules/@openai/codex-linux-x64/codex"
sleep "${FAKE_NPM_SECONDS:-0}"
printf '#!/bin/sh\\necho codex-cli 0.171.0\\n' > "$prefix/node_modules/.bin/codex"
chmod +x "$prefix/node_modules/.bin/codex"
cat > "$prefix/package-lock.json" <<EOF
{"packages": {"": {}, "node_modules/@openai/codex": {"version": "0.171.0"},
 "node_modules/@openai/codex-linux-x64": {"version": "0.171.0-linux-x64", "integrity": "$FAKE_INTEGRITY"},
 "node_modules/@openai/codex-linux-arm64": {"version": "0.171.0-linux-arm64", "integrity": "sha512-other"}}}
EOF
"""


@pytest.fixture
def npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    binary = tmp_path / "bin" / "npm"
    binary.parent.mkdir()
    for tool in ("sh", "mkdir", "head", "sleep", "chmod", "cat"):  # what the stand-in npm uses, no real npm
        found = shutil.which(tool)
        assert found, tool
        (binary.parent / tool).symlink_to(found)
    binary.write_text(FAKE_NPM)
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_NPM_CALLS", str(tmp_path / "npm-calls"))
    monkeypatch.setenv("FAKE_INTEGRITY", str(PINNED))
    return binary


def _calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "npm-calls"
    return calls.read_text().split() if calls.exists() else []


def test_the_lock_pins_both_linux_builds() -> None:
    assert PINNED and PINNED.startswith("sha512-")
    assert pinned_integrity(LOCK, codex_install.CODEX_VERSION, "linux-arm64")
    assert npm_platform("x86_64", "Linux") == "linux-x64" and npm_platform("aarch64", "Linux") == "linux-arm64"
    assert npm_platform("x86_64", "Darwin") is None


def test_installs_with_progress_and_checks_the_lock(tmp_path: Path, npm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NPM_SECONDS", "0.6")
    prefix = tmp_path / "cache" / "codex-0.171.0"
    said: list[str] = []
    result = ensure_codex(prefix, LOCK, said.append, str(npm), "linux-x64", progress_seconds=0.2)
    assert result.outcome is Outcome.READY and result.exit_code == 0, result
    assert (prefix / "node_modules" / ".bin" / "codex").exists()
    assert said[0].startswith("installing @openai/codex@0.171.0 into")
    assert any(line.strip().startswith("… 3 MB so far") for line in said), said  # progress while npm runs
    assert said[-1].strip() == "… done: 3 MB"
    # Cached: the next run checks the lock and does not call npm again.
    again = ensure_codex(prefix, LOCK, said.append, str(npm), "linux-x64")
    assert again.outcome is Outcome.READY and _calls(tmp_path) == [str(prefix)]


def test_an_install_that_differs_from_the_lock_is_removed_and_refused(
    tmp_path: Path, npm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_INTEGRITY", "sha512-somethingelse")
    prefix = tmp_path / "cache" / "codex-0.171.0"
    result = ensure_codex(prefix, LOCK, lambda _: None, str(npm), "linux-x64")
    assert result.outcome is Outcome.REFUSED and result.exit_code == 1
    assert "sha512-somethingelse" in result.message and str(PINNED) in result.message
    assert not prefix.exists()


def test_a_cached_install_that_differs_from_the_lock_is_refused(tmp_path: Path, npm: Path) -> None:
    prefix = tmp_path / "cache" / "codex-0.171.0"
    ensure_codex(prefix, LOCK, lambda _: None, str(npm), "linux-x64")
    lock = prefix / "package-lock.json"
    lock.write_text(lock.read_text().replace(str(PINNED), "sha512-tampered"))
    result = ensure_codex(prefix, LOCK, lambda _: None, None, "linux-x64")
    assert result.outcome is Outcome.REFUSED and not prefix.exists()


def test_without_npm_it_says_so_and_installs_nothing(tmp_path: Path) -> None:
    prefix = tmp_path / "cache" / "codex-0.171.0"
    result = ensure_codex(prefix, LOCK, lambda _: None, None, "linux-x64")
    assert result.outcome is Outcome.NO_NPM and result.exit_code == 0
    assert "npm not found" in result.message and not prefix.exists()


def test_a_failed_npm_leaves_no_half_install(tmp_path: Path, npm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NPM_EXIT", "1")
    prefix = tmp_path / "cache" / "codex-0.171.0"
    result = ensure_codex(prefix, LOCK, lambda _: None, str(npm), "linux-x64")
    assert result.outcome is Outcome.NPM_FAILED and "network unreachable" in result.message
    assert not prefix.exists()


def _main(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update({"PATH": path, "SANDBOX_CONTROLLER_CACHE": str(tmp_path / "cache")})
    return subprocess.run(
        [sys.executable, "-m", "agents_simulator.codex_install", "--lock", str(LOCK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.mark.skipif(npm_platform() != "linux-x64", reason="the stand-in npm writes the linux-x64 layout")
def test_the_command_scripts_dev_runs(tmp_path: Path, npm: Path) -> None:
    """What scripts/dev prints: without npm, the stand-in is announced (exit 0); with npm, the
    checked install into the cache (exit 0); an install that differs stops dev (exit 1)."""
    (tmp_path / "empty").mkdir()
    no_npm = _main(tmp_path, str(tmp_path / "empty"))
    assert no_npm.returncode == 0, no_npm.stderr
    assert "npm not found" in no_npm.stdout and "STAND-IN" in no_npm.stdout
    installed = _main(tmp_path, str(npm.parent))
    assert installed.returncode == 0, installed.stderr
    assert "matches codex.lock" in installed.stdout
    assert (tmp_path / "cache" / "codex-0.171.0" / "node_modules" / ".bin" / "codex").exists()
    lock = tmp_path / "cache" / "codex-0.171.0" / "package-lock.json"
    lock.write_text(lock.read_text().replace(str(PINNED), "sha512-tampered"))
    refused = _main(tmp_path, str(npm.parent))
    assert refused.returncode == 1 and "codex.lock says" in refused.stdout


def test_the_real_install_records_what_the_lock_pins() -> None:
    """The layout read above is npm's: the cached real install (scripts/test's) matches the lock."""
    prefix = codex_install.cache_prefix()
    platform = npm_platform()
    if platform is None or not (prefix / "package-lock.json").exists():
        pytest.skip(f"no cached codex install at {prefix}")
    assert installed_integrity(prefix, platform) == pinned_integrity(LOCK, codex_install.CODEX_VERSION, platform)
