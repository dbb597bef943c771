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

import base64
import json
import os
import socket
import uuid

from controller.inbox import Job

TASK_SYNC_SESSION = "controller.sync_session"
"""The task the worker registers (``queue.TASK_SYNC_SESSION``; the contract test checks they agree)."""

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_REPLY_TO = str(uuid.uuid4())  # Celery puts its app's per-thread id here; no result is ever sent back
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"  # Celery's anonymous node name


def job_kwargs(job: Job) -> dict[str, object]:
    """The task's keyword arguments (as ``queue.publisher`` passes them)."""
    kwargs: dict[str, object] = {"webhook_id": job.webhook_id, "event_type": job.event_type}
    if job.received_at:
        kwargs["received_at"] = job.received_at  # for delivery → sandbox start latency
    return kwargs


def encode(job: Job, queue: str) -> str:
    """The JSON text kombu's Redis transport would push for this job onto ``queue``."""
    args = [job.session_id]
    kwargs = job_kwargs(job)
    body = base64.b64encode(json.dumps([args, kwargs, _EMBED]).encode("utf-8")).decode("ascii")
    template = _templates.get(queue) or _templates.setdefault(queue, _template(queue))
    return template % {
        "body": body,
        "id": random_uuid(),
        "argsrepr": json.dumps(repr(args)),
        "kwargsrepr": json.dumps(repr(kwargs)),
        "delivery_tag": random_uuid(),
    }


def random_uuid() -> str:
    """A random (version 4) UUID's text, as ``str(uuid.uuid4())`` gives it, for a third of the cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


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
