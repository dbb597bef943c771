"""Import rules that cover new code by themselves: an allowlist for the pure decisions (what
``.importlinter`` cannot say: its contracts forbid, they do not allow)."""

from __future__ import annotations

import grimp

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
