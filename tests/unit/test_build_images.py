"""``scripts/build-images`` (the multi-architecture controller and runner images) agrees with
what it builds from: every platform it builds by default has a pinned codex for that platform
in ``runner_image/codex.lock``, its codex version and image names are the ones the Makefile,
the chart and README use, and a platform it cannot build is refused in one line before any
engine runs. (Building needs podman or buildah and base images; no build runs here.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images"
CHART = ROOT / "helm" / "sandbox-controller"


def _script() -> str:
    return SCRIPT.read_text()


def _default(name: str) -> str:
    [value] = re.findall(rf"^{name}=(\S+)$", _script(), re.MULTILINE)
    return value


def _codex_platforms() -> dict[str, str]:
    """The script's map from an image platform to the codex npm package's platform."""
    return dict(re.findall(r"^\s+(linux/\w+)\) echo (linux-[\w-]+) ;;$", _script(), re.MULTILINE))


def _locked() -> set[str]:
    lines = (ROOT / "runner_image" / "codex.lock").read_text().splitlines()
    return {line.split()[0] for line in lines if line and not line.startswith("#")}


def test_every_default_platform_has_a_pinned_codex_of_its_own() -> None:
    platforms = _default("PLATFORMS").split(",")
    assert platforms == ["linux/amd64", "linux/arm64"]
    mapping = _codex_platforms()
    version = re.search(r"CODEX_VERSION:-([\d.]+)", _script())
    assert version is not None
    for platform in platforms:
        assert f"{version.group(1)}-{mapping[platform]}" in _locked(), platform
    assert len({mapping[p] for p in platforms}) == len(platforms)  # each its own binary


def test_the_script_and_the_makefile_agree_on_codex_and_its_platform_names() -> None:
    makefile = (ROOT / "runner_image" / "Makefile").read_text()
    version = re.search(r"CODEX_VERSION:-([\d.]+)", _script())
    assert version is not None and f"CODEX_VERSION ?= {version.group(1)}\n" in makefile
    # The Makefile's one-platform build names the same codex platforms.
    assert "$(if $(filter linux/arm64,$(PLATFORM)),linux-arm64,linux-x64)" in makefile
    assert _codex_platforms() == {"linux/amd64": "linux-x64", "linux/arm64": "linux-arm64"}


def test_the_image_names_are_the_charts() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert f"CONTROLLER_IMAGE:-{values['image']['repository']}:{app_version}}}" in _script()
    assert f"RUNNER_IMAGE:-{values['sandbox']['image']['repository']}:${{codex_version}}}}" in _script()
    assert values["sandbox"]["image"]["tag"] == re.search(r"CODEX_VERSION:-([\d.]+)", _script()).group(1)  # type: ignore[union-attr]


def test_the_dockerfiles_build_any_platform_from_the_same_text() -> None:
    """Nothing in either Dockerfile names one architecture: the runner finds codex under any
    target triple, and the bases are given as arguments."""
    runner = (ROOT / "runner_image" / "Dockerfile").read_text()
    assert "vendor/*/bin/codex" in runner
    for dockerfile in (ROOT / "Dockerfile", ROOT / "runner_image" / "Dockerfile"):
        code = "\n".join(line for line in dockerfile.read_text().splitlines() if not line.startswith("#"))
        assert not re.search(r"amd64|arm64|x86_64|aarch64|linux-x64", code), dockerfile


def test_an_unknown_platform_is_refused_in_one_line_before_any_build() -> None:
    done = subprocess.run(
        [str(SCRIPT), "--platforms", "linux/amd64,linux/s390x"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "ENGINE": "podman"},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "build-images: unsupported platform linux/s390x (linux/amd64, linux/arm64)"
    ]
    assert done.stdout == ""


def test_help_prints_the_usage() -> None:
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "scripts/build-images --platforms linux/amd64" in done.stdout
    assert "set -euo" not in done.stdout
