"""One JSON object per line on stdout, with context bound at each boundary.

``bind(session_id=..., webhook_id=...)`` adds fields to every log line written inside the
``with`` block (context variables, so it works across threads and asyncio tasks).
Secrets never reach here: settings hold them as ``config.Secret`` whose ``str`` is masked,
and the formatter additionally redacts every secret value given to ``setup(secrets=...)``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("log_context")
_MIN_REDACT_LENGTH = 6

_NOISY = ("httpx", "httpcore", "urllib3", "kubernetes", "celery", "kombu", "amqp", "uvicorn.access")
_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "color_message"}
"""Record attributes that are not event fields. ``color_message`` is uvicorn's copy of the
message with ANSI colour escapes, meant for terminals: the JSON line keeps ``event`` only."""


class bind:  # lower case: used as a function, ``with logs.bind(...)``
    """Add fields (None values skipped) to every log line inside the ``with`` block.

    A class rather than a ``contextlib.contextmanager`` generator: the receiver binds twice
    per delivery, and this costs a third as much."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        fields = self._fields
        if None in fields.values():
            fields = {k: v for k, v in fields.items() if v is not None}
        self._token = _context.set({**_context.get({}), **fields})

    def __exit__(self, *exc_info: object) -> None:
        _context.reset(self._token)


def bound() -> dict[str, Any]:
    return dict(_context.get({}))


class JsonFormatter(logging.Formatter):
    """One JSON object per record; every value in ``secrets`` is replaced by ``[REDACTED]``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = frozenset(s for s in secrets if s and len(s) >= _MIN_REDACT_LENGTH)
        self._encode = json.JSONEncoder(default=str, ensure_ascii=False).encode  # built once, not per line

    def redact(self, secrets: Iterable[str]) -> None:
        """Redact these values too, from now on."""
        self._secrets = self._secrets | frozenset(s for s in secrets if s and len(s) >= _MIN_REDACT_LENGTH)

    def _scrub(self, text: str) -> str:
        for value in self._secrets:
            if value in text:
                text = text.replace(value, "[REDACTED]")
        return text

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(_context.get({}))
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                line[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            line["error_type"] = record.exc_info[0].__name__
            line["traceback"] = self.formatException(record.exc_info)
        return self._scrub(self._encode(line))


def setup(level: str = "INFO", stream: Any = None, secrets: Iterable[str] = ()) -> None:
    """Route every logger to one JSON stream that never shows ``secrets``; quiet chatty libraries."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in _NOISY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # A line shows none of the caller's file and line, thread or process (``_STANDARD_ATTRS``):
    # the standard library's documented switches stop each record from collecting them, about a
    # third of a line's cost (the receiver writes one per delivery).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def redact(secrets: Iterable[str]) -> None:
    """Redact ``secrets`` too in every line from now on (secrets read after ``setup``: a
    webhook secret that arrived with a rotation)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonFormatter):
            handler.formatter.redact(secrets)


class Throttle:
    """How often a kind of line a client can cause is written: the first at once, then at most
    one every ``seconds`` per key, carrying how many there were since the last written — so a
    flood of refusals shows in the log (and in full in the metrics) without flooding it."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._clock = clock
        self._pending: dict[str, int] = {}
        self._written_at: dict[str, float] = {}

    def count(self, key: str) -> int:
        """Count one line of ``key``: how many to report now (this one and those held back),
        or 0 when nothing is to be written."""
        pending = self._pending[key] = self._pending.get(key, 0) + 1
        now = self._clock()
        last = self._written_at.get(key)
        if last is not None and 0 <= now - last < self._seconds:
            return 0
        self._written_at[key] = now
        del self._pending[key]
        return pending


def get(name: str) -> logging.Logger:
    return logging.getLogger(name)


def now_ms() -> int:
    return int(time.time() * 1000)
