"""``python -m agents_simulator`` (also ``sandbox-controller simulator``): serve the simulator.

Secrets may come from flags or, to keep them out of the process list, from the environment:
``SANDBOX_CONTROLLER_SIMULATOR_ENVIRONMENT_KEY``, ``SANDBOX_CONTROLLER_SIMULATOR_WEBHOOK_SECRET``,
``SANDBOX_CONTROLLER_SIMULATOR_API_KEY`` (a flag wins over its variable).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence

import uvicorn

from agents_simulator import config as defaults
from agents_simulator.app import create_app
from agents_simulator.config import SimulatorConfig
from controller import logs

ENV_PREFIX = "SANDBOX_CONTROLLER_SIMULATOR_"
_TOKEN = re.compile(r"token=[^\s&\"']+")


class HideConnectionTokens(logging.Filter):
    """uvicorn logs WebSocket paths with their query; mask the connection token in them."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "token=" in message:
            record.msg, record.args = _TOKEN.sub("token=[REDACTED]", message), None
        return True


DESCRIPTION = "A local simulator of OpenAI's Agents API."


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m agents_simulator``."""
    parser = argparse.ArgumentParser(prog="python -m agents_simulator", description=DESCRIPTION)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's options to ``parser`` (also the ``sandbox-controller simulator`` subparser)."""
    parser.add_argument("--host", default=defaults.DEFAULT_HOST, help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, required=True, help="port to serve; part of every remote_url")
    parser.add_argument(
        "--webhook-url",
        action="append",
        default=[],
        dest="webhook_urls",
        metavar="URL",
        help="where to POST events; repeat for several; omit to send none",
    )
    parser.add_argument("--webhook-secret", help=f"signing secret, whsec_... or plain (or ${ENV_PREFIX}WEBHOOK_SECRET)")
    parser.add_argument("--environment-key", help=f"key executors must present (or ${ENV_PREFIX}ENVIRONMENT_KEY)")
    parser.add_argument("--api-key", help=f"exact bearer token /v1 calls need; default any (or ${ENV_PREFIX}API_KEY)")
    parser.add_argument(
        "--connect-timeout-seconds",
        type=float,
        default=defaults.DEFAULT_CONNECT_TIMEOUT_SECONDS,
        help="wait this long for an executor before failing a session (default %(default)s)",
    )
    parser.add_argument(
        "--turn-seconds",
        type=float,
        default=defaults.DEFAULT_TURN_SECONDS,
        help="length of a simulated turn (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-retry-initial-seconds",
        type=float,
        default=defaults.DEFAULT_RETRY_INITIAL_SECONDS,
        help="first retry delay (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-retry-max-seconds",
        type=float,
        default=defaults.DEFAULT_RETRY_MAX_SECONDS,
        help="cap on one retry delay (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-retry-horizon-seconds",
        type=float,
        default=defaults.DEFAULT_RETRY_HORIZON_SECONDS,
        help="give up on a delivery after this long (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-max-attempts",
        type=int,
        default=defaults.DEFAULT_RETRY_MAX_ATTEMPTS,
        help="attempts per delivery, the first included (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-timeout-seconds",
        type=float,
        default=defaults.DEFAULT_WEBHOOK_TIMEOUT_SECONDS,
        help="timeout of one delivery attempt (default %(default)s)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> SimulatorConfig:
    """Build the config; raises ValueError listing every problem (never a secret's value)."""
    env = os.environ if environ is None else environ

    def secret(value: str | None, name: str) -> str | None:
        return value if value is not None else (env.get(ENV_PREFIX + name) or None)

    return SimulatorConfig(
        port=args.port,
        host=args.host,
        environment_key=secret(args.environment_key, "ENVIRONMENT_KEY") or "",
        webhook_urls=tuple(args.webhook_urls),
        webhook_secret=secret(args.webhook_secret, "WEBHOOK_SECRET"),
        api_key=secret(args.api_key, "API_KEY"),
        connect_timeout_seconds=args.connect_timeout_seconds,
        turn_seconds=args.turn_seconds,
        webhook_retry_initial_seconds=args.webhook_retry_initial_seconds,
        webhook_retry_max_seconds=args.webhook_retry_max_seconds,
        webhook_retry_horizon_seconds=args.webhook_retry_horizon_seconds,
        webhook_max_attempts=args.webhook_max_attempts,
        webhook_timeout_seconds=args.webhook_timeout_seconds,
    )


def run(config: SimulatorConfig, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM."""
    logs.setup(log_level, secrets=[s for s in (config.environment_key, config.webhook_secret, config.api_key) if s])
    logging.getLogger("uvicorn.error").addFilter(HideConnectionTokens())
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,  # WebSocket URLs carry connection tokens
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return command(build_parser().parse_args(argv))


def command(args: argparse.Namespace) -> int:
    """Serve with the options ``add_arguments`` defined; 2 when they do not make a config."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2
    run(config, args.log_level)
    return 0
