"""The simulator's fault book (``agents_simulator/faults.py``) on a fake clock: counted and
timed faults, narrowed ones, and the arguments it refuses."""

from __future__ import annotations

import pytest

from agents_simulator.faults import Faults
from tests.support.clock import FakeClock


def test_a_counted_fault_is_used_up_and_a_timed_one_expires() -> None:
    clock = FakeClock()
    faults = Faults(clock)
    faults.arm("register", 503, count=2)
    assert [f is not None for f in (faults.take("register"), faults.take("register"), faults.take("register"))] == [
        True,
        True,
        False,
    ]
    faults.arm("retrieve_session", 429, seconds=5, retry_after=1)
    for _ in range(10):
        taken = faults.take("retrieve_session", "sess_1")
        assert taken is not None and taken.status == 429
    clock.advance(5)
    assert faults.take("retrieve_session", "sess_1") is None
    assert faults.to_json() == []


def test_a_narrowed_fault_wins_for_its_object_only() -> None:
    faults = Faults(FakeClock())
    faults.arm("retrieve_session", 503, seconds=60)
    faults.arm("retrieve_session", 404, seconds=60, object_id="sess_a")
    a, b = faults.take("retrieve_session", "sess_a"), faults.take("retrieve_session", "sess_b")
    assert a is not None and a.status == 404
    assert b is not None and b.status == 503
    faults.arm("retrieve_environment", kind="timeout", hold_seconds=3, seconds=10, object_id="env_a")
    assert faults.take("retrieve_environment", "env_b") is None
    held = faults.take("retrieve_environment", "env_a")
    assert held is not None and (held.kind, held.hold_seconds) == ("timeout", 3)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"target": "nope"}, "unknown fault target"),
        ({"target": "register", "status": 200}, "4xx or 5xx"),
        ({"target": "register", "kind": "timeout"}, "applies to the API's calls"),
        ({"target": "retrieve_session", "kind": "slow"}, "unknown fault kind"),
        ({"target": "retrieve_session", "count": 2, "seconds": 3.0}, "either a count or seconds"),
        ({"target": "retrieve_session", "seconds": 0.0}, "between 0 and 86400"),
        ({"target": "retrieve_session", "count": 0}, "at least 1"),
        ({"target": "retrieve_session", "object_id": ""}, "must not be empty"),
    ],
)
def test_bad_faults_are_refused(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Faults(FakeClock()).arm(**arguments)  # type: ignore[arg-type]
