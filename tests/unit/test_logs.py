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
