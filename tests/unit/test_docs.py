"""What a newcomer reads agrees with the code: one name per image, the tiers scripts/test
takes, the webhook event types, and docs that stand alone (no links out of the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from controller.config import KubernetesSettings
from controller.events import HANDLED_TYPES
from controller.runners.kubernetes.manifests import SandboxTemplate

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHART = ROOT / "helm" / "sandbox-controller"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def test_docs_stand_alone() -> None:
    """No link or path out of the repository (`../…`), and every relative link resolves."""
    for doc in DOCS:
        text = _text(doc)
        assert "../shared" not in text and "shared/docs" not in text, doc
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if "://" in target:
                continue
            assert (doc.parent / target).resolve().is_relative_to(ROOT), (doc, target)
            assert (doc.parent / target).exists(), (doc, target)


def test_one_runner_image_name_everywhere() -> None:
    values = yaml.safe_load(_text(CHART / "values.yaml"))
    chart_image = f"{values['sandbox']['image']['repository']}:{values['sandbox']['image']['tag']}"
    assert KubernetesSettings.image == SandboxTemplate.image == chart_image
    makefile = _text(ROOT / "runner_image" / "Makefile")
    assert f"IMAGE ?= {values['sandbox']['image']['repository']}\n" in makefile
    assert "TAG ?= $(CODEX_VERSION)" in makefile and f"CODEX_VERSION ?= {values['sandbox']['image']['tag']}" in makefile
    readme = _text(ROOT / "README.md")
    assert chart_image in readme
    for doc in DOCS:  # no other local name for the runner or controller images
        text = _text(doc)
        assert not re.search(r"(?<![/\w-])sandbox-runner:", text), doc
        assert "sandbox-controller-runner" not in text, doc
        assert not re.search(r"(?<![/\w-])sandbox-controller:", text), doc


def test_one_controller_image_name_everywhere() -> None:
    values = yaml.safe_load(_text(CHART / "values.yaml"))
    version = yaml.safe_load(_text(CHART / "Chart.yaml"))["appVersion"]
    assert f"{values['image']['repository']}:{version}" in _text(ROOT / "README.md")


def test_docs_name_exactly_the_event_types_the_controller_handles() -> None:
    """L4: nothing lists webhook event types by hand except as the controller subscribes them."""
    notes = _text(CHART / "templates" / "NOTES.txt")
    for text in [*(_text(d) for d in DOCS), notes]:
        assert '"event_types"' not in text
        assert "webhook register" in text or "webhook_endpoints" not in text
    readme = _text(ROOT / "README.md")
    for event_type in HANDLED_TYPES:
        assert f"`{event_type}`" in readme
        assert event_type in notes


def test_scripts_test_takes_every_tier_the_docs_name_and_refuses_others_before_set_up() -> None:
    script = _text(ROOT / "scripts" / "test")
    [accepted] = re.findall(r"^  (static\|[a-z|]+)\) ;;$", script, flags=re.MULTILINE)
    tiers = set(accepted.split("|"))
    named = set()
    for doc in DOCS:
        named |= set(re.findall(r"scripts/test ([a-z]+)", _text(doc)))
    named |= set(re.findall(r"`(static|unit|chart|contract|kube|system|all|cluster)`", _text(ROOT / "README.md")))
    assert named and named <= tiers, named - tiers
    done = subprocess.run(
        [str(ROOT / "scripts" / "test"), "no-such-tier"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert done.returncode == 2
    assert "unknown tier: no-such-tier" in done.stderr
    assert "==>" not in done.stdout  # refused before any set-up step


def test_readme_documents_every_setting() -> None:
    """Each setting the config reads (``KEYS``) has a row in README's configuration table (a
    secret's ``_FILE`` variant on its row: ``CONTROLLER_X`` / ``_FILE``), and the table names
    no setting the config does not read."""
    from controller.config import KEYS

    readme = _text(ROOT / "README.md")
    table = readme[readme.index("## Configuration") : readme.index("## Operations")]
    rows = [line for line in table.splitlines() if line.startswith("| `CONTROLLER_")]
    named = set()
    for row in rows:
        first = row.split(" | ")[0]
        [name] = re.findall(r"`(CONTROLLER_[A-Z_]+)`", first)
        named.add(name)
        if "/ `_FILE`" in first:
            named.add(name + "_FILE")
    assert named == KEYS, (sorted(KEYS - named), sorted(named - KEYS))
