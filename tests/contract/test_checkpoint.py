"""``LocalRunner`` suspending a sandbox with CRIU (issue 29), with a stand-in executor whose
background process keeps its state only in memory. Real CRIU (scripts/criu.sh), real processes,
a listening socket on loopback; skipped with the reason when this host cannot checkpoint."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.decide import Cause
from controller.lifecycle import suspends
from controller.model import Handle, SandboxSpec
from controller.runners.local import CLOCK_CATCH_UP_SECONDS, LocalRunner, session_key
from controller.runners.local.checkpoint import has_sys_resource
from controller.runners.local.checkpoint import volume as checkpoint_volume
from controller.runners.local.procfs import proc_stat
from tests.support.criu import criu_binary
from tests.support.keeper import KEEPER
from tests.support.local_runner import live, sandbox_pids
from tests.support.other_uids import free_uid_range, python_for_others, shared_directory
from tests.support.processes import assert_no_process_left, processes_under, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CRIU checkpoints other processes only as root")

# The executor: starts a background child that holds a random token and a counter only in
# memory and answers "<token> <counter> <pid>" on a loopback port it writes to `port`; then waits.
FAKE_EXECUTOR = f"""
import os, time
if os.fork() == 0:
    exec({KEEPER!r})
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def spec(environment_id: str = "env_1") -> SandboxSpec:
    return SandboxSpec(session_id="sess_1", environment_id=environment_id, remote_url="https://remote.test/env")


def runner_of(tmp_path: Path, program: str) -> tuple[LocalRunner, Path, list[str]]:
    """A checkpointing runner whose executor is ``program`` (Python, written to
    ``fake_executor.py``, which tests that make a second runner name), the directory of session
    ``sess_1`` and the resume outcomes it reports."""
    script = tmp_path / "fake_executor.py"
    script.write_text(program)
    outcomes: list[str] = []
    runner = LocalRunner(
        tmp_path / "state", [sys.executable, str(script)], "envkey", criu=criu_binary(), on_resume=outcomes.append
    )
    return runner, tmp_path / "state" / "sessions" / session_key("sess_1"), outcomes


@pytest.fixture
def made(tmp_path: Path) -> Iterator[tuple[LocalRunner, Path, list[str]]]:
    runner, directory, outcomes = runner_of(tmp_path, FAKE_EXECUTOR)
    try:
        yield runner, directory, outcomes
    finally:
        runner.stop_all()
        wait_for(lambda: not live(runner), 15, "every executor to stop")


def alive(pid: int) -> bool:
    found = proc_stat(pid)
    return found is not None and found.running


def ask(directory: Path) -> tuple[str, int, int]:
    port = int((directory / "workspace" / "port").read_text())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        token, counter, pid = conn.recv(200).decode().split()
    return token, int(counter), int(pid)


def test_a_suspended_sandbox_leaves_no_process_and_resumes_with_its_memory(
    made: tuple[LocalRunner, Path, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29: suspend dumps the whole tree (executor and its background process) and leaves
    nothing running; the next ensure restores it: the same token, a counter that went on from
    where it stopped, and one sandbox (the new generation's handle) for the session."""
    runner, directory, outcomes = made
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    token, before, inner_pid = ask(directory)
    wait_for(lambda: ask(directory)[1] > before, 10, "the counter to go on")
    pids = sandbox_pids(directory.parents[1], first)
    assert len(pids) >= 2  # the executor and its background child
    at_suspend = ask(directory)[1]

    runner.suspend(first)
    assert live(runner) == [] and runner.find("sess_1") is None
    assert not [p for p in pids if alive(p)], "a process of the suspended sandbox is left"
    suspended = runner.suspended("sess_1")
    assert suspended is not None and suspended["size_bytes"] > 0
    with pytest.raises(OSError):
        ask(directory)  # nobody answers while suspended

    second = runner.ensure(spec(), 2)
    assert second.generation == 2 and second != first
    assert outcomes == ["restored"], [getattr(r, "reason", None) for r in caplog.records]
    assert live(runner) == [second]
    again, counter, same_pid = ask(directory)
    assert again == token and same_pid == inner_pid
    assert counter > at_suspend
    assert runner.suspended("sess_1") is None and not (directory / "checkpoint").exists()
    assert runner.ensure(spec(), 2) == second  # L1: one sandbox, not a second start


def test_a_checkpoint_that_cannot_be_restored_falls_back_to_a_fresh_start(
    made: tuple[LocalRunner, Path, list[str]],
) -> None:
    """Issue 29: a corrupt image is not fatal: the next ensure logs it, counts ``fresh_start``,
    drops the checkpoint and starts a new executor on the same workspace."""
    runner, directory, outcomes = made
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    token, _, _ = ask(directory)
    (directory / "workspace" / "kept.txt").write_text("kept")
    runner.suspend(first)
    for image in (directory / "checkpoint").glob("pagemap-*.img"):
        image.write_bytes(b"corrupt")
    (directory / "workspace" / "port").unlink()
    second = runner.ensure(spec(), 2)
    assert outcomes == ["fresh_start"]
    assert live(runner) == [second]
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the fresh background process to listen")
    assert ask(directory)[0] != token
    assert (directory / "workspace" / "kept.txt").read_text() == "kept"
    assert not (directory / "checkpoint").exists()


def test_discard_removes_the_checkpoint_with_the_workspace(made: tuple[LocalRunner, Path, list[str]]) -> None:
    """Issue 29, L16: a session released for good loses its checkpoint with its workspace."""
    runner, directory, _ = made
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    runner.suspend(first)
    assert (directory / "checkpoint").is_dir()
    runner.discard("sess_1")
    assert not (directory / "checkpoint").exists() and not (directory / "suspended.json").exists()


def identity_of(pid: int) -> tuple[list[int], list[int], str]:
    """(real, effective, saved, fs uids), (the same gids), and the supplementary groups."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return (
        [int(x) for x in fields["Uid"].split()],
        [int(x) for x in fields["Gid"].split()],
        fields["Groups"].strip(),
    )


@pytest.fixture
def separate() -> Iterator[tuple[LocalRunner, Path, Path]]:
    """A runner giving each session a uid of its own, in a directory that uid can traverse."""
    with shared_directory("sc-checkpoint-") as base:
        script = base / "fake_executor.py"
        script.write_text(FAKE_EXECUTOR)
        script.chmod(0o644)
        runner = LocalRunner(
            base / "state", [python_for_others(), str(script)], "envkey", run_as=free_uid_range(2), criu=criu_binary()
        )
        try:
            yield runner, base / "state" / "sessions" / session_key("sess_1"), base
        finally:
            runner.stop_all()


def assert_runs_as_the_sessions_uid(state: Path, handle: Handle, uid: int) -> None:
    leader = int(handle.uid.split(":")[0])
    inside = os.readlink(f"/proc/{leader}/ns/pid")
    everything = sandbox_pids(state, handle)
    pids = [p for p in everything if os.readlink(f"/proc/{p}/ns/pid") == inside]
    # Outside the namespace, in the sandbox's cgroup: only the root ``unshare`` that made it.
    for pid in set(everything) - set(pids):
        assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"unshare", pid
    assert len(pids) >= 3  # pid 1 (root, waiting), the executor, its background child
    for pid in pids:
        if pid != leader:
            assert identity_of(pid) == ([uid] * 4, [uid] * 4, ""), pid
    assert identity_of(leader)[0] == [0] * 4  # pid 1 stays root: it only waits for the executor


def test_with_a_uid_per_session_the_namespaced_executor_runs_as_that_uid(
    separate: tuple[LocalRunner, Path, Path],
) -> None:
    """L2, issue 29: in a pid namespace of its own (started as root: ``unshare`` needs it) the
    executor still runs as the session's uid, every uid and gid of each of its processes
    dropped, no supplementary groups; only the namespace's pid 1, which waits for it, is root."""
    runner, directory, _ = separate
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    uid = (directory / "workspace").stat().st_uid
    assert uid != 0
    assert_runs_as_the_sessions_uid(directory.parents[1], first, uid)


@pytest.mark.skipif(
    not has_sys_resource(),
    reason="this host's root lacks CAP_SYS_RESOURCE: CRIU cannot read the rlimits of another uid's "
    'process (criu dump: "Can\'t get rlimit 0: Operation not permitted")',
)
def test_with_a_uid_per_session_a_suspended_sandbox_resumes_as_that_uid(
    separate: tuple[LocalRunner, Path, Path],
) -> None:
    """L2, issue 29: a sandbox of a session's own uid is suspended and restored, and its
    restored processes are that uid again."""
    runner, directory, _ = separate
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    uid = (directory / "workspace").stat().st_uid
    token = ask(directory)[0]
    runner.suspend(first)
    assert runner.suspended("sess_1") is not None
    second = runner.ensure(spec(), 2)
    assert ask(directory)[0] == token
    assert_runs_as_the_sessions_uid(directory.parents[1], second, uid)


def test_without_checkpointing_the_idle_rule_releases(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """L11, issue 29: with ``CONTROLLER_IDLE_SUSPEND=stop`` (no CRIU given) the runner does not
    checkpoint, so the one choice of "suspend or stop" (``lifecycle.suspends``) releases its idle
    sandbox: nothing left running, no checkpoint, "executor stopped". ``suspend`` is never asked
    of it, and refuses (stopping nothing)."""
    caplog.set_level(logging.INFO, logger="controller")
    script = tmp_path / "fake_executor.py"
    script.write_text(FAKE_EXECUTOR)
    runner = LocalRunner(tmp_path / "state", [sys.executable, str(script)], "envkey")
    directory = tmp_path / "state" / "sessions" / session_key("sess_1")
    try:
        first = runner.ensure(spec(), 1)
        wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
        pids = sandbox_pids(tmp_path / "state", first)
        assert not runner.checkpointing and not suspends(runner, Cause.IDLE)
        with pytest.raises(RuntimeError, match="does not checkpoint"):
            runner.suspend(first)
        assert live(runner) == [first]
        runner.release(first)
        assert live(runner) == [] and not [p for p in pids if alive(p)]
        assert not (directory / "checkpoint").exists() and runner.suspended("sess_1") is None
        assert [r.getMessage() for r in caplog.records if r.getMessage() == "executor stopped"] == ["executor stopped"]
    finally:
        runner.stop_all()


def test_a_dump_that_fails_stops_the_sandbox_and_the_next_start_is_fresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29: a CRIU that cannot dump (a stand-in that fails) leaves no half checkpoint: the
    sandbox is stopped instead (logged with the reason), and the next ensure starts afresh."""
    script = tmp_path / "fake_executor.py"
    script.write_text(FAKE_EXECUTOR)
    failing = tmp_path / "criu"
    failing.write_text("#!/bin/sh\necho 'Error (criu/cr-dump.c:1): stand-in refuses' > dump.log\nexit 1\n")
    failing.chmod(0o755)
    outcomes: list[str] = []
    runner = LocalRunner(
        tmp_path / "state", [sys.executable, str(script)], "envkey", criu=str(failing), on_resume=outcomes.append
    )
    directory = tmp_path / "state" / "sessions" / session_key("sess_1")
    try:
        first = runner.ensure(spec(), 1)
        wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
        token = ask(directory)[0]
        runner.suspend(first)
        assert live(runner) == [] and not (directory / "checkpoint").exists()
        [failed] = [r for r in caplog.records if r.getMessage() == "checkpoint failed, executor stopped instead"]
        assert "stand-in refuses" in failed.__dict__["reason"]
        (directory / "workspace" / "port").unlink()
        second = runner.ensure(spec(), 2)
        wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the fresh background process to listen")
        assert ask(directory)[0] != token and live(runner) == [second]
        assert outcomes == []  # no checkpoint was there to restore
    finally:
        runner.stop_all()


@pytest.mark.parametrize("criu", ["missing", "off"])
def test_a_checkpoint_without_a_criu_to_restore_it_falls_back_to_a_fresh_start(
    made: tuple[LocalRunner, Path, list[str]], tmp_path: Path, criu: str
) -> None:
    """Issue 29: a worker whose CRIU is gone (``missing``), or that runs with checkpointing off
    again (``off``), meets a session's checkpoint: it counts ``fresh_start``, drops the
    checkpoint and starts a new executor on the same workspace."""
    runner, directory, _ = made
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    token = ask(directory)[0]
    runner.suspend(first)
    assert (directory / "checkpoint").is_dir()
    (directory / "workspace" / "port").unlink()
    outcomes: list[str] = []
    other = LocalRunner(
        tmp_path / "state",
        [sys.executable, str(tmp_path / "fake_executor.py")],
        "envkey",
        criu=str(tmp_path / "no-criu") if criu == "missing" else None,
        on_resume=outcomes.append,
    )
    try:
        second = other.ensure(spec(), 2)
        assert outcomes == ["fresh_start"] and live(other) == [second]
        wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the fresh background process to listen")
        assert ask(directory)[0] != token
        assert not (directory / "checkpoint").exists()
    finally:
        other.stop_all()


# The executor of the room tests: holds MiB of random bytes (as many as its first argument)
# in memory, writes "ready" into its workspace once they are filled, then waits.
HOLDER = """
import os, sys, time
kept = bytearray(os.urandom(int(sys.argv[1]) * 2**20))
open("ready", "w").close()
while True:
    time.sleep(1)
"""


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB tmpfs to hold the state directory: a small state volume."""
    mount = tmp_path / "volume"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def holder_runner(
    tmp_path: Path, state: Path, mebibytes: int, refused: list[str], outcomes: list[str], **limits: float
) -> LocalRunner:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    return LocalRunner(
        state,
        [sys.executable, str(script), str(mebibytes)],
        "envkey",
        criu=criu_binary(),
        on_resume=outcomes.append,
        on_checkpoint_refused=refused.append,
        **limits,  # type: ignore[arg-type]
    )


def held_spec(session_id: str) -> SandboxSpec:
    return SandboxSpec(session_id=session_id, environment_id="env_" + session_id, remote_url="https://remote.test/e")


def ready(state: Path, session_id: str) -> bool:
    return (state / "sessions" / session_key(session_id) / "workspace" / "ready").exists()


def test_the_checkpoint_images_never_pass_their_cap(
    tmp_path: Path, volume: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37 (6): two idle sessions holding 48 MiB each, a cap of 25 % of a 256 MiB state
    volume (64 MiB): the first is suspended with its memory; the second's image would take the
    images past the cap, so it is not written: that sandbox is stopped the ordinary way (nothing
    of it left, its workspace kept), counted ``cap``, and the images stay under the cap. Its next
    start is fresh; the first still resumes with its memory."""
    state = volume / "state"
    refused: list[str] = []
    outcomes: list[str] = []
    runner = holder_runner(tmp_path, state, 48, refused, outcomes, checkpoint_max_percent=25.0)
    try:
        first = runner.ensure(held_spec("sess_a"), 1)
        second = runner.ensure(held_spec("sess_b"), 1)
        wait_for(lambda: ready(state, "sess_a") and ready(state, "sess_b"), 30, "both holders to fill their memory")
        runner.suspend(first)
        assert runner.suspended("sess_a") is not None and refused == []
        pids = sandbox_pids(state, second)
        runner.suspend(second)
        assert refused == ["cap"]
        assert (
            runner.suspended("sess_b") is None
            and not (state / "sessions" / session_key("sess_b") / "checkpoint").exists()
        )
        assert live(runner) == [] and not [p for p in pids if alive(p)]
        assert runner.keeps_workspace("sess_b")
        cap = checkpoint_volume(state)[0] * 0.25
        assert 0 < runner.checkpoint_bytes() <= cap
        [line] = [r for r in caplog.records if r.getMessage() == "checkpoint refused, executor stopped instead"]
        assert line.__dict__["reason"] == "cap" and line.__dict__["session_id"] == "sess_b"
        runner.ensure(held_spec("sess_b"), 2)  # no checkpoint: a fresh start, nothing counted
        runner.ensure(held_spec("sess_a"), 2)
        assert outcomes == ["restored"]
    finally:
        runner.stop_all()


def test_a_dump_that_would_leave_less_than_the_reserve_free_is_not_written(tmp_path: Path, volume: Path) -> None:
    """Issue 37 (6): with a live workspace's file filling the 256 MiB state volume to 40 MiB
    free, a 48-MiB sandbox is not dumped (20 % of the volume, 51 MiB, must stay free): it is
    stopped, counted ``reserve``, nothing is written, and the live workspace keeps its room."""
    state = volume / "state"
    refused: list[str] = []
    runner = holder_runner(tmp_path, state, 48, refused, [], checkpoint_max_percent=100.0)
    try:
        handle = runner.ensure(held_spec("sess_a"), 1)
        wait_for(lambda: ready(state, "sess_a"), 30, "the holder to fill its memory")
        _, free = checkpoint_volume(state)
        filler = volume / "live-workspace-file"
        with open(filler, "wb") as out:
            out.write(b"\0" * (free - 40 * 2**20))
        runner.suspend(handle)
        assert refused == ["reserve"]
        assert live(runner) == [] and runner.suspended("sess_a") is None
        assert not (state / "sessions" / session_key("sess_a") / "checkpoint").exists()
        assert runner.checkpoint_bytes() == 0
        assert checkpoint_volume(state)[1] >= 39 * 2**20  # the room the live workspace had is still free
    finally:
        runner.stop_all()


def test_a_restored_sandbox_carries_its_lineages_first_start_and_one_past_its_lifetime_starts_fresh(
    made: tuple[LocalRunner, Path, list[str]], tmp_path: Path
) -> None:
    """Issue 37 (7): a restore is not a new sandbox for the maximum lifetime: the restored
    handle carries its lineage's first start (suspended again and restored, still the same); a
    checkpoint whose lineage is past ``max_lifetime_seconds`` is not restored: a fresh start
    (its own lineage, a new memory), counted ``fresh_start``."""
    runner, directory, outcomes = made
    first = runner.ensure(spec(), 1)
    wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the background process to listen")
    token = ask(directory)[0]
    runner.suspend(first)
    second = runner.ensure(spec(), 2)
    assert outcomes == ["restored"] and second.lineage_started_at == first.created_at
    runner.suspend(second)
    third = runner.ensure(spec(), 3)
    assert outcomes == ["restored", "restored"] and third.lineage_started_at == first.created_at
    assert runner.find("sess_1") == third  # what an adopting worker reads carries it too
    runner.suspend(third)

    lifetime = 2.0
    other = LocalRunner(
        tmp_path / "state",
        [sys.executable, str(tmp_path / "fake_executor.py")],
        "envkey",
        criu=criu_binary(),
        on_resume=outcomes.append,
        max_lifetime_seconds=lifetime,
    )
    try:
        wait_for(lambda: time.time() - first.created_at > lifetime, 10, "the lineage to pass its lifetime")
        (directory / "workspace" / "port").unlink()
        fourth = other.ensure(spec(), 4)
        assert outcomes[-1] == "fresh_start" and fourth.lineage_started_at == 0.0
        wait_for(lambda: (directory / "workspace" / "port").exists(), 15, "the fresh background process to listen")
        assert ask(directory)[0] != token
    finally:
        other.stop_all()


# The executor of the clock test: writes its monotonic clock into its workspace every 50 ms.
CLOCK = """
import os, time
while True:
    with open("clock.partial", "w") as f:
        f.write(repr(time.monotonic()))
    os.rename("clock.partial", "clock")
    time.sleep(0.05)
"""


@pytest.mark.parametrize("suspended_for", [0, 86_400])
def test_a_restored_sandbox_finds_its_clocks_moved_on_past_any_reconnect_backoff(
    tmp_path: Path, suspended_for: int
) -> None:
    """Issue 37 (8): the sandbox runs in a time namespace of its own, and a restore moves its
    monotonic clock on by at least ``CLOCK_CATCH_UP_SECONDS`` (longer than codex's longest
    reconnect backoff), even after a suspension of a second: a backoff it was dumped asleep in
    is over when it wakes. After a suspension of a day, the clock moves on by the day (the
    time-namespace image rewritten with larger offsets) and the tree is still restored, not
    started afresh."""
    runner, directory, outcomes = runner_of(tmp_path, CLOCK)
    clock = directory / "workspace" / "clock"
    try:
        first = runner.ensure(spec(), 1)
        wait_for(clock.exists, 15, "the executor to write its clock")
        runner.suspend(first)
        if suspended_for:  # as if the suspension had lasted that long
            saved = json.loads((directory / "suspended.json").read_text())
            saved["suspended_at"] -= suspended_for
            (directory / "suspended.json").write_text(json.dumps(saved))
        before = float(clock.read_text())
        runner.ensure(spec(), 2)
        wait_for(lambda: float(clock.read_text()) != before, 15, "the restored executor to write its clock")
        assert outcomes == ["restored"]
        assert float(clock.read_text()) - before >= max(CLOCK_CATCH_UP_SECONDS, suspended_for)
    finally:
        runner.stop_all()


# The executor holding 64 MiB of memory besides the keeper: its largest pages image, cut, makes
# CRIU 4.2's restore spin for good (a restored task at 100 % CPU) rather than fail.
HOLDING_EXECUTOR = f"""
import os, time
if os.fork() == 0:
    exec({KEEPER!r})
hold = bytearray(os.urandom(1 << 20) * 64)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


@pytest.mark.parametrize("manifest", ["kept", "absent"])
def test_a_cut_image_falls_back_to_a_fresh_start_at_once_and_leaves_no_process(tmp_path: Path, manifest: str) -> None:
    """Issue 37 (5), L16: the largest pages image cut to half (a disk that filled). With the
    dump's manifest (``kept``) the restore refuses the images before CRIU runs; a checkpoint
    without one (``absent``: written before the manifest) makes CRIU spin, and the restore is
    given up at its bound (seconds, not minutes) with CRIU and every process it restored killed
    (the session's cgroup). Either way the next ensure counts ``fresh_start`` and starts a new
    executor on the same workspace, and no process of the old tree is left."""
    script = tmp_path / "holding_executor.py"
    script.write_text(HOLDING_EXECUTOR)
    outcomes: list[str] = []
    runner = LocalRunner(
        tmp_path / "state", [sys.executable, str(script)], "envkey", criu=criu_binary(), on_resume=outcomes.append
    )
    directory = tmp_path / "state" / "sessions" / session_key("sess_1")
    try:
        first = runner.ensure(spec(), 1)
        wait_for(lambda: (directory / "workspace" / "port").exists(), 30, "the background process to listen")
        wait_for(lambda: "ready" in (directory / "executor.log").read_text(), 30, "the 64 MiB to be held")
        token = ask(directory)[0]
        runner.suspend(first)
        pages = max((directory / "checkpoint").glob("pages-*.img"), key=lambda p: p.stat().st_size)
        assert pages.stat().st_size > 32 << 20
        os.truncate(pages, pages.stat().st_size // 2)
        if manifest == "absent":
            (directory / "checkpoint" / "manifest.json").unlink()
        (directory / "workspace" / "port").unlink()

        resumed: list[Handle] = []
        thread = threading.Thread(target=lambda: resumed.append(runner.ensure(spec(), 2)), daemon=True)
        thread.start()
        wait_for(lambda: resumed, 30, "the resume to give up and start afresh")
        [second] = resumed
        assert outcomes == ["fresh_start"] and live(runner) == [second]
        wait_for(lambda: (directory / "workspace" / "port").exists(), 30, "the fresh background process to listen")
        assert ask(directory)[0] != token
        leader = int(second.uid.split(":")[0])
        fresh = pid_namespace(leader)

        def old_tree() -> list[str]:
            """Processes of the session that are not the fresh sandbox (its namespace, and the
            ``unshare`` outside it that made it)."""
            found = processes_under(directory)
            return [p for p in found if pid_namespace(int(p.split(":")[0])) != fresh and "unshare --pid" not in p]

        wait_for(lambda: not old_tree(), 10, "no process of the old tree to be left")
    finally:
        runner.stop_all()
        assert_no_process_left(directory)
