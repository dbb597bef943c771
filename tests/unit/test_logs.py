"""``controller/logs.py``: one JSON line per record, secrets redacted; ``bind`` scopes its fields."""

from __future__ import annotations

import json
import logging

import pytest

from controller import logs


def test_a_record_with_a_nested_field_makes_one_json_line() -> None:
    record = logging.LogRecord("t", logging.INFO, "", 0, "event", (), None)
    record.problems = ["secret #1 is short"]
    line = json.loads(logs.JsonFormatter().format(record))
    assert (line["event"], line["problems"]) == ("event", ["secret #1 is short"])


def test_a_secret_is_redacted_from_the_line() -> None:
    record = logging.LogRecord("t", logging.INFO, "", 0, "leaked: %s", ("whsec_abcdefgh",), None)
    assert "whsec_abcdefgh" not in logs.JsonFormatter(["whsec_abcdefgh"]).format(record)


def test_bind_adds_fields_for_its_block_only_and_skips_none() -> None:
    assert logs.bound() == {}
    with logs.bind(webhook_id="wh_1", event_id=None):
        assert logs.bound() == {"webhook_id": "wh_1"}
        with pytest.raises(RuntimeError), logs.bind(session_id="sess_1"):
            assert logs.bound() == {"webhook_id": "wh_1", "session_id": "sess_1"}
            raise RuntimeError("the block failed")
        assert logs.bound() == {"webhook_id": "wh_1"}
    assert logs.bound() == {}


def test_a_throttle_writes_the_first_at_once_then_one_per_interval_with_the_count() -> None:
    """A kind of line a client can cause: the first is written, the next 99 within the interval
    are held back, and the first after it reports all of them; each key on its own."""
    now = [0.0]
    throttle = logs.Throttle(10.0, clock=lambda: now[0])
    assert [throttle.count("a") for _ in range(100)] == [1] + [0] * 99
    assert throttle.count("b") == 1  # another key: at once
    now[0] = 10.0
    assert throttle.count("a") == 100  # the 99 held back and this one
    assert throttle.count("a") == 0
