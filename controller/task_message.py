"""A webhook job as the Celery task message a worker consumes, written without Celery.

The receiver queues a job by pushing this message onto the webhook queue's Redis list itself,
in the same Redis script that de-duplicates and wants the work (``store.redis.RedisInbox``):
one round trip per delivery, where ``app.send_task`` costs about half a millisecond of CPU
(kombu builds a producer per publish) and a round trip of its own.

The message is what ``app.send_task(TASK_SYNC_SESSION, args=[session_id], kwargs=..., queue=QUEUE)``
stores through kombu's Redis transport: Celery's task protocol 2 (headers naming the task and
its id; the body ``[args, kwargs, embed]`` as JSON) in kombu's envelope (body base64-encoded,
``properties`` with ``delivery_info``, a unique ``delivery_tag`` and ``priority`` 0). With
priority 0 kombu's Redis transport pushes to the list named after the queue itself (higher
priorities get a suffixed list), so the list key is the queue's name.

This format belongs to Celery 5 and kombu 5: the dependency is pinned to that major version,
and ``tests/contract/test_task_message.py`` checks, against a real redis-server and a real
Celery worker, that the message equals what ``send_task`` writes (ids aside) and that the
worker runs it with the job's arguments.
"""

from __future__ import annotations

import binascii
import json
import os
import socket
import uuid
from json.encoder import encode_basestring_ascii as _json_text  # json.dumps' own (C)

from controller.inbox import Job

TASK_SYNC_SESSION = "controller.sync_session"
"""The task the worker registers (``queue.TASK_SYNC_SESSION``; the contract test checks they agree)."""

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_EMBED_JSON = json.dumps(_EMBED)
_REPLY_TO = str(uuid.uuid4())  # Celery puts its app's per-thread id here; no result is ever sent back
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"  # Celery's anonymous node name


def job_kwargs(job: Job) -> dict[str, object]:
    """The task's keyword arguments (as ``queue.publisher`` passes them)."""
    kwargs: dict[str, object] = {"webhook_id": job.webhook_id, "event_type": job.event_type}
    if job.received_at:
        kwargs["received_at"] = job.received_at  # for delivery → sandbox start latency
    return kwargs


def encode(job: Job, queue: str) -> str:
    """The JSON text kombu's Redis transport would push for this job onto ``queue``.

    The receiver writes one per delivery, so the per-job parts are put together as text: the
    body is exactly ``json.dumps([args, job_kwargs(job), embed])`` (``json.dumps``' own string
    encoder; a float's ``repr``, as ``json.dumps`` writes it), and ``argsrepr``/``kwargsrepr``
    are exactly ``repr(args)``/``repr(kwargs)`` (``tests/unit/test_task_message.py`` checks both
    against the plain construction)."""
    session, webhook, kind = job.session_id, job.webhook_id, job.event_type
    kwargs_json = f'{{"webhook_id": {_json_text(webhook)}, "event_type": {_json_text(kind)}'
    kwargs_repr = f"{{'webhook_id': {webhook!r}, 'event_type': {kind!r}"
    if job.received_at:  # as job_kwargs
        at = repr(job.received_at)
        kwargs_json += f', "received_at": {at}'
        kwargs_repr += f", 'received_at': {at}"
    body = f"[[{_json_text(session)}], {kwargs_json}}}, {_EMBED_JSON}]"
    task_id, delivery_tag = random_uuids(2)
    template = _templates.get(queue) or _templates.setdefault(queue, _template(queue))
    return template % {
        "body": binascii.b2a_base64(body.encode("utf-8"), newline=False).decode("ascii"),
        "id": task_id,
        "argsrepr": _json_text(f"[{session!r}]"),
        "kwargsrepr": _json_text(kwargs_repr + "}"),
        "delivery_tag": delivery_tag,
    }


def random_uuid() -> str:
    """A random (version 4) UUID's text, as ``str(uuid.uuid4())`` gives it, for a third of the cost."""
    return random_uuids(1)[0]


def random_uuids(count: int) -> list[str]:
    """``count`` random UUIDs (``random_uuid``) from one read of the system's random source."""
    text = os.urandom(16 * count).hex()
    return [
        # Version 4 (the 13th digit), RFC 4122 variant (the 17th: 8, 9, a or b from its random bits).
        f"{t[:8]}-{t[8:12]}-4{t[13:16]}-{_VARIANT[t[16]]}{t[17:20]}-{t[20:32]}"
        for t in (text[start : start + 32] for start in range(0, 32 * count, 32))
    ]


_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


_templates: dict[str, str] = {}


def _template(queue: str) -> str:
    """The message's JSON for ``queue`` with a ``%(name)s`` slot for each per-message value: the
    same text as ``json.dumps`` of the whole message, a third of its cost per message."""
    slot = {name: f"\x00{name}\x00" for name in ("body", "id", "argsrepr", "kwargsrepr", "delivery_tag")}
    message = {
        "body": slot["body"],
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": TASK_SYNC_SESSION,
            "id": slot["id"],
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": slot["id"],
            "parent_id": None,
            "argsrepr": slot["argsrepr"],
            "kwargsrepr": slot["kwargsrepr"],
            "origin": _ORIGIN,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": slot["id"],
            "reply_to": _REPLY_TO,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": slot["delivery_tag"],
        },
    }
    text = json.dumps(message).replace("%", "%%")
    for name in slot:
        quoted = f"%({name})s" if name in ("argsrepr", "kwargsrepr") else f'"%({name})s"'  # already JSON strings
        text = text.replace(json.dumps(slot[name]), quoted)
    return text
