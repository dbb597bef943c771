"""Which stop suspends (issue 29): only the idle rule's, and only with a runner that can."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from controller import cli, fleet
from controller.config import Settings
from controller.decide import Verdict
from controller.errors import ConfigError
from controller.model import Handle, LastDecision, SandboxSpec, SessionStatus
from controller.runners.base import Suspends
from controller.runners.local import host_can_checkpoint
from tests.support.fakes import T0, FakeRunner, World, make_session, verdicts


@dataclass
class SuspendingRunner(FakeRunner):
    """``FakeRunner`` that also suspends: a suspended sandbox is gone like a released one, and
    leaves a checkpoint of 21 MB taken at ``T0 + 700``. ``checkpointing`` False: a runner built
    to suspend whose checkpointing is off (``CONTROLLER_IDLE_SUSPEND=stop``)."""

    checkpoints: dict[str, dict[str, float]] = field(default_factory=dict)
    checkpointing: bool = True

    def suspend(self, handle: Handle) -> None:
        self.calls.append(("suspend", handle.session_id, handle.generation))
        current = self.live.get(handle.session_id)
        if current is not None and current.handle.uid == handle.uid:
            del self.live[handle.session_id]
            self.checkpoints[handle.session_id] = {"size_bytes": 21e6, "suspended_at": T0 + 700}

    def suspended(self, session_id: str) -> dict[str, float] | None:
        return self.checkpoints.get(session_id)


class _Decisions:
    def last_decision(self, session_id: str) -> LastDecision | None:
        return None

    def timer(self, session_id: str) -> float | None:
        return None


def world_with(runner: FakeRunner, **settings: float) -> World:
    world = World(**settings)  # type: ignore[arg-type]
    world.runner = runner
    world.deps = replace(world.deps, runner=runner)
    return world


def test_the_idle_rule_suspends_with_a_runner_that_can() -> None:
    """L11, issue 29: an idle session past the timeout: its sandbox is suspended, not released;
    the workspace is kept and the record says stopped, as after any idle stop."""
    runner = SuspendingRunner()
    assert isinstance(runner, Suspends)
    world = world_with(runner, idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert runner.calls == [("suspend", "sess_1", 1)]
    assert world.stopped == ["idle"]
    record = world.store.record("sess_1")
    assert record is not None and record.stopped_at is not None


def test_a_stop_for_age_releases_even_with_a_runner_that_suspends() -> None:
    """L11, issue 29: only idleness suspends; a sandbox past its lifetime is stopped for good."""
    runner = SuspendingRunner()
    world = world_with(runner, max_lifetime=100.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(200)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.stopped == ["lifetime"]
    assert runner.calls == [("release", "sess_1", 1)]


def test_the_idle_rule_releases_with_a_runner_whose_checkpointing_is_off() -> None:
    """L11, issue 29: "suspend or stop" is chosen once, in ``lifecycle.suspends``: a runner that
    could suspend but does not checkpoint (the local runner with ``CONTROLLER_IDLE_SUSPEND=stop``)
    has its idle sandbox released, and is never asked to suspend it."""
    runner = SuspendingRunner(checkpointing=False)
    world = world_with(runner, idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert runner.calls == [("release", "sess_1", 1)]
    assert world.stopped == ["idle"] and runner.checkpoints == {}
    record = world.store.record("sess_1")
    assert record is not None and record.stopped_at is not None


def test_a_runner_that_cannot_suspend_is_released_by_the_idle_rule() -> None:
    """L11: without ``suspend`` (the Kubernetes runner) the idle rule releases, as before."""
    world = World(idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.runner.calls == [("release", "sess_1", 1)]


def test_status_and_explain_show_a_suspended_sandbox_with_its_image_size_and_age() -> None:
    """Issue 29: after an idle suspension ``status`` says ``suspended`` (not ``gone``) with the
    checkpoint's size and age, and ``explain`` shows the same; a running sandbox shows none."""
    runner = SuspendingRunner()
    world = world_with(runner, idle_timeout=600.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    [running] = fleet.status(world.store, _Decisions(), runner, "local", world.clock.now())
    assert (running.health, running.suspended) == ("running", None)
    world.clock.advance(700)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    world.clock.advance(90)

    [row] = fleet.status(world.store, _Decisions(), runner, "local", world.clock.now())
    assert row.health == "suspended"
    assert row.to_json()["suspended"] == {"size_bytes": 21e6, "age_seconds": 90.0}
    assert fleet.explain("sess_1", world.deps).observed["suspended"] == {"size_bytes": 21e6, "age_seconds": 90.0}


def test_check_config_says_in_one_line_whether_this_host_can_checkpoint_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: ``check-config`` prints one line: a CRIU that is missing, or whose ``criu
    check`` fails, is named with the reason (here a stand-in CRIU that fails as Debian 12's
    3.17 does on this kernel)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert host_can_checkpoint(str(tmp_path / "nowhere" / "criu")) == (
        False,
        f"'{tmp_path / 'nowhere' / 'criu'}' not found (build it with scripts/criu.sh, then set CONTROLLER_CRIU)",
    )
    fake = tmp_path / "criu"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "Version: 3.17.1"; exit 0; fi\n'
        'echo "Error (criu/crtools.c:260): Could not initialize kernel features detection." >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    can, reason = host_can_checkpoint(str(fake))
    assert not can
    assert reason == (
        f"{fake} (Version: 3.17.1): criu check failed: "
        "Error (criu/crtools.c:260): Could not initialize kernel features detection."
    )
    monkeypatch.setenv("CONTROLLER_CRIU", str(fake))
    monkeypatch.setenv("CONTROLLER_IDLE_SUSPEND", "checkpoint")
    cli.main(["check-config", "--role", "serve"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("checkpoint")]
    assert lines == [f"checkpoint (idle suspend: checkpoint): cannot checkpoint here: {reason}"]


def test_the_idle_suspend_setting_is_stop_or_checkpoint_and_checkpoint_only_with_the_local_runner() -> None:
    """Issue 29: ``stop`` by default; ``checkpoint`` with the local runner; anything else, or
    ``checkpoint`` with the Kubernetes runner (which cannot), is refused at start with the reason."""
    assert Settings.from_env({}).runner.local_idle_suspend == "stop"
    chosen = Settings.from_env({"CONTROLLER_IDLE_SUSPEND": "Checkpoint", "CONTROLLER_CRIU": "/opt/criu"})
    assert (chosen.runner.local_idle_suspend, chosen.runner.criu) == ("checkpoint", "/opt/criu")
    with pytest.raises(ConfigError) as wrong:
        Settings.from_env({"CONTROLLER_IDLE_SUSPEND": "hibernate"})
    assert wrong.value.problems == ["CONTROLLER_IDLE_SUSPEND must be one of stop, checkpoint, got 'hibernate'"]
    with pytest.raises(ConfigError) as kubernetes:
        Settings.from_env({"CONTROLLER_IDLE_SUSPEND": "checkpoint", "CONTROLLER_RUNNER": "kubernetes"})
    assert kubernetes.value.problems == [
        "CONTROLLER_IDLE_SUSPEND=checkpoint works with the local runner only; with CONTROLLER_RUNNER=kubernetes an "
        "idle sandbox is stopped (docs/kubernetes.md says what checkpointing pods would need)"
    ]


@dataclass
class RestoringRunner(SuspendingRunner):
    """``SuspendingRunner`` whose next ``ensure`` of a suspended session restores it: the handle
    carries its lineage's first start (``T0``: the world maps its first sandbox then)."""

    def ensure(self, spec: SandboxSpec, generation: int) -> Handle:
        restored = self.checkpoints.pop(spec.session_id, None)
        handle = super().ensure(spec, generation)
        if restored is None:
            return handle
        handle = replace(handle, lineage_started_at=T0)
        self.live[spec.session_id].handle = handle
        return handle


def test_a_restored_sandbox_is_stopped_at_its_lineages_lifetime_not_its_restores() -> None:
    """Issue 37 (7), L11: a lifetime of 100 s; the sandbox started at T0 is suspended idle at
    T0+10 and restored by a connection request at T0+50. Its record keeps the lineage's first
    start, so at T0+120 (70 s after the restore, 120 s after the first start) it is replaced for
    its lifetime, while the executor is connected (without the lineage: kept until T0+150)."""
    runner = RestoringRunner()
    world = world_with(runner, idle_timeout=5.0, max_lifetime=100.0)
    world.sessions.put(make_session(status=SessionStatus.IDLE, actions=(), last_active_at=int(T0)))
    world.mapped()
    world.clock.advance(10)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert runner.calls == [("suspend", "sess_1", 1)]

    world.clock.advance(40)
    world.sessions.put(make_session(last_active_at=int(world.clock.now())))
    world.deliver()
    record = world.store.record("sess_1")
    assert record is not None and record.handle.generation == 2 and not record.stopped
    assert record.lineage_started_at == T0 and record.started_at == T0 + 50
    world.sessions.connected["env_1"] = True

    world.clock.advance(70)
    assert verdicts(world.deliver())[0] is Verdict.REPLACE
    assert world.stopped[-1] == "lifetime"
    record = world.store.record("sess_1")
    assert record is not None and record.lineage_started_at is None  # the replacement starts its own
