"""The one place that builds concrete adapters from settings."""

from __future__ import annotations

import shlex

import redis

from controller import logs
from controller.clock import SystemClock
from controller.config import Settings
from controller.lifecycle import Deps
from controller.metrics import SESSIONS_REFUSED_TOTAL, Counters, Metrics
from controller.runners.base import Runner
from controller.sessions import HttpSessions
from controller.store.redis import RedisSessionStore, connect
from controller.templates import Templates
from controller.templates import load as load_templates
from controller.trust import Policy


def redact_secrets(settings: Settings) -> None:
    """Register every secret with the log formatter, so none can leak into a line."""
    values = [s.reveal() for s in settings.webhook.secrets]
    for secret in (settings.api.api_key, settings.runner.executor_key):
        if secret is not None:
            values.append(secret.reveal())
    logs.redact(*values)


def runner(settings: Settings, templates: Templates | None = None) -> Runner:
    if settings.runner.kind == "local":
        assert settings.runner.executor_key is not None
        from controller.runners.local import LocalRunner

        return LocalRunner(
            state_directory=settings.runner.local_state_directory,
            executor_command=shlex.split(settings.runner.executor_command),
            executor_key=settings.runner.executor_key.reveal(),
        )
    return kubernetes_runner(settings, templates or sandbox_templates(settings))


def kubernetes_runner(settings: Settings, templates: Templates) -> Runner:
    """Pods in the sandbox namespace; in-cluster credentials, else $KUBECONFIG."""
    import os

    from kubernetes import client, config

    from controller.runners.kubernetes import KubernetesRunner
    from controller.runners.manifests import PodSettings

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    k = settings.kubernetes
    return KubernetesRunner(
        client.CoreV1Api(),
        PodSettings(namespace=k.namespace, executor_key_secret=k.executor_key_secret),
        templates.get,
    )


def sandbox_templates(settings: Settings) -> Templates:
    from controller.runners.manifests import SandboxTemplate

    k = settings.kubernetes
    return load_templates(k.templates_file, SandboxTemplate(image=k.image, runtime_class_name=k.runtime_class))


def store(settings: Settings, client: redis.Redis | None = None) -> RedisSessionStore:
    q = settings.queue
    assert q.redis_url is not None
    return RedisSessionStore(client or connect(q.redis_url), q.lease_ttl_seconds, q.recovery_after_seconds)


def worker_deps(settings: Settings, counters: Counters | None = None) -> Deps:
    assert settings.api.api_key is not None
    metrics = counters if counters is not None else Metrics()
    templates = sandbox_templates(settings)  # read once: the runner builds pods from it, lifecycle chooses
    return Deps(
        sessions=HttpSessions(
            settings.api.base_url,
            settings.api.api_key.reveal(),
            timeout_seconds=settings.api.timeout_seconds,
            max_attempts=settings.api.max_attempts,
        ),
        store=store(settings),
        runner=runner(settings, templates),
        clock=SystemClock(),
        routing=settings.routing,
        grace_seconds=settings.runner.executor_grace_seconds,
        max_lifetime_seconds=settings.lifecycle.max_lifetime_seconds or None,
        choose_template=templates.choose,
        trust_policy=Policy(settings.runner.remote_url_allowlist),
        on_refusal=lambda kind: metrics.inc(SESSIONS_REFUSED_TOTAL, reason=kind),
        renew_every_seconds=settings.queue.lease_ttl_seconds / 3,
    )


def receiver_app(settings: Settings):  # type: ignore[no-untyped-def]
    """The Starlette app with its Redis inbox publishing to the Celery queue."""
    from controller.receiver import ReceiverServices, create_app
    from controller.store.redis import RedisInbox
    from controller.worker import make_app, publisher

    assert settings.queue.redis_url is not None
    client = connect(settings.queue.redis_url)
    inbox = RedisInbox(
        client,
        store(settings, client),
        publisher(make_app(settings)),
        settings.webhook.dedup_ttl_seconds,
    )
    return create_app(ReceiverServices.from_settings(settings.webhook, inbox, SystemClock()))
