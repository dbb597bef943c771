"""Idle shutdown against keep-warm: a scripted "day" of sessions, run twice side by side.

Starts the whole loop twice on loopback (redis-server, the simulator, a receiver, two Celery
workers, the scheduler, the local runner with the real codex), once with idle shutdown and
once with keep-warm (idle timeout 0), and plays the same script on both: each session takes
turns separated by idle gaps, some shorter than the idle timeout, some much longer. Time is
compressed: one second stands for ``--scale`` seconds of a real day (the default, 600, makes
a 30-minute idle timeout 3 s and a 6-hour working day 36 s).

It prints, for both runs: executor-seconds (how long executors ran, sampled every 0.2 s),
inputs that failed, and, for the idle run, the stop latency after each idle deadline
(p50/p99: time of the logged stop minus last activity + timeout) and the connection time of
inputs that found their sandbox stopped.

Usage: .venv/bin/python bench/idle_day.py [--sessions 6] [--scale 600]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.codex import codex_binary
from tests.system.loop import Loop

IDLE_TIMEOUT_REAL = 30 * 60  # the default idle timeout, in real seconds
DAY_REAL = 6 * 3600  # one working day of a session, in real seconds


def script(sessions: int, seed: int = 7) -> list[list[float]]:
    """Per session, the real-time offsets of its turns: bursts of quick follow-ups, then a
    break (meetings, lunch, the evening) longer than the idle timeout."""
    rng = random.Random(seed)
    plans = []
    for _ in range(sessions):
        at, turns = rng.uniform(0, 1800), []
        while at < DAY_REAL:
            for _ in range(rng.randint(2, 5)):  # a burst: gaps of 1-10 minutes
                turns.append(at)
                at += rng.uniform(60, 600)
            at += rng.uniform(2400, 7200)  # a break of 40-120 minutes
        plans.append([t for t in turns if t < DAY_REAL])
    return plans


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def play(directory: Path, idle_timeout: float, plans: list[list[float]], scale: float) -> dict[str, Any]:
    loop = Loop(
        directory,
        codex_binary(),
        receivers=1,
        workers=2,
        extra_env={"CONTROLLER_IDLE_TIMEOUT_SECONDS": f"{idle_timeout:g}"},
    )
    alive_seconds: dict[str, float] = defaultdict(float)
    connect_times: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()
    stop_sampling = threading.Event()
    try:
        loop.start()

        def sample() -> None:
            last = time.monotonic()
            while not stop_sampling.wait(0.2):
                now = time.monotonic()
                for sid, count in loop.live_executors().items():
                    alive_seconds[sid] += count * (now - last)
                last = now

        sampler = threading.Thread(target=sample, daemon=True)
        with loop.api() as client:
            sessions = [loop.create_session(client, input_text=None)["id"] for _ in plans]
        start = time.monotonic() + 2
        sampler.start()

        def run(index: int) -> None:
            sid = sessions[index]
            with loop.api() as client:
                for offset in plans[index]:
                    time.sleep(max(0.0, start + offset / scale - time.monotonic()))
                    sent = time.monotonic()
                    client.post(
                        f"/v1/agents/sessions/{sid}/events",
                        json={"events": [{"type": "agent.session.input.message", "input": "next step"}]},
                    ).raise_for_status()
                    needed_connection = False
                    while True:
                        status = client.get(f"/v1/agents/sessions/{sid}").json()["status"]
                        if status == "failed":
                            with lock:
                                failed.append(sid)
                            return
                        if status == "requires_action":
                            needed_connection = True
                        elif status in ("in_progress", "idle"):
                            if needed_connection:
                                with lock:
                                    connect_times.append(time.monotonic() - sent)
                            break
                        time.sleep(0.05)

        with ThreadPoolExecutor(max_workers=len(plans)) as pool:
            list(pool.map(run, range(len(plans))))
        time.sleep(max(0.0, start + DAY_REAL / scale - time.monotonic()))  # the day runs to its end
        stop_sampling.set()
        sampler.join(timeout=10)
        lateness = []
        for worker in loop.workers:
            for line in worker.log_lines():
                if line.get("event") == "sandbox stopped" and line.get("cause") == "idle":
                    since = max(float(line["last_active_at"]), float(line["started_at"]))
                    lateness.append(float(line["time"]) - (since + idle_timeout))
        return {
            "executor_seconds": sum(alive_seconds.values()),
            "turns": sum(len(p) for p in plans),
            "failed": len(failed),
            "stops": len(lateness),
            "lateness": lateness,
            "connect_times": connect_times,
        }
    finally:
        stop_sampling.set()
        loop.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--scale", type=float, default=600.0, help="real seconds per wall-clock second")
    args = parser.parse_args()
    plans = script(args.sessions)
    timeout = IDLE_TIMEOUT_REAL / args.scale
    with tempfile.TemporaryDirectory(prefix="idle-day-") as tmp:
        idle = play(Path(tmp) / "idle", timeout, plans, args.scale)
        warm = play(Path(tmp) / "warm", 0, plans, args.scale)
    real = args.scale  # one wall second stands for this many real seconds
    print(
        f"day: {args.sessions} sessions, {idle['turns']} turns over {DAY_REAL / 3600:g} h, "
        f"idle timeout {IDLE_TIMEOUT_REAL / 60:g} min (compressed x{args.scale:g}: {timeout:g} s)"
    )
    for name, run in (("keep-warm", warm), ("idle shutdown", idle)):
        print(
            f"{name:>13}: executor time {run['executor_seconds'] * real / 3600:.1f} h "
            f"({run['executor_seconds']:.1f} s wall), inputs failed {run['failed']}, idle stops {run['stops']}"
        )
    saved = 1 - idle["executor_seconds"] / warm["executor_seconds"] if warm["executor_seconds"] else 0.0
    print(f"compute saved by idle shutdown: {saved:.0%}")
    if idle["lateness"]:
        late = idle["lateness"]
        print(
            f"stop latency after the idle deadline: p50 {statistics.median(late):.2f} s, "
            f"p99 {percentile(late, 0.99):.2f} s, max {max(late):.2f} s (n={len(late)})"
        )
    if idle["connect_times"]:
        times = idle["connect_times"]
        print(
            f"inputs that found their sandbox stopped: {len(times)}; input→connected "
            f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s"
        )
    return 0 if idle["failed"] == warm["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
