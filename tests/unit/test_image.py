"""The production image holds the product only: the Agents API simulator stays out of it.

No Docker engine here, so the check reads what decides the image's file list: the stages the
Dockerfile's default target is built from, what they ``COPY``, and which packages setuptools
finds (``pip install .``) in exactly those files.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import setuptools

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = "agents_simulator"


def _stages() -> list[tuple[str, str, list[str]]]:
    """(name, base, COPY sources) of every stage, in order."""
    stages: list[tuple[str, str, list[str]]] = []
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        words = raw.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            name = words[3] if len(words) >= 4 and words[2].upper() == "AS" else ""
            stages.append((name, words[1], []))
        elif words[0] == "COPY":
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            stages[-1][2].extend(sources)
    return stages


def _default_target_copies() -> list[str]:
    """What the default target (the last stage) and the stages it is built from copy in."""
    stages = _stages()
    by_name = {name: (base, copies) for name, base, copies in stages if name}
    _, base, copies = stages[-1]
    sources = list(copies)
    while base in by_name:
        base, inherited = by_name[base]
        sources.extend(inherited)
    return sources


def _find(where: Path) -> list[str]:
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return sorted(setuptools.find_packages(where=str(where), include=found["include"]))


def test_the_default_image_target_copies_the_controller_package_only() -> None:
    copied = _default_target_copies()
    # LICENSE: pyproject names it; lock/product.txt: the dependencies, pinned with hashes
    assert sorted(copied) == ["LICENSE", "README.md", "controller", "lock/product.txt", "pyproject.toml"]
    assert not any(SIMULATOR in source for source in copied)


def test_pip_install_of_the_image_build_files_installs_no_simulator(tmp_path: Path) -> None:
    for source in _default_target_copies():
        path = ROOT / source
        if path.is_dir():
            shutil.copytree(path, tmp_path / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, tmp_path / source)
    packages = _find(tmp_path)
    assert "controller" in packages
    assert "controller.runners" in packages
    assert not [p for p in packages if p.split(".")[0] == SIMULATOR]


def test_development_installs_have_the_simulator_and_no_tests() -> None:
    packages = _find(ROOT)
    assert {"controller", SIMULATOR} <= set(packages)
    assert not [p for p in packages if p.split(".")[0] not in ("controller", SIMULATOR)]


def _pip_installs() -> list[list[str]]:
    """The words of each ``pip install`` the Dockerfile runs (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    installs: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("RUN "):
            continue
        for command in line.removeprefix("RUN ").split("&&"):
            words = command.split()
            if words[:2] == ["pip", "install"]:
                installs.append(words[2:])
    return installs


def test_every_image_installs_its_dependencies_from_the_lock_with_hashes_checked() -> None:
    """Each target installs lock/product.txt with ``--require-hashes`` (pip then refuses a file
    whose sha256 differs and any dependency the lock does not pin) and the package itself with
    ``--no-deps``: nothing is resolved from the package index at build time."""
    installs = _pip_installs()
    from_lock = [words for words in installs if "--require-hashes" in words]
    package = [words for words in installs if "--require-hashes" not in words]
    stages = [name for name, _, _ in _stages() if name and name != "base"]
    assert len(from_lock) == len(stages) == len(package), (installs, stages)
    for words in from_lock:
        assert words[words.index("-r") + 1] == "lock/product.txt"
    for words in package:
        assert words[-1] == "." and "--no-deps" in words and "--no-build-isolation" in words, words
