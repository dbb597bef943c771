"""The receiver's webhook secrets as an operator can get them wrong: a real ``sandbox-controller
serve`` (its own HTTP/1.1 server) on loopback with redis-server, reading its secrets from a file.

A secret with fewer than 24 bytes of key material is refused at start (exit 2, the setting
named, the value never printed) and when the file changes under a running receiver (the last
good secrets stay, with a warning and ``controller_webhook_secrets_refused_total``). A secrets
path that is not a regular file (a FIFO) is refused without blocking, at start and while
running: ``/healthz`` keeps answering."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.signing import secret_key
from tests.support.processes import assert_no_process_left, wait_for
from tests.support.receiver import Receiver
from tests.support.redis_server import RedisServer
from tests.support.simulator import new_webhook_secret

pytestmark = pytest.mark.timeout(120)

SHORT = "whsec_" + base64.b64encode(b"a sixteen-byte k").decode()  # 16 bytes: guessable


@pytest.fixture
def receiver(server: RedisServer, tmp_path: Path) -> Iterator[tuple[Receiver, str]]:
    """A running receiver whose secrets file holds one good secret."""
    secret = new_webhook_secret()
    secrets_file = tmp_path / "webhook-secrets"
    secrets_file.write_text(secret + "\n")
    world = Receiver(tmp_path, server, secrets_file).start()
    try:
        yield world, secret
    finally:
        world.stop()
        assert_no_process_left(tmp_path)


def serve(server: RedisServer, **settings: str) -> subprocess.CompletedProcess[str]:
    """``sandbox-controller serve`` with ``settings``: it must refuse before it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLLER_")}
    env.update(CONTROLLER_REDIS_URL=server.url, **settings)
    return subprocess.run(
        [sys.executable, "-m", "controller", "serve", "--host", "127.0.0.1", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,  # a receiver blocked on a FIFO would run into this
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("short", ["whsec_", "wh", SHORT])
def test_a_short_secret_stops_the_receiver_at_start(server: RedisServer, tmp_path: Path, short: str) -> None:
    """L3: `serve` with a secret of fewer than 24 bytes of key material (``whsec_`` is an empty
    HMAC key) exits 2 naming the setting, given directly or in a file, and never prints it."""
    direct = serve(server, CONTROLLER_WEBHOOK_SECRETS=short)
    assert direct.returncode == 2, direct.stdout + direct.stderr
    assert "CONTROLLER_WEBHOOK_SECRETS: secret #1 has fewer than 24 bytes of key material" in direct.stderr
    assert "Traceback" not in direct.stderr
    path = tmp_path / "secrets"
    path.write_text(short)
    from_file = serve(server, CONTROLLER_WEBHOOK_SECRETS_FILE=str(path))
    assert from_file.returncode == 2, from_file.stdout + from_file.stderr
    assert "CONTROLLER_WEBHOOK_SECRETS_FILE: secret #1 has fewer than 24 bytes" in from_file.stderr
    if len(short) > len("whsec_"):
        for done in (direct, from_file):
            assert short.removeprefix("whsec_") not in done.stdout + done.stderr


def test_a_fifo_at_the_secrets_path_stops_the_receiver_at_start_without_blocking(
    server: RedisServer, tmp_path: Path
) -> None:
    """L3: a FIFO where the secrets file should be would block a reader until something writes
    to it: `serve` refuses it at once (exit 2), naming the setting and what the path is."""
    fifo = tmp_path / "secrets"
    os.mkfifo(fifo)
    done = serve(server, CONTROLLER_WEBHOOK_SECRETS_FILE=str(fifo))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"CONTROLLER_WEBHOOK_SECRETS_FILE: cannot read {fifo}: is a FIFO, not a regular file" in done.stderr


@pytest.mark.parametrize("truncated", ["whsec_", "wh"])
def test_a_running_receiver_keeps_its_last_good_secret_when_the_file_is_truncated(
    receiver: tuple[Receiver, str], truncated: str
) -> None:
    """L3: the secrets file truncated to ``whsec_`` or ``wh`` under a running receiver is not
    taken up: the genuine secret keeps getting 200, a delivery forged with the truncated key
    keeps getting 401, and the refusal is a warning and a metric (no value in the log)."""
    world, secret = receiver
    assert world.post_signed(secret) == 200
    world.secrets_file.write_text(truncated)
    sample = 'controller_webhook_secrets_refused_total{reason="invalid"}'
    # The receiver looks at the file at most once a second, when a delivery comes.
    wait_for(lambda: world.post_signed(secret) == 200 and world.metric(sample) == 1, 10, "the refusal", interval=0.3)
    assert world.post_signed(secret_key(truncated)) == 401
    assert world.post_signed(secret) == 200
    log = world.log()
    assert "the secrets in use stay" in log and "webhook secrets read again" not in log
    assert secret not in log


def test_a_fifo_swapped_in_under_a_running_receiver_never_hangs_it(receiver: tuple[Receiver, str]) -> None:
    """L3: the secrets file replaced by a FIFO (nobody writing to it) is refused without blocking:
    /healthz and deliveries keep being answered at once, with the last good secret; the metric
    says ``not_a_file``. Put back as a file, a new secret is taken up again."""
    world, secret = receiver
    world.secrets_file.unlink()
    os.mkfifo(world.secrets_file)
    sample = 'controller_webhook_secrets_refused_total{reason="not_a_file"}'
    wait_for(lambda: world.post_signed(secret) == 200 and world.metric(sample) == 1, 10, "the refusal", interval=0.3)
    for _ in range(3):
        assert world.healthz(timeout=2) == 200
        assert world.post_signed(secret) == 200
    assert world.post_signed(new_webhook_secret()) == 401
    assert "is a FIFO, not a regular file" in world.log()

    world.secrets_file.unlink()
    fresh = new_webhook_secret()
    world.secrets_file.write_text(fresh)
    wait_for(lambda: world.post_signed(fresh) == 200, 10, "the new secret to be taken up", interval=0.3)
    assert world.post_signed(secret) == 401
