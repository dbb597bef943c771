"""The runner's section: which runner, the executor (its key, command, where it may connect)
and the local runner's state, users and idle suspension."""

from __future__ import annotations

from dataclasses import dataclass

from controller.config.masked import Printable, Secret
from controller.config.reader import PREFIX, Reader
from controller.trust import DEFAULT_ALLOWLIST, pattern_problem

RUNNERS = ("local", "kubernetes")
IDLE_SUSPENDS = ("stop", "checkpoint")
MAX_UID = 2**32 - 2
"""The highest uid an executor may get (``2**32 - 1`` is ``(uid_t) -1``: "no change")."""


@dataclass(frozen=True, repr=False)
class RunnerSettings(Printable):
    kind: str = "local"
    """``local`` (child processes) or ``kubernetes`` (pods)."""
    executor_key: Secret | None = None
    """The environment key given to the executor as CODEX_API_KEY (L2)."""
    remote_url_allowlist: tuple[str, ...] = DEFAULT_ALLOWLIST
    """Host patterns a session's remote_url must match before the executor key goes there (L2;
    ``controller/trust.py``): https only, plain http to a loopback host only."""
    executor_command: str = "codex"
    """The executor binary; run as ``<command> exec-server --remote … --environment-id …``."""
    executor_grace_seconds: float = 60.0
    """A running sandbox whose executor has not connected after this is replaced (L14)."""
    local_state_directory: str = "/tmp/sandbox-controller"
    """Local runner: per-session workspaces, pid files and logs live under here. Created 0700
    (0711 when executors run as another user); refused unless owned by the controller's uid
    and not group/world-writable, and unless every directory on the way is owned by root or
    the controller and writable by no one else but with the sticky bit (``runners/local/state.py``:
    ``state_directory_problems``), so a shared parent such as /tmp is safe."""
    local_executor_user: str = "nobody"
    """Local runner, worker running as root: the unprivileged user (name or uid) every executor
    runs as (unless ``local_executor_uids`` gives each its own)."""
    local_executor_uids: tuple[int, int] | None = None
    """Local runner, worker running as root: a range of uids (first, last), one per session
    that has a sandbox or a kept workspace, so executors are apart from each other too. None
    (the default): every executor runs as ``local_executor_user``."""
    local_executor_same_user: bool = False
    """Local runner: opt in to running executors as the worker's own uid (no separation from
    the controller's secrets; ``dev`` sets it). Required when the worker is not root."""
    local_idle_suspend: str = "stop"
    """Local runner: what the idle rule does to a sandbox (``CONTROLLER_IDLE_SUSPEND``): ``stop``
    (its processes end, its workspace stays) or ``checkpoint`` (its whole process tree is
    dumped with CRIU into the state directory and restored at the next connection request,
    ``runners/local/checkpoint.py``; a fresh start whenever that is impossible)."""
    criu: str = "criu"
    """The CRIU binary (``CONTROLLER_CRIU``: a path, or a name on PATH) for ``checkpoint``."""
    checkpoint_max_percent: float = 25.0
    """Local runner, ``checkpoint``: the sum of every session's checkpoint images may take at
    most this share of the state directory's volume (its size); a dump that would pass it is
    not made: the sandbox is stopped instead (``runners/local/checkpoint.py``: ``Room``)."""
    checkpoint_reserve_percent: float = 20.0
    """Local runner, ``checkpoint``: the share of the state directory's volume that must stay
    free after a dump, for live workspaces; a dump that would leave less is not made."""
    local_allow_redis_without_password: bool = False
    """Local runner: allow executors of another uid beside a Redis URL without a password (only
    when Redis is out of their reach: another host behind a firewall, a socket they cannot
    open). Without it such a worker refuses to start: the executors' code could otherwise use
    Redis as its admin (the queue, the leases, the mapping)."""


def kind(r: Reader) -> str:
    return r.choice("RUNNER", RunnerSettings.kind, RUNNERS)


def idle_suspend(r: Reader, runner: str) -> str:
    suspend = r.choice("IDLE_SUSPEND", RunnerSettings.local_idle_suspend, IDLE_SUSPENDS)
    if suspend == "checkpoint" and runner != "local":
        r.problems.append(
            f"{PREFIX}IDLE_SUSPEND=checkpoint works with the local runner only; with {PREFIX}RUNNER={runner} "
            "an idle sandbox is stopped (docs/kubernetes.md says what checkpointing pods would need)"
        )
    return suspend


def runner(r: Reader, runner: str, suspend: str) -> RunnerSettings:
    return RunnerSettings(
        kind=runner,
        executor_key=r.secret("EXECUTOR_KEY"),
        remote_url_allowlist=_allowlist(r, "REMOTE_URL_ALLOWLIST"),
        executor_command=r.command("EXECUTOR_COMMAND", RunnerSettings.executor_command),
        executor_grace_seconds=r.number(
            "EXECUTOR_GRACE_SECONDS", RunnerSettings.executor_grace_seconds, float, 1.0, 3600
        ),
        local_state_directory=r.text("LOCAL_STATE_DIRECTORY", RunnerSettings.local_state_directory),
        local_executor_user=r.text("LOCAL_EXECUTOR_USER", RunnerSettings.local_executor_user),
        local_executor_uids=_uid_range(r, "LOCAL_EXECUTOR_UIDS"),
        local_executor_same_user=r.flag("LOCAL_EXECUTOR_SAME_USER", RunnerSettings.local_executor_same_user),
        local_allow_redis_without_password=r.flag(
            "LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD", RunnerSettings.local_allow_redis_without_password
        ),
        local_idle_suspend=suspend,
        criu=r.text("CRIU", RunnerSettings.criu),
        checkpoint_max_percent=r.number(
            "CHECKPOINT_MAX_PERCENT", RunnerSettings.checkpoint_max_percent, float, 0.0, 100.0
        ),
        checkpoint_reserve_percent=r.number(
            "CHECKPOINT_RESERVE_PERCENT", RunnerSettings.checkpoint_reserve_percent, float, 0.0, 100.0
        ),
    )


def check_keys_differ(r: Reader, api_key: Secret | None, executor_key: Secret | None) -> None:
    """L2: the executor's key must not be the controller's own API key."""
    if api_key is not None and executor_key is not None and api_key == executor_key:
        r.problems.append(f"{PREFIX}EXECUTOR_KEY must be a separate, restricted key, not {PREFIX}API_KEY (L2)")


def check_executor_identity(r: Reader, settings: RunnerSettings) -> None:
    """One way to say who executors run as."""
    if settings.local_executor_uids is None:
        return
    if settings.local_executor_same_user:
        r.problems.append(f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_SAME_USER=true, not both")
    if r.env.get(PREFIX + "LOCAL_EXECUTOR_USER", "").strip():
        r.problems.append(f"set {PREFIX}LOCAL_EXECUTOR_UIDS or {PREFIX}LOCAL_EXECUTOR_USER, not both")


def _allowlist(r: Reader, name: str) -> tuple[str, ...]:
    """Host patterns (``trust.pattern_problem``), lower-cased; unset means the default."""
    patterns = tuple(p.lower() for p in r.words(name))
    if not patterns:
        if r.env.get(PREFIX + name, "").strip():
            r.problems.append(f"{PREFIX}{name} lists no host pattern")
        return DEFAULT_ALLOWLIST
    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem is not None:
            r.problems.append(f"{PREFIX}{name}: {problem}")
    return patterns


def _uid_range(r: Reader, name: str) -> tuple[int, int] | None:
    """``FIRST-LAST``, inclusive: uids an executor may run as (never 0, never the ``-1``
    that means "unchanged" to the kernel)."""
    raw = r.get(PREFIX + name, "").strip()
    if not raw:
        return None
    first, dash, last = raw.partition("-")
    if not dash or not first.strip().isdigit() or not last.strip().isdigit():
        r.problems.append(f"{PREFIX}{name} must look like FIRST-LAST (e.g. 200000-299999), got {raw!r}")
        return None
    low, high = int(first), int(last)
    if not 1 <= low <= high <= MAX_UID:
        r.problems.append(f"{PREFIX}{name} must satisfy 1 <= FIRST <= LAST <= {MAX_UID}, got {raw!r}")
        return None
    return low, high
