"""The one place that builds concrete adapters from settings."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from controller import logs
from controller.clock import SystemClock
from controller.config import PREFIX, Settings
from controller.errors import ConfigError
from controller.lifecycle import Deps
from controller.runners.base import Runner
from controller.sessions import HttpSessions
from controller.store.redis import RedisSessionStore, connect
from controller.templates import Templates
from controller.templates import load as load_templates

if TYPE_CHECKING:
    from controller.runners.local import LocalRunner, RunAs


def redact_secrets(settings: Settings) -> None:
    """Register every secret with the log formatter, so none can leak into a line."""
    values = [s.reveal() for s in settings.webhook.secrets]
    for secret in (settings.api.api_key, settings.runner.executor_key):
        if secret is not None:
            values.append(secret.reveal())
    logs.redact(*values)


def runner(settings: Settings, templates: Templates | None = None) -> Runner:
    if settings.runner.kind == "local":
        return local_runner(settings)
    return kubernetes_runner(settings, templates or sandbox_templates(settings))


def local_runner(settings: Settings) -> LocalRunner:
    """Child processes on this machine; raises ConfigError (exit 2) for an unsafe state
    directory or an executor user it cannot switch to."""
    from controller.runners.local import LocalRunner

    assert settings.runner.executor_key is not None  # Settings.require checked it
    return LocalRunner(
        state_directory=settings.runner.local_state_directory,
        executor_command=shlex.split(settings.runner.executor_command),
        executor_key=settings.runner.executor_key.reveal(),
        run_as=executor_user(settings),
    )


def executor_user(settings: Settings) -> RunAs | None:
    """Who the local runner's executors run as: ``CONTROLLER_LOCAL_EXECUTOR_USER`` when this
    process is root; its own uid only on the ``CONTROLLER_LOCAL_EXECUTOR_SAME_USER`` opt-in."""
    import os
    import pwd

    from controller.runners.local import RunAs

    if settings.runner.local_executor_same_user:
        return None
    name = settings.runner.local_executor_user
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        raise ConfigError([f"{PREFIX}LOCAL_EXECUTOR_USER={name!r} is not a user on this machine"]) from None
    same_user = f"set {PREFIX}LOCAL_EXECUTOR_SAME_USER=true to run executors as this uid (no separation)"
    if entry.pw_uid == 0:
        raise ConfigError([f"{PREFIX}LOCAL_EXECUTOR_USER={name!r} is root; name an unprivileged user, or {same_user}"])
    uid = os.geteuid()
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


def store(settings: Settings) -> RedisSessionStore:
    assert settings.queue.redis_url is not None
    return RedisSessionStore(connect(settings.queue.redis_url), settings.queue.lease_ttl_seconds)


def worker_deps(settings: Settings) -> Deps:
    assert settings.api.api_key is not None
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
        RedisSessionStore(client, settings.queue.lease_ttl_seconds),
        publisher(make_app(settings)),
        settings.webhook.dedup_ttl_seconds,
    )
    return create_app(ReceiverServices.from_settings(settings.webhook, inbox, SystemClock()))
