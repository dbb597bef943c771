"""Import rules that cover new code by themselves: an allowlist for the pure decisions (what
``.importlinter`` cannot say: its contracts forbid, they do not allow), every module in a layer,
and the contracts catching a module they have never heard of (a copy of the packages with new
modules added, linted)."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]

DECIDE_MAY_IMPORT = frozenset(
    {
        "__future__",
        "dataclasses",
        "enum",
        "typing",
        "controller.model",  # the observations and records decided on
        "controller.trust",  # is a spec safe to start (ids, remote_url): pure checks
    }
)
"""All that ``controller.decide`` may import: values and pure checks. A new import, of the
standard library (``os``, ``socket``, ``time``…) or of the project (``controller.files``…),
fails here until it is argued for and added."""


def test_decide_imports_only_what_it_is_allowed() -> None:
    """The decisions stay pure by construction: whatever ``controller.decide`` imports is on its
    allowlist (grimp, the graph import-linter reads)."""
    graph = grimp.build_graph("controller", include_external_packages=True)
    imported = graph.find_modules_directly_imported_by("controller.decide")
    assert imported - DECIDE_MAY_IMPORT == set()


def _layers() -> list[str]:
    """The modules and packages named in the top-level layers contract of ``.importlinter``."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    return re.findall(r"controller(?:\.\w+)*", parser["importlinter:contract:layers"]["layers"])


def test_every_module_at_any_depth_is_in_a_layer() -> None:
    """A module in no layer is checked by no layer rule: each module of ``controller`` is named
    in the layers contract or lies in a package that is; a package left out may hold only its
    docstring (``controller.store``) or re-export its own modules, each in a layer
    (``controller.endpoint``'s face: a chain through it is the layers contract's), so nothing
    escapes through its ``__init__``."""
    graph = grimp.build_graph("controller", include_external_packages=True)
    layered = _layers()
    outside = set()
    for module in sorted(m for m in graph.modules if m.startswith("controller")):
        if any(module == name or module.startswith(name + ".") for name in layered):
            continue
        is_container = any(name.startswith(module + ".") for name in layered)
        imported = graph.find_modules_directly_imported_by(module) - {"__future__"}
        if is_container and all(name.startswith(module + ".") for name in imported):
            continue
        outside.add(module)
    assert outside == set(), f"modules in no layer of .importlinter: {sorted(outside)}"


NEW_MODULES = {
    "controller/brand_new_simulated.py": ("import agents_simulator\n", "agents_simulator"),
    "controller/brand_new_door.py": ("import kubernetes\n", "kubernetes"),
    "controller/brand_new_io.py": ("import redis\n", "redis"),
    "controller/store/brand_new.py": ("from controller import redis_client\n", "controller.redis_client"),
}
"""Modules nobody has told the contracts about, each importing what only one place may."""


def lint_copy(directory: Path, extra: dict[str, str], contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over a copy of the packages with ``extra`` files added (path → text)."""
    for package in ("controller", "agents_simulator"):
        shutil.copytree(ROOT / package, directory / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in extra.items():
        (directory / path).write_text(text)
    (directory / ".importlinter").write_text(contracts)
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(directory)},
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        check=False,
    )


def test_a_new_module_is_covered_by_the_contracts_without_editing_them(tmp_path: Path) -> None:
    """Contracts by construction: a module added under ``controller/`` (or under one of its
    packages) that imports the simulator, the Kubernetes client, Redis, or (from the store) the
    module that builds Redis clients breaks a contract, though no contract names it: they
    protect what is imported, or name whole packages, rather than list the modules to check."""
    contracts = (ROOT / ".importlinter").read_text()
    result = lint_copy(tmp_path, {path: text for path, (text, _) in NEW_MODULES.items()}, contracts)
    output = " ".join(result.stdout.split())
    output = output[output.find("Contracts:") :]  # the verdicts, without the banner
    assert result.returncode == 1, output
    for path, (_, imported) in NEW_MODULES.items():
        module = path.removesuffix(".py").replace("/", ".")
        assert f"{module} -> {imported}" in output, f"{module} importing {imported} broke no contract: {output}"
