"""Clean-up rules: maximum lifetime, mappings without compute, adoption, discard, and the sweep.

Extends ``test_lifecycle.py`` (the same ``World``, from ``tests.support.fakes``): ``work`` for
L1/L16/L18, and ``reconcile.sweep``, which only asks for work and decides nothing itself.
``decide`` for L17 (maximum lifetime, mappings without compute) is tests/unit/test_decide.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller import reconcile
from controller.decide import Decision, Verdict
from controller.lifecycle import work
from controller.model import Handle, Health, Record, SandboxSpec, SessionStatus
from controller.store.base import Busy
from tests.support.fakes import T0, World, make_session, verdicts

LIFETIME = 3600.0
IDLE = make_session(status=SessionStatus.IDLE, actions=())
WANTS = make_session()


def record(session_id: str = "sess_1", started_at: float = T0, generation: int = 1) -> Record:
    handle = Handle(session_id=session_id, name=f"sandbox-g{generation}", generation=generation, uid=f"u{generation}")
    return Record(session_id=session_id, environment_id="env_1", handle=handle, started_at=started_at)


# --- work: adoption, release, discard -----------------------------------------------------------


def test_unrecorded_live_sandbox_is_adopted_then_released_and_discarded_once() -> None:
    """L1/L16: the orphan is adopted (no second ensure); on deletion it is released and its workspace discarded once."""
    world = World()
    orphan = world.orphan()
    world.sessions.put(make_session())
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    assert world.runner.calls == []  # no second ensure
    saved = world.store.record("sess_1")
    assert saved is not None and saved.handle == orphan
    assert world.runner.max_live["sess_1"] == 1

    del world.sessions.sessions["sess_1"]  # deleted: no webhook; a later round (the sweep) finds it
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert world.runner.calls == [("release", "sess_1", 1), ("discard", "sess_1", 0)]
    assert world.runner.live == {}
    assert world.store.record("sess_1") is None

    assert verdicts(world.deliver()) == [Verdict.IGNORE]  # nothing left: no second release or discard
    assert world.count("release") == 1 and world.count("discard") == 1


def test_orphan_of_a_deleted_session_is_released_without_being_recorded() -> None:
    """L17/L16: a live sandbox of a deleted session, never recorded, is released and its workspace discarded."""
    world = World()
    world.orphan()
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert world.runner.calls == [("release", "sess_1", 1), ("discard", "sess_1", 0)]
    assert world.runner.live == {} and world.store.session_ids() == []


def test_orphan_of_an_idle_session_is_neither_stopped_nor_duplicated() -> None:
    """L1/L13: an adopted sandbox of an idle session is left running; nothing is started."""
    world = World()
    world.orphan()
    world.sessions.put(IDLE)
    assert verdicts(world.deliver()) == [Verdict.IGNORE]
    assert world.runner.calls == []
    assert "sess_1" in world.runner.live


def test_max_lifetime_replace_in_work() -> None:
    """L15/L17: past its maximum lifetime while a connection is requested, the sandbox is
    replaced by exactly one new one (never released with nothing started)."""
    world = World(max_lifetime=LIFETIME)
    world.sessions.put(make_session())
    world.sessions.connected["env_1"] = True
    assert verdicts(world.deliver()) == [Verdict.START]
    world.clock.advance(LIFETIME)
    assert verdicts(world.deliver()) == [Verdict.KEEP]
    world.clock.advance(1)
    assert verdicts(world.deliver()) == [Verdict.REPLACE]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.handle.generation == 2 and not saved.stopped
    assert world.count("release") == 1 and world.count("ensure") == 2
    assert world.runner.max_live["sess_1"] == 1


def test_mapping_of_a_vanished_sandbox_is_removed() -> None:
    """L17: the sandbox vanished (node lost, deleted by hand); its mapping goes, nothing is started."""
    world = World()
    world.sessions.put(IDLE)
    handle = world.mapped()
    world.runner.live.clear()  # gone without the controller
    assert verdicts(world.deliver()) == [Verdict.STOP]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.stopped
    assert world.count("ensure") == 0
    assert ("release", "sess_1", handle.generation) in world.runner.calls  # releasing what is gone is fine


def test_crashed_sandbox_of_a_live_session_keeps_its_workspace() -> None:
    """L16: the workspace outlives the pod (crash): removing the mapping must not discard the volume."""
    world = World()
    world.sessions.put(IDLE)
    handle = world.mapped()
    world.runner.set_health(handle, Health.FAILED)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    saved = world.store.record("sess_1")
    assert saved is not None and saved.stopped
    assert world.count("release") == 1
    assert world.count("discard") == 0


def test_max_lifetime_release_of_a_live_session_keeps_its_workspace() -> None:
    """L16/L17: compute past its lifetime is released; the live session's workspace stays for the next sandbox."""
    world = World(max_lifetime=LIFETIME)
    world.sessions.put(IDLE)
    world.mapped()
    world.clock.advance(LIFETIME + 1)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.runner.live == {}
    assert world.count("discard") == 0


@pytest.mark.parametrize("ending", ["deleted", "failed"])
def test_workspace_is_discarded_with_the_session(ending: str) -> None:
    """L16: a deleted or failed session is released for good: its workspace is discarded, once."""
    world = World()
    world.mapped()
    if ending == "failed":
        world.sessions.put(make_session(status=SessionStatus.FAILED, actions=()))
    assert verdicts(world.deliver()) == [Verdict.RELEASE]
    assert verdicts(world.deliver()) == [Verdict.IGNORE]
    assert world.runner.calls == [("release", "sess_1", 1), ("discard", "sess_1", 0)]


# --- reconcile.sweep -------------------------------------------------------------------------


def test_sweep_enqueues_the_union_of_mapped_and_managed_once_each() -> None:
    """L17: every session with a mapping or a managed sandbox is enqueued exactly once, and its want bumped."""
    world = World()
    world.mapped("sess_a")  # mapped and managed
    world.store.records["sess_b"] = record("sess_b")  # mapped only (its sandbox vanished)
    world.orphan("sess_c")  # managed only (never recorded)
    result = world.sweep()
    assert result == reconcile.Sweep(mapped=2, managed=2, enqueued=3, running=2)
    assert sorted(world.published) == ["sess_a", "sess_b", "sess_c"]
    for sid in ("sess_a", "sess_b", "sess_c"):
        assert world.store.counters(sid) == (1, 0)
    assert world.store.counters("sess_other") == (0, 0)


def test_a_partial_sweep_leaves_timed_sessions_to_their_timers() -> None:
    """L17: between full sweeps, a mapped session with a timer armed is left to that timer (a
    running sandbox, a kept workspace); a mapped session without one and a sandbox or workspace
    without a mapping are enqueued."""
    world = World()
    world.mapped("sess_timed")
    world.store.timers["sess_timed"] = 1_000.0
    world.mapped("sess_untimed")
    world.orphan("sess_orphan")
    world.store.timers["sess_orphan"] = 1_000.0  # a timer without a mapping does not excuse it
    world.store.records["sess_kept"] = record("sess_kept")  # stopped, workspace kept, retention timer
    world.store.timers["sess_kept"] = 1_000.0
    world.runner.kept_workspaces.update({"sess_kept", "sess_unrecorded_workspace"})
    result = reconcile.sweep(world.store, world.runner, world.published.extend, full=False)
    assert sorted(world.published) == ["sess_orphan", "sess_unrecorded_workspace", "sess_untimed"]
    assert result.enqueued == 3 and result.left_to_timers == 2
    assert world.store.counters("sess_timed") == (0, 0)
    world.published.clear()
    full = reconcile.sweep(world.store, world.runner, world.published.extend, full=True)
    every = ["sess_kept", "sess_orphan", "sess_timed", "sess_unrecorded_workspace", "sess_untimed"]
    assert sorted(world.published) == every
    assert full.left_to_timers == 0


def test_a_full_sweep_first_has_the_runner_stop_sandboxes_no_record_names_and_a_partial_one_does_not() -> None:
    """L17, issue 37: a sandbox whose start was cut short before its runner recorded it is found
    by nothing a worker reads; each full sweep asks a runner that can tell them
    (``EndsUnrecorded``) to stop them, before it lists what it manages. A partial sweep does not
    (it runs every few seconds, and a start may be under way)."""
    world = World()
    asked: list[str] = []

    class Ending(type(world.runner)):  # type: ignore[misc]
        def end_unrecorded(self) -> list[str]:
            asked.append("end")
            return []

    world.runner.__class__ = Ending
    reconcile.sweep(world.store, world.runner, world.published.extend, full=False)
    assert asked == []
    reconcile.sweep(world.store, world.runner, world.published.extend, full=True)
    assert asked == ["end"]


def test_a_partial_sweep_with_the_pod_watch_live_leaves_watched_sandboxes_to_it() -> None:
    """L17: with the pod watch live, a partial sweep also leaves a mapped session whose sandbox is
    there to the watch (it reports the sandbox going, failing, restarting); a mapping whose
    sandbox is not listed, a mapped session with neither sandbox nor timer, and a sandbox
    without a mapping are still enqueued. Without the watch, or on a full sweep, they are too."""
    world = World()
    world.mapped("sess_watched")
    world.mapped("sess_vanished")
    world.runner.live.pop("sess_vanished")  # its pod went while nobody looked
    world.store.records["sess_kept"] = replace(record("sess_kept"), stopped_at=T0)  # no retention: no timer
    world.orphan("sess_orphan")
    world.mapped("sess_timed")
    world.store.timers["sess_timed"] = 1_000.0
    result = reconcile.sweep(world.store, world.runner, world.published.extend, full=False, watched=True)
    assert sorted(world.published) == ["sess_kept", "sess_orphan", "sess_vanished"]
    assert (result.enqueued, result.left_to_timers, result.left_to_watch) == (3, 1, 1)
    assert world.store.counters("sess_watched") == (0, 0)
    world.published.clear()
    unwatched = reconcile.sweep(world.store, world.runner, world.published.extend, full=False, watched=False)
    assert sorted(world.published) == ["sess_kept", "sess_orphan", "sess_vanished", "sess_watched"]
    assert unwatched.left_to_watch == 0
    world.published.clear()
    full = reconcile.sweep(world.store, world.runner, world.published.extend, full=True, watched=True)
    assert sorted(world.published) == ["sess_kept", "sess_orphan", "sess_timed", "sess_vanished", "sess_watched"]
    assert (full.left_to_timers, full.left_to_watch) == (0, 0)


def test_sweep_decides_nothing_itself() -> None:
    """L17/L18: the sweep reads no session, starts and stops nothing, and leaves every mapping as it was."""
    world = World()
    world.mapped("sess_a")
    world.orphan("sess_c")
    records = dict(world.store.records)
    world.sweep()
    assert world.sessions.gets == 0
    assert world.runner.calls == []
    assert world.store.records == records
    assert set(world.runner.live) == {"sess_a", "sess_c"}


def test_sweep_of_nothing_enqueues_nothing() -> None:
    world = World()
    assert world.sweep() == reconcile.Sweep(mapped=0, managed=0, enqueued=0)
    assert world.published == []


def test_sweep_then_work_cleans_up_what_deleting_sessions_left_behind() -> None:
    """L17: deleted → released; failed → released; vanished sandbox → stopped (workspace kept); live → kept."""
    world = World()
    world.sessions.connected["env_1"] = True
    world.mapped("sess_deleted")
    world.mapped("sess_failed")
    world.sessions.put(make_session("sess_failed", status=SessionStatus.FAILED, actions=()))
    world.store.records["sess_vanished"] = record("sess_vanished")
    world.sessions.put(make_session("sess_vanished", status=SessionStatus.IDLE, actions=()))
    world.mapped("sess_live")
    world.sessions.put(make_session("sess_live"))
    world.orphan("sess_orphan")

    world.sweep()
    assert world.work_published() == {
        "sess_deleted": [Verdict.RELEASE],
        "sess_failed": [Verdict.RELEASE],
        "sess_live": [Verdict.KEEP],
        "sess_orphan": [Verdict.RELEASE],
        "sess_vanished": [Verdict.STOP],
    }
    assert set(world.runner.live) == {"sess_live"}
    assert world.store.session_ids() == ["sess_live", "sess_vanished"]
    assert all(c[0] != "ensure" for c in world.runner.calls)

    world.sweep()  # the next round finds only what is left
    assert sorted(world.published) == ["sess_live", "sess_vanished"]


def test_sweep_during_a_start_is_coordinated_by_the_lease() -> None:
    """L18: a sweep racing a start only asks for more work; the holder goes round again and no pod is left."""
    world = World()
    world.sessions.put(make_session())
    busy: list[list[Decision] | Busy] = []

    def deleted_and_swept_mid_start(spec: SandboxSpec, generation: int) -> None:
        world.runner.on_ensure = None
        del world.sessions.sessions["sess_1"]  # deleted while its pod is being created
        world.store.records["sess_1"] = record()  # visible to the sweep as mapped
        world.sweep()
        busy.extend(work(sid, world.deps) for sid in world.published)

    world.runner.on_ensure = deleted_and_swept_mid_start
    assert verdicts(world.deliver()) == [Verdict.START, Verdict.RELEASE]
    assert len(busy) == 1 and isinstance(busy[0], Busy)  # the sweep's job never acted alongside
    assert world.runner.live == {}  # no orphan after the cleanup completed
    assert world.store.record("sess_1") is None
    assert world.store.holder("sess_1") is None
    want, done = world.store.counters("sess_1")
    assert want == done == 2
    assert world.work_published() == {"sess_1": []}  # the retried job finds nothing left to do


def test_a_kept_workspace_whose_session_is_deleted_later_is_discarded_by_the_sweep() -> None:
    """L16, L17: the sandbox of an idle session died, so its mapping became a stopped one and its
    workspace stayed; when the session is deleted later, the sweep finds it and the worker
    releases the mapping and discards the workspace."""
    world = World()
    world.sessions.put(IDLE)
    handle = world.mapped()
    world.runner.set_health(handle, Health.FAILED)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.runner.workspaces() == ["sess_1"]
    del world.sessions.sessions["sess_1"]  # deleted: the API now answers 404
    world.sweep()
    assert world.work_published() == {"sess_1": [Verdict.RELEASE]}
    assert world.count("discard") == 1
    assert world.runner.workspaces() == []


def test_an_adopted_orphan_keeps_its_real_age_for_the_maximum_lifetime() -> None:
    """L17: a sandbox nobody recorded is adopted with its own creation time, so an old one
    is released for age instead of looking newborn."""
    world = World(max_lifetime=100.0)
    world.sessions.put(IDLE)
    orphan = world.orphan()
    world.runner.live["sess_1"].handle = replace(orphan, created_at=T0 - 500.0)
    assert verdicts(world.deliver()) == [Verdict.STOP]
    assert world.count("release") == 1
    assert world.count("discard") == 0  # the session lives on: its workspace stays (L16)
