"""What a newcomer reads agrees with the code: one name per image, the tiers scripts/test
takes, the webhook event types, and docs that stand alone (no links out of the repository)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from controller.config import BOUNDS, KEYS, KubernetesSettings, number_text
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


# --- every reference a doc makes resolves ---------------------------------------------------------

CLAIMS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md", ROOT / "BENCHMARKS.md"]
"""The documents whose sentences are claims about this repository: each file, test, setting and
metric they name must exist."""
TOP_LEVEL = (
    "agents_simulator/",
    "bench/",
    "controller/",
    "docs/",
    "helm/",
    "runner_image/",
    "scripts/",
    "tests/",
    ".ci/",
)


def _claims() -> list[tuple[Path, str]]:
    return [(doc, _text(doc)) for doc in CLAIMS]


def _defined_tests() -> dict[Path, set[str]]:
    """Each test module under tests/ with the test functions (and classes) it defines."""
    found = {}
    for module in (ROOT / "tests").rglob("test_*.py"):
        found[module] = set(re.findall(r"^\s*(?:async )?def (test_\w+)|^class (Test\w+)", _text(module), re.MULTILINE))
        found[module] = {a or b for a, b in found[module]}
    return found


def test_every_file_a_doc_names_exists() -> None:
    """A path a doc names in backticks (from the repository's root) is there."""
    missing = []
    for doc, text in _claims():
        for quoted in re.findall(r"`([^`\s]+)`", text):
            path = re.split(r"::|:(?=\s|$)", quoted)[0].rstrip(",.;:")
            named = path.startswith(TOP_LEVEL) and not any(c in path for c in "*{}<>$")
            if named and not (ROOT / path).exists():
                missing.append(f"{doc.name}: {quoted}")
    assert missing == [], missing


def test_every_test_a_doc_names_exists() -> None:
    """``path::test_name`` names a test that module defines (``::name`` continues the previous
    path); any other ``test_…`` a doc names is a test function or module somewhere under tests/."""
    defined = _defined_tests()
    everywhere = set().union(*defined.values()) | {module.stem for module in defined}
    wrong = []
    for doc, text in _claims():
        previous: Path | None = None
        for path, name in re.findall(r"((?:tests/)?[\w/]*test_\w+\.py)?::(test_\w+)", text):
            if path:
                module = ROOT / path if path.startswith("tests/") else None
                matches = [m for m in defined if m == module or (module is None and m.name == Path(path).name)]
                previous = matches[0] if len(matches) == 1 else None
                if previous is None:
                    wrong.append(f"{doc.name}: {path} (no such test module, or more than one)")
                    continue
            if previous is None or name not in defined[previous]:
                wrong.append(f"{doc.name}: {path or '…'}::{name}")
        for name in set(re.findall(r"\b(test_\w+)\b", text)):
            if name not in everywhere:
                wrong.append(f"{doc.name}: {name}")
    assert wrong == [], wrong


def test_every_setting_a_doc_names_is_one_the_controller_reads() -> None:
    """A ``CONTROLLER_…`` name in a doc is a setting the parser reads (no stale or misspelt one)."""
    from controller.config import KEYS

    unknown = []
    for doc, text in _claims():
        for name in set(re.findall(r"\bCONTROLLER_[A-Z0-9_]*[A-Z0-9]\b", text)):
            if name not in KEYS:
                unknown.append(f"{doc.name}: {name}")
    assert unknown == [], unknown


def test_every_metric_a_doc_names_is_exported() -> None:
    """A ``controller_…`` metric in a doc is one the controller exports."""
    from tests.support.metrics import exported

    known = exported()
    unknown = []
    for doc, text in _claims():
        for name in set(re.findall(r"\bcontroller_[a-z_]*[a-z]\b", text)):
            if name not in known:
                unknown.append(f"{doc.name}: {name}")
    assert unknown == [], unknown


def test_every_metric_exported_has_a_row_in_the_metrics_table() -> None:
    """The other way: each metric the controller exports is in README's metrics table (a row
    names it first, maybe beside others), so a new metric cannot stay undocumented."""
    from tests.support.metrics import exported

    named = set()
    for line in _text(ROOT / "README.md").splitlines():
        if line.lstrip().startswith("| `controller_"):
            named |= set(re.findall(r"`(controller_[a-z_]*[a-z])", line.split("|")[1]))
    suffixes = ("_total", "_bucket", "_sum", "_count")
    families = {name for name in exported() if not name.endswith(suffixes)}  # a counter's family has no _total
    missing = sorted(name for name in families if name not in named and f"{name}_total" not in named)
    assert missing == [], missing


def _settings_rows() -> dict[str, str]:
    """README's settings table: each variable named at the start of a row, with its row."""
    rows = {}
    for line in _text(ROOT / "README.md").splitlines():
        for name in re.findall(r"^\| `(CONTROLLER_[A-Z0-9_]+)`(?: / `(_FILE)`)?", line):
            rows[name[0]] = line
            if name[1]:
                rows[name[0] + "_FILE"] = line
    return rows


def test_the_settings_table_names_every_setting_and_every_numbers_range() -> None:
    """Every setting the parser reads has its row in README's table (a secret's ``_FILE`` variant
    on its row: ``CONTROLLER_X`` / ``_FILE``), the table names no setting the parser does not read,
    and every number's row states the range ``config`` enforces (``BOUNDS``), as ``min–max``."""
    rows = _settings_rows()
    assert KEYS - set(rows) == set(), sorted(KEYS - set(rows))
    assert set(rows) - KEYS == set(), sorted(set(rows) - KEYS)
    for name, (minimum, maximum) in BOUNDS.items():
        assert f"range {number_text(minimum)}–{number_text(maximum)}" in rows[name], name


def _default_cells() -> dict[str, str]:
    """README's settings table: each variable's default, the row's second cell."""
    cells = {}
    for line in _text(ROOT / "README.md").splitlines():
        found = re.match(r"^\| `(CONTROLLER_[A-Z0-9_]+)`(?: / `_FILE`)? \| ([^|]*) \|", line)
        if found:
            cells[found.group(1)] = found.group(2).strip()
    return cells


def test_the_settings_table_states_every_default_the_parser_falls_back_to() -> None:
    """Each number's, text's and flag's default in README's table is the parser's own (``DEFAULTS``):
    a number as ``number_text`` writes it, a text or flag in backticks, an empty text as ``—``
    (a cell may go on after the value, as ``0 (off; …)`` does)."""
    from controller.config import DEFAULTS

    cells = _default_cells()
    wrong = []
    for name, default in sorted(DEFAULTS.items()):
        if isinstance(default, bool):
            expected = f"`{'true' if default else 'false'}`"
        elif isinstance(default, int | float):
            expected = number_text(default)
        else:
            expected = f"`{default}`" if default else "—"
        cell = cells.get(name, "")
        if cell != expected and not cell.startswith(expected + " "):
            wrong.append(f"{name}: README says {cell!r}, the parser {expected!r}")
    assert wrong == [], wrong


def _metric_row(metric: str) -> str:
    [row] = [line for line in _text(ROOT / "README.md").splitlines() if line.lstrip().startswith(f"| `{metric}")]
    return row


def _receiver_outcomes() -> set[str]:
    """Every ``outcome`` the receiver counts deliveries under, read from its code."""
    import inspect

    from controller.endpoint import app
    from controller.inbox import Outcome

    return {*re.findall(r'outcome="(\w+)"', inspect.getsource(app)), *(o.value for o in Outcome), "ignored"}


def _labelled() -> dict[str, set[str]]:
    """The values each labelled metric takes, read from the code that counts them."""
    from controller.decide import Cause, Verdict
    from controller.endpoint import REFUSAL_REASONS
    from controller.runners.kubernetes import seccomp

    return {
        "controller_webhooks_total": _receiver_outcomes(),
        "controller_decisions_total": {v.value for v in Verdict},
        "controller_sandboxes_stopped_total": {c.value for c in Cause},
        "controller_sandboxes_cannot_start_total": {seccomp.NO_NODE, seccomp.MISSING_ON_NODE},
        "controller_receiver_refused_total": set(REFUSAL_REASONS),
    }


def test_the_metrics_table_names_every_label_value_the_code_counts() -> None:
    """README's metrics table names every value a label takes in the code (the outcomes of
    ``controller_webhooks_total``, ``decide.Verdict``, ``decide.Cause``), so an added value
    cannot stay undocumented."""
    missing = []
    for metric, values in _labelled().items():
        words = set(re.findall(r"\w+", _metric_row(metric).split("|")[3]))
        missing += [f"{metric}: {value}" for value in sorted(values - words)]
    assert missing == [], missing


def test_the_metrics_table_names_only_label_values_the_code_counts() -> None:
    """The other way: each value README's metrics table names (in backticks) for a label the
    code counts under (``_labelled``) is one the code counts, so a value invented, or one since
    removed, cannot stay in the table."""
    invented = []
    for metric, values in _labelled().items():
        named = set(re.findall(r"`([a-z][a-z0-9_]*)`", _metric_row(metric).split("|")[3])) - NOT_LABEL_VALUES
        invented += [f"{metric}: {value}" for value in sorted(named - values)]
    assert invented == [], invented


NOT_LABEL_VALUES = {"last_active_at", "explain"}
"""Words in backticks in those rows that are no label value: a log line's field, a command."""

NOT_SETTINGS = {("scripts/build-images", "CONTROLLER_IMAGE"), ("scripts/build-images", "controller_image")}
"""Names that look like a setting or a metric and are neither: the image ``build-images`` builds
(its environment variable and shell variable)."""


def _code_and_config() -> list[Path]:
    """The files whose docstrings, comments and values are claims too: the package, the simulator,
    the benchmarks, the chart, the runner image, the scripts and the tools' config files."""
    places = ("controller", "agents_simulator", "bench", "helm", "runner_image")
    found = [p for place in places for p in (ROOT / place).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    found += [p for p in (ROOT / "scripts").iterdir() if p.is_file()]
    found += [ROOT / ".importlinter", ROOT / "pyproject.toml", ROOT / "Dockerfile"]
    return sorted(p for p in found if p.suffix not in (".png", ".pyc", ".tgz"))


def test_every_setting_and_metric_the_code_and_chart_name_exists() -> None:
    """A ``CONTROLLER_…`` setting or ``controller_…`` metric named anywhere in the code, its
    docstrings and comments, the chart (values, alerts, dashboard) or the tools' config is one
    the parser reads or the controller exports: a stale name in a comment or an alert on a
    metric that is gone fails here, not only one in README."""
    from tests.support.metrics import exported

    known = exported()
    wrong = []
    for path in _code_and_config():
        name = str(path.relative_to(ROOT))
        text = path.read_text(errors="replace")
        for setting in set(re.findall(r"\bCONTROLLER_[A-Z0-9_]*[A-Z0-9]\b", text)):
            if setting not in KEYS and (name, setting) not in NOT_SETTINGS:
                wrong.append(f"{name}: {setting}")
        for metric in set(re.findall(r"\bcontroller_[a-z_]*[a-z]\b", text)):
            if metric not in known and (name, metric) not in NOT_SETTINGS:
                wrong.append(f"{name}: {metric}")
    assert wrong == [], sorted(wrong)


def _statuses_sent() -> set[int]:
    """The statuses the receiver's server answers with itself: each ``refuse(NNN`` of the
    server, and each framing error's ``status``."""
    server = _text(ROOT / "controller" / "endpoint" / "server.py")
    framing = _text(ROOT / "controller" / "endpoint" / "framing.py")
    return {int(code) for code in re.findall(r"refuse\((\d{3}),", server)} | {
        int(code) for code in re.findall(r"^    status = (\d{3})$", framing, re.MULTILINE)
    }


def test_the_servers_docstring_names_exactly_the_statuses_it_sends() -> None:
    """``controller/endpoint/server.py`` lists its refusals ("Every refusal — 400, …"): each
    status named there is one the server sends, and each one it sends is named (a 413 listed
    there was never sent: the app refuses an over-cap body)."""
    server = _text(ROOT / "controller" / "endpoint" / "server.py")
    docstring = server.split('"""')[1]
    listed = docstring[docstring.index("Every refusal") :].split("calls ``on_refused")[0]
    named = {int(code) for code in re.findall(r"\b([45]\d\d)\b", listed)}
    sent = _statuses_sent()
    assert named == sent, f"named but not sent: {sorted(named - sent)}; sent but not named: {sorted(sent - named)}"


UVICORN_NAMED = {
    "controller/logs.py": "the simulator's uvicorn logs through JsonFormatter",
    "controller/endpoint/server.py": "uvloop, which the server runs on, comes with uvicorn[standard] (the simulator's)",
    "tests/unit/test_cli.py": "tests JsonFormatter with a uvicorn record",
    "tests/unit/test_docs.py": "this check",
}
"""Files of the product and its tests that name uvicorn without serving with it, and why."""


def test_only_what_runs_uvicorn_names_it() -> None:
    """The receiver runs its own HTTP/1.1 server, not uvicorn (the simulator still does): a file
    of the product or its tests that names uvicorn imports it (the simulator, its harness, the
    benchmarks' baselines) or says why it names it (``UVICORN_NAMED``), so "served by uvicorn"
    cannot outlive the change again."""
    stale = []
    for path in [*(ROOT / "controller").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        imports = re.search(r"^\s*(?:import|from) uvicorn\b", text, re.MULTILINE)
        if "uvicorn" in text.lower() and not imports and name not in UVICORN_NAMED:
            stale.append(name)
    assert stale == [], stale


def _import_layers() -> dict[str, set[int]]:
    """``.importlinter``'s top-level layers: each module or package of ``controller`` (first name
    after ``controller.``) with the layers (by position) it has modules in."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(ROOT / ".importlinter")
    found: dict[str, set[int]] = {}
    for position, line in enumerate(parser["importlinter:contract:layers"]["layers"].split("\n")):
        for name in re.findall(r"controller\.(\w+)", line):
            found.setdefault(name, set()).add(position)
    return found


def test_the_readmes_layer_map_names_every_module_in_its_layer() -> None:
    """README's map of controller/ names every module and package of it, each line's modules all
    in one layer of the import contract (``.importlinter``), so the map cannot fall behind."""
    readme = _text(ROOT / "README.md")
    block = readme[readme.index("controller/        the product") : readme.index("  runners/kubernetes/")]
    package = ROOT / "controller"
    modules = {p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    layers = _import_layers()
    named: set[str] = set()
    for line in block.splitlines()[1:]:
        on_line = {w for w in re.findall(r"\b(\w+)(?:\.py\b|/)?", line) if w in modules}
        named |= on_line
        shared = set.intersection(*(layers.get(m, set()) for m in on_line)) if on_line else {0}
        assert shared, f"README's layer map puts modules of different layers on one line: {sorted(on_line)}"
    assert modules - named == set(), f"modules missing from README's layer map: {sorted(modules - named)}"
    assert modules - set(layers) == set(), f"modules in no layer of .importlinter: {sorted(modules - set(layers))}"


def _support_statement() -> str:
    """README's statement of where test helpers live (the ``tests/support`` entry of its map)."""
    readme = _text(ROOT / "README.md")
    return readme[readme.index("tests/support    ") : readme.index("tests/unit       ")]


def _test_imports() -> dict[str, set[str]]:
    """Each Python file of tests/ and bench/ (by path) with the files of tests/ it imports (an
    import anywhere in it, a function's too; ``from tests.x import y`` names module y if it is one)."""
    import ast

    found: dict[str, set[str]] = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        names: set[str] = set()
        for node in ast.walk(ast.parse(_text(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        targets = set()
        for name in names:
            if name.startswith("tests."):
                target = name.replace(".", "/") + ".py"
                if (ROOT / target).exists():
                    targets.add(target)
        found[str(path.relative_to(ROOT))] = targets
    return found


def _tier(path: str) -> str:
    """``tests/system`` for tests/system/x.py, ``bench`` for bench/…"""
    return "/".join(path.split("/")[:2]) if path.startswith("tests/") else path.split("/")[0]


def test_test_helpers_live_where_the_readme_says() -> None:
    """README's statement holds: no module imports a test module (``test_*.py``) but the ones it
    names (each really imported), and what a module imports from another tier is in tests/support
    or in a harness it names, so a helper shared across tiers cannot settle in a test module or in
    a tier it does not belong to without the statement (and this test) changing."""
    statement = _support_statement()
    named = set(re.findall(r"tests/[\w/]+(?:\.py|/)", statement))
    assert all((ROOT / p).exists() for p in named), sorted(p for p in named if not (ROOT / p).exists())
    imported_test_modules = {p for p in named if p.rsplit("/", 1)[-1].startswith("test_")}
    harnesses = named - imported_test_modules - {"tests/support/"}
    wrong, used = [], set()
    for path, targets in _test_imports().items():
        for target in targets - {path}:
            is_test_module = target.rsplit("/", 1)[-1].startswith("test_")
            if is_test_module and target not in imported_test_modules:
                wrong.append(f"{path} imports the test module {target}")
            elif is_test_module:
                used.add(target)
            elif _tier(target) != _tier(path) and not _in(target, {"tests/support/", *harnesses}):
                wrong.append(f"{path} imports {target}, of another tier, neither in tests/support nor a harness")
    assert wrong == [], wrong
    assert imported_test_modules <= used, f"README names test modules nobody imports: {imported_test_modules - used}"


def _in(path: str, places: set[str]) -> bool:
    """Whether ``path`` is one of ``places`` or lies in one of them (those ending in ``/``)."""
    return any(path == place or (place.endswith("/") and path.startswith(place)) for place in places)


# --- the chaos catalogue's ranges -----------------------------------------------------------------

RANGE = re.compile(r"(\d+(?:\.\d+)?)–(\d+(?:\.\d+)?) s\b")


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    start = text.index(heading)
    end = re.search(r"^#", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + end.start()] if end else text[start:]


def test_the_docs_state_the_chaos_catalogues_ranges_as_the_schedule_draws_them() -> None:
    """Issue 27: RELIABILITY.md states the catalogue with the text the schedule generates from the
    ranges its draws use (``schedule.catalogue_text``), and every range README's "Chaos runs"
    gives (``a–b s``) is one the catalogue draws: a range edited on either side fails here."""
    from tests.chaos.schedule import RANGES, catalogue_text

    def flat(text: str) -> str:
        return " ".join(text.split())

    reliability = _section(_text(ROOT / "RELIABILITY.md"), "## Seeded fault schedule")
    assert flat(catalogue_text()) in flat(reliability), "RELIABILITY.md: state the catalogue as catalogue_text() does"
    drawn = {(float(low), float(high)) for low, high in RANGES}
    readme = _section(_text(ROOT / "README.md"), "### Chaos runs")
    stated = [(float(low), float(high)) for low, high in RANGE.findall(readme)]
    assert stated and set(stated) <= drawn, sorted(set(stated) - drawn)
