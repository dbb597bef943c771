"""The composition root: decisions feed the decisions metric; worker dependencies are per process."""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from controller import logs, queue, task_message, wiring, worker
from controller.config import PREFIX, Settings
from controller.decide import Decision, Verdict
from controller.lifecycle import Deps
from controller.metrics import DECISIONS_TOTAL, Metrics
from controller.model import SandboxSpec
from controller.runners.local import cgroups
from tests.support.fakes import World, make_session
from tests.support.processes import free_port, wait_for


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        PREFIX + "REDIS_URL": "redis://127.0.0.1:1/0",  # never dialled: clients connect lazily
        PREFIX + "WEBHOOK_SECRETS": "a-webhook-secret-of-24-bytes",
        PREFIX + "API_KEY": "sk-test-api-key",
        PREFIX + "EXECUTOR_KEY": "envkey-test",
        PREFIX + "RUNNER": "local",
        PREFIX + "LOCAL_STATE_DIRECTORY": str(tmp_path / "sandboxes"),
        PREFIX + "LOCAL_EXECUTOR_SAME_USER": "true",  # the executor user is not what this tests
    }


def settings(tmp_path: Path) -> Settings:
    return Settings.from_env(_env(tmp_path))


def test_decisions_are_counted_by_verdict() -> None:
    metrics = Metrics()
    world = World(on_decision=wiring.count_decisions(metrics))
    world.sessions.put(make_session())
    world.deliver()
    world.deliver()
    assert metrics.value(DECISIONS_TOTAL, verdict="start") == 1
    assert metrics.value(DECISIONS_TOTAL, verdict="keep") == 1
    assert metrics.value(DECISIONS_TOTAL, verdict="release") == 0


def test_production_worker_dependencies_count_their_decisions(tmp_path: Path) -> None:
    metrics = Metrics()
    deps = wiring.worker_deps(settings(tmp_path), metrics)
    deps.on_decision("sess_1", Decision(Verdict.REPLACE, "sandbox gone"))
    assert metrics.value(DECISIONS_TOTAL, verdict="replace") == 1


def test_worker_dependencies_are_built_once_per_process_at_process_init() -> None:
    built: list[Deps] = []
    world = World()

    def build() -> Deps:
        built.append(world.deps)
        return world.deps

    deps = wiring.ProcessDeps(build)
    assert built == []  # nothing is built before the fork
    deps.on_process_init()
    assert deps() is world.deps
    assert deps() is world.deps
    assert len(built) == 1


def test_the_worker_app_has_the_task_the_publisher_names(tmp_path: Path) -> None:
    app = wiring.worker_app(settings(tmp_path))
    assert queue.TASK_SYNC_SESSION in app.tasks
    assert app.conf.task_default_queue == queue.QUEUE
    assert task_message.TASK_SYNC_SESSION == queue.TASK_SYNC_SESSION  # the receiver writes its messages


def test_every_configured_secret_is_redacted_from_log_lines(tmp_path: Path) -> None:
    formatter = logs.JsonFormatter(wiring.secret_values(settings(tmp_path)))
    secrets = ("sk-test-api-key", "envkey-test", "a-webhook-secret-of-24-bytes")
    record = logging.makeLogRecord({"msg": "leaked: %s %s %s", "args": secrets, "levelname": "INFO"})
    line = formatter.format(record)
    assert not [s for s in secrets if s in line]
    assert line.count("[REDACTED]") == 3


def test_a_secret_read_after_set_up_is_redacted_too() -> None:
    """A webhook secret that arrived with a rotation (``FileVerifier`` reads it after
    ``logs.setup``) joins the secrets every line is scrubbed of."""
    stream = io.StringIO()
    logs.setup("INFO", stream=stream, secrets=["the-first-secret"])
    logs.redact(["the-rotated-secret"])
    logs.get("test.redact").info("leaked: the-first-secret the-rotated-secret")
    line = stream.getvalue()
    assert "secret" not in line.replace("[REDACTED]", "") and line.count("[REDACTED]") == 2


def test_only_the_kubernetes_runner_gets_a_pod_watch_and_it_can_be_turned_off(tmp_path: Path) -> None:
    """The scheduler watches pods only with the Kubernetes runner, unless told not to."""
    assert wiring.pod_watch(settings(tmp_path)) is None
    off = Settings.from_env({PREFIX + "RUNNER": "kubernetes", PREFIX + "KUBERNETES_WATCH_PODS": "false"})
    assert wiring.pod_watch(off) is None


def test_the_redis_and_sentinel_passwords_are_redacted_from_log_lines(tmp_path: Path) -> None:
    with_sentinels = Settings.from_env(
        {
            PREFIX + "REDIS_URL": "redis://:the-redis%2Fpassword@mymaster/0",
            PREFIX + "REDIS_SENTINELS": "127.0.0.1:26379",
            PREFIX + "REDIS_SENTINEL_PASSWORD": "the-sentinel-password",
        }
    )
    formatter = logs.JsonFormatter(wiring.secret_values(with_sentinels))
    record = logging.makeLogRecord(
        {"msg": "leaked: %s %s", "args": ("the-redis/password", "the-sentinel-password"), "levelname": "INFO"}
    )
    line = formatter.format(record)
    assert "password" not in line.replace("[REDACTED]", "") and line.count("[REDACTED]") == 2


def test_the_ca_bundle_setting_reaches_the_pods_the_kubernetes_runner_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """CONTROLLER_KUBERNETES_CA_BUNDLE_CONFIGMAP → every sandbox pod mounts it (no cluster needed:
    the runner is only built, never asked to call the API)."""
    from controller.runners.kubernetes import api, templates
    from controller.runners.kubernetes.manifests import SandboxTemplate, make_pod
    from controller.runners.kubernetes.runner import KubernetesRunner

    monkeypatch.setattr(api, "connect", lambda *args, **kwargs: object())
    s = Settings.from_env({PREFIX + "RUNNER": "kubernetes", PREFIX + "KUBERNETES_CA_BUNDLE_CONFIGMAP": "proxy-ca"})
    runner = wiring.kubernetes_runner(s, templates.load(None, SandboxTemplate()))
    assert isinstance(runner, KubernetesRunner)
    spec = SandboxSpec("sess_ca", "env_ca", "https://api.openai.com", "/workspace")
    pod = make_pod(spec, 1, SandboxTemplate(), runner._placement._settings)  # placement builds the pods
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "ca-bundle"]
    assert volume["configMap"]["name"] == "proxy-ca"


def test_a_pool_process_connects_its_runner_then_redis_at_its_start_on_its_connect_thread() -> None:
    """``ProcessDeps.on_process_init`` starts the process's connect thread: the runner's
    ``connect`` first, then ``warm`` (``connect_redis`` in the worker) with the process's
    dependencies; the signal itself waits for neither."""
    done: list[tuple[str, str]] = []

    class Runner:
        def connect(self) -> None:
            done.append(("runner", threading.current_thread().name))

    world = SimpleNamespace(runner=Runner())
    deps = wiring.ProcessDeps(
        lambda: world,  # type: ignore[arg-type,return-value]
        warm=lambda found: done.append(("redis" if found is world else "other", threading.current_thread().name)),
    )
    deps.on_process_init()
    wait_for(lambda: len(done) == 2, 10, "the connect thread")
    assert done == [("runner", "connect"), ("redis", "connect")]


def test_redis_away_at_a_pool_process_start_is_one_warning_line_and_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``connect_redis`` with nothing listening at Redis's address: one warning line (the
    store's connection failed; the producer is not tried), no exception (the process lives,
    and its first job connects as it would have), and no producer kept for the jobs."""
    found = Settings.from_env({**_env(tmp_path), PREFIX + "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    producer = worker.KeptProducer(queue.make_app(found))
    with caplog.at_level(logging.WARNING):
        wiring.connect_redis(producer)(SimpleNamespace(store=wiring.store(found)))  # type: ignore[arg-type]
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in lines] == ["could not connect to Redis ahead of a job"]
    assert producer._kept is None


def test_a_producer_a_job_already_took_is_never_connected_by_the_connect_thread(tmp_path: Path) -> None:
    """``KeptProducer.connect`` leaves alone the producer a job took first (two threads never
    share one): it returns without connecting anything (here: nothing listens at Redis's
    address, and it raises nothing)."""
    found = Settings.from_env({**_env(tmp_path), PREFIX + "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    producer = worker.KeptProducer(queue.make_app(found))
    taken = producer.get()
    producer.connect()
    assert producer.get() is taken


def test_a_worker_whose_sandboxes_get_no_cgroup_says_so_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37 (4): where no cgroup can be made (here: as if not root), the worker starts (its
    sandboxes are sessions, as before) and says in one line, with the reason, that a process
    leaving a sandbox's session outlives it; with cgroups it says nothing of it."""
    unavailable = (None, "moving executors into cgroups needs the worker to run as root (it runs as uid 1000)")
    monkeypatch.setattr(cgroups, "parent", lambda make=True: unavailable)
    runner = wiring.local_runner(settings(tmp_path))
    assert not runner.contained
    with caplog.at_level(logging.WARNING):
        wiring.say_if_not_contained(runner)
    [line] = [r for r in caplog.records if r.getMessage().startswith("sandbox processes not contained")]
    assert "outlives" in line.getMessage() and line.__dict__["reason"] == unavailable[1]
    caplog.clear()
    monkeypatch.setattr(cgroups, "parent", lambda make=True: (tmp_path, "a cgroup per sandbox"))
    wiring.say_if_not_contained(wiring.local_runner(settings(tmp_path)))
    assert not [r for r in caplog.records if r.getMessage().startswith("sandbox processes not contained")]
