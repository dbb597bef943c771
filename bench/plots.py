"""Shared by the benchmark scripts: where results go, and a PNG writer (matplotlib, headless).

The ``bench`` extra provides matplotlib (``scripts/venv`` installs it from the lock); each
script also prints its table, so a run without it still gives the numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def save_png(name: str, draw: Callable[[Any], None], title: str) -> Path | None:
    """Draw on one matplotlib Axes and write ``bench/results/<name>.png``; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (scripts/venv installs it): no plot, the table above is the result")
        return None
    RESULTS.mkdir(exist_ok=True)
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    draw(axes)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path = RESULTS / f"{name}.png"
    figure.savefig(path)
    plt.close(figure)
    print(f"plot: {path.relative_to(RESULTS.parents[1])}")
    return path


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
