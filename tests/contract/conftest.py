"""Fixtures shared by the contract tests."""

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer
from tests.support.simulator import start_simulator  # noqa: F401  (a fixture: pytest finds it here)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server per test module (some modules stop and restart theirs)."""
    redis_server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield redis_server
    finally:
        redis_server.stop()
