"""The CLI: ``simulator`` and ``dev`` are ordinary subcommands, present only with the simulator package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agents_simulator import cli as simulator_cli
from agents_simulator import dev
from agents_simulator.config import TlsListener
from controller.cli import build_parser
from tests.support.tls import TestCA


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


def _simulator_args(*extra: str) -> object:
    return build_parser().parse_args(["simulator", "--port", "8090", *extra])


SIM_SECRETS = {simulator_cli.ENV_PREFIX + "ENVIRONMENT_KEY": "ek-test"}


def test_the_simulator_stands_in_for_a_public_https_url(tmp_path: Path) -> None:
    """--public-url is every session's remote_url (WebSockets follow it); --tls-listen with its
    certificate and key serves the same API over TLS; the certificate is loaded up front."""
    ca = TestCA()
    certificate = ca.issue(tmp_path, ["api.openai.com"])
    argv = ["--public-url", "https://api.openai.com/", "--tls-listen", "192.0.2.10:443"]
    argv += ["--tls-cert", str(certificate.certfile), "--tls-key", str(certificate.keyfile)]
    config = simulator_cli.config_from_args(_simulator_args(*argv), environ=SIM_SECRETS)
    assert config.base_url == "https://api.openai.com"
    assert config.websocket_base_url == "wss://api.openai.com"
    assert config.tls == TlsListener("192.0.2.10", 443, str(certificate.certfile), str(certificate.keyfile))
    assert str(certificate.keyfile) not in repr(config)
    plain = simulator_cli.config_from_args(_simulator_args("--host", "10.0.0.5"), environ=SIM_SECRETS)
    assert (plain.base_url, plain.tls) == ("http://127.0.0.1:8090", None)  # loopback, as before


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (["--tls-listen", "127.0.0.1:8443"], "go together (missing --tls-cert, --tls-key)"),
        (["--tls-listen", "8443", "--tls-cert", "c", "--tls-key", "k"], "--tls-listen must be HOST:PORT, got '8443'"),
        (["--tls-listen", "127.0.0.1:8443", "--tls-cert", "/nonexistent.crt", "--tls-key", "/nonexistent.key"],
         "cannot load the TLS certificate /nonexistent.crt and its key"),
        (["--public-url", "https://api.openai.com/v1"], "public URL must be http(s)://host[:port] with no path"),
        (["--public-url", "api.openai.com"], "public URL must be http(s)://host[:port] with no path"),
    ],
)  # fmt: skip
def test_bad_tls_or_public_url_options_are_one_line_errors(
    extra: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulator_cli.command(_simulator_args(*extra)) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1 and "Traceback" not in err
