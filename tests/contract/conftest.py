"""Fixtures shared by the contract tests."""

from tests.support.simulator import start_simulator  # noqa: F401  (a fixture: pytest finds it here)
