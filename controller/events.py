"""Webhook envelopes: parse the verified raw body, then decide enqueue or drop.

``parse`` runs only after ``signing.Verifier`` accepted the raw bytes (L3). It turns them
into an ``Event`` or raises ``BadPayload`` (400) for a body that is not a UTF-8 JSON
object with a string ``type`` and an object ``data``, or that lacks what the controller
needs for a known session event (``data.id``; ``data.required_action.type`` for an
action-required event). Fields the controller does not use are not checked, so an
envelope that grows new fields keeps working.

``classify`` is a plain decision (L4, L9, L10): only an ``environment_connection``
action, a failed session, and an idle session are enqueued; every other verified event is
acknowledged and dropped, with a short, fixed ``reason`` fit for logs and metric labels. A session id
that does not match ``trust.ID_PATTERN`` is dropped before anything uses it (L2).

``agent.session.created`` of a self-hosted session is enqueued only when pre-start is on
(``classify(event, prestart=True)``, L9's eager mode): its job makes a worker read the new
session and start its sandbox if its agent is one configured to pre-start. Otherwise it is
acknowledged and dropped, as before.

``agent.session.idle`` is a timer signal (L11, L13): its job makes a worker re-read the session
under its lease and arm the idle check (``last_active_at`` + the idle timeout). It never
starts compute (only a pending ``environment_connection`` action does) and never stops
anything by itself: an idle event can arrive after a new input's connection request was
resolved but before its turn starts, and the re-read then sees the session at work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.errors import BadPayload
from controller.model import ENVIRONMENT_CONNECTION
from controller.trust import valid_id

SESSION_CREATED = "agent.session.created"
SESSION_ACTION_REQUIRED = "agent.session.action_required"
SESSION_IN_PROGRESS = "agent.session.in_progress"
SESSION_IDLE = "agent.session.idle"
SESSION_FAILED = "agent.session.failed"

SESSION_TYPES = frozenset({SESSION_CREATED, SESSION_ACTION_REQUIRED, SESSION_IN_PROGRESS, SESSION_IDLE, SESSION_FAILED})
"""Known event types whose ``data.id`` is a session id (required)."""

HANDLED_TYPES = (SESSION_ACTION_REQUIRED, SESSION_FAILED, SESSION_IDLE)
"""The event types ``classify`` can enqueue without pre-start: exactly what a webhook endpoint
for this controller subscribes to (``sandbox-controller webhook register``). A unit test holds
this tuple, ``handled_types`` and ``classify`` to each other."""


def handled_types(prestart: bool) -> tuple[str, ...]:
    """The event types ``classify`` can enqueue: with pre-start, session creations too."""
    return (*HANDLED_TYPES, SESSION_CREATED) if prestart else HANDLED_TYPES


_ENVIRONMENT_PREFIXES = ("agent.environment.", "environment.")


@dataclass(frozen=True)
class Event:
    """One verified webhook event; ``data`` is the envelope's ``data`` object as sent."""

    id: str
    type: str
    created_at: int
    session_id: str | None
    required_action_type: str | None
    data: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)


@dataclass(frozen=True)
class Disposition:
    """What to do with an event: ``enqueue`` it or acknowledge and drop it, and why."""

    enqueue: bool
    reason: str


# Reasons (a fixed set: they become metric labels).
ENVIRONMENT_CONNECTION_REQUESTED = Disposition(True, "environment_connection")
SESSION_FAILED_RELEASE = Disposition(True, "session_failed")
OTHER_REQUIRED_ACTION = Disposition(False, "other_required_action")
SESSION_CREATED_NOT_EAGER = Disposition(False, "session_created")
SESSION_CREATED_PRESTART = Disposition(True, "session_created_prestart")
LATE_SIGNAL = Disposition(False, "late_signal")
SESSION_IDLE_SIGNAL = Disposition(True, "session_idle")
ENVIRONMENT_REPORT = Disposition(False, "environment_report")
UNKNOWN_TYPE = Disposition(False, "unknown_type")
NO_SESSION = Disposition(False, "no_session")
MALFORMED_SESSION_ID = Disposition(False, "malformed_session_id")


def parse(body: bytes) -> Event:
    """The event in a verified body, or ``BadPayload`` (its message never echoes the body)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadPayload("body is not UTF-8") from exc
    try:
        envelope = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise BadPayload("body is not JSON") from exc
    if not isinstance(envelope, dict):
        raise BadPayload("body is not a JSON object")

    event_type = envelope.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise BadPayload("event has no string type")
    data = envelope.get("data")
    if not isinstance(data, dict):
        raise BadPayload("event has no data object")
    event_id = envelope.get("id", "")
    if not isinstance(event_id, str):
        raise BadPayload("event id is not a string")
    created_at = envelope.get("created_at", 0)
    if not isinstance(created_at, int) or isinstance(created_at, bool):
        raise BadPayload("event created_at is not an integer")

    return Event(
        id=event_id,
        type=event_type,
        created_at=created_at,
        session_id=_session_id(event_type, data),
        required_action_type=_required_action_type(event_type, data),
        data=data,
    )


def classify(event: Event, prestart: bool = False) -> Disposition:
    """Enqueue only what asks this controller for work (L4); acknowledge the rest (L9, L10).
    With ``prestart``, a self-hosted session's creation is work too (L9's eager mode).
    Work for a session id that fails ``trust.ID_PATTERN`` is never enqueued (L2): it could
    become a Redis key, a path, a label or an argument."""
    disposition = _classify(event, prestart)
    if disposition.enqueue and not valid_id(event.session_id):
        return MALFORMED_SESSION_ID
    return disposition


def _classify(event: Event, prestart: bool) -> Disposition:
    if event.type == SESSION_ACTION_REQUIRED:
        if event.required_action_type != ENVIRONMENT_CONNECTION:
            return OTHER_REQUIRED_ACTION
        return ENVIRONMENT_CONNECTION_REQUESTED if event.session_id else NO_SESSION
    if event.type == SESSION_FAILED:
        return SESSION_FAILED_RELEASE if event.session_id else NO_SESSION
    if event.type == SESSION_IDLE:
        return SESSION_IDLE_SIGNAL if event.session_id else NO_SESSION
    if event.type == SESSION_CREATED:
        if not prestart or event.data.get("environment_type") != "self_hosted":
            return SESSION_CREATED_NOT_EAGER
        return SESSION_CREATED_PRESTART if event.session_id else NO_SESSION
    if event.type == SESSION_IN_PROGRESS:
        return LATE_SIGNAL
    if event.type.startswith(_ENVIRONMENT_PREFIXES):
        return ENVIRONMENT_REPORT
    return UNKNOWN_TYPE


def _session_id(event_type: str, data: Mapping[str, Any]) -> str | None:
    value = data.get("id")
    if event_type in SESSION_TYPES:
        if not isinstance(value, str) or not value:
            raise BadPayload(f"{event_type} event has no session id in data.id")
        return value
    if event_type.startswith("agent.session.") and isinstance(value, str) and value:
        return value  # a future session event: keep the id for logs, require nothing
    return None


def _required_action_type(event_type: str, data: Mapping[str, Any]) -> str | None:
    if event_type != SESSION_ACTION_REQUIRED:
        return None
    action = data.get("required_action")
    action_type = action.get("type") if isinstance(action, dict) else None
    if not isinstance(action_type, str) or not action_type:
        raise BadPayload(f"{event_type} event has no data.required_action.type")
    return action_type


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""Built once: ``json.loads`` with an argument builds a decoder per call."""
