"""The CLI: ``simulator`` and ``dev`` are ordinary subcommands, present only with the simulator package."""

from __future__ import annotations

import sys

import pytest

from agents_simulator import cli as simulator_cli
from agents_simulator import dev
from controller.cli import build_parser


def test_simulator_subcommand_takes_its_options_first() -> None:
    args = build_parser().parse_args(
        ["simulator", "--port", "8090", "--webhook-url", "http://127.0.0.1:8080/webhooks", "--turn-seconds", "1"]
    )
    assert args.func is simulator_cli.command
    assert (args.port, args.webhook_urls, args.turn_seconds) == (8090, ["http://127.0.0.1:8080/webhooks"], 1.0)
    prefix = simulator_cli.ENV_PREFIX
    secrets = {prefix + "ENVIRONMENT_KEY": "ek-test", prefix + "WEBHOOK_SECRET": "s"}
    assert simulator_cli.config_from_args(args, environ=secrets).port == 8090


def test_dev_subcommand_keeps_its_options() -> None:
    argv = ["dev", "--simulate", "--port", "9000", "--sessions", "2", "--exit-after-scenario"]
    args = build_parser().parse_args(argv)
    assert args.func is dev.main
    assert (args.simulate, args.port, args.simulator_port, args.sessions) == (True, 9000, 8090, 2)
    assert args.exit_after_scenario is True and args.state_directory is None


def test_without_the_simulator_package_the_product_commands_remain(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the production image, which does not contain agents_simulator."""
    monkeypatch.setitem(sys.modules, "agents_simulator", None)  # importing it now fails
    parser = build_parser()
    assert parser.parse_args(["serve", "--port", "1"]).port == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["simulator", "--port", "8090"])
    with pytest.raises(SystemExit):
        parser.parse_args(["dev"])
