"""``sandbox-controller``: serve | worker | scheduler | node-agent | webhook | status | explain | release | dev |
simulator | check-config.

Settings come from ``CONTROLLER_*`` variables (see ``controller/config/``), parsed once here; a bad
configuration prints every problem and exits with status 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence

from controller import (
    __version__,
    endpoint,
    fleet,
    holds,
    logs,
    queue,
    scheduler,
    start_stages,
    webhook_cli,
    wiring,
    worker,
)
from controller.config import Settings
from controller.errors import ConfigError, ControllerError, UsageError
from controller.metrics import RECEIVER_REFUSED_TOTAL, Metrics, serve_metrics
from controller.runners.local import cgroup_parent, host_can_checkpoint


def _settings(role: str | None = None) -> Settings:
    """The settings, after every check a process of ``role`` makes at start (``wiring.preflight``,
    the very checks ``check-config`` reports)."""
    settings = Settings.from_env(os.environ)
    if role is not None:
        wiring.preflight(settings, role)
    logs.setup(settings.log_level, secrets=wiring.secret_values(settings))
    return settings


ROLES = ("serve", "worker", "scheduler")


def cmd_check_config(args: argparse.Namespace) -> int:
    """Print the effective settings (every credential masked), then whether each process would
    start with them: each role runs ``wiring.preflight``, exactly what that process runs at
    start (as this user, on this machine: run it where and as whom the process runs).

    Exit 2: the settings themselves are invalid (nothing would start). Exit 1: valid, but a
    role asked about would refuse (every reason listed). Exit 0: every role asked about would start.
    """
    settings = Settings.from_env(os.environ)
    print(json.dumps(settings.describe(), indent=2))
    roles = ROLES if args.role == "all" else (args.role,)
    refused = 0
    for role in roles:
        try:
            wiring.preflight(settings, role)
        except ConfigError as exc:
            refused += 1
            print(f"{role}: would refuse to start (exit 2):", file=sys.stderr)
            for problem in exc.problems:
                print(f"  - {problem}", file=sys.stderr)
        else:
            print(f"{role}: ready", file=sys.stderr)
        for warning in wiring.preflight_warnings(settings, role):
            print(f"{role}: warning: {warning}", file=sys.stderr)
    if settings.runner.kind == "local":
        can, reason = host_can_checkpoint(settings.runner.criu)
        mode = settings.runner.local_idle_suspend
        verdict = "can" if can else "cannot"
        print(f"checkpoint (idle suspend: {mode}): {verdict} checkpoint here: {reason}", file=sys.stderr)
        where, why = cgroup_parent(make=False)
        contained = "contained" if where else "not contained (a process that leaves its session outlives it)"
        print(f"sandbox processes: {contained}: {why}", file=sys.stderr)
    if args.session is not None:
        refused += _check_session(settings, args.session)
    return 1 if refused else 0


def _check_session(settings: Settings, session_id: str) -> int:
    """Read one session with the configured API key and base URL: whether they see it (1: not)."""
    if settings.api.api_key is None:
        print(f"session {session_id}: not read: CONTROLLER_API_KEY is not set", file=sys.stderr)
        return 1
    sessions = wiring.api_sessions(settings)
    try:
        found = sessions.get(session_id)
    finally:
        sessions.close()
    if found is None:
        print(
            f"session {session_id}: 404 with this CONTROLLER_API_KEY and CONTROLLER_API_BASE_URL; if the "
            "session exists (the application that created it can read it), the key is another project's "
            "or the base URL is wrong",
            file=sys.stderr,
        )
        return 1
    print(f"session {session_id}: found ({found.status.value}): the API key and base URL see it", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings("serve")
    app = wiring.receiver_app(settings)
    # Everything built so far (Celery, Starlette, the app) lives as long as the process: frozen out
    # of the collector, a full collection no longer walks it, which on this heap stalled every
    # delivery in flight for 20-80 ms (bench/receiver_fastpath.py's p99).
    gc.freeze()
    counters = app.state.services.counters
    if settings.metrics.port and isinstance(counters, Metrics):
        # Off the public port: a client of the webhook endpoint gets no answer it did not pay for.
        serve_metrics(counters.registry, args.metrics_host, settings.metrics.port)
    endpoint.run(
        app,
        args.host,
        args.port,
        endpoint.Limits.from_settings(settings.receiver, settings.webhook.body_timeout_seconds),
        on_refused=lambda reason: counters.inc(RECEIVER_REFUSED_TOTAL, reason=reason),
    )
    return 0


def worker_argv(concurrency: int, hostname: str) -> list[str]:
    """The Celery worker's arguments: both queues, the webhook queue first (``controller.queue``)."""
    return [
        "--quiet",  # no banner: stdout carries JSON lines only
        "worker",
        f"--concurrency={concurrency}",
        f"--queues={','.join(queue.CONSUMED)}",  # webhook jobs first
        f"--hostname={hostname}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=INFO",
    ]


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings("worker")
    for warning in wiring.preflight_warnings(settings, "worker"):
        logs.get("controller.worker").warning("codex sandbox unavailable", extra={"reason": warning})
    if settings.runner.kind == "local":
        local = wiring.local_runner(settings)  # creates the state directory (checked again once created)
        wiring.say_if_not_contained(local)
    if settings.metrics.port:
        wiring.serve_worker_metrics(settings, args.metrics_host)  # before any metric exists
    app = wiring.worker_app(settings)
    return worker.run(app, worker_argv(args.concurrency, args.hostname))


def cmd_scheduler(args: argparse.Namespace) -> int:
    settings = _settings("scheduler")
    parts = wiring.scheduler_parts(settings)
    if settings.metrics.port:
        serve_metrics(wiring.scheduler_metrics(settings, parts).registry, args.metrics_host, settings.metrics.port)
    scheduler.run(
        settings,
        parts.store,
        parts.runner,
        parts.client,
        parts.publish,
        on_sweep=parts.on_sweep,
        watch=parts.watch,
        on_pools=parts.on_pools,
    )
    return 0


def cmd_node_agent(args: argparse.Namespace) -> int:
    settings = _settings("node-agent")
    # Imported here: it loads the Kubernetes client, which no other command of this module needs.
    from controller.node_agent import agent

    return agent.run(settings.node_agent, settings.kubernetes.namespace)


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings("scheduler")  # the store and the runner, as the scheduler reads them
    parts = wiring.fleet_parts(settings)
    rows = fleet.status(parts.store, parts.store, parts.runner, settings.runner.kind, parts.clock.now())
    totals = fleet.totals(rows)
    missing = parts.store.missing()
    confirm_seconds = settings.lifecycle.deletion_confirm_seconds
    held = holds.held(parts.store, parts.clock.now(), confirm_seconds)
    if args.json:
        body = {
            "sessions": [r.to_json() for r in rows],
            "totals": totals,
            "not_found_since": missing,
            "held": [h.to_json() for h in held],
        }
        print(json.dumps(body, indent=2))
        return 0
    header = f"{'SESSION':<34} {'RUNNER':<10} {'SANDBOX':<40} {'GEN':>3} {'AGE':>8} {'HEALTH':<11} {'NEXT TIMER':>10}"
    print(f"{header} LAST DECISION")
    for r in rows:
        last = f"{r.last.verdict}: {r.last.reason}" if r.last else "-"
        age = _duration(r.age_seconds)
        timer = "-" if r.next_timer_in_seconds is None else _duration(r.next_timer_in_seconds)
        if r.suspended is not None:
            size, age_of = r.suspended["size_bytes"] / 1e6, _duration(r.suspended["age_seconds"])
            last += f" (checkpoint {size:.1f} MB, {age_of} old)"
        if r.crash_loop is not None:
            left = r.crash_loop["next_start_in_seconds"]
            after = "restarted" if left is None else f"next start in {_duration(float(left))}"
            last += f" (CrashLoopBackOff: {r.crash_loop['restarts']} exits in a row, {after})"
        print(
            f"{r.session_id:<34} {r.runner:<10} {r.sandbox:<40} {r.generation:>3} {age:>8} {r.health:<11} "
            f"{timer:>10} {last}"
        )
    health = ", ".join(f"{k} {v}" for k, v in totals["by_health"].items()) or "none"
    verdicts = ", ".join(f"{k} {v}" for k, v in totals["by_last_verdict"].items()) or "none"
    print(f"{totals['sessions']} session(s) with a sandbox; health: {health}; last decisions: {verdicts}")
    if totals["checkpoint_bytes"]:
        print(f"checkpoint images: {totals['checkpoint_bytes'] / 1e6:.1f} MB on the state volume")
    if missing:
        confirm = _duration(settings.lifecycle.deletion_confirm_seconds)
        print(f"{len(missing)} session(s) answer 404; each counts as deleted only after {confirm} of 404s")
    if totals["deletions_held"] or held:
        print(f"{fleet.HELD_NOTICE} ({max(totals['deletions_held'], len(held))} session(s))")
    for h in held:
        print(
            f"  held: {h.session_id}: answers 404 for {_duration(parts.clock.now() - h.not_found_since)}, "
            f"deletion held for {_duration(h.held_seconds)}; `sandbox-controller check-config --session "
            f"{h.session_id}` reads it with this key; if it was deleted: `sandbox-controller release {h.session_id}`"
        )
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """End a held deletion: say in one line what releasing the session destroys; with ``--yes``,
    ask the workers to do it (``holds``)."""
    settings = _settings("scheduler")
    parts = wiring.fleet_parts(settings)
    line = holds.describe(args.session_id, parts.store, parts.runner, parts.clock.now())
    if not args.yes:
        print(f"would {line} (nothing done: add --yes to release)")
        return 0
    client = wiring.redis_endpoint(settings).client()
    holds.release(args.session_id, parts.store, parts.clock.now(), queue.batch_publisher(client, queue.QUEUE))
    print(f"asked to {line}; a worker does it if the session still answers 404")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    settings = _settings("worker")  # the API, the store and the runner, as a worker reads them
    deps = wiring.worker_deps(settings)
    found = fleet.explain(args.session_id, deps)
    store = wiring.store(settings)
    last = store.last_decision(args.session_id)
    last_json = None if last is None else {"verdict": last.verdict, "reason": last.reason, "at": last.at}
    start = store.last_start(args.session_id)
    stamps = {name: float(start[name]) for name in start_stages.STAMPS if start.get(name)}
    source, template = start.get("source", ""), start.get("template", "")
    if args.json:
        decision = {"verdict": found.decision.verdict.value, "reason": found.decision.reason}
        body = {"session_id": found.session_id, "decision": decision, "observed": found.observed, "last": last_json}
        body["last_start"] = (
            {"source": source, "template": template, "stamps": stamps, "stages": dict(start_stages.stages(stamps))}
            if stamps
            else None
        )
        print(json.dumps(body, indent=2))
        return 0
    print(f"session {found.session_id}: {found.decision.verdict.value} — {found.decision.reason}")
    for key, value in found.observed.items():
        print(f"  {key}: {json.dumps(value)}")
    if last is None:
        print("  last decision by a worker: none recorded")
    else:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last.at))
        print(f"  last decision by a worker: {last.verdict} — {last.reason} ({when})")
    for line in start_stages.render(stamps, source, template) or ["last start: none recorded"]:
        print(f"  {line}")
    print("(read only: nothing was started, released or saved)")
    return 0


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _metrics_host(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        help="address of GET /metrics, served on CONTROLLER_METRICS_PORT (default 0.0.0.0)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-controller",
        description="Run self-hosted sandboxes for OpenAI's Agents API. Settings come from CONTROLLER_* "
        "environment variables; `sandbox-controller check-config` shows them and what each process needs.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the webhook receiver",
        description="Serve POST /webhooks, GET /healthz and /readyz, and GET /metrics on "
        "CONTROLLER_METRICS_PORT (a port of its own). Needs CONTROLLER_REDIS_URL "
        "and CONTROLLER_WEBHOOK_SECRETS (or CONTROLLER_WEBHOOK_SECRETS_FILE).",
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    _metrics_host(serve)
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser(
        "worker",
        help="run a Celery worker",
        description="Consume the queue: look each session up and start, keep or release its sandbox. Needs "
        "CONTROLLER_REDIS_URL, CONTROLLER_API_KEY and, with the local runner, CONTROLLER_EXECUTOR_KEY.",
    )
    worker.add_argument("--concurrency", type=int, default=2, help="pool processes working jobs at once (default 2)")
    worker.add_argument("--hostname", default="worker@%h", help="Celery node name (default worker@%%h: this host)")
    _metrics_host(worker)
    worker.set_defaults(func=cmd_worker)

    scheduler = sub.add_parser(
        "scheduler",
        help="sweep and recover on timers (one active at a time)",
        description="Needs CONTROLLER_REDIS_URL and, with the local runner, CONTROLLER_EXECUTOR_KEY.",
    )
    _metrics_host(scheduler)
    scheduler.set_defaults(func=cmd_scheduler)

    node_agent = sub.add_parser(
        "node-agent",
        help="serve a node's checkpoint requests (suspend with memory on Kubernetes; one per node)",
        description="Checkpoint the sandbox pods of this node that ask for it through the kubelet, keep each "
        "as a checkpoint image in the node's containerd, and delete the images nothing names any more "
        "(docs/kubernetes.md). Needs CONTROLLER_NODE_AGENT_NODE_NAME and CONTROLLER_NODE_AGENT_KUBELET_URL.",
    )
    node_agent.set_defaults(func=cmd_node_agent)

    webhook_cli.add_commands(sub)

    status = sub.add_parser("status", help="every session with a sandbox, its health and last decision")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=cmd_status)

    explain = sub.add_parser(
        "explain", help="what the controller would decide about a session now, and why (read only)"
    )
    explain.add_argument("session_id", metavar="SESSION_ID")
    explain.add_argument("--json", action="store_true", help="print JSON")
    explain.set_defaults(func=cmd_explain)
    release = sub.add_parser(
        "release",
        help="end a held deletion: release a session that answers 404 (its sandbox and workspace)",
        description="Prints, in one line, what releasing the session destroys; with --yes a worker releases "
        "it, under the session's lease, if it still answers 404.",
    )
    release.add_argument("session_id", metavar="SESSION_ID")
    release.add_argument("--yes", action="store_true", help="do it (without: only say what it would destroy)")
    release.set_defaults(func=cmd_release)
    _add_development_commands(sub)

    check = sub.add_parser(
        "check-config",
        help="print the effective configuration (secrets masked) and what each process would refuse",
        description="Prints the settings as parsed, then for each process whether it would start. Exit status: "
        "0 every role asked about would start; 1 one would refuse (the reasons are listed); 2 the settings "
        "are invalid.",
    )
    check.add_argument(
        "--role", choices=(*ROLES, "all"), default="all", help="the process to check for (default: all three)"
    )
    check.add_argument(
        "--session",
        metavar="SESSION_ID",
        help="also read this session with the configured API key and base URL (is a 404 a wrong key?)",
    )
    check.set_defaults(func=cmd_check_config)
    return parser


def _add_development_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dev`` and ``simulator``, from the ``agents_simulator`` package beside this one.

    Development installs have it; the production image does not (see Dockerfile), and there
    these two commands are simply absent. No other product module reaches that package.
    """
    try:
        # Imported here, not at the top: the package is absent from the production image.
        from agents_simulator import cli as simulator_cli
        from agents_simulator import dev
    except ModuleNotFoundError as exc:
        if exc.name != "agents_simulator":
            raise
        return
    dev_parser = sub.add_parser("dev", help="run receiver and worker locally on embedded defaults")
    dev.add_arguments(dev_parser)
    dev_parser.set_defaults(func=dev.main)

    simulator = sub.add_parser("simulator", help="run the Agents API simulator", description=simulator_cli.DESCRIPTION)
    simulator_cli.add_arguments(simulator)
    simulator.set_defaults(func=simulator_cli.command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:  # every problem, one per line (one alone: one line)
        if len(exc.problems) == 1:
            print(f"sandbox-controller: invalid configuration: {exc.problems[0]}", file=sys.stderr)
        else:
            print(f"sandbox-controller: {exc}", file=sys.stderr)
        return 2
    except UsageError as exc:  # an argument, or a file or place it names, cannot be used
        print(f"sandbox-controller: {exc}", file=sys.stderr)
        return 2
    except ControllerError as exc:  # a command's call failed: say why (ids only, never secrets)
        print(f"sandbox-controller: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or socket a command used failed under it: one line, no traceback
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"sandbox-controller: {exc.strerror or type(exc).__name__}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
