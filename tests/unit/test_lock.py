"""The Python lock is what runs: every install is the lock's, and the lock is pyproject's.

``lock/all.txt`` pins every dependency of the product, the tests and the benchmarks with the
sha256 of every file of it (README, "Reproducible installs"); ``lock/product.txt`` is the
product's share, what the images install. These tests read the files and the interpreter that
runs them: what is installed must be exactly the lock (``scripts/venv`` makes it so), every pin
must carry hashes, the product's share must pin what the whole lock pins, and each range in
pyproject.toml must admit its pin (a dependency added or narrowed there without
``scripts/lock`` fails here, offline).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "lock"
PROJECT = "sandbox-controller"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>[^ ;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: str | None
    hashes: tuple[str, ...]

    def applies(self, environment: dict[str, str] | None = None) -> bool:
        return self.marker is None or Marker(self.marker).evaluate(environment)


def read_lock(path: Path) -> list[Pin]:
    """Each ``name==version ; marker`` entry with the ``--hash`` lines under it."""
    pins: list[Pin] = []
    entry: dict[str, str | None] | None = None
    hashes: list[str] = []

    def close() -> None:
        if entry is not None:
            pins.append(Pin(str(entry["name"]), str(entry["version"]), entry["marker"], tuple(hashes)))

    for line in path.read_text().splitlines():
        if match := _PIN.match(line):
            close()
            entry = {"name": canonicalize_name(match["name"]), "version": match["version"], "marker": match["marker"]}
            hashes = []
        elif line.strip().startswith("--hash="):
            hashes.append(line.strip().removeprefix("--hash=").rstrip(" \\"))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"{path.name}: a line the lock format does not have: {line!r}")
    close()
    return pins


def wanted_here(pins: list[Pin]) -> dict[str, str]:
    """The pins that apply to the running interpreter: name -> version."""
    wanted: dict[str, str] = {}
    for pin in pins:
        if pin.applies():
            assert pin.name not in wanted, f"{pin.name} is pinned twice for this interpreter"
            wanted[pin.name] = pin.version
    return wanted


def installed() -> dict[str, str]:
    """name -> version of every distribution installed into the running interpreter's
    environment (its site-packages: not what a package vendors and puts on ``sys.path`` at run
    time, as setuptools does), but this project."""
    found: dict[str, str] = {}
    where = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    for dist in importlib.metadata.distributions(path=where):
        name = canonicalize_name(dist.metadata["Name"])
        if name != PROJECT:
            found.setdefault(name, dist.version)
    return found


def differences(wanted: dict[str, str], have: dict[str, str]) -> list[str]:
    lines = [
        f"{n}: lock {wanted[n]}, installed {have[n]}"
        for n in sorted(wanted.keys() & have.keys())
        if wanted[n] != have[n]
    ]
    lines += [f"{n}: lock {wanted[n]}, not installed" for n in sorted(wanted.keys() - have.keys())]
    lines += [f"{n}: installed {have[n]}, not in the lock" for n in sorted(have.keys() - wanted.keys())]
    return lines


def test_what_is_installed_is_exactly_the_lock() -> None:
    """The interpreter running the tests has every package of lock/all.txt that applies to it, at
    its pinned version, and nothing else: an install that drifted (a package upgraded by hand,
    an unpinned install, a package the lock does not name) fails here."""
    if sys.prefix == sys.base_prefix:
        pytest.fail("the tests run outside a virtualenv: scripts/test runs them in .venv, made by scripts/venv")
    found = differences(wanted_here(read_lock(LOCK / "all.txt")), installed())
    assert not found, "installed packages differ from lock/all.txt (run scripts/venv):\n" + "\n".join(found)


def test_the_comparison_sees_each_kind_of_drift() -> None:
    """The check above fails on a changed version, a missing package and an extra one."""
    wanted = {"redis": "8.2.0", "httpx": "0.29.0"}
    assert differences(wanted, dict(wanted)) == []
    assert differences(wanted, {"redis": "8.1.0", "httpx": "0.29.0"}) == ["redis: lock 8.2.0, installed 8.1.0"]
    assert differences(wanted, {"redis": "8.2.0"}) == ["httpx: lock 0.29.0, not installed"]
    assert differences(wanted, {**wanted, "six": "1.17.0"}) == ["six: installed 1.17.0, not in the lock"]


def test_every_pin_is_exact_and_carries_hashes() -> None:
    for name in ("all.txt", "product.txt", "uv.txt"):
        pins = read_lock(LOCK / name)
        assert pins, f"lock/{name} pins nothing"
        for pin in pins:
            assert pin.hashes, f"lock/{name}: {pin.name} has no hash"
            assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), pin.name


def test_the_products_share_pins_what_the_whole_lock_pins() -> None:
    """lock/product.txt (the images) is a subset of lock/all.txt (the tests) with the same
    versions and hashes: the images run what the tests ran."""
    whole = {(pin.name, pin.marker): pin for pin in read_lock(LOCK / "all.txt")}
    for pin in read_lock(LOCK / "product.txt"):
        assert whole.get((pin.name, pin.marker)) == pin, f"lock/product.txt: {pin.name} differs from lock/all.txt"


def _requirements(extras: bool) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [Requirement(r) for r in project["project"]["dependencies"]]
    found += [Requirement(r) for r in project["build-system"]["requires"]]
    if extras:
        for listed in project["project"]["optional-dependencies"].values():
            found += [Requirement(r) for r in listed]
    return found


# The interpreters the lock is made for: the images' (Python 3.11 on Linux, amd64 and arm64;
# the Dockerfile's base has 3.11.13, the real-node tier's Debian base 3.11.2).
_IMAGES = [
    {"python_version": "3.11", "python_full_version": full, "platform_machine": machine}
    for full in ("3.11.13", "3.11.2")
    for machine in ("x86_64", "aarch64")
]


def _environment(base: dict[str, str]) -> dict[str, str]:
    return {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", **base}


@pytest.mark.parametrize(("lock", "extras"), [("all.txt", True), ("product.txt", False)])
def test_each_range_in_pyproject_admits_its_pin(lock: str, extras: bool) -> None:
    """Every requirement of pyproject.toml (the product's, the build backend's and, for
    lock/all.txt, every extra's) is pinned for the images' interpreters at a version its range
    admits."""
    pins = read_lock(LOCK / lock)
    for base in _IMAGES:
        environment = _environment(base)
        here = {pin.name: pin.version for pin in pins if pin.applies(environment)}
        for requirement in _requirements(extras):
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            name = canonicalize_name(requirement.name)
            assert name in here, f"lock/{lock}: {name} (pyproject.toml) is not pinned: run scripts/lock"
            assert requirement.specifier.contains(Version(here[name]), prereleases=True), (
                f"lock/{lock}: {name}=={here[name]} is outside pyproject.toml's {requirement.specifier}: "
                "run scripts/lock"
            )
