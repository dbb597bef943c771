"""What a round of work on one session is given (``Deps``): the Agents API (``Sessions``), the
store, the runner and the one clock, the policy (``Routing``, grace, lifetime, idle timeout,
retention, pre-start, deletion confirmation) and the callbacks that count what happens. Every
side effect of a round sits behind these, so tests pass fakes and a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from controller import trust
from controller.clock import Clock
from controller.config import RoutingSettings
from controller.decide import Decision
from controller.model import Link, Session
from controller.runners.base import Runner
from controller.store.base import SessionStore


class Sessions(Protocol):
    """The Agents API as decisions need it (adapter: ``sessions.HttpSessions``)."""

    def get(self, session_id: str) -> Session | None:
        """The session, or None when it was deleted (404)."""
        ...

    def environment_link(self, environment_id: str) -> Link | None:
        """Whether an executor holds the environment's link, held it and lost it, or never held
        it; None when unknown."""
        ...


Routing = RoutingSettings
"""Which sessions this controller serves (L6): the routing settings, as parsed (``decide.Routing``)."""


@dataclass
class Deps:
    sessions: Sessions
    store: SessionStore
    runner: Runner
    clock: Clock
    """The one clock every time-based decision reads, once per round (the workers: Redis's ``TIME``)."""
    routing: Routing = field(default_factory=Routing)
    grace_seconds: float = 60.0
    max_lifetime_seconds: float | None = None
    on_decision: Callable[[str, Decision], None] = lambda session_id, decision: None
    trust_policy: trust.Policy = trust.DEFAULT_POLICY
    on_refusal: Callable[[str], None] = lambda kind: None
    """Called with ``Decision.refused`` for each refusal (the worker counts them in a metric)."""
    choose_template: Callable[[Session], str | None] = lambda session: None
    renew_every_seconds: float | None = None
    """Renew the lease this often while working (a third of its TTL); None: never."""
    idle_timeout_seconds: float = 0.0
    """Stop an idle session's sandbox this long after its last activity; 0: keep warm (L11)."""
    retention_seconds: float = 0.0
    """Discard a stopped session's workspace this long after the stop; 0: keep it (L16)."""
    on_stop: Callable[[str], None] = lambda cause: None
    """Called with ``Decision.cause`` for each sandbox stopped, released or replaced (metrics)."""
    prestarts_agent: Callable[[str | None], bool] = lambda agent_id: False
    """Whether sessions of this agent are pre-started (``LifecycleSettings.prestarts_agent``)."""
    prestart_max_sandboxes: int = 10
    """Pre-started sandboxes not yet used, at most (``CONTROLLER_PRESTART_MAX_SANDBOXES``)."""
    on_prestart_skipped: Callable[[], None] = lambda: None
    """Called for each creation that started nothing because the pre-start budget was used up."""
    deletion_confirm_seconds: float = 0.0
    """How long a session's reads must answer 404 before it counts as deleted; 0: at once."""
    compare_sessions: int = 3
    """Other mapped sessions read to confirm a deletion (``Missing``)."""
    on_held: Callable[[], None] = lambda: None
    """Called for each deletion held because most sessions read answer 404 (a metric)."""
    on_crash_loop: Callable[[], None] = lambda: None
    """Called for each crash-loop back-off begun (``Decision.crash_loop``: a metric)."""
    on_cannot_start: Callable[[str], None] = lambda kind: None
    """Called with ``CannotStart.kind`` for each sandbox first found unable to start (a metric)."""
    on_start_failed: Callable[[str, str, bool], None] = lambda session_id, reason, permanent: None
    """Called with (session id, reason, permanent) for each sandbox start that failed (a metric,
    and the session's latest decision for ``status``/``explain``)."""
