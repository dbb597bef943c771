"""``sandbox-controller``: serve | worker | scheduler | dev | simulator | check-config.

Settings come from ``CONTROLLER_*`` variables (see ``config.py``), parsed once here; a bad
configuration prints every problem and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import uvicorn

from controller import __version__, logs, queue, scheduler, server, wiring
from controller.config import Settings
from controller.errors import ConfigError


def _settings(role: str | None = None) -> Settings:
    settings = Settings.from_env(os.environ)
    if role is not None:
        settings.require(role)
    logs.setup(settings.log_level, secrets=wiring.secret_values(settings))
    return settings


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = Settings.from_env(os.environ)
    print(json.dumps(settings.describe(), indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings("serve")
    app = wiring.receiver_app(settings)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        lifespan="off",
        **server.options(settings.receiver),
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings("worker")
    if settings.runner.kind == "local":
        wiring.local_runner(settings)  # an unsafe state directory or executor user: exit 2 now, not per task
    app = wiring.worker_app(settings)
    app.worker_main(
        [
            "--quiet",  # no banner: stdout carries JSON lines only
            "worker",
            f"--concurrency={args.concurrency}",
            f"--queues={queue.QUEUE}",
            f"--hostname={args.hostname}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ]
    )
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    settings = _settings("scheduler")
    parts = wiring.scheduler_parts(settings)
    scheduler.run(settings, parts.store, parts.runner, parts.client, parts.publish, on_sweep=parts.on_sweep)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-controller", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the webhook receiver")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8080)
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run a Celery worker")
    worker.add_argument("--concurrency", type=int, default=2)
    worker.add_argument("--hostname", default="worker@%h")
    worker.set_defaults(func=cmd_worker)

    scheduler = sub.add_parser("scheduler", help="sweep and recover on timers (one active at a time)")
    scheduler.set_defaults(func=cmd_scheduler)

    _add_development_commands(sub)

    check = sub.add_parser("check-config", help="print the effective configuration, secrets masked")
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
    except ConfigError as exc:
        print(f"sandbox-controller: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
