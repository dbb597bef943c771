"""The composition root: the one place that builds concrete adapters from settings.

Each role gets its parts here and nowhere else: ``receiver_app`` (the webhook receiver
publishing to the queue), ``worker_app`` (the Celery app whose task works sessions), and
``scheduler_parts`` (what the reconcile sweep needs). A worker process's dependencies are
built in Celery's ``worker_process_init`` signal, after the fork, so no connection crosses it.
"""

from __future__ import annotations

import atexit
import grp
import os
import pwd
import shlex
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import redis
from celery import Celery, signals
from starlette.applications import Starlette

from controller import logs, queue, scheduler, worker
from controller.clock import SystemClock
from controller.config import PREFIX, Settings
from controller.decide import Decision
from controller.endpoint import ReceiverServices, create_app
from controller.errors import ConfigError, StoreUnavailable
from controller.lifecycle import Deps
from controller.metrics import (
    API_REQUESTS_TOTAL,
    CANNOT_START_TOTAL,
    CHECKPOINT_BYTES,
    CHECKPOINTS_REFUSED_TOTAL,
    COLD_STARTS_TOTAL,
    CRASH_LOOPS_TOTAL,
    DECISIONS_TOTAL,
    DELETIONS_HELD_TOTAL,
    GAUGE_HELP,
    PLACEMENTS_TOTAL,
    PRESTARTS_SKIPPED_TOTAL,
    RESUMES_TOTAL,
    SANDBOXES_RUNNING,
    SANDBOXES_STOPPED_TOTAL,
    SESSIONS_REFUSED_TOTAL,
    START_FAILURES_TOTAL,
    Counters,
    Metrics,
    QueueCollector,
    ReadGauge,
    WarmPoolCollector,
    multiprocess_registry,
    process_exited,
    serve_metrics,
    use_multiprocess,
)
from controller.model import PoolState
from controller.reconcile import Sweep
from controller.redis_client import Endpoint
from controller.runners.base import Connects, DemandLog, Runner
from controller.runners.kubernetes.manifests import PodSettings, SandboxTemplate
from controller.runners.kubernetes.pool import SETTLE_LONGEST_SECONDS
from controller.runners.kubernetes.templates import Templates
from controller.runners.kubernetes.templates import load as load_templates
from controller.runners.local import LocalRunner, RunAs, UidRange, codex_sandbox_problem, state_directory_problems
from controller.sessions import HttpSessions
from controller.store.redis import RedisClock, RedisDemandLog, RedisInbox, RedisSessionStore
from controller.trust import Policy

log = logs.get(__name__)


def secret_values(settings: Settings) -> list[str]:
    """Every secret's value (and URL credential), for the log formatter to redact."""
    return settings.secret_values()


def runner(
    settings: Settings,
    templates: Templates | None = None,
    counters: Counters | None = None,
    demand: DemandLog | None = None,
) -> Runner:
    """The configured runner; with ``counters``, the pods it places are counted by template and
    source (``controller_sandbox_placements_total``: the workers', which place them); with
    ``demand``, the placements of templates with a warm pool are noted there (the workers) and
    read from there to size the pools sized by demand and to hold any pool's refills while its
    sessions are being placed (the scheduler)."""
    if settings.runner.kind == "local":
        return local_runner(settings, counters)
    return kubernetes_runner(settings, templates or sandbox_templates(settings), counters, demand)


def preflight(settings: Settings, role: str) -> None:
    """Every check a process of ``role`` makes before it starts, all problems reported together
    (``ConfigError``: exit 2). ``serve``, ``worker`` and ``scheduler`` call it first thing (through
    ``cli``), and ``check-config`` calls this very function for each role, so it says "ready"
    exactly when the process would start. Read only: it creates nothing."""
    problems: list[str] = []
    try:
        settings.require(role)
    except ConfigError as exc:
        problems += exc.problems
    if role in ("worker", "scheduler") and settings.runner.kind == "local":
        problems += local_runner_problems(settings)
    elif role in ("worker", "scheduler"):
        try:
            sandbox_templates(settings)  # a bad templates file: refused now, not in every task
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)


def preflight_warnings(settings: Settings, role: str) -> list[str]:
    """What a process of ``role`` would start with but should be told about, one line each with
    the fix: for a local-runner worker, a host that cannot give Codex its own sandbox (only
    sessions that ask for it need it, so it refuses nothing). ``check-config`` prints them;
    the worker logs them at start."""
    if role != "worker" or settings.runner.kind != "local":
        return []
    unprivileged = not (settings.runner.local_executor_same_user and os.geteuid() == 0)
    problem = codex_sandbox_problem(unprivileged)
    return [problem] if problem else []


def local_runner_problems(settings: Settings) -> list[str]:
    """What keeps the local runner from starting: whom executors run as (``executor_identity``),
    Redis within their reach without a password, and an unsafe state directory."""
    problems: list[str] = []
    try:
        executor_identity(settings)
    except ConfigError as exc:
        problems += exc.problems
    separate = not settings.runner.local_executor_same_user
    q = settings.queue
    if separate and q.redis_url and not q.redis_password_set and not settings.runner.local_allow_redis_without_password:
        problems.append(
            f"{PREFIX}REDIS_URL has no password while executors run as another user on this machine: their "
            "code could use Redis as its admin (the queue, the leases, the session mapping). Give Redis a "
            "password (requirepass, or an ACL user) and put it in the URL (redis://:PASSWORD@host:6379/0, or "
            f"?password= for a unix socket), or set {PREFIX}LOCAL_ALLOW_REDIS_WITHOUT_PASSWORD=true if the "
            "executors cannot reach it (another host behind a firewall, a socket they cannot open)"
        )
    problems += state_directory_problems(Path(settings.runner.local_state_directory), traversable=separate)
    if settings.runner.local_idle_suspend == "checkpoint" and os.geteuid() != 0:
        problems.append(
            f"{PREFIX}IDLE_SUSPEND=checkpoint needs the worker to run as root (each executor gets a pid "
            f"namespace, and CRIU dumps and restores it); this process runs as uid {os.geteuid()}"
        )
    return problems


def local_runner(settings: Settings, counters: Counters | None = None) -> LocalRunner:
    """Child processes on this machine; raises ConfigError (exit 2) for an unsafe state
    directory or an executor user it cannot switch to (``preflight`` said so already). With
    ``CONTROLLER_IDLE_SUSPEND=checkpoint``, idle sandboxes are checkpointed with CRIU; with
    ``counters``, each start of a session that had a checkpoint is counted by outcome, and each
    suspension whose image did not fit by reason."""
    assert settings.runner.executor_key is not None  # Settings.require checked it
    checkpointing = settings.runner.local_idle_suspend == "checkpoint"
    return LocalRunner(
        state_directory=settings.runner.local_state_directory,
        executor_command=shlex.split(settings.runner.executor_command),
        executor_key=settings.runner.executor_key.reveal(),
        run_as=executor_identity(settings),
        criu=settings.runner.criu if checkpointing else None,
        on_resume=(lambda outcome: counters.inc(RESUMES_TOTAL, outcome=outcome)) if counters else lambda outcome: None,
        max_lifetime_seconds=settings.lifecycle.max_lifetime_seconds or None,
        checkpoint_max_percent=settings.runner.checkpoint_max_percent,
        checkpoint_reserve_percent=settings.runner.checkpoint_reserve_percent,
        on_checkpoint_refused=(
            (lambda reason: counters.inc(CHECKPOINTS_REFUSED_TOTAL, reason=reason)) if counters else lambda reason: None
        ),
    )


def say_if_not_contained(runner: LocalRunner) -> None:
    """One warning line at a worker's start when its sandboxes get no cgroup (README: what a
    sandbox process can escape then), with the reason."""
    if not runner.contained:
        log.warning(
            "sandbox processes not contained: a process that leaves its sandbox's session outlives it",
            extra={"reason": runner.containment},
        )


def executor_identity(settings: Settings) -> RunAs | UidRange | None:
    """Whom the local runner's executors run as, when this process is root: a uid of
    ``CONTROLLER_LOCAL_EXECUTOR_UIDS`` per session, else ``CONTROLLER_LOCAL_EXECUTOR_USER``;
    its own uid only on the ``CONTROLLER_LOCAL_EXECUTOR_SAME_USER`` opt-in."""
    if settings.runner.local_executor_same_user:
        return None
    same_user = f"set {PREFIX}LOCAL_EXECUTOR_SAME_USER=true to run executors as this uid (no separation)"
    uid = os.geteuid()
    if settings.runner.local_executor_uids is not None:
        first, last = settings.runner.local_executor_uids
        setting = f"{PREFIX}LOCAL_EXECUTOR_UIDS={first}-{last}"
        if uid != 0:
            raise ConfigError(
                [f"executors run as uids of {setting}, which needs the worker to run as root (it runs as uid {uid})"]
            )
        taken = sorted(
            {f"uid {e.pw_uid} (user {e.pw_name!r})" for e in pwd.getpwall() if first <= e.pw_uid <= last}
            | {f"gid {g.gr_gid} (group {g.gr_name!r})" for g in grp.getgrall() if first <= g.gr_gid <= last}
        )
        if taken:
            raise ConfigError(
                [
                    f"{setting} includes {', '.join(taken[:3])}{' and more' if len(taken) > 3 else ''}: executors "
                    "would run as (or with the group of) an account of this machine; choose a range no user or "
                    "group has"
                ]
            )
        return UidRange(first, last)
    name = settings.runner.local_executor_user
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise ConfigError([f"{PREFIX}LOCAL_EXECUTOR_USER={name!r} is not a user on this machine"]) from None
    if entry.pw_uid == 0:
        raise ConfigError([f"{PREFIX}LOCAL_EXECUTOR_USER={name!r} is root; name an unprivileged user, or {same_user}"])
    if entry.pw_uid == uid:
        raise ConfigError([f"{PREFIX}LOCAL_EXECUTOR_USER={name!r} is this process's own uid {uid}; {same_user}"])
    if uid != 0:
        raise ConfigError(
            [
                f"executors run as {PREFIX}LOCAL_EXECUTOR_USER={name!r}, which needs the worker to run as root "
                f"(it runs as uid {uid}); run it as root, or {same_user}"
            ]
        )
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=entry.pw_name)


def kubernetes_runner(
    settings: Settings, templates: Templates, counters: Counters | None = None, demand: DemandLog | None = None
) -> Runner:
    """Pods in the sandbox namespace; in-cluster credentials, else $KUBECONFIG."""
    # Imported here, not at the top: the Kubernetes client takes about half a second to import
    # and only this runner and the pod watch need it (receivers, and workers with the local
    # runner, never do). ``runners.kubernetes.api`` is the one module that imports it.
    from controller.runners.kubernetes import api
    from controller.runners.kubernetes.runner import KubernetesRunner

    k = settings.kubernetes
    return KubernetesRunner(
        api.connect(),
        PodSettings(
            namespace=k.namespace,
            executor_key_secret=k.executor_key_secret,
            workspace_directory=settings.routing.workspace_directory,
            ca_bundle_configmap=k.ca_bundle_configmap,
        ),
        templates.get,
        templates.pooled(),
        on_placed=placements(templates, counters, demand),
        demand=demand,
        checkpointing=any(t.checkpoint_idle for t in templates.by_name.values()),
        checkpoint_timeout_seconds=k.checkpoint_timeout_seconds,
        max_lifetime_seconds=settings.lifecycle.max_lifetime_seconds or None,
        on_resume=(lambda outcome: counters.inc(RESUMES_TOTAL, outcome=outcome)) if counters else lambda outcome: None,
    )


def placements(
    templates: Templates, counters: Counters | None, demand: DemandLog | None
) -> Callable[[str, str, str], None]:
    """The Kubernetes runner's ``on_placed``: count each pod placed by template and source, each
    cold one by its reason too (``pool_empty``: the pool had none to claim); note the placements
    of a template with a warm pool in ``demand`` (they size a pool sized by demand, and hold
    every pool's refills while its sessions are being placed; a note that fails is logged: it
    never fails the start)."""

    def on_placed(template: str, source: str, reason: str) -> None:
        if counters is not None:
            counters.inc(PLACEMENTS_TOTAL, template=template, source=source)
            if source == "cold":
                counters.inc(COLD_STARTS_TOTAL, template=template, reason=reason)
        chosen = templates.get(template)
        if demand is not None and chosen.pooled:
            try:
                demand.note(template, chosen.warm_window_seconds if chosen.sized_by_demand else SETTLE_LONGEST_SECONDS)
            except StoreUnavailable as exc:
                log.warning(
                    "could not note the placement for the warm pool", extra={"template": template, "reason": str(exc)}
                )

    return on_placed


def pod_watch(settings: Settings) -> scheduler.SandboxWatch | None:
    """The scheduler's watch on the sandbox pods (Kubernetes runner, unless turned off), with a
    client of its own (its long request holds a connection)."""
    if settings.runner.kind != "kubernetes" or not settings.kubernetes.watch_pods:
        return None
    from controller.runners.kubernetes import api
    from controller.runners.kubernetes.watch import PodWatch

    return PodWatch(api.connect(), settings.kubernetes.namespace)


def sandbox_templates(settings: Settings) -> Templates:
    k = settings.kubernetes
    return load_templates(
        k.templates_file,
        SandboxTemplate(image=k.image, runtime_class_name=k.runtime_class, host_users=not k.user_namespaces),
    )


def redis_endpoint(settings: Settings) -> Endpoint:
    """Where Redis is: one URL, or the master a Sentinel set names (``redis_client``)."""
    return Endpoint.from_settings(settings.queue)


def store(settings: Settings, client: redis.Redis | None = None) -> RedisSessionStore:
    q = settings.queue
    return RedisSessionStore(client or redis_endpoint(settings).client(), q.lease_ttl_seconds, q.recovery_after_seconds)


def count_decisions(counters: Counters) -> Callable[[str, Decision], None]:
    """``Deps.on_decision``: count each decision by verdict (never by session: ids are not labels)."""

    def on_decision(session_id: str, decision: Decision) -> None:
        counters.inc(DECISIONS_TOTAL, verdict=decision.verdict.value)

    return on_decision


def remember_decisions(decisions: RedisSessionStore) -> Callable[[str, Decision], None]:
    """``Deps.on_decision``: note the latest decision per session for ``status`` and ``explain``
    (stamped with Redis's clock). A failed note is logged and does not fail the work (it
    reports; it decides nothing)."""

    def on_decision(session_id: str, decision: Decision) -> None:
        try:
            decisions.note_decision(session_id, decision.verdict.value, decision.reason, decision.held)
        except StoreUnavailable:
            log.warning("could not note the decision", extra={"session_id": session_id})

    return on_decision


def note_start_failures(decisions: RedisSessionStore, metrics: Counters) -> Callable[[str, str, bool], None]:
    """``Deps.on_start_failed``: count each failed start by kind, and note it as the session's
    latest decision ("start failed" / "start refused", with the reason) for ``status`` and
    ``explain``. A failed note is logged and does not fail the work."""

    def on_start_failed(session_id: str, reason: str, permanent: bool) -> None:
        metrics.inc(START_FAILURES_TOTAL, kind="permanent" if permanent else "transient")
        try:
            decisions.note_decision(session_id, "start refused" if permanent else "start failed", reason)
        except StoreUnavailable:
            log.warning("could not note the failed start", extra={"session_id": session_id})

    return on_start_failed


def each(*calls: Callable[[str, Decision], None]) -> Callable[[str, Decision], None]:
    def on_decision(session_id: str, decision: Decision) -> None:
        for call in calls:
            call(session_id, decision)

    return on_decision


def api_sessions(settings: Settings, metrics: Counters | None = None) -> HttpSessions:
    """The Agents API client, with the configured key and base URL (the workers', ``check-config``'s)."""
    assert settings.api.api_key is not None
    return HttpSessions(
        settings.api.base_url,
        settings.api.api_key.reveal(),
        timeout_seconds=settings.api.timeout_seconds,
        max_attempts=settings.api.max_attempts,
        on_response=count_api_requests(metrics if metrics is not None else Metrics()),
    )


def worker_deps(settings: Settings, counters: Counters | None = None) -> Deps:
    assert settings.api.api_key is not None
    metrics = counters if counters is not None else Metrics()
    templates = sandbox_templates(settings)  # read once: the runner builds pods from it, lifecycle chooses
    client = redis_endpoint(settings).client()
    session_store = store(settings, client)
    lifecycle = settings.lifecycle
    return Deps(
        sessions=api_sessions(settings, metrics),
        store=session_store,
        runner=runner(settings, templates, metrics, RedisDemandLog(client)),
        clock=RedisClock(client),  # one clock for every process: the one timers fall due on
        routing=settings.routing,
        grace_seconds=settings.runner.executor_grace_seconds,
        max_lifetime_seconds=lifecycle.max_lifetime_seconds or None,
        on_decision=each(count_decisions(metrics), remember_decisions(session_store)),
        choose_template=templates.choose,
        trust_policy=Policy(settings.runner.remote_url_allowlist),
        on_refusal=lambda kind: metrics.inc(SESSIONS_REFUSED_TOTAL, reason=kind),
        renew_every_seconds=settings.queue.lease_ttl_seconds / 3,
        idle_timeout_seconds=lifecycle.idle_timeout_seconds,
        retention_seconds=lifecycle.workspace_retention_seconds,
        on_stop=lambda cause: metrics.inc(SANDBOXES_STOPPED_TOTAL, reason=cause),
        prestarts_agent=lifecycle.prestarts_agent,
        prestart_max_sandboxes=lifecycle.prestart_max_sandboxes,
        on_prestart_skipped=lambda: metrics.inc(PRESTARTS_SKIPPED_TOTAL),
        deletion_confirm_seconds=lifecycle.deletion_confirm_seconds,
        on_held=lambda: metrics.inc(DELETIONS_HELD_TOTAL),
        on_start_failed=note_start_failures(session_store, metrics),
        on_crash_loop=lambda: metrics.inc(CRASH_LOOPS_TOTAL),
        on_cannot_start=lambda kind: metrics.inc(CANNOT_START_TOTAL, reason=kind),
    )


class ProcessDeps:
    """One worker process's ``Deps``, built by Celery's ``worker_process_init`` signal (after the
    fork: connections must not cross it) and handed to each task run in that process.

    Celery logs and swallows an exception raised in that signal; the first task then builds
    again, so it fails with the real cause (a bad templates file, no kubeconfig) and retries.
    The process's connections are opened then, on a thread of its own: the signal waits for no
    network (Celery gives a new pool process a few seconds to come up, and an API server away
    would hold it longer). First a runner that ``Connects``, then ``warm`` (``connect_redis``:
    the store's connection and the watch jobs' producer); each is best effort, a failure one
    warning line, and a job never waits for them.
    """

    def __init__(self, build: Callable[[], Deps], warm: Callable[[Deps], None] | None = None) -> None:
        self._build = build
        self._warm = warm
        self._deps: Deps | None = None

    def on_process_init(self, **_: Any) -> None:
        self._deps = self._build()
        # Before its first job, not inside it.
        threading.Thread(target=self._connect, args=(self._deps,), name="connect", daemon=True).start()

    def _connect(self, deps: Deps) -> None:
        if isinstance(deps.runner, Connects):
            deps.runner.connect()
        if self._warm is not None:
            self._warm(deps)

    def __call__(self) -> Deps:
        if self._deps is None:
            self._deps = self._build()
        return self._deps


def connect_redis(producer: worker.KeptProducer | None) -> Callable[[Deps], None]:
    """``ProcessDeps``' ``warm``: open a pool process's connections to Redis at its start, the
    store's (the lease, the record, the clock, the demand log: one client) and the producer's
    that queues the watch jobs (None: the process queues none, its metrics not served). Without
    it the process's first job opened both (on the 2-core node, ten fresh processes' first jobs
    at once, beside the sandboxes they had just placed). Redis away, or refusing the configured
    credentials: one warning line, and each job connects as it would have (and reports a
    refusal as it would have)."""

    def warm(deps: Deps) -> None:
        try:
            if isinstance(deps.store, RedisSessionStore):
                deps.store.connect()
            if producer is not None:
                producer.connect()
        except (StoreUnavailable, ConfigError) as exc:
            log.warning("could not connect to Redis ahead of a job", extra={"reason": str(exc)})

    return warm


def count_api_requests(counters: Counters) -> Callable[[str, str], None]:
    """``HttpSessions``' ``on_response``: count Agents API requests by operation and status."""

    def on_response(operation: str, status: str) -> None:
        counters.inc(API_REQUESTS_TOTAL, operation=operation, status=status)

    return on_response


def worker_app(settings: Settings, metrics: Metrics | None = None) -> Celery:
    """The Celery app with the ``sync_session`` task; each pool process builds its own ``Deps``.

    ``metrics`` is shared by every pool process: created here, before the fork, it counts in
    each child's own files when multiprocess mode is on (``metrics.use_multiprocess``).
    """
    app = queue.make_app(settings)
    if settings.runner.kind != "local":  # see ``runner``
        from controller.runners.kubernetes import api

        api.load_models()  # here, before the fork: every pool process inherits them built
        api.load_verbs()  # so with the client's argument validators
    # Celery's result backend (none: results are ignored), built by a process's first publish
    # (the name resolved through every installed package's entry points): here, before the fork.
    queue.build_backend(app)
    counted = metrics if metrics is not None else Metrics()
    producer = worker.KeptProducer(app)
    watch = bool(settings.metrics.port)  # watch jobs observe a start's last stages: only when served
    deps = ProcessDeps(lambda: worker_deps(settings, counted), warm=connect_redis(producer if watch else None))
    signals.worker_process_init.connect(deps.on_process_init, weak=False)
    signals.worker_process_shutdown.connect(_pool_process_exited, weak=False)
    signals.worker_ready.connect(worker.announce_ready, weak=False)
    worker.register(app, settings.queue.task_max_retries, deps, counted, watch_connections=watch, producer=producer)
    return app


def serve_worker_metrics(settings: Settings, host: str) -> None:
    """Multiprocess mode in a fresh directory (``PROMETHEUS_MULTIPROC_DIR`` when set, emptied;
    else a temporary one removed at exit), and ``GET /metrics`` summing every pool process.
    Call before ``worker_app`` creates any metric."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    directory = Path(given) if given else Path(tempfile.mkdtemp(prefix="sandbox-controller-metrics-"))
    if not given:
        atexit.register(shutil.rmtree, directory, True)
    use_multiprocess(directory)
    serve_metrics(multiprocess_registry(), host, settings.metrics.port)
    log.info("metrics served", extra={"port": settings.metrics.port})


def _pool_process_exited(pid: int | None = None, **_: Any) -> None:
    process_exited(pid or os.getpid())


def scheduler_metrics(settings: Settings, parts: SchedulerParts) -> Metrics:
    """The scheduler's registry: the standard process metrics plus the queue gauges, read at
    scrape (and, local runner checkpointing, the checkpoint images' bytes on its state volume)."""
    found = parts.metrics  # the registry ``on_sweep`` sets the running-sandboxes gauge in
    depth = partial(parts.client.llen, queue.QUEUE)
    found.registry.register(QueueCollector(depth, parts.store.pending_count, parts.store.timer_count))
    if isinstance(parts.runner, LocalRunner) and settings.runner.local_idle_suspend == "checkpoint":
        images = ReadGauge(CHECKPOINT_BYTES, GAUGE_HELP[CHECKPOINT_BYTES], parts.runner.checkpoint_bytes)
        found.registry.register(images)
    return found


class FleetParts(NamedTuple):
    store: RedisSessionStore
    runner: Runner
    clock: RedisClock


def fleet_parts(settings: Settings) -> FleetParts:
    """What ``status`` reads: the mapping and last decisions, the runner's view of each sandbox,
    and Redis's clock (the one the workers decide on)."""
    client = redis_endpoint(settings).client()
    return FleetParts(store(settings, client), runner(settings), RedisClock(client))


class SchedulerParts(NamedTuple):
    store: RedisSessionStore
    runner: Runner
    client: redis.Redis
    publish: scheduler.Publish
    metrics: Metrics
    watch: scheduler.SandboxWatch | None = None
    pools: WarmPoolCollector | None = None

    def on_sweep(self, sweep: Sweep) -> None:
        """``scheduler.run``'s ``on_sweep``: the running-sandboxes gauge follows each sweep."""
        self.metrics.set(SANDBOXES_RUNNING, sweep.running)

    def on_pools(self, pools: Sequence[PoolState]) -> None:
        """``scheduler.run``'s ``on_pools``: the warm-pool gauges follow each tending."""
        if self.pools is not None:
            self.pools.update(pools)


def scheduler_parts(settings: Settings) -> SchedulerParts:
    # Leadership's renewals and the leader's pushes: a short timeout, well within the renew deadline.
    client = redis_endpoint(settings).client(timeout_seconds=1.0)
    metrics, pools = Metrics(), WarmPoolCollector()
    metrics.registry.register(pools)
    return SchedulerParts(
        store(settings),
        runner(settings, demand=RedisDemandLog(redis_endpoint(settings).client())),
        client,
        # The leader's jobs, pushed only while its term holds the leader key (fenced).
        queue.fenced_publisher(client, queue.MAINTENANCE_QUEUE, scheduler.LEADER_KEY),
        metrics,
        pod_watch(settings),
        pools,
    )


def receiver_app(settings: Settings) -> Starlette:
    """The Starlette app with its Redis inbox: one script per delivery, awaited on the event loop,
    that de-duplicates, wants the work and pushes the Celery task message (``task_message``)."""
    client = redis_endpoint(settings).pipelined()  # one pipelined connection for every delivery
    inbox = RedisInbox(
        client,
        queue.QUEUE,
        settings.webhook.dedup_ttl_seconds,
        settings.queue.recovery_after_seconds,
    )
    services = ReceiverServices.from_settings(
        settings.webhook, inbox, SystemClock(), prestart=settings.lifecycle.prestarts
    )
    return create_app(services)
