"""Shared by the benchmark scripts: percentiles, and the executor a loop on loopback runs."""

from __future__ import annotations

import sys

from agents_simulator.dev import find_codex


def percentile(values: list[float], q: float) -> float:
    """The value at rank ``q`` (0..1) of ``values``, the nearest rank between first and last."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def executor() -> tuple[str, bool]:
    """The executor command: the real codex when installed (``scripts/test`` caches it), else
    the labelled stand-in; and whether it is the real codex."""
    codex = find_codex()
    return (codex or f"{sys.executable} -m agents_simulator.standin"), codex is not None
