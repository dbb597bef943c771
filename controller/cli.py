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

from controller import __version__, logs
from controller.config import Settings
from controller.errors import ConfigError


def _settings(role: str | None = None) -> Settings:
    settings = Settings.from_env(os.environ)
    if role is not None:
        settings.require(role)
    from controller.wiring import redact_secrets

    redact_secrets(settings)
    logs.setup(settings.log_level)
    return settings


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = Settings.from_env(os.environ)
    print(json.dumps(settings.describe(), indent=2))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from controller import wiring

    settings = _settings("serve")
    app = wiring.receiver_app(settings)
    uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False, lifespan="off")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from controller.worker import QUEUE, make_app

    settings = _settings("worker")
    if settings.runner.kind == "local":
        from controller import wiring

        wiring.local_runner(settings)  # an unsafe state directory or executor user: exit 2 now, not per task
    app = make_app(settings)
    app.worker_main(
        [
            "--quiet",  # no banner: stdout carries JSON lines only
            "worker",
            f"--concurrency={args.concurrency}",
            f"--queues={QUEUE}",
            f"--hostname={args.hostname}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ]
    )
    return 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    from controller import scheduler, wiring
    from controller.store.redis import connect
    from controller.worker import make_app, publisher

    settings = _settings("scheduler")
    assert settings.queue.redis_url is not None
    scheduler.run(
        settings,
        wiring.store(settings),
        wiring.runner(settings),
        connect(settings.queue.redis_url),
        publisher(make_app(settings)),
    )
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from controller import dev

    return dev.main(args)


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

    scheduler = sub.add_parser("scheduler", help="run the reconcile sweep on a timer (one active at a time)")
    scheduler.set_defaults(func=cmd_scheduler)

    dev = sub.add_parser("dev", help="run receiver and worker locally on embedded defaults")
    dev.add_argument("--simulate", action="store_true", help="also run the simulator and a short scenario")
    dev.add_argument("--port", type=int, default=8080, help="receiver port (127.0.0.1)")
    dev.add_argument("--simulator-port", type=int, default=8090)
    dev.add_argument("--sessions", type=int, default=3, help="sessions in the scripted scenario")
    dev.add_argument("--state-directory", default=None, help="where sandboxes and embedded Redis keep state")
    dev.add_argument("--exit-after-scenario", action="store_true", help="stop once the scenario is over")
    dev.set_defaults(func=cmd_dev)

    # Listed for --help only: main() hands `simulator ...` to the simulator's own parser whole
    # (argparse.REMAINDER in a subparser would drop leading options such as --port).
    sub.add_parser("simulator", help="run the Agents API simulator (see `simulator --help`)", add_help=False)

    check = sub.add_parser("check-config", help="print the effective configuration, secrets masked")
    check.set_defaults(func=cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulator"]:
        # argparse.REMAINDER in a subparser drops leading options (`simulator --port 8090`).
        from controller.simulator import cli as simulator_cli

        return simulator_cli.main(argv[1:])
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
