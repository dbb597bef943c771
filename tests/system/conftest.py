from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.codex import codex_binary
from tests.system.loop import Loop


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    world = Loop(tmp_path_factory.mktemp("loop"), codex_binary())
    try:
        world.start()
        yield world
    finally:
        world.stop()
