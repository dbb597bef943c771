"""``task_message.encode`` (pure): valid JSON whatever the ids hold. That the message is the one
Celery's ``send_task`` writes, and that a real worker runs it, is tests/contract/test_task_message.py."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller import task_message
from controller.inbox import Job


@pytest.mark.parametrize("text", ['quote"', "percent%s%%", "back\\slash", "é ünïcode", "new\nline", "'apostrophe'"])
def test_any_text_in_ids_and_queue_names_round_trips(text: str) -> None:
    job = Job(f"sess_{text}", f"wh_{text}", f"type_{text}", received_at=1.25)
    message = json.loads(task_message.encode(job, f"queue_{text}"))
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert args == [job.session_id]
    assert kwargs == {"webhook_id": job.webhook_id, "event_type": job.event_type, "received_at": 1.25}
    assert message["headers"]["argsrepr"] == repr(args)
    assert message["headers"]["kwargsrepr"] == repr(kwargs)
    assert message["properties"]["delivery_info"] == {"exchange": "", "routing_key": f"queue_{text}"}


def test_each_message_has_its_own_ids() -> None:
    job = Job("sess_1", "wh_1", "agent.session.action_required")
    first, second = (json.loads(task_message.encode(job, "q")) for _ in range(2))
    assert first["headers"]["id"] == first["headers"]["root_id"] == first["properties"]["correlation_id"]
    assert first["headers"]["id"] != second["headers"]["id"]
    assert first["properties"]["delivery_tag"] != second["properties"]["delivery_tag"]
    assert first["properties"]["delivery_tag"] != first["headers"]["id"]


def test_task_ids_are_version_4_uuids() -> None:
    ids = {task_message.random_uuid() for _ in range(1000)}
    assert len(ids) == 1000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)


def test_one_read_gives_many_uuids_with_every_random_bit_kept() -> None:
    """The variant digit keeps its two random bits (8, 9, a and b all occur: the chance that one
    of them is missing from 1000 draws is below 1e-120), and the other digits stay random."""
    ids = task_message.random_uuids(1000)
    assert len(set(ids)) == 1000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)
    assert {text[19] for text in ids} == set("89ab")
    assert {text[15] for text in ids} == set("0123456789abcdef")


@given(
    session=st.text(),
    webhook=st.text(),
    kind=st.text(),
    received_at=st.one_of(st.just(0.0), st.floats(min_value=0, max_value=4e9, allow_nan=False)),
)
def test_the_message_text_is_what_json_dumps_and_repr_write(
    session: str, webhook: str, kind: str, received_at: float
) -> None:
    """L5: the per-job parts, put together as text for speed, are exactly the plain construction:
    the body is ``json.dumps([args, kwargs, embed])`` and the argument summaries are ``repr``s."""
    job = Job(session, webhook, kind, received_at=received_at)
    message = json.loads(task_message.encode(job, "q"))
    args, kwargs = [session], task_message.job_kwargs(job)
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    assert base64.b64decode(message["body"]) == json.dumps([args, kwargs, embed]).encode("utf-8")
    assert message["headers"]["argsrepr"] == repr(args)
    assert message["headers"]["kwargsrepr"] == repr(kwargs)
