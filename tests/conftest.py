"""Fixtures every tier shares."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    # Under CI every property test draws the same examples each run: a build that passes today
    # passes tomorrow. Elsewhere each run draws new ones (a discrepancy found prints its example).
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """A test that runs a command's ``main`` in-process has it set logging up for the process
    (``logs.setup``: a JSON handler on the stream it finds, pytest's capture of that test, and
    the switches that stop records collecting their source file). Undo it after the test, so a
    later test never writes to a closed capture or loses its log records' details."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    switches = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = switches
