"""The lifecycle's section: when sandboxes start early, go idle, are stopped or replaced, when
workspaces are discarded and a deletion counts, and how often the scheduler sweeps."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable
from controller.config.reader import DAY, Reader


@dataclass(frozen=True, repr=False)
class LifecycleSettings(Printable):
    idle_timeout_seconds: float = 1800.0
    """Stop a sandbox once its session has been idle this long (L11, L12): the worker re-reads
    the session and stops only an ``idle`` one with no pending environment_connection action
    whose ``last_active_at`` is at least this old; the workspace is kept. 0: keep warm."""
    workspace_retention_seconds: float = 7 * 24 * 3600.0
    """Discard a stopped session's workspace this long after its sandbox stopped (L16).
    0: keep it until the session is deleted or fails."""
    max_lifetime_seconds: float = 0.0
    """Stop any sandbox older than this, or replace it while a connection is requested
    (0: no limit) (L17)."""
    reconcile_interval_seconds: float = 300.0
    """How often the scheduler sweeps every mapped session and managed sandbox (L17)."""
    full_sweep_interval_seconds: float = 3600.0
    """How often a sweep is full: it works every mapped session, even one whose timer or pod
    watch would bring it back (the safety net for a session deleted while its sandbox is quiet:
    deleting a session sends no webhook, L17). The first sweep after a scheduler starts is full."""
    prestart_agent_ids: tuple[str, ...] = ()
    """Agents whose sessions get their sandbox when they are created (``agent.session.created``,
    L9's eager mode), before any connection is asked for; ``*``: every agent this controller
    serves. Empty (the default): a sandbox starts only on an ``environment_connection`` action.
    A pre-started sandbox nobody uses is stopped by the idle timeout like any other."""
    prestart_max_sandboxes: int = 10
    """Pre-started sandboxes not yet used (no input came), at most: beyond it a creation starts
    nothing (a log line and ``controller_prestarts_skipped_total``). A session that asks for a
    connection is never held back by it."""
    deletion_confirm_seconds: float = 60.0
    """A session counts as deleted only once every read of it over this long answered 404 (at
    least three reads spread over the period, ``decide.SPREAD_READS``); until then its sandbox
    and workspace are kept. When most sessions read to confirm it answer 404 too, or there is
    none to compare with (a wrong key, project or base URL), nothing is released until an
    operator releases it (``sandbox-controller release``). 0: a 404 counts at once."""

    @property
    def prestarts(self) -> bool:
        """Whether any session may be pre-started (the receiver then enqueues creations)."""
        return bool(self.prestart_agent_ids)

    def prestarts_agent(self, agent_id: str | None) -> bool:
        return "*" in self.prestart_agent_ids or (agent_id is not None and agent_id in self.prestart_agent_ids)


def lifecycle(r: Reader) -> LifecycleSettings:
    s = LifecycleSettings
    return LifecycleSettings(
        idle_timeout_seconds=r.number("IDLE_TIMEOUT_SECONDS", s.idle_timeout_seconds, float, 0.0, 30 * DAY),
        workspace_retention_seconds=r.number(
            "WORKSPACE_RETENTION_SECONDS", s.workspace_retention_seconds, float, 0.0, 365 * DAY
        ),
        max_lifetime_seconds=r.number("MAX_LIFETIME_SECONDS", s.max_lifetime_seconds, float, 0.0, 365 * DAY),
        reconcile_interval_seconds=r.number(
            "RECONCILE_INTERVAL_SECONDS", s.reconcile_interval_seconds, float, 1.0, DAY
        ),
        full_sweep_interval_seconds=r.number(
            "FULL_SWEEP_INTERVAL_SECONDS", s.full_sweep_interval_seconds, float, 1.0, 7 * DAY
        ),
        prestart_agent_ids=r.words("PRESTART_AGENT_IDS"),
        prestart_max_sandboxes=r.number("PRESTART_MAX_SANDBOXES", s.prestart_max_sandboxes, int, 0, 10_000),
        deletion_confirm_seconds=r.number("DELETION_CONFIRM_SECONDS", s.deletion_confirm_seconds, float, 0.0, 86_400),
    )
