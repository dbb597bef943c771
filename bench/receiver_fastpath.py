"""The receiver against a truly bare app and a 20-line handler, side by side in one run.

One run starts a real redis-server (append-only, fsync every second: the Helm chart's Redis)
and one single-process server per case on loopback:

  bare       bench/bare_app.py: POST /webhooks reads the body, answers 200, run as anyone runs it
             (``uvicorn bare_app:app --no-access-log``: uvicorn's defaults, so httptools and
             uvloop, which ``uvicorn[standard]`` installs): the ceiling
  bare-h11   the same app on the server settings ``serve`` had before issue 21 (``bench/serve_app.py
             … h11``: uvicorn's pure-Python h11 parser with the header cap, the connection cap):
             the baseline BENCHMARKS.md used before issue 21
  bare-serve (only with ``--cases``) the same app on ``serve``'s own server now
             (``controller.endpoint.run``: httptools for the head, every phase bounded)
  handler    bench/webhook_handler.py, the 20-line handler: ``standardwebhooks`` verification,
             LPUSH with redis-py in Starlette's thread pool, on uvicorn's defaults
  serve-before  (with ``--before DIR``) the same, from an earlier commit's ``controller/`` in DIR
             (``git archive main controller | tar -x -C DIR``), for a before/after in one run
  serve      ``sandbox-controller serve`` as the Helm chart runs it: the secrets in a file
             (``CONTROLLER_WEBHOOK_SECRETS_FILE``, looked at once a second), INFO logging (one JSON
             line per delivery, to a file here), the default limits

and drives them with the Go load generator (bench/loadgen, stdlib only, built here with
``go build`` into ~/.cache/sandbox-controller/bench): keep-alive connections, every request
freshly signed with a fresh webhook-id (so every ``serve`` and handler request is a new job).

1. Throughput, closed loop: for each round (default 3), client count (16, 64) and case in turn
   (interleaved, so a busier minute of the machine hits every case alike): requests/second, the
   closed-loop p50/p99 latency, and the server's CPU time per request (user + system from /proc,
   which moves less with the machine's load). Every answer must be 2xx, and ``serve`` must have
   queued exactly one Celery message per 2xx (and the handler one list entry per 2xx). The
   1-minute load average is recorded before every round.
2. Latency, open loop: ``serve`` at half of its own median saturation throughput, per client
   count, and the bare app at the same rate as a control; p50/p99 from when each request was due.
3. With ``--profile SECONDS``: ``serve`` under 16 closed-loop clients for that long with py-spy
   sampling it (``pip install py-spy``; needs ptrace, as root), the samples attributed to the
   stages of a request (``bench/request_profile.py``) in µs of CPU per request.

    .venv/bin/python bench/receiver_fastpath.py [--rounds 3] [--clients 16,64] [--seconds 5] [--profile 10]

The ``bench`` extra provides ``standardwebhooks`` (``scripts/venv`` installs it from the
lock). Figures from different runs or machines are not comparable; the ratios of one run are
the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import instructions as bench_instructions
from bench.plots import markdown_table
from controller import queue
from tests.support.processes import Managed, free_port, port_open, python_module, wait_for
from tests.support.redis_server import RedisServer

SECRET = "whsec_" + "YmVuY2htYXJrLXNlY3JldC1ub3QtYS1yZWFsLW9uZQ=="
CASES = ("bare", "bare-h11", "bare-serve", "handler", "serve-before", "serve")
DEFAULT_CASES = ("bare", "bare-h11", "handler", "serve")
BASELINES = ("bare", "bare-h11", "bare-serve", "handler", "serve-before")
HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "sandbox-controller" / "bench"
GOALS = {"bare": 0.35, "handler": 1.5}
P99_GOAL_MS = 20.0


def build_loadgen() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    binary = CACHE / "loadgen"
    env = {**os.environ, "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "loadgen", env=env, check=True)
    return binary


def load(binary: Path, port: int, clients: int, seconds: float, warmup: float, rate: float = 0) -> dict[str, Any]:
    argv = [
        str(binary), "-url", f"http://127.0.0.1:{port}/webhooks", "-clients", str(clients),
        "-duration", f"{seconds}s", "-warmup", f"{warmup}s", "-rate", str(rate),
    ]  # fmt: skip
    env = {**os.environ, "LOADGEN_SECRET": SECRET}
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=seconds + warmup + 60)
    result: dict[str, Any] = json.loads(done.stdout)
    if result["non_2xx"] or result["errors"] or not result["requests"]:
        raise SystemExit(f"port {port}, {clients} clients: not every answer was 2xx: {result}")
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def uvicorn_defaults(app: str, port: int) -> list[str]:
    """``uvicorn APP`` as anyone runs it (its defaults), without the access log."""
    return python_module(
        "uvicorn", "--app-dir", str(HERE), app, "--host", "127.0.0.1", "--port", str(port),
        "--no-access-log", "--log-level", "warning",
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="16,64", help="client connection counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run (after 1 s warm-up)")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"of {', '.join(CASES)}, comma-separated")
    parser.add_argument("--no-latency", action="store_true", help="skip the open-loop latency runs")
    parser.add_argument("--profile", type=float, default=0, help="seconds of py-spy profile of serve (0: none)")
    parser.add_argument(
        "--instructions", type=float, default=0, help="seconds of load per case under callgrind (0: none)"
    )
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also run serve-before: serve from the controller/ package in DIR (an earlier commit's)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    cases = [c for c in CASES if c in args.cases.split(",") or (c == "serve-before" and args.before)]
    binary = build_loadgen()
    directory = Path(tempfile.mkdtemp(prefix="bench-fastpath-"))
    redis = RedisServer(directory / "redis").start()
    client = redis.client()
    client.config_set("appendfsync", "everysec")  # as the Helm chart's Redis (appendonly, default fsync)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLLER_", "BENCH_"))}
    ports = {case: free_port() for case in cases}
    secrets_file = directory / "webhook-secrets"
    secrets_file.write_text(SECRET + "\n")
    secrets_file.chmod(0o600)

    handler_env = {**base, "BENCH_SECRET": SECRET, "BENCH_REDIS_URL": redis.url}
    serve_env = {**base, "CONTROLLER_REDIS_URL": redis.url, "CONTROLLER_WEBHOOK_SECRETS_FILE": str(secrets_file)}

    def command(case: str, port: int) -> tuple[list[str], dict[str, str]]:
        """How each case is started, listening on ``port``."""
        if case == "bare":
            return uvicorn_defaults("bare_app:app", port), base
        if case in ("bare-h11", "bare-serve"):
            server_app = [sys.executable, str(HERE / "serve_app.py"), "bare_app:app", str(port)]
            return [*server_app, "h11"] if case == "bare-h11" else server_app, base
        if case == "handler":
            return uvicorn_defaults("webhook_handler:app", port), handler_env
        serve = python_module("controller", "serve", "--host", "127.0.0.1", "--port", str(port))
        if case == "serve-before":
            return serve, {**serve_env, "PYTHONPATH": str(Path(args.before).resolve())}
        return serve, serve_env

    # In the temporary directory, so that ``-m controller`` finds the package installed (or the one
    # PYTHONPATH names), not the one in the directory the benchmark was started from.
    servers = {case: Managed(case, *command(case, ports[case]), directory / f"{case}.log", directory) for case in cases}
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(case, c): [] for case in cases for c in levels}
    latency: dict[int, list[tuple[float, float, float, float, float]]] = {c: [] for c in levels}
    loads: list[str] = []
    instructions: dict[str, float] = {}
    profile_text = ""
    before = loadavg()
    try:
        for each in servers.values():
            each.start()
        wait_for(lambda: all(port_open(p) for p in ports.values()), 60, "the servers")
        for round_ in range(1, args.rounds + 1):
            loads.append(loadavg())
            for clients in levels:
                for case in cases:
                    used = cpu_seconds(servers[case].pid)
                    result = load(binary, ports[case], clients, args.seconds, 1.0)
                    used = cpu_seconds(servers[case].pid) - used
                    runs[case, clients].append(
                        {
                            "rps": result["rps"],
                            "p50": result["p50_ms"],
                            "p99": result["p99_ms"],
                            "cpu": used / result["all_2xx"] * 1e6,  # µs per request, warm-up included
                        }
                    )
                    stored = {"serve": queue.QUEUE, "serve-before": queue.QUEUE, "handler": "bench:jobs"}.get(case)
                    if stored is not None and (queued := client.llen(stored)) != result["all_2xx"]:
                        raise SystemExit(f"{case} answered {result['all_2xx']} 2xx but queued {queued} jobs")
                    client.delete(queue.QUEUE, "bench:jobs")
                    time.sleep(0.5)  # let the machine settle between runs
                line = "  ".join(
                    f"{c} {runs[c, clients][-1]['rps']:5.0f}/s {runs[c, clients][-1]['cpu']:3.0f}µs "
                    f"p99 {runs[c, clients][-1]['p99']:.1f}ms"
                    for c in cases
                )
                print(f"round {round_} (load {loads[-1]}), {clients:>3} clients: {line}", flush=True)
        if not args.no_latency and "serve" in cases and "bare" in cases:
            for round_ in range(1, args.rounds + 1):
                for clients in levels:
                    rate = statistics.median(run["rps"] for run in runs["serve", clients]) / 2
                    result = load(binary, ports["serve"], clients, args.seconds, 1.0, rate=rate)
                    client.delete(queue.QUEUE)
                    time.sleep(0.5)
                    control = load(binary, ports["bare"], clients, args.seconds, 1.0, rate=rate)
                    time.sleep(0.5)
                    latency[clients].append(
                        (rate, result["p50_ms"], result["p99_ms"], control["p50_ms"], control["p99_ms"])
                    )
                    print(
                        f"round {round_}, {clients:>3} clients at {rate:.0f} req/s: "
                        f"serve p50 {result['p50_ms']:.1f} ms  p99 {result['p99_ms']:.1f} ms; "
                        f"bare p50 {control['p50_ms']:.1f} ms  p99 {control['p99_ms']:.1f} ms",
                        flush=True,
                    )
        if args.instructions:
            for case in cases:
                port = free_port()
                instructions[case] = bench_instructions.per_request(
                    case, *command(case, port), port, directory,
                    lambda port=port: load(binary, port, 16, args.instructions, 1.0),
                )  # fmt: skip
                client.delete(queue.QUEUE, "bench:jobs")
                print(f"{case}: {instructions[case] / 1000:.0f} thousand instructions per request", flush=True)
        if args.profile and "serve" in cases:
            from bench import request_profile

            profile_text = request_profile.profile(
                servers["serve"].pid,
                lambda: load(binary, ports["serve"], 16, args.profile, 1.0),
                directory / "serve.pyspy",
            )
            client.delete(queue.QUEUE)
    finally:
        for each in servers.values():
            each.stop()
        client.close()
        redis.stop()
        shutil.rmtree(directory, ignore_errors=True)
    after = loadavg()
    if args.rounds:  # --rounds 0: only --instructions or --profile
        report(args, cases, levels, runs, latency, loads, before, after)
    if instructions:
        print("\nuser-space instructions per request (callgrind, 16 clients; independent of the machine's load)\n")
        header = ["", *(f"{case} (thousands)" for case in instructions)]
        row = ["instructions", *(f"{n / 1000:.0f}" for n in instructions.values())]
        if "serve" in instructions:
            header += [f"serve/{case}" for case in instructions if case != "serve"]
            row += [f"{instructions['serve'] / n:.2f}" for case, n in instructions.items() if case != "serve"]
        print(markdown_table(header, [row]))
    if profile_text:
        print(f"\nwhere serve's CPU goes per request (py-spy, 16 clients, {args.profile:g} s)\n")
        print(profile_text)
    return 0


def report(
    args: argparse.Namespace,
    cases: list[str],
    levels: list[int],
    runs: dict[tuple[str, int], list[dict[str, float]]],
    latency: dict[int, list[tuple[float, float, float, float, float]]],
    loads: list[str],
    before: str,
    after: str,
) -> None:
    def med(case: str, clients: int, key: str = "rps") -> float:
        return statistics.median(run[key] for run in runs[case, clients])

    def spread(case: str, clients: int) -> str:
        values = [run["rps"] for run in runs[case, clients]]
        return f"{min(values):.0f}–{max(values):.0f}"

    baselines = [case for case in BASELINES if case in cases]
    print(f"\nmedians of {args.rounds} interleaved rounds, {args.seconds:g} s each; one server process per case")
    print(f"load average (1, 5, 15 min): before {before}, after {after}; at each round: {' | '.join(loads)}")
    print(f"{os.cpu_count()} cores, shared with the load generator and Redis\n")
    header = ["clients", *(f"{case} (req/s)" for case in cases)]
    if "serve" in cases:
        header += [f"serve/{case}" for case in baselines]
    rows = []
    for c in levels:
        row = [str(c), *(f"{med(case, c):.0f} ({spread(case, c)})" for case in cases)]
        if "serve" in cases:
            row += [f"{med('serve', c) / med(case, c):.2f}" for case in baselines]
        rows.append(row)
    print(markdown_table(header, rows))
    print("\nclosed-loop latency p50 / p99 (ms), medians\n")
    print(
        markdown_table(
            ["clients", *cases],
            [[str(c), *(f"{med(case, c, 'p50'):.1f} / {med(case, c, 'p99'):.1f}" for case in cases)] for c in levels],
        )
    )
    print("\nserver CPU time per request (user + system, µs), medians\n")
    cpu_rows = [[str(c), *(f"{med(case, c, 'cpu'):.0f}" for case in cases)] for c in levels]
    print(markdown_table(["clients", *cases], cpu_rows))
    if any(latency.values()):
        print("\nserve at half of its saturation throughput (open loop), and the bare app at that rate, medians\n")
        lat_header = ["clients", "rate (req/s)", "serve p50 (ms)", "serve p99 (ms)", "bare p50 (ms)", "bare p99 (ms)"]
        lat_rows = [
            [str(c), f"{statistics.median(row[0] for row in latency[c]):.0f}"]
            + [f"{statistics.median(row[i] for row in latency[c]):.1f}" for i in range(1, 5)]
            for c in levels
            if latency[c]
        ]
        print(markdown_table(lat_header, lat_rows))
    if "serve" in cases:
        print("\ngoals")
        for c in levels:
            for case, goal in GOALS.items():
                if case in cases:
                    ratio = med("serve", c) / med(case, c)
                    print(f"  {c} clients: serve/{case} {ratio:.2f} (goal ≥ {goal}): {met(ratio >= goal)}")
        if 64 in levels:
            p99 = med("serve", 64, "p99")
            print(
                f"  64 clients: serve p99, closed loop {p99:.1f} ms (goal < {P99_GOAL_MS:g}): {met(p99 < P99_GOAL_MS)}"
            )
            if latency.get(64):
                p99 = statistics.median(row[2] for row in latency[64])
                goal = f"(goal < {P99_GOAL_MS:g})"
                print(f"  64 clients: serve p99 at half saturation {p99:.1f} ms {goal}: {met(p99 < P99_GOAL_MS)}")


def met(yes: bool) -> str:
    return "met" if yes else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
