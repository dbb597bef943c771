"""A worker process's first job against its later ones: are dependencies built before work?

Each Celery pool process builds its dependencies (Agents API client, store, runner) when it
starts (``wiring.ProcessDeps`` on ``worker_process_init``), so its first job should cost what
later jobs of the same kind cost. Runs the whole loop on loopback (redis-server, the simulator,
one receiver, two workers × two pool processes, the scheduler, the local runner), creates
sessions one after another, then reads the workers' "task started"/"task done" lines and
prints, per pool process, the first job's duration next to the median of that process's later
jobs of the same kind (the baseline, measured in the same run).

    .venv/bin/python bench/first_job.py [--sessions 20] [--interval 0.3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import executor
from bench.plots import markdown_table
from tests.support.processes import wait_for
from tests.system.loop import Loop


def job_durations(lines: list[dict[str, object]]) -> dict[int, list[tuple[str, float]]]:
    """Per pool process, its jobs in the order it started them: (kind, seconds)."""
    started: dict[str, tuple[int, str, float]] = {}
    done: dict[str, float] = {}
    for line in lines:
        task_id = str(line.get("task_id", ""))
        if line.get("event") == "task started":
            started[task_id] = (int(str(line["pid"])), str(line["event_type"]), float(str(line["time"])))
        elif line.get("event") == "task done":
            done[task_id] = float(str(line["time"]))
    jobs: dict[int, list[tuple[float, str, float]]] = {}
    for task_id, (pid, kind, at) in started.items():
        if task_id in done:
            jobs.setdefault(pid, []).append((at, kind, done[task_id] - at))
    return {pid: [(kind, seconds) for _, kind, seconds in sorted(entries)] for pid, entries in jobs.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between session creations")
    args = parser.parse_args()
    command, codex = executor()
    directory = Path(tempfile.mkdtemp(prefix="bench-first-job-"))
    loop = Loop(directory, command, receivers=1, workers=2)
    try:
        loop.start()
        with loop.api() as client:
            sessions = []
            for _ in range(args.sessions):
                sessions.append(loop.create_session(client))
                time.sleep(args.interval)
        environments = {s["environment"]["id"] for s in sessions}
        wait_for(
            lambda: environments <= {r["environment_id"] for r in loop.registrations() if r["status_code"] == 200},
            300,
            "every executor to register",
            interval=1.0,
        )
        lines = [line for worker in loop.workers for line in worker.log_lines()]
    finally:
        loop.stop()
        shutil.rmtree(directory, ignore_errors=True)

    rows = []
    for pid, jobs in sorted(job_durations(lines).items()):
        kind, first = jobs[0]
        later = [seconds for k, seconds in jobs[1:] if k == kind]
        baseline = statistics.median(later) if later else float("nan")
        rows.append(
            [
                str(pid),
                kind,
                f"{first * 1000:.1f}",
                f"{baseline * 1000:.1f}",
                str(len(later)),
                f"{first / baseline:.2f}" if later else "—",
            ]
        )
    print(f"\n{args.sessions} sessions; 2 workers × 2 pool processes; {'real codex' if codex else 'stand-in'}\n")
    print(
        markdown_table(
            [
                "pool process",
                "first job's kind",
                "first job (ms)",
                "later jobs of that kind, median (ms)",
                "later jobs",
                "ratio",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
