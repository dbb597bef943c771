"""``python -m agents_simulator`` (also ``sandbox-controller simulator``): serve the simulator.

Secrets may come from flags or, to keep them out of the process list, from the environment:
``SANDBOX_CONTROLLER_SIMULATOR_ENVIRONMENT_KEY``, ``SANDBOX_CONTROLLER_SIMULATOR_WEBHOOK_SECRET``,
``SANDBOX_CONTROLLER_SIMULATOR_API_KEY`` (a flag wins over its variable).

``--tls-listen HOST:PORT --tls-cert FILE --tls-key FILE`` serves the same API (one engine) over
TLS at a second address as well, the admin endpoints excepted (they stay on the main one), and
``--public-url`` names what sessions give executors as ``remote_url``: together they stand the
simulator in for ``https://api.openai.com`` where that name resolves to the TLS address and the
executor trusts the certificate's CA (the real-node tier).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import ssl
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agents_simulator import config as defaults
from agents_simulator.app import create_app
from agents_simulator.config import SimulatorConfig, TlsListener
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
    parser.add_argument(
        "--public-url",
        help="the remote_url sessions name, e.g. https://api.openai.com served by --tls-listen (default: loopback)",
    )
    parser.add_argument("--tls-listen", metavar="HOST:PORT", help="also serve the same API over TLS there")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain of --tls-listen")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-listen")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> SimulatorConfig:
    """Build the config; raises ValueError listing every problem (never a secret's value)."""
    env = os.environ if environ is None else environ

    def secret(value: str | None, name: str) -> str | None:
        return value if value is not None else (env.get(ENV_PREFIX + name) or None)

    return SimulatorConfig(
        port=args.port,
        host=args.host,
        public_url=args.public_url,
        tls=_tls_listener(args),
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


def _tls_listener(args: argparse.Namespace) -> TlsListener | None:
    """``--tls-listen`` with its certificate and key (all three or none), checked by loading them."""
    given = {"--tls-listen": args.tls_listen, "--tls-cert": args.tls_cert, "--tls-key": args.tls_key}
    if not any(given.values()):
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise ValueError(f"--tls-listen, --tls-cert and --tls-key go together (missing {', '.join(missing)})")
    host, _, port = str(args.tls_listen).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--tls-listen must be HOST:PORT, got {args.tls_listen!r}")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS certificate {args.tls_cert} and its key: {exc}") from exc
    return TlsListener(host.strip("[]"), int(port), args.tls_cert, args.tls_key)


def _without_admin(app: ASGIApp) -> ASGIApp:
    """The app as the TLS listener serves it: what the real API serves (the public API, the
    executor's endpoints, /healthz), not the admin endpoints, which stay on the main listener."""

    async def public(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith("/admin"):
            await JSONResponse({"error": {"code": "not_found", "message": "Not found."}}, 404)(scope, receive, send)
            return
        await app(scope, receive, send)

    return public


class _Beside(uvicorn.Server):
    """A listener served beside the main one: the main server owns the signals, and its end
    ends this one."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve_both(main: uvicorn.Server, beside: uvicorn.Server) -> None:
    """The main server (and its lifespan: the engine) first, the TLS listener once it runs."""
    main_task = asyncio.create_task(main.serve())
    while not main.started and not main_task.done():
        await asyncio.sleep(0.05)
    beside_task = asyncio.create_task(beside.serve()) if main.started else None
    try:
        await main_task
    finally:
        beside.should_exit = True
        if beside_task is not None:
            await beside_task


def run(config: SimulatorConfig, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM (on both listeners when ``config.tls`` is set)."""
    logs.setup(log_level, secrets=[s for s in (config.environment_key, config.webhook_secret, config.api_key) if s])
    logging.getLogger("uvicorn.error").addFilter(HideConnectionTokens())
    app = create_app(config)
    common: dict[str, Any] = {
        "log_config": None,
        "access_log": False,  # WebSocket URLs carry connection tokens
        "timeout_graceful_shutdown": 5,
    }
    main = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, lifespan="on", **common))
    if config.tls is None:
        main.run()
        return
    tls = config.tls
    beside = _Beside(
        uvicorn.Config(
            _without_admin(app), host=tls.host, port=tls.port, lifespan="off", ssl_certfile=tls.certfile,
            ssl_keyfile=tls.keyfile, **common,
        )
    )  # fmt: skip
    asyncio.run(_serve_both(main, beside))


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
