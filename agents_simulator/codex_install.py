"""The pinned codex for ``scripts/dev``: installed from npm into the cache ``scripts/test`` uses,
and checked against ``runner_image/codex.lock`` before anything runs it.

``python -m agents_simulator.codex_install [--lock PATH]`` does nothing when ``codex`` is on
``PATH`` or ``CONTROLLER_EXECUTOR_COMMAND`` names an executor. Otherwise it uses the cached
install (``~/.cache/sandbox-controller/codex-<version>``, or under ``SANDBOX_CONTROLLER_CACHE``)
or makes one with ``npm install --prefix``, printing how far the download got every few
seconds. Either way the integrity npm recorded for the native package (``package-lock.json``)
must equal the one in ``codex.lock``: an install that differs is removed and the command
exits 1. Without ``npm`` (or when npm fails) it says so and exits 0: ``dev`` then runs its
labelled stand-in executor, which runs no commands.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

CODEX_VERSION = "0.171.0"
CODEX_PACKAGE = f"@openai/codex@{CODEX_VERSION}"
DEFAULT_LOCK = Path(__file__).resolve().parents[1] / "runner_image" / "codex.lock"
PROGRESS_SECONDS = 5.0

Say = Callable[[str], None]


class Outcome(StrEnum):
    READY = "ready"  # a checked codex is in the cache
    NOT_NEEDED = "not-needed"  # codex on PATH, or an executor named by CONTROLLER_EXECUTOR_COMMAND
    NO_NPM = "no-npm"  # nothing installed: dev runs the stand-in
    NPM_FAILED = "npm-failed"  # nothing installed: dev runs the stand-in
    UNPINNED = "unpinned"  # codex.lock records no integrity for this platform: nothing installed
    REFUSED = "refused"  # an install whose integrity differs from codex.lock (removed)


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    message: str

    @property
    def exit_code(self) -> int:
        return 1 if self.outcome is Outcome.REFUSED else 0


def cache_prefix() -> Path:
    """Where ``scripts/test`` installs the pinned codex (npm --prefix), under the cache root."""
    cache = Path(os.environ.get("SANDBOX_CONTROLLER_CACHE") or Path.home() / ".cache" / "sandbox-controller")
    return cache / f"codex-{CODEX_VERSION}"


def binary_in(prefix: Path) -> Path:
    return prefix / "node_modules" / ".bin" / "codex"


def npm_platform(machine: str | None = None, system: str | None = None) -> str | None:
    """The suffix of codex's native npm package for this machine (``linux-x64``…), or None."""
    system = (system or platform.system()).lower()
    machine = (machine or platform.machine()).lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if system != "linux" or arch is None:
        return None
    return f"linux-{arch}"


def pinned_integrity(lock: Path, version: str, npm_suffix: str) -> str | None:
    """The integrity ``codex.lock`` records for ``<version>-<platform>``."""
    for line in lock.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) == 2 and not line.startswith("#") and fields[0] == f"{version}-{npm_suffix}":
            return fields[1]
    return None


def installed_integrity(prefix: Path, npm_suffix: str) -> str | None:
    """The integrity npm recorded (``package-lock.json``) for the native package it installed."""
    try:
        lock = json.loads((prefix / "package-lock.json").read_text(encoding="utf-8"))
        entry = lock["packages"][f"node_modules/@openai/codex-{npm_suffix}"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (prefix / "node_modules" / "@openai" / f"codex-{npm_suffix}").is_dir():
        return None  # recorded but not installed (another platform's optional package)
    integrity = entry.get("integrity") if isinstance(entry, dict) else None
    return integrity if isinstance(integrity, str) else None


def ensure_codex(
    prefix: Path,
    lock: Path,
    say: Say,
    npm: str | None,
    npm_suffix: str | None,
    progress_seconds: float = PROGRESS_SECONDS,
) -> Result:
    """A checked codex in ``prefix``: the cached one, or one npm installs now."""
    if npm_suffix is None:
        return Result(Outcome.UNPINNED, f"codex.lock pins codex for Linux x64/arm64 only; install {CODEX_PACKAGE}")
    expected = pinned_integrity(lock, CODEX_VERSION, npm_suffix)
    if expected is None:
        return Result(Outcome.UNPINNED, f"{lock} records no integrity for {CODEX_VERSION}-{npm_suffix}")
    if not binary_in(prefix).exists():
        if npm is None:
            return Result(
                Outcome.NO_NPM,
                f"npm not found: cannot install {CODEX_PACKAGE} (install Node.js and npm, then run scripts/dev again)",
            )
        say(f"installing {CODEX_PACKAGE} into {prefix} (first run: about 420 MB)")
        failed = _npm_install(npm, prefix, say, progress_seconds)
        if failed:
            return Result(Outcome.NPM_FAILED, f"npm install {CODEX_PACKAGE} failed: {failed}")
    actual = installed_integrity(prefix, npm_suffix)
    if actual != expected:
        shutil.rmtree(prefix, ignore_errors=True)
        return Result(
            Outcome.REFUSED,
            f"the installed @openai/codex-{npm_suffix} has integrity {actual}, codex.lock says {expected}: "
            f"removed {prefix}",
        )
    return Result(Outcome.READY, f"codex {CODEX_VERSION} ({npm_suffix}) matches codex.lock: {binary_in(prefix)}")


def _npm_install(npm: str, prefix: Path, say: Say, progress_seconds: float) -> str | None:
    """Run npm; say how much has landed every ``progress_seconds``; the failure, or None."""
    prefix.mkdir(parents=True, exist_ok=True)
    done = threading.Event()

    def report() -> None:
        while not done.wait(progress_seconds):
            say(f"  … {_megabytes(prefix)} MB so far")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        completed = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(prefix), CODEX_PACKAGE],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        completed = None
        error = str(exc)
    finally:
        done.set()
        reporter.join()
    if completed is not None and completed.returncode == 0 and binary_in(prefix).exists():
        say(f"  … done: {_megabytes(prefix)} MB")
        return None
    if completed is not None:
        lines = (completed.stderr or completed.stdout).strip().splitlines()
        error = lines[-1] if lines else f"exit status {completed.returncode}"
    shutil.rmtree(prefix, ignore_errors=True)  # a half install must not pass for a cached one
    return error


def _megabytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total // (1024 * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents_simulator.codex_install", description=__doc__)
    parser.add_argument("--lock", type=Path, default=DEFAULT_LOCK, help="the codex.lock to check against")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    if os.environ.get("CONTROLLER_EXECUTOR_COMMAND"):
        return 0
    on_path = shutil.which("codex")
    if on_path:
        say(f"codex on PATH: {on_path}")
        return 0
    result = ensure_codex(cache_prefix(), args.lock, say, shutil.which("npm"), npm_platform())
    say(result.message)
    if result.outcome in (Outcome.NO_NPM, Outcome.NPM_FAILED, Outcome.UNPINNED):
        say("scripts/dev goes on with the STAND-IN executor: the scenario's command will be skipped")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
