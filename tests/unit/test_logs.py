"""``controller/logs.py``: the JSON line, written for fewer instructions than ``json.dumps``
(the receiver writes one per delivery), is the same text; ``bind`` scopes its fields."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller import logs

flat_values = st.one_of(
    st.text(), st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False, allow_infinity=False)
)


@given(st.dictionaries(st.text(), flat_values, max_size=12))
def test_a_flat_line_is_the_text_json_dumps_writes(line: dict[str, object]) -> None:
    assert logs.flat_json(line) == json.dumps(line, ensure_ascii=False)


@pytest.mark.parametrize("value", [{"nested": 1}, [1, 2], float("nan"), float("inf"), b"bytes", logging.INFO.__class__])
def test_anything_else_is_left_to_json_dumps(value: object) -> None:
    assert logs.flat_json({"event": "x", "value": value}) is None


def test_a_record_with_a_nested_field_still_makes_one_json_line() -> None:
    record = logging.LogRecord("t", logging.INFO, "", 0, "event", (), None)
    record.problems = ["secret #1 is short"]
    line = json.loads(logs.JsonFormatter().format(record))
    assert (line["event"], line["problems"]) == ("event", ["secret #1 is short"])


def test_a_secret_is_redacted_from_a_flat_line_too() -> None:
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
