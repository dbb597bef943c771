"""Redis implementations of the session store and of the receiver's inbox.

Keys (all under ``sc:``; ``{sid}`` is the session id):

    sc:want:{sid}    work generation asked for (INCR per delivery)
    sc:done:{sid}    work generation completed
    sc:fence:{sid}   the last fencing token handed out (expires after a day)
    sc:lease:{sid}   holder's fencing token, with a TTL
    sc:rec:{sid}     the session→sandbox mapping (hash)
    sc:sessions      ids with a mapping
    sc:pending       ids whose wanted work is not done (sorted set; score: when, in ms of
                     Redis time, a job is next expected to pick it up; see ``take_overdue``)
    sc:requeues      per pending session, how often it was re-enqueued without a worker
                     taking it since (hash; paces the recovery pass during a long backlog)
    sc:seen:{wid}    de-duplication: "done" once the delivery's job is queued (set in the
                     same script as the push)
    sc:timers        each session's one durable timer (sorted set; score: due time, Unix ms;
                     see ``controller.timers``): ``take_due`` pops due ones and wants work
    sc:missing       per session whose reads answer 404, when they began to (hash; Unix
                     seconds), until its deletion is confirmed (``decide.Missing``)
    sc:missing:reads per such session, the 404 reads counted toward the confirmation and
                     when the last was made (hash; "reads last", ``decide.counted``)
    sc:release       per such session, when an operator asked for its release (hash; Unix
                     seconds; ``sandbox-controller release``), cleared with ``sc:missing``
    sc:prestarted    pre-started sandboxes not yet used, and reservations for them (sorted set;
                     score: when reserved, Unix ms): the pre-start budget
    sc:decision:{sid} the latest decision about a session (hash; for ``status``/``explain``)

Beside them, the scheduler's ``sc:scheduler:leader`` (``scheduler.LEADER_KEY``: the leading
term, with a TTL) and Celery's queues (``queue.QUEUE``, ``queue.MAINTENANCE_QUEUE``).

``sc:want``/``sc:done`` are deleted by the ``complete`` that catches up with the last want of
a session that has no mapping: nothing is pending then, and a later delivery simply starts
again from zero. The pending index is kept in the same scripts as the counters, so a
session is in ``sc:pending`` exactly while want > done.

Fencing tokens are Redis time in microseconds, or the previous token + 1 if that is not
higher: strictly increasing per session, and still higher than any token handed out before
Redis lost its data (a counter would restart at 1 and let a stale lease pass ``check``).

Multi-key checks run as small Lua scripts so that "is the lease still mine?" and the write
it guards happen atomically. redis-py errors are translated here, once.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from controller import logs, task_message
from controller.errors import Fenced, StoreUnavailable
from controller.inbox import Job, Outcome
from controller.model import Handle, LastDecision, NotFound, Record
from controller.store.base import Busy, Lease
from controller.store.pipelined import PipelinedRedis

log = logs.get(__name__)

# Lua numbers are doubles: integers below 2^53 are exact (Redis time in µs is ~2^51), and
# are passed to Redis as '%d' strings so that no exponent notation sneaks into a key.
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

_WANT = (
    _NOW_MS
    + """
local n = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], string.format('%d', now_ms() + tonumber(ARGV[2])), ARGV[1])
return n
"""
)

_ACQUIRE = (
    _NOW_MS
    + """
local want = tonumber(redis.call('GET', KEYS[3]) or '0')
local done = tonumber(redis.call('GET', KEYS[4]) or '0')
if want <= done then
  redis.call('ZREM', KEYS[5], ARGV[3])
  redis.call('HDEL', KEYS[6], ARGV[3])
  return {-1, 0}
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
if previous >= token then token = previous + 1 end
local text = string.format('%d', token)
redis.call('SET', KEYS[2], text, 'PX', ARGV[2])
redis.call('SET', KEYS[1], text, 'PX', ARGV[1])
redis.call('ZADD', KEYS[5], 'XX', string.format('%d', now_ms() + tonumber(ARGV[1])), ARGV[3])
redis.call('HDEL', KEYS[6], ARGV[3])
return {token, want}
"""
)

_COMPLETE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local done = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[2]) > done then redis.call('SET', KEYS[3], ARGV[2]) end
local want = tonumber(redis.call('GET', KEYS[2]) or '0')
if want > tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return want
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[5], ARGV[4])
redis.call('HDEL', KEYS[6], ARGV[4])
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('DEL', KEYS[2], KEYS[3]) end
return 0
"""

_RELEASE = (
    _NOW_MS
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[2], 'XX', string.format('%d', now_ms() + tonumber(ARGV[3])), ARGV[2])
return 1
"""
)

_CHECK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SADD', KEYS[3], ARGV[2])
if redis.call('HGET', KEYS[2], 'prestarted') ~= '1' then redis.call('ZREM', KEYS[4], ARGV[2]) end
return 1
"""

_FORGET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""

# Per-session keys are built here rather than passed in KEYS: fine on a single Redis (the
# only deployment this store supports), not on Redis Cluster.
_TAKE_OVERDUE = (
    _NOW_MS
    + """
local now = now_ms()
local overdue = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'LIMIT', 0, ARGV[1])
local taken = {}
for _, sid in ipairs(overdue) do
  local want = tonumber(redis.call('GET', 'sc:want:' .. sid) or '0')
  local done = tonumber(redis.call('GET', 'sc:done:' .. sid) or '0')
  if want <= done then
    redis.call('ZREM', KEYS[1], sid)
    redis.call('HDEL', KEYS[2], sid)
  else
    local left = redis.call('PTTL', 'sc:lease:' .. sid)
    if left > 0 then
      redis.call('ZADD', KEYS[1], string.format('%d', now + left), sid)
    elseif left == -2 then
      -- Back off per session while its re-enqueued jobs are not taken either (a long queue):
      -- grace, 2x, 4x ... 32x; the count resets when a worker takes the lease.
      local n = redis.call('HINCRBY', KEYS[2], sid, 1)
      local wait = tonumber(ARGV[2]) * math.pow(2, math.min(n - 1, 5))
      redis.call('ZADD', KEYS[1], string.format('%d', now + wait), sid)
      taken[#taken + 1] = sid
    else
      redis.call('ZADD', KEYS[1], string.format('%d', now + tonumber(ARGV[2])), sid)
    end
  end
end
return taken
"""
)

_ARM = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[3], ARGV[2])
  redis.call('HDEL', KEYS[4], ARGV[2])
  redis.call('HDEL', KEYS[5], ARGV[2])
else
  redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[4])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[4], ARGV[2], ARGV[5]) end
end
return 1
"""

# A read that found the session: its 404 marks and any release asked go (``found``).
_FOUND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
return 1
"""

# An operator's release of a session known to answer 404 (``ask_release``).
_ASK_RELEASE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""

# A pre-start takes room in the budget under its lease. Members whose record is no longer a
# pre-started, running sandbox (used since, stopped, gone) and that were reserved more than
# ARGV[4] ms ago (a start still on its way is not cut short) are dropped first.
_RESERVE_PRESTART = (
    _NOW_MS
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('ZSCORE', KEYS[2], ARGV[2]) then return 1 end
local now = now_ms()
local members = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local sid, at = members[i], tonumber(members[i + 1])
  local rec = redis.call('HMGET', 'sc:rec:' .. sid, 'prestarted', 'stopped_at')
  local waiting = rec[1] == '1' and (not rec[2] or rec[2] == '')
  if not waiting and now - at > tonumber(ARGV[4]) then redis.call('ZREM', KEYS[2], sid) end
end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[2], string.format('%d', now), ARGV[2])
return 1
"""
)

# The latest decision, stamped with Redis's clock.
_NOTE_DECISION = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'verdict', ARGV[1], 'reason', ARGV[2], 'held', ARGV[3],
  'at', string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""

# A start's timeline (``start_stages``): a new start replaces the last one; later stamps are added
# only while the timeline is still that sandbox's (a newer start's is never overwritten).
_BEGIN_START = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'sandbox', ARGV[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
_ADD_TO_START = """
if redis.call('HGET', KEYS[1], 'sandbox') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# Pop due timers and want work on each, as ``_WANT`` does, in one step: a timer is never lost
# between being taken and its work being recorded (the recovery pass enqueues what is wanted).
_TAKE_DUE = (
    _NOW_MS
    + """
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'LIMIT', 0, ARGV[1])
for _, sid in ipairs(due) do
  redis.call('ZREM', KEYS[1], sid)
  redis.call('INCR', 'sc:want:' .. sid)
  redis.call('ZADD', KEYS[2], string.format('%d', now + tonumber(ARGV[2])), sid)
end
return due
"""
)

SESSIONS_KEY = "sc:sessions"
TIMERS_KEY = "sc:timers"
MISSING_KEY = "sc:missing"
MISSING_READS_KEY = "sc:missing:reads"
RELEASE_KEY = "sc:release"
PRESTARTED_KEY = "sc:prestarted"
PRESTART_RESERVATION_MS = 60_000
"""A pre-start's reservation counts this long even before its start is recorded."""
PENDING_KEY = "sc:pending"
REQUEUES_KEY = "sc:requeues"
FENCE_TTL_MS = 24 * 3600 * 1000
DECISION_TTL_SECONDS = 7 * 24 * 3600


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
        raise StoreUnavailable(f"redis unavailable during {what}", retry_after=2) from exc
    except redis.ResponseError as exc:
        # NOREPLICAS: the server's min-replicas-to-write refuses writes while too few replicas are in sync.
        if str(exc).startswith(("LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "NOREPLICAS")):
            raise StoreUnavailable(f"redis not ready during {what}", retry_after=2) from exc
        raise


class RedisClock:
    """Redis's own clock (``TIME``): the one clock every process shares (``clock.Clock``).

    Timers fall due on it (the scripts above read ``TIME``), so the workers decide on it too: a
    worker whose own clock is off neither stops a sandbox early nor re-arms a timer that is
    already due. ``lifecycle.act`` reads it once per round."""

    def __init__(self, client: redis.Redis) -> None:
        self._r = client

    def now(self) -> float:
        with _translated("read the clock"):
            seconds, microseconds = self._r.time()
        return float(seconds) + microseconds / 1_000_000


class RedisSessionStore:
    """``SessionStore`` on Redis, plus the pending-work index the recovery pass reads.

    ``requeue_after_seconds``: how long a job that was enqueued for a session may take to
    take its lease before ``take_overdue`` hands the session out again.
    """

    def __init__(self, client: redis.Redis, lease_ttl_seconds: float, requeue_after_seconds: float = 15.0) -> None:
        self._r = client
        self._ttl_ms = int(lease_ttl_seconds * 1000)
        self._requeue_ms = int(requeue_after_seconds * 1000)
        self._want = client.register_script(_WANT)
        self._acquire = client.register_script(_ACQUIRE)
        self._complete = client.register_script(_COMPLETE)
        self._release = client.register_script(_RELEASE)
        self._check = client.register_script(_CHECK)
        self._save = client.register_script(_SAVE)
        self._forget = client.register_script(_FORGET)
        self._take_overdue = client.register_script(_TAKE_OVERDUE)
        self._arm = client.register_script(_ARM)
        self._ask_release = client.register_script(_ASK_RELEASE)
        self._found = client.register_script(_FOUND)
        self._take_due = client.register_script(_TAKE_DUE)
        self._reserve_prestart = client.register_script(_RESERVE_PRESTART)
        self._note_decision = client.register_script(_NOTE_DECISION)
        self._begin_start = client.register_script(_BEGIN_START)
        self._add_to_start = client.register_script(_ADD_TO_START)

    @property
    def lease_ttl_seconds(self) -> float:
        return self._ttl_ms / 1000

    def connect(self) -> None:
        """Open the client's first connection now, with a ``PING`` (``StoreUnavailable`` when
        Redis cannot be reached): a worker pool process makes it at its start, not inside its
        first job (the connection's set-up is CPU on each side: the name's lookup, the
        handshake, ``ROLE``, the client reading its own version from the package's metadata)."""
        with _translated("connect"):
            self._r.ping()

    def want(self, session_id: str) -> int:
        with _translated("want"):
            return int(self._want(keys=[f"sc:want:{session_id}", PENDING_KEY], args=[session_id, self._requeue_ms]))

    def want_many(self, session_ids: Sequence[str]) -> None:
        """One pipeline (one round trip) of ``want`` scripts; each stays atomic on its own."""
        if not session_ids:
            return
        with _translated("want"), self._r.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                self._want(keys=[f"sc:want:{sid}", PENDING_KEY], args=[sid, self._requeue_ms], client=pipe)
            pipe.execute()

    def acquire(self, session_id: str) -> Lease | Busy | None:
        sid = session_id
        keys = [f"sc:lease:{sid}", f"sc:fence:{sid}", f"sc:want:{sid}", f"sc:done:{sid}", PENDING_KEY, REQUEUES_KEY]
        with _translated("acquire"):
            first, second = self._acquire(keys=keys, args=[self._ttl_ms, FENCE_TTL_MS, sid])
        if first == -1:
            return None
        if first == 0:
            return Busy(retry_after=max(int(second), 100) / 1000)
        return Lease(session_id=sid, token=int(first), wanted=int(second))

    def complete(self, lease: Lease) -> Lease | None:
        sid = lease.session_id
        keys = [f"sc:lease:{sid}", f"sc:want:{sid}", f"sc:done:{sid}", f"sc:rec:{sid}", PENDING_KEY, REQUEUES_KEY]
        with _translated("complete"):
            result = int(self._complete(keys=keys, args=[lease.token, lease.wanted, self._ttl_ms, sid]))
        if result == -1:
            raise Fenced(f"lease of session {sid} was lost before completing")
        if result == 0:
            return None
        return Lease(session_id=sid, token=lease.token, wanted=result)

    def abandon(self, lease: Lease) -> None:
        """Release; the work stays pending (a retry is expected within ``requeue_after_seconds``)."""
        sid = lease.session_id
        with _translated("abandon"):
            self._release(keys=[f"sc:lease:{sid}", PENDING_KEY], args=[lease.token, sid, self._requeue_ms])

    def take_overdue(self, limit: int) -> list[str]:
        """Sessions with work wanted and not done, no lease, and no job expected any more.

        Each one returned is marked as enqueued now (the caller enqueues it) and is not handed
        out again for the grace period, doubling (up to 32x) while no worker takes it, so a
        long queue is not flooded with duplicates. A session whose lease is held is looked at
        again when the lease would expire; one whose work is done leaves the index.
        """
        with _translated("take overdue work"):
            taken: list[str] = self._take_overdue(keys=[PENDING_KEY, REQUEUES_KEY], args=[limit, self._requeue_ms])
        return list(taken)

    def pending_count(self) -> int:
        with _translated("count pending work"):
            return int(self._r.zcard(PENDING_KEY))

    def check(self, lease: Lease) -> None:
        with _translated("check"):
            held = self._check(keys=[f"sc:lease:{lease.session_id}"], args=[lease.token, self._ttl_ms])
        if not held:
            raise Fenced(f"lease of session {lease.session_id} is no longer held")

    def record(self, session_id: str) -> Record | None:
        with _translated("read record"):
            data: dict[str, str] = self._r.hgetall(f"sc:rec:{session_id}")  # type: ignore[assignment]
        return _record_from(session_id, data) if data else None

    def save(self, lease: Lease, record: Record) -> None:
        sid = lease.session_id
        fields = _record_fields(record)
        flat: list[Any] = [lease.token, sid]
        for key, value in fields.items():
            flat += [key, value]
        with _translated("save record"):
            ok = self._save(keys=[f"sc:lease:{sid}", f"sc:rec:{sid}", SESSIONS_KEY, PRESTARTED_KEY], args=flat)
        if not ok:
            raise Fenced(f"lease of session {sid} lost; record not saved")

    def forget(self, lease: Lease) -> None:
        sid = lease.session_id
        with _translated("forget record"):
            ok = self._forget(
                keys=[f"sc:lease:{sid}", f"sc:rec:{sid}", SESSIONS_KEY, PRESTARTED_KEY], args=[lease.token, sid]
            )
        if not ok:
            raise Fenced(f"lease of session {sid} lost; record not removed")

    def session_ids(self) -> list[str]:
        with _translated("list sessions"):
            members: set[str] = self._r.smembers(SESSIONS_KEY)  # type: ignore[assignment]
            return sorted(members)

    def arm(
        self,
        lease: Lease,
        due_at: float | None,
        missing_since: float | None = None,
        missing_reads: tuple[int, float] | None = None,
    ) -> None:
        sid = lease.session_id
        due = "" if due_at is None else str(int(due_at * 1000))
        missing = "" if missing_since is None else repr(missing_since)
        reads = "" if missing_reads is None else f"{missing_reads[0]} {missing_reads[1]!r}"
        keys = [f"sc:lease:{sid}", TIMERS_KEY, MISSING_KEY, MISSING_READS_KEY, RELEASE_KEY]
        with _translated("arm timer"):
            ok = self._arm(keys=keys, args=[lease.token, sid, due, missing, reads])
        if not ok:
            raise Fenced(f"lease of session {sid} lost; timer not armed")

    def found(self, lease: Lease) -> None:
        sid = lease.session_id
        with _translated("forget the 404s"):
            ok = self._found(
                keys=[f"sc:lease:{sid}", MISSING_KEY, MISSING_READS_KEY, RELEASE_KEY], args=[lease.token, sid]
            )
        if not ok:
            raise Fenced(f"lease of session {sid} lost; its 404s not forgotten")

    def missing_since(self, session_id: str) -> float | None:
        with _translated("read missing"):
            since = self._r.hget(MISSING_KEY, session_id)
        return None if since is None else float(since)

    def not_found(self, session_id: str) -> NotFound | None:
        with _translated("read missing"), self._r.pipeline(transaction=False) as pipe:
            pipe.hget(MISSING_KEY, session_id)
            pipe.hget(MISSING_READS_KEY, session_id)
            pipe.hget(RELEASE_KEY, session_id)
            since, reads, asked = pipe.execute()
        if since is None:
            return None
        count, last = (1, None) if not reads else (int(reads.split()[0]), float(reads.split()[1]))
        return NotFound(float(since), count, last, None if asked is None else float(asked))

    def ask_release(self, session_id: str, at: float) -> bool:
        with _translated("ask for a release"):
            return bool(self._ask_release(keys=[MISSING_KEY, RELEASE_KEY], args=[session_id, repr(at)]))

    def missing(self) -> dict[str, float]:
        """Every session whose reads answer 404 and since when (``status``)."""
        with _translated("list missing"):
            found: dict[str, str] = self._r.hgetall(MISSING_KEY)  # type: ignore[assignment]
        return {sid: float(since) for sid, since in found.items()}

    def others_to_compare(self, session_id: str, count: int) -> list[str]:
        if count <= 0:
            return []
        with _translated("pick sessions to compare"):
            picked: list[str] = self._r.srandmember(SESSIONS_KEY, 3 * count + 1)  # type: ignore[assignment]
            others = [sid for sid in picked if sid != session_id]
            marked = self._r.hmget(MISSING_KEY, others) if others else []
        answering = [sid for sid, since in zip(others, marked, strict=True) if since is None]
        missing = [sid for sid, since in zip(others, marked, strict=True) if since is not None]
        return (answering or missing)[:count]

    def reserve_prestart(self, lease: Lease, limit: int) -> bool:
        sid = lease.session_id
        with _translated("reserve a pre-start"):
            result = int(
                self._reserve_prestart(
                    keys=[f"sc:lease:{sid}", PRESTARTED_KEY], args=[lease.token, sid, limit, PRESTART_RESERVATION_MS]
                )
            )
        if result == -1:
            raise Fenced(f"lease of session {sid} lost; pre-start not reserved")
        return result == 1

    def timer(self, session_id: str) -> float | None:
        with _translated("read timer"):
            score = self._r.zscore(TIMERS_KEY, session_id)
        return None if score is None else float(score) / 1000

    def take_due(self, limit: int) -> list[str]:
        """Sessions whose timer is due: each timer removed, the session's work wanted (one step)."""
        with _translated("take due timers"):
            due: list[str] = self._take_due(keys=[TIMERS_KEY, PENDING_KEY], args=[limit, self._requeue_ms])
        return list(due)

    def armed(self) -> set[str]:
        with _translated("list timers"):
            members: list[str] = self._r.zrange(TIMERS_KEY, 0, -1)  # type: ignore[assignment]
        return set(members)

    def timer_count(self) -> int:
        with _translated("count timers"):
            return int(self._r.zcard(TIMERS_KEY))

    # -- the last decision per session (read by `status` and `explain`) --------------------

    def note_decision(self, session_id: str, verdict: str, reason: str, held: bool = False) -> None:
        """Keep the latest decision about a session, stamped with Redis's clock: a small hash
        beside the record, not fenced (it reports, it decides nothing), kept
        ``DECISION_TTL_SECONDS`` after the last one."""
        with _translated("note decision"):
            self._note_decision(
                keys=[f"sc:decision:{session_id}"], args=[verdict, reason, "1" if held else "0", DECISION_TTL_SECONDS]
            )

    def last_decision(self, session_id: str) -> LastDecision | None:
        with _translated("read decision"):
            data: dict[str, str] = self._r.hgetall(f"sc:decision:{session_id}")  # type: ignore[assignment]
        if not data:
            return None
        return LastDecision(
            data.get("verdict", ""), data.get("reason", ""), float(data.get("at", "0")), data.get("held") == "1"
        )

    def begin_start(self, session_id: str, sandbox: str, fields: Mapping[str, str]) -> None:
        """Keep ``fields`` as the session's last start (of ``sandbox``), replacing the one
        before; not fenced (it reports, it decides nothing), kept ``DECISION_TTL_SECONDS``."""
        with _translated("note start"):
            self._begin_start(keys=[f"sc:start:{session_id}"], args=[sandbox, DECISION_TTL_SECONDS, *_flat(fields)])

    def add_to_start(self, session_id: str, sandbox: str, fields: Mapping[str, str]) -> bool:
        """Add ``fields`` to the session's last start, only while it is still ``sandbox``'s."""
        with _translated("note start"):
            return bool(
                self._add_to_start(
                    keys=[f"sc:start:{session_id}"], args=[sandbox, DECISION_TTL_SECONDS, *_flat(fields)]
                )
            )

    def last_start(self, session_id: str) -> dict[str, str]:
        """The session's last start as noted (empty when none is kept)."""
        with _translated("read start"):
            data: dict[str, str] = self._r.hgetall(f"sc:start:{session_id}")  # type: ignore[assignment]
        return data


def _flat(fields: Mapping[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


def _record_fields(record: Record) -> dict[str, str]:
    return {
        "environment_id": record.environment_id,
        "name": record.handle.name,
        "generation": str(record.handle.generation),
        "uid": record.handle.uid,
        "handle_environment_id": record.handle.environment_id,
        "started_at": repr(record.started_at),
        "stopped_at": "" if record.stopped_at is None else repr(record.stopped_at),
        "disconnected_at": "" if record.disconnected_at is None else repr(record.disconnected_at),
        "seen_connected": "1" if record.seen_connected else "0",
        "prestarted": "1" if record.prestarted else "0",
        "link_unknown": "1" if record.link_unknown else "0",
        "link_looked_at": "" if record.link_looked_at is None else repr(record.link_looked_at),
        "lineage_started_at": "" if record.lineage_started_at is None else repr(record.lineage_started_at),
        "down_since": "" if record.down_since is None else repr(record.down_since),
        "crashes": str(record.crashes),
        "backoff_until": "" if record.backoff_until is None else repr(record.backoff_until),
        "cannot_start_since": "" if record.cannot_start_since is None else repr(record.cannot_start_since),
    }


def _optional_time(text: str | None) -> float | None:
    return float(text) if text else None


def _record_from(session_id: str, data: dict[str, str]) -> Record:
    return Record(
        session_id=session_id,
        environment_id=data.get("environment_id", ""),
        handle=Handle(
            session_id=session_id,
            name=data.get("name", ""),
            generation=int(data.get("generation", "0")),
            uid=data.get("uid", ""),
            environment_id=data.get("handle_environment_id", ""),
        ),
        started_at=float(data.get("started_at", "0")),
        stopped_at=_optional_time(data.get("stopped_at")),
        disconnected_at=_optional_time(data.get("disconnected_at")),
        seen_connected=data.get("seen_connected") == "1",
        prestarted=data.get("prestarted") == "1",
        link_unknown=data.get("link_unknown") == "1",
        link_looked_at=_optional_time(data.get("link_looked_at")),
        lineage_started_at=_optional_time(data.get("lineage_started_at")),
        down_since=_optional_time(data.get("down_since")),
        crashes=int(data.get("crashes") or "0"),
        backoff_until=_optional_time(data.get("backoff_until")),
        cannot_start_since=_optional_time(data.get("cannot_start_since")),
    )


_SUBMIT = (
    _NOW_MS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[3], string.format('%d', now_ms() + tonumber(ARGV[2])), ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[3])
redis.call('SET', KEYS[1], 'done', 'EX', ARGV[4])
return 1
"""
)
"""De-duplicate, want, queue, remember, in one atomic step: 1 queued, 0 a duplicate. The want
is ``_WANT``'s (same keys, same pending-index score)."""


class RedisInbox:
    """De-duplicates on webhook-id and queues the job in one Redis script (L5).

    The script, atomically: answers "duplicate" for an id already queued; otherwise wants the
    session's work (as ``RedisSessionStore.want``: the recovery pass redoes it if the job is
    lost later), pushes the Celery task message (``task_message.encode``) onto the webhook
    queue, and remembers the id for ``dedup_ttl_seconds``. ``submit`` returns only after the
    script did, so the receiver's 2xx means the job is stored; any failure raises ``Transient``
    (503, the sender retries) and, the script being atomic, left nothing half done. A retry of
    a delivery whose answer was lost after the script ran is a duplicate, not a second job.

    When the master has replicas, "stored" means on a replica too: ``submit`` returns once the
    script's writes reached one (``WAIT``), and raises ``StoreUnavailable`` (503) if none
    confirms within a second. A failover then promotes a replica that has every delivery the
    receiver acknowledged. A duplicate waits too: since Redis 7.0 ``WAIT`` counts everything the
    master had written when the connection's last command ran (not only the connection's own
    writes), so a duplicate's 2xx also means the first delivery, whichever receiver took it, is
    on a replica.

    """

    def __init__(
        self,
        client: PipelinedRedis,
        queue: str,
        dedup_ttl_seconds: int,
        requeue_after_seconds: float = 15.0,
    ) -> None:
        self._r = client
        self._queue = queue
        self._dedup_ttl = dedup_ttl_seconds
        self._requeue_ms = int(requeue_after_seconds * 1000)
        self._submit = client.register_script(_SUBMIT)

    async def submit(self, job: Job) -> Outcome:
        sid = job.session_id
        keys = [f"sc:seen:{job.webhook_id}", f"sc:want:{sid}", PENDING_KEY, self._queue]
        args: list[str | int] = [sid, self._requeue_ms, task_message.encode(job, self._queue), self._dedup_ttl]
        with _translated("enqueue"):
            queued = int(await self._submit(keys=keys, args=args, replicated=True))
        return Outcome.ENQUEUED if queued == 1 else Outcome.DUPLICATE

    async def ready(self) -> bool:
        try:
            return bool(await self._r.ping())
        except redis.RedisError:
            return False

    async def close(self) -> None:
        """Close the client's connection (on the loop that used it)."""
        await self._r.aclose()


DEMAND_KEY_PREFIX = "sc:pool:demand:"
_NOTE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], string.format('%d.%06d', t[1], t[2]), t[1] .. '.' .. t[2] .. '-' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%.6f', now - tonumber(ARGV[1])))
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1])) + 60)
return 1
"""


class RedisDemandLog:
    """``runners.base.DemandLog`` on Redis: one sorted set per template of when its sessions
    were placed. Each note is stamped with Redis's own clock (``TIME``, in the script), so every
    worker's stamps and the scheduler's ``now`` are on one clock whatever the nodes' clocks say.
    A note also drops the notes older than the window it keeps, and the key expires a minute
    after the last note's window: a template nobody uses leaves nothing behind."""

    def __init__(self, client: redis.Redis) -> None:
        self._r = client
        self._note = client.register_script(_NOTE)

    def note(self, template: str, keep_seconds: float) -> None:
        with _translated("note a placement"):
            self._note(keys=[DEMAND_KEY_PREFIX + template], args=[keep_seconds, secrets.token_hex(4)])

    def recent(self, template: str) -> tuple[float, list[float]]:
        with _translated("read the placements"):
            pipe = self._r.pipeline(transaction=True)
            pipe.time()
            pipe.zrange(DEMAND_KEY_PREFIX + template, 0, -1, withscores=True)
            (seconds, microseconds), noted = pipe.execute()
        return float(seconds) + microseconds / 1_000_000, [float(score) for _, score in noted]
