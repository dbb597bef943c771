"""The one place that builds concrete adapters from settings."""

from __future__ import annotations

import shlex

from controller import logs
from controller.clock import SystemClock
from controller.config import Settings
from controller.lifecycle import Deps, Routing
from controller.runners.base import Runner
from controller.sessions import HttpSessions
from controller.store.redis import RedisSessionStore, connect


def redact_secrets(settings: Settings) -> None:
    """Register every secret with the log formatter, so none can leak into a line."""
    values = [s.reveal() for s in settings.webhook.secrets]
    for secret in (settings.api.api_key, settings.runner.executor_key):
        if secret is not None:
            values.append(secret.reveal())
    logs.redact(*values)


def routing(settings: Settings) -> Routing:
    r = settings.routing
    return Routing(
        workspace_directory=r.workspace_directory,
        agent_ids=r.agent_ids,
        metadata_key=r.metadata_key,
        metadata_value=r.metadata_value,
    )


def runner(settings: Settings) -> Runner:
    assert settings.runner.executor_key is not None
    if settings.runner.kind == "local":
        from controller.runners.local import LocalRunner

        return LocalRunner(
            state_directory=settings.runner.local_state_directory,
            executor_command=shlex.split(settings.runner.executor_command),
            executor_key=settings.runner.executor_key.reveal(),
        )
    raise NotImplementedError("the kubernetes runner is not wired yet")


def store(settings: Settings) -> RedisSessionStore:
    assert settings.queue.redis_url is not None
    return RedisSessionStore(connect(settings.queue.redis_url), settings.queue.lease_ttl_seconds)


def worker_deps(settings: Settings) -> Deps:
    assert settings.api.api_key is not None
    return Deps(
        sessions=HttpSessions(
            settings.api.base_url,
            settings.api.api_key.reveal(),
            timeout_seconds=settings.api.timeout_seconds,
            max_attempts=settings.api.max_attempts,
        ),
        store=store(settings),
        runner=runner(settings),
        clock=SystemClock(),
        routing=routing(settings),
        grace_seconds=settings.runner.executor_grace_seconds,
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
