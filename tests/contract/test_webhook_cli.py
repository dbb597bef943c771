"""``sandbox-controller webhook register|rotate|test|list|delete`` against the simulator, with
the official ``openai`` client as the judge of what the API holds, and a real receiver
(``sandbox-controller serve`` on loopback, with redis-server) taking the deliveries."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from controller.events import HANDLED_TYPES
from controller.signing import Verifier
from tests.support.processes import assert_no_process_left, wait_for
from tests.support.receiver import Receiver
from tests.support.redis_server import RedisServer
from tests.support.signing import verify
from tests.support.simulator import SimulatorProcess, StartSimulator, WebhookReceiver, new_webhook_secret

pytestmark = pytest.mark.timeout(120)


class Cli:
    def __init__(self, simulator: SimulatorProcess) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
        self.env.update(CONTROLLER_API_KEY=simulator.api_key, CONTROLLER_API_BASE_URL=simulator.base_url)

    def __call__(self, *args: str | bytes, check: bool = True, umask: int = -1) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable.encode(), b"-m", b"controller", b"webhook", *(os.fsencode(a) for a in args)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            umask=umask,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done


@pytest.fixture
def world(
    start_simulator: StartSimulator, server: RedisServer, tmp_path: Path
) -> Iterator[tuple[SimulatorProcess, Cli, Receiver, Path]]:
    simulator = start_simulator()
    secrets_file = tmp_path / "secrets" / "webhook-secrets"
    receiver = Receiver(tmp_path, server, secrets_file)
    try:
        yield simulator, Cli(simulator), receiver, secrets_file
    finally:
        receiver.stop()
        assert_no_process_left(tmp_path)


def test_register_is_idempotent_and_subscribes_exactly_the_handled_types(
    world: tuple[SimulatorProcess, Cli, Receiver, Path],
) -> None:
    """L4: the endpoint subscribes exactly the types the controller enqueues; a second register
    changes nothing and shows no secret; the secret file is created 0600 and holds only it."""
    simulator, cli, receiver, secrets_file = world
    client = simulator.openai()

    first = cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    [endpoint] = list(client.webhooks.list())
    assert endpoint.url == receiver.url
    assert sorted(endpoint.event_types) == sorted(HANDLED_TYPES)
    assert endpoint.id in first.stdout
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    secret = secrets_file.read_text().strip()
    assert secret.startswith("whsec_") and "," not in secret
    assert endpoint.signing_secret_hint is not None and endpoint.signing_secret_hint.endswith(secret[-4:])
    assert secret not in first.stdout + first.stderr

    again = cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    assert "unchanged" in again.stdout
    assert [e.id for e in client.webhooks.list()] == [endpoint.id]
    assert secrets_file.read_text().strip() == secret  # the secret stands; the file is untouched

    # An endpoint someone subscribed to other types is brought back to exactly the handled ones.
    client.webhooks.update(endpoint.id, event_types=["agent.session.idle"])
    fixed = cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    assert "updated" in fixed.stdout
    assert sorted(client.webhooks.retrieve(endpoint.id).event_types) == sorted(HANDLED_TYPES)


def test_register_with_prestart_also_subscribes_to_session_creations(
    world: tuple[SimulatorProcess, Cli, Receiver, Path],
) -> None:
    """L4, L9: with pre-start configured (CONTROLLER_PRESTART_AGENT_IDS, as the controller has it),
    `register` subscribes to agent.session.created too, and `list` says the endpoint fits."""
    simulator, cli, receiver, secrets_file = world
    cli.env["CONTROLLER_PRESTART_AGENT_IDS"] = "agent_a"
    cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    [endpoint] = list(simulator.openai().webhooks.list())
    assert sorted(endpoint.event_types) == sorted((*HANDLED_TYPES, "agent.session.created"))
    assert "differ" not in cli("list").stdout
    del cli.env["CONTROLLER_PRESTART_AGENT_IDS"]
    assert "differ" in cli("list").stdout  # without pre-start, one more type than it handles


def test_register_without_a_file_shows_the_secret_once(world: tuple[SimulatorProcess, Cli, Receiver, Path]) -> None:
    """Without --secret-file or --kube-secret the secret is printed, on the creating run only."""
    simulator, cli, receiver, _ = world
    first = cli("register", "--url", receiver.url)
    shown = [line for line in first.stdout.splitlines() if line.startswith("whsec_")]
    assert len(shown) == 1
    hint = simulator.openai().webhooks.list().data[0].signing_secret_hint
    assert hint is not None and hint.endswith(shown[0][-4:])
    assert "whsec_" not in cli("register", "--url", receiver.url).stdout


def test_test_reports_whether_the_receiver_took_it(world: tuple[SimulatorProcess, Cli, Receiver, Path]) -> None:
    """`webhook test` says "received" (exit 0) when the receiver verified the API's test event,
    and "NOT received" (exit 1) when it refused it (here: it holds another secret)."""
    _, cli, receiver, secrets_file = world
    cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    receiver.start()
    ok = cli("test", "--url", receiver.url)
    assert "received" in ok.stdout and "NOT" not in ok.stdout

    secrets_file.write_text(new_webhook_secret())
    receiver.restart()
    refused = cli("test", "--url", receiver.url, check=False)
    assert refused.returncode == 1
    assert "answered 401" in refused.stdout and "NOT received" in refused.stdout


def test_rotate_keeps_both_secrets_valid_through_the_overlap(
    world: tuple[SimulatorProcess, Cli, Receiver, Path],
) -> None:
    """L3: after `rotate`, the API's deliveries are taken throughout (the API signs with both);
    the running receiver takes up the NEW,OLD value the command wrote, without a restart, and
    accepts deliveries signed with either alone; after `--finish` it refuses the old one, again
    without a restart. Each change is waited for (bounded): the receiver looks at its secrets
    file at most once a second."""
    simulator, cli, receiver, secrets_file = world
    client = simulator.openai()
    cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    old = secrets_file.read_text().strip()
    receiver.start()

    rotated = cli("rotate", "--url", receiver.url, "--secret-file", str(secrets_file))
    new, kept = secrets_file.read_text().strip().split(",")
    assert kept == old and new != old and new.startswith("whsec_")
    assert "until" in rotated.stdout and "--finish" in rotated.stdout
    assert old not in rotated.stdout and new not in rotated.stdout
    hint = client.webhooks.list().data[0].signing_secret_hint
    assert hint is not None and hint.endswith(new[-4:])

    assert "received" in cli("test", "--url", receiver.url).stdout  # signed with both

    pid = receiver.process.pid if receiver.process else None
    wait_for(lambda: receiver.post_signed(new) == 200, 10, "the receiver to take up NEW,OLD", interval=0.3)
    assert receiver.post_signed(old) == 200
    assert receiver.post_signed(new_webhook_secret()) == 401
    assert "received" in cli("test", "--url", receiver.url).stdout

    cli("rotate", "--finish", "--secret-file", str(secrets_file))
    assert secrets_file.read_text().strip() == new
    wait_for(lambda: receiver.post_signed(old) == 401, 10, "the receiver to retire the old secret", interval=0.3)
    assert receiver.post_signed(new) == 200
    assert receiver.process is not None and receiver.process.pid == pid  # the same process throughout
    log = (receiver.directory / "receiver.log").read_text()
    assert log.count("webhook secrets read again") == 2
    assert old not in log and new not in log


def test_list_and_delete_agree_with_the_official_client(world: tuple[SimulatorProcess, Cli, Receiver, Path]) -> None:
    """`list` shows what the client created; `delete` removes it so the client gets 404."""
    simulator, cli, receiver, _ = world
    client = simulator.openai()
    other = client.webhooks.create(name="other", url="http://127.0.0.1:9/else", event_types=["agent.session.idle"])
    cli("register", "--url", receiver.url)

    listed = json.loads(cli("list", "--json").stdout)
    assert {e["id"] for e in listed} == {e.id for e in client.webhooks.list()}
    text = cli("list").stdout
    assert "2 endpoint(s)" in text and "event types differ" in text  # only the foreign one differs
    assert text.count("event types differ") == 1

    cli("delete", "--url", receiver.url)
    assert [e.id for e in client.webhooks.list()] == [other.id]
    cli("delete", "--id", other.id)
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(other.id)
    missing = cli("delete", "--url", receiver.url, check=False)
    assert missing.returncode == 2 and "no webhook endpoint" in missing.stderr


def test_official_client_reads_every_webhook_answer(start_simulator: StartSimulator) -> None:
    """The simulator's webhook endpoints parse into the client's typed objects; `test` posts
    one sample event signed with the endpoint's secret (both secrets during an overlap)."""
    simulator = start_simulator()
    client = simulator.openai()
    with WebhookReceiver(script=[503]) as listener:
        created = client.webhooks.create(name="n", url=listener.url, event_types=["agent.session.failed"])
        assert created.signing_secret.startswith("whsec_")
        assert client.webhooks.retrieve(created.id).updated_at == created.updated_at
        unchanged = client.webhooks.update(created.id, event_types=["agent.session.failed"])
        assert unchanged.updated_at == created.updated_at  # an unchanged update does not advance it
        assert "agent.session.action_required" in client.webhooks.event_types.list().data

        failed = client.webhooks.test(created.id, event_type="agent.session.failed")
        assert (failed.status_code, failed.webhook_endpoint_id) == (503, created.id)  # the answer, passed on
        rotated = client.webhooks.rotate_secret(created.id, keep_old_secret_active_for_24_hours=True)
        assert rotated.signing_secret != created.signing_secret
        result = client.webhooks.test(created.id, event_type="agent.session.failed")
        assert (result.object, result.status_code, result.event_type) == (
            "webhook_endpoint.test",
            200,
            "agent.session.failed",
        )
        last = listener.snapshot()[-1]
        assert last.event["type"] == "agent.session.failed"
        for secret in (created.signing_secret, rotated.signing_secret):
            verify(Verifier([secret]), last.headers, last.body, time.time())

        client.webhooks.rotate_secret(created.id)  # no overlap: the previous secret is dropped at once
        client.webhooks.test(created.id, event_type="agent.session.failed")
        assert len(listener.snapshot()[-1].headers["webhook-signature"].split()) == 1

    deleted = client.webhooks.delete(created.id)
    assert deleted.deleted and deleted.object == "webhook_endpoint.deleted"
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(created.id)


def test_api_failures_are_reported_by_what_to_do(world: tuple[SimulatorProcess, Cli, Receiver, Path]) -> None:
    """A 503 is ApiUnavailable (try again), a 4xx ApiRejected (fix the call); either exits 1
    with the reason and writes no secret file."""
    simulator, cli, receiver, secrets_file = world
    simulator.admin("POST", "/admin/faults", {"target": "list_webhook_endpoints", "status": 503, "count": 1})
    busy = cli("register", "--url", receiver.url, "--secret-file", str(secrets_file), check=False)
    assert busy.returncode == 1 and "ApiUnavailable" in busy.stderr and "503" in busy.stderr
    assert not secrets_file.exists()
    bad = cli("register", "--url", "ftp://nowhere", check=False)
    assert bad.returncode == 1 and "ApiRejected" in bad.stderr and "400" in bad.stderr
    assert cli("register", "--url", receiver.url, "--secret-file", str(secrets_file)).returncode == 0


# -- a secret is never lost; every error is one line --------------------------------------------


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed with a single line on stderr, no traceback."""
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandbox-controller: "), done.stderr
    return lines[0]


def test_register_proves_the_secret_file_writable_before_it_creates_the_endpoint(
    world: tuple[SimulatorProcess, Cli, Receiver, Path], tmp_path: Path
) -> None:
    """A --secret-file that cannot be written (its directory is a file; the path is a directory
    or a FIFO) is refused in one line before the API is asked: no endpoint is created, so no
    secret shown only once is lost, and a second register with a good path gets it."""
    simulator, cli, receiver, secrets_file = world
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    directory = tmp_path / "a-directory"
    directory.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    for bad, reason in (
        (blocker / "secrets", "is not a directory"),
        (directory, "is a directory, not a regular file"),
        (fifo, "is a FIFO, not a regular file"),
    ):
        done = cli("register", "--url", receiver.url, "--secret-file", str(bad), check=False)
        line = one_line_error(done)
        assert done.returncode == 2 and reason in line and "cannot write the secrets" in line, line
        assert list(simulator.openai().webhooks.list()) == []  # the API was never asked
    cli("register", "--url", receiver.url, "--secret-file", str(secrets_file))
    assert secrets_file.read_text().startswith("whsec_")


def test_under_umask_000_a_new_secret_directory_is_0700_and_the_file_0600(
    world: tuple[SimulatorProcess, Cli, Receiver, Path], tmp_path: Path
) -> None:
    """The secret file is written atomically with mode 0600 and a directory it creates is 0700,
    whatever the umask (under umask 000 the directory was 0777); so does `rotate`."""
    _, cli, receiver, _ = world
    target = tmp_path / "new" / "nested" / "webhook-secrets"
    cli("register", "--url", receiver.url, "--secret-file", str(target), umask=0)
    for directory in (tmp_path / "new", tmp_path / "new" / "nested"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    cli("rotate", "--url", receiver.url, "--secret-file", str(target), umask=0)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text().count(",") == 1
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no partial file left behind


@pytest.mark.parametrize("command", ["register", "rotate"])
def test_a_secret_that_cannot_be_saved_after_all_is_shown_once_with_the_reason(
    world: tuple[SimulatorProcess, Cli, Receiver, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """If writing the secret fails after the API made it (here: the disk is full when the file
    is moved into place), the command prints it once, with the reason on stderr, and exits 1; a later
    `register` says the file holds none and how to get a new one. Before, it crashed and the
    secret was neither shown nor saved."""
    import errno

    from controller import cli as controller_cli

    simulator, _, receiver, secrets_file = world
    for key in [k for k in os.environ if k.startswith("CONTROLLER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CONTROLLER_API_KEY", simulator.api_key)
    monkeypatch.setenv("CONTROLLER_API_BASE_URL", simulator.base_url)
    if command == "rotate":
        assert controller_cli.main(["webhook", "register", "--url", receiver.url]) == 0
    capsys.readouterr()

    replace = os.replace

    def disk_full(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(target) == secrets_file:  # the secret's last step into place
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        replace(source, target)

    monkeypatch.setattr(os, "replace", disk_full)
    argv = ["webhook", command, "--url", receiver.url, "--secret-file", str(secrets_file)]
    assert controller_cli.main(argv) == 1
    out, err = capsys.readouterr()
    [reason] = err.strip().splitlines()
    assert "could not save the" in reason and "No space left on device" in reason
    shown = [line for line in out.splitlines() if line.startswith("whsec_")]
    assert len(shown) == 1
    hint = simulator.openai().webhooks.list().data[0].signing_secret_hint
    assert hint is not None and hint.endswith(shown[0].split(",")[0][-4:])  # the API's current secret
    assert not secrets_file.exists()
    monkeypatch.undo()
    monkeypatch.setenv("CONTROLLER_API_KEY", simulator.api_key)
    monkeypatch.setenv("CONTROLLER_API_BASE_URL", simulator.base_url)
    assert controller_cli.main(["webhook", "register", "--url", receiver.url, "--secret-file", str(secrets_file)]) == 0
    assert "holds no secret; if it was lost, `webhook rotate` makes a new one" in capsys.readouterr().out


def test_every_cli_error_is_one_line_never_a_traceback(
    world: tuple[SimulatorProcess, Cli, Receiver, Path], tmp_path: Path
) -> None:
    """`--kube-secret` without any kubeconfig, `rotate --finish` on a directory or a FIFO
    (refused without blocking), and a URL or id holding a lone surrogate (bytes that are not
    UTF-8 on the command line): each is one clear line and a non-zero exit, and nothing is
    created at the API."""
    simulator, cli, receiver, _ = world
    cli.env.update(KUBECONFIG=str(tmp_path / "no-kubeconfig"), HOME=str(tmp_path))
    cli.env.pop("KUBERNETES_SERVICE_HOST", None)
    kube = one_line_error(cli("register", "--url", receiver.url, "--kube-secret", "ns/name", check=False))
    assert "--kube-secret needs a kubeconfig" in kube
    directory = tmp_path / "a-directory"
    directory.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    assert "is a directory" in one_line_error(cli("rotate", "--finish", "--secret-file", str(directory), check=False))
    assert "is a FIFO" in one_line_error(cli("rotate", "--finish", "--secret-file", str(fifo), check=False))
    surrogate = receiver.url.encode() + b"/\xff"
    assert "--url holds bytes that are not UTF-8 text" in one_line_error(
        cli("register", "--url", surrogate, check=False)
    )
    assert "--url holds bytes" in one_line_error(cli("rotate", "--url", surrogate, check=False))
    assert "--id holds bytes" in one_line_error(cli("delete", "--id", b"we_\xfe", check=False))
    assert "holds control characters" in one_line_error(cli("test", "--url", receiver.url + "\n", check=False))
    assert list(simulator.openai().webhooks.list()) == []
