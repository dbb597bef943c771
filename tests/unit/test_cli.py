"""The CLI: ``simulator`` and ``dev`` are ordinary subcommands, present only with the simulator package."""

from __future__ import annotations

import os
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
    secrets = {prefix + "ENVIRONMENT_KEY": "ek-test", prefix + "WEBHOOK_SECRET": "a-webhook-secret-of-24-bytes"}
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


def test_help_is_plain_text_and_every_serve_and_worker_option_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    """--help shows no reStructuredText markup, and no option of serve or worker goes unexplained."""
    from controller.cli import main

    for argv in ([], ["serve"], ["worker"], ["scheduler"], ["webhook"], ["check-config"]):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text, argv
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("serve", "worker", "scheduler"):
        for action in commands[name]._actions:
            assert action.help, f"{name} {action.option_strings} has no help"


def test_check_config_says_what_each_process_would_refuse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing set: the settings print, each role lists what it lacks, and the exit status is 1;
    with what serve needs, `--role serve` exits 0; invalid settings exit 2."""
    from controller.cli import main

    for key in [k for k in os.environ if k.startswith("CONTROLLER_")]:
        monkeypatch.delenv(key)
    assert main(["check-config"]) == 1
    err = capsys.readouterr().err
    assert "serve: would refuse to start" in err and "CONTROLLER_REDIS_URL is required for `serve`" in err
    assert "worker: would refuse to start" in err and "CONTROLLER_API_KEY" in err
    monkeypatch.setenv("CONTROLLER_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("CONTROLLER_WEBHOOK_SECRETS", "a-webhook-secret-of-24-bytes")
    assert main(["check-config", "--role", "serve"]) == 0
    assert "serve: ready" in capsys.readouterr().err
    monkeypatch.setenv("CONTROLLER_METRICS_PORT", "not-a-port")
    assert main(["check-config"]) == 2


def test_json_log_lines_carry_no_terminal_colour_copy() -> None:
    """uvicorn adds ``color_message`` (ANSI escapes) to its records: the JSON line keeps ``event`` only."""
    import json
    import logging

    from controller.logs import JsonFormatter

    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (7,), None)
    record.color_message = "Started server process [\x1b[36m%d\x1b[0m]"
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "Started server process [7]"
    assert "color_message" not in line
