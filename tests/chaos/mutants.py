"""Mutants of the product that the chaos judge must catch (``scripts/test chaos --mutants``).

Each mutant is a small text replacement in one product file that brings back a defect class
issue 25 or issue 37 names. ``main`` applies them one at a time, runs CI's fixed runs (``schedule.CI_RUNS``:
seed, faults and minutes; the next run only while none caught it) against the mutated product,
the run that caught the mutant last first (``FIRST_RUN``; then the others in CI's order), and
reports for each whether it was caught and by which invariants (``checker.INVARIANTS``),
keeping each run's event log in a directory it names; it exits 1 when any mutant survived.

A mutant the chaos tier cannot reasonably meet names a ``guard``: a targeted test (a pytest
node id) run against the same mutated product after the seeds. (The deletion mutants of issue
25's defects 1, 2 and 5 had guards until CI's third run, ``schedule.CI_RUNS``, reached them,
and ``lease-not-checked`` until its fourth, the stale-worker fault; those tests stay in the
suite.) None has one today. It is reported apart — "not
caught by chaos; caught by its guard" — never counted as caught by the chaos tier; the run
exits 0 only when each mutant is caught by the seeds or, failing that, by its guard.
The product file is restored after each mutant whatever happens (``applied``: a ``finally``,
SIGTERM turned into an exception, and a backup beside the file that the next run restores
first if a run was killed outright).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
BACKUP_SUFFIX = ".mutant-backup"
T = TypeVar("T")


@dataclass(frozen=True)
class Mutant:
    name: str
    defect: str
    path: str
    """The product file, relative to the repository's root."""
    old: str
    """Text that occurs exactly once in the file."""
    new: str
    more: tuple[tuple[str, str], ...] = ()
    """Further (old, new) replacements in the same file, each ``old`` there exactly once: for a
    defect the product guards against twice (both guards go, or the mutant changes nothing)."""
    guard: str | None = None
    """A targeted test that must fail on this mutant, for a defect the seeded schedule cannot
    reasonably reach (``why_not_chaos`` says why)."""
    why_not_chaos: str = ""


MUTANTS = (
    Mutant(
        "grace-from-start",
        "the grace clock runs from the sandbox's start: a look that sees the executor connected does not stop it",
        "controller/decide.py",
        "return replace(record, disconnected_at=None, seen_connected=True, link_unknown=False, link_looked_at=None)",
        "return replace(record, seen_connected=True, link_unknown=False, link_looked_at=now)",
    ),
    Mutant(
        "delete-at-first-404",
        "a session counts as deleted at its first 404 read (no confirmation period)",
        "controller/decide.py",
        "    if confirm_seconds <= 0:\n        return True\n    since, reads, _ = counted(",
        "    if True:\n        return True\n    since, reads, _ = counted(",
    ),
    Mutant(
        "start-failure-dropped",
        "a start that fails for a passing reason (RunnerRejected) is marked done, never retried",
        "controller/lifecycle.py",
        'raise StartFailed(f"sandbox start failed; retried while the session asks: {exc}") from exc',
        "raise",
    ),
    Mutant(
        "idle-stop-early",
        "an idle sandbox is stopped at a third of its idle timeout",
        "controller/decide.py",
        "        if now - since >= timeout:\n",
        "        if now - since >= timeout / 3:\n",
    ),
    Mutant(
        "prestart-budget-ignored",
        "pre-starts ignore CONTROLLER_PRESTART_MAX_SANDBOXES",
        "controller/lifecycle.py",
        "if decision.prestart and not deps.store.reserve_prestart(lease, deps.prestart_max_sandboxes):",
        "if False:",
    ),
    Mutant(
        "release-leaves-executor",
        "the local runner's release forgets the sandbox but leaves its executor running",
        "controller/runners/local/runner.py",
        '            self._stop(current)\n            (directory / "sandbox.json").unlink(missing_ok=True)\n'
        '        log.info("executor stopped"',
        '            (directory / "sandbox.json").unlink(missing_ok=True)\n        log.info("executor stopped"',
    ),
    Mutant(
        "lease-not-checked",
        "a worker does not check its lease before it acts (a worker that lost it may still start a sandbox): "
        "the start's lease check goes, and so does the fenced forgetting of 404 marks before acting (issue "
        "37's fix of defect 1), which checks the lease too",
        "controller/lifecycle.py",
        "    deps.store.check(lease)  # fenced: a worker that lost its lease must not act\n",
        "",
        more=(
            (
                "            deps.store.found(lease)  # fenced; before acting: a round that then fails keeps "
                "no 404 mark\n",
                "            pass\n",
            ),
        ),
    ),
    Mutant(
        "deletion-by-two-404s",
        "a deletion is confirmed by two 404 reads a confirmation period apart (issue 25, defect 1), "
        "not by three spread over it: a session readable between two one-shot 404s is released",
        "controller/decide.py",
        "\nSPREAD_READS = 3\n",
        "\nSPREAD_READS = 2\n",
    ),
    Mutant(
        "lone-session-not-held",
        "a session answering 404 with no other mapped session to compare with is released once its "
        "period ends, not held (issue 25, defect 2: a wrong key destroys a one-session deployment)",
        "controller/decide.py",
        "    if _most_missing(missing) if confirm_seconds > 0 else (missing.compared and _most_missing(missing)):\n",
        "    if missing.compared and _most_missing(missing):\n",
    ),
    Mutant(
        "release-ignored",
        "the worker ignores an operator's release (`sandbox-controller release --yes`): a held deletion "
        "never ends (issue 25, defect 5)",
        "controller/decide.py",
        "    if missing.release_asked is not None and missing.since is not None:\n",
        "    if False:\n",
    ),
    Mutant(
        "release-not-noted",
        "`sandbox-controller release --yes` queues a round but never notes the operator's release, so the "
        "worker keeps the hold (issue 25, defect 5: no way for an operator to end one)",
        "controller/holds.py",
        "    if not store.ask_release(session_id, now):\n",
        "    if store.not_found(session_id) is None:\n",
    ),
    Mutant(
        "idle-never-applied",
        "the idle timeout is never applied: an idle sandbox is never stopped (issue 37: the card's "
        "idle-shutdown timer, with nothing in CI's runs to notice)",
        "controller/decide.py",
        "        if now - since >= timeout:\n",
        "        if False:\n",
    ),
    Mutant(
        "lease-taken-while-held",
        "a worker takes a session's lease while another still holds it: two workers act on one "
        "session at once (issue 37)",
        "controller/store/redis.py",
        "if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('PTTL', KEYS[1])} end\n",
        "",
    ),
    Mutant(
        "stop-signals-leader-only",
        "a stop signals only the executor's recorded leader process, not its cgroup (nor kills the "
        "cgroup): once the npm launcher is killed, the native codex outlives every stop and release "
        "(issue 37)",
        "controller/runners/local/processes.py",
        "            return cgroups.signal_members(cgroup, sig)\n",
        "            with suppress(ProcessLookupError):\n"
        "                os.kill(leader(handle)[0], sig)\n"
        "            return True\n",
        more=(
            (
                "                cgroups.end(cgroup, wait)  # kills, waits until it is empty, removes it\n",
                "                pass\n",
            ),
            (
                "        if cgroup is not None and not cgroups.end(cgroup, KILL_WAIT_SECONDS):"
                "  # the cgroup goes with it\n",
                "        if False:\n",
            ),
        ),
    ),
    Mutant(
        "crash-loop-no-backoff",
        "an executor that exits at start is restarted at every look, with no back-off (issue 37, defect 2)",
        "controller/decide.py",
        "    if crashes <= 1:\n",
        "    if True:\n",
    ),
    Mutant(
        "blind-spots-unbounded",
        "blind spots (reads that fail) restart a wedged executor's grace clock for ever: it is never "
        "replaced while the API fails a read every few seconds (issue 37, defect 3); the bound goes "
        "whole (``_bound``), both of its uses with it: the one-line form of before took one use "
        "away and left the other (an executor whose link no look can read) in place",
        "controller/decide.py",
        "    return record.down_since + BLIND_SPOT_GRACES * grace_seconds\n",
        "    return None\n",
    ),
    Mutant(
        "found-not-before-acting",
        "a round that found its session forgets its 404 marks only at its end, so rounds whose start "
        "fails keep them and one later 404 confirms a deletion (issue 37, defect 1)",
        "controller/lifecycle.py",
        "            deps.store.found(lease)  # fenced; before acting: a round that then fails keeps no 404 mark\n",
        "            pass\n",
    ),
    Mutant(
        "stop-spares-detached",
        "a sandbox is not a cgroup: its stop signals the executor's own process session only, so a "
        "command's detached child (a session of its own) outlives the sandbox once the executor died "
        "ungracefully (issue 37, defect 4)",
        "controller/runners/local/processes.py",
        'self._cgroups, self.containment = cgroups.parent() if contain else (None, "turned off by the caller")',
        'self._cgroups, self.containment = (None, "a mutant") if contain else (None, "turned off by the caller")',
    ),
    Mutant(
        "cut-checkpoint-waits",
        "a restore neither checks its images against the dump's sizes nor gives up within seconds: a cut "
        "checkpoint leaves CRIU spinning for two minutes before the fresh start (issue 37, defect 5)",
        "controller/runners/local/checkpoint.py",
        "    _check_manifest(images)\n    bound = restore_bound(image_size(images))\n",
        "    bound = 120.0\n",
    ),
    Mutant(
        "restore-clocks-kept",
        "the executor is dumped with its link up and restored with its clocks where they were: codex's "
        "reconnect backoff, which short links never reset, grows with every suspension (issue 37, defect 8)",
        "controller/runners/local/suspend.py",
        "        if checkpoint.close_links(tree, EXECUTOR_EXECUTABLE):  # dumped asleep in its backoff, not linked\n"
        "            time.sleep(LINK_NOTICE_SECONDS)\n",
        "",
        more=(
            (
                "            checkpoint.advance_clocks(images, max(CLOCK_CATCH_UP_SECONDS, round(suspended_for)))\n",
                "",
            ),
        ),
    ),
    Mutant(
        "checkpoint-images-unbounded",
        "nothing caps the checkpoint images or keeps room for live workspaces: idle sessions' images "
        "fill the state volume, and a live session's write fails with the disk full (issue 37, defect 6)",
        "controller/runners/local/checkpoint.py",
        '    if room.images_bytes + image_bytes > room.size_bytes * max_percent / 100:\n        return "cap"\n'
        '    if room.free_bytes - image_bytes < room.size_bytes * reserve_percent / 100:\n        return "reserve"\n',
        "",
    ),
    Mutant(
        "restore-starts-lineage",
        "a restored sandbox starts a lineage of its own: each restore renews the maximum lifetime, and a "
        "session suspended and resumed now and then keeps one process tree for ever (issue 37, defect 7)",
        "controller/runners/local/suspend.py",
        "time.time(), lineage, cgroup,",
        "time.time(), 0.0, cgroup,",
    ),
)

FIRST_RUN = {
    "delete-at-first-404": 1,
    "stop-signals-leader-only": 1,
    "lease-not-checked": 3,
    "deletion-by-two-404s": 2,
    "lone-session-not-held": 2,
    "release-ignored": 2,
    "release-not-noted": 2,
    "crash-loop-no-backoff": 3,
    "blind-spots-unbounded": 3,
    "found-not-before-acting": 3,
    "stop-spares-detached": 3,
    "cut-checkpoint-waits": 4,
    "restore-clocks-kept": 4,
    "checkpoint-images-unbounded": 4,
    "restore-starts-lineage": 5,
}
"""For a mutant the first of CI's runs does not catch, the index (in ``schedule.CI_RUNS``) of the
run that caught it last (RELIABILITY.md's tables): ``main`` makes that run first, so a full
``--mutants`` run makes one run per mutant when each is caught where it was before, and all of
them for a mutant that is not."""


def runs_for(mutant: Mutant, runs: tuple[T, ...]) -> list[T]:
    """``runs`` in the order ``main`` makes them for ``mutant``: its ``FIRST_RUN`` first, then the
    others in their order."""
    first = FIRST_RUN.get(mutant.name, 0)
    return [runs[first], *(run for index, run in enumerate(runs) if index != first)]


def restore_leftovers(root: Path = ROOT) -> list[Path]:
    """Put back any product file a killed earlier run left mutated (its backup is beside it)."""
    restored = []
    for backup in sorted((root / "controller").rglob(f"*{BACKUP_SUFFIX}")):
        target = backup.with_name(backup.name[: -len(BACKUP_SUFFIX)])
        target.write_bytes(backup.read_bytes())
        backup.unlink()
        restored.append(target)
    return restored


def mutated(mutant: Mutant, text: str) -> str:
    """The file's text with the mutant applied; ValueError unless each ``old`` (``old``, then
    those of ``more``) occurs exactly once."""
    for old, new in ((mutant.old, mutant.new), *mutant.more):
        found = text.count(old)
        if found != 1:
            raise ValueError(f"mutant {mutant.name}: its text occurs {found} times in {mutant.path} (not once)")
        text = text.replace(old, new)
    return text


@contextmanager
def applied(mutant: Mutant, root: Path = ROOT) -> Iterator[None]:
    """The product file mutated for the block, and restored byte for byte after it."""
    target = root / mutant.path
    original = target.read_bytes()
    changed = mutated(mutant, original.decode())
    backup = target.with_name(target.name + BACKUP_SUFFIX)
    backup.write_bytes(original)
    try:
        target.write_text(changed)
        yield
    finally:
        target.write_bytes(original)
        backup.unlink(missing_ok=True)


def guard_catches(mutant: Mutant, root: Path = ROOT) -> bool:
    """Run the mutant's guard (with the mutant applied by the caller): True when it fails as a
    test (pytest's exit status 1), not when it passes or cannot run (2–5)."""
    assert mutant.guard is not None
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", mutant.guard]
    print(f"--> guard of {mutant.name}: {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, cwd=root, check=False)
    return done.returncode == 1


def main() -> int:
    from tests.chaos.run import exit_on_signal, run
    from tests.chaos.schedule import CI_RUNS, select

    signal.signal(signal.SIGTERM, exit_on_signal)  # a killed run restores the product file on its way out
    kept = Path(tempfile.mkdtemp(prefix="chaos-mutants-"))  # each run's event log, for a survivor's story
    print(f"event logs: {kept}")
    for path in restore_leftovers():
        print(f"restored {path} (left mutated by a killed run)")
    names = set(sys.argv[1:])
    chosen = [m for m in MUTANTS if not names or m.name in names]
    survived = []
    rows = []
    for mutant in chosen:
        caught: dict[int, int] = {}
        seeds_run = []
        errors: list[str] = []
        started = time.time()
        with applied(mutant), tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
            print(f"\n==> mutant {mutant.name}: {mutant.defect}", flush=True)
            for seed, faults, minutes in runs_for(mutant, CI_RUNS):
                seeds_run.append(seed)
                result = run(Path(scratch) / f"seed-{seed}", seed, minutes, select(faults))
                print(result.report(), flush=True)
                events = Path(scratch) / f"seed-{seed}" / "events.log"
                if events.exists():
                    shutil.copyfile(events, kept / f"{mutant.name}-seed-{seed}.events.log")
                errors += result.errors
                for violation in result.violations:
                    caught[violation.invariant] = caught.get(violation.invariant, 0) + 1
                if caught:
                    break
            guarded = not caught and mutant.guard is not None and guard_catches(mutant)
        by = ", ".join(f"invariant {i} ({n})" for i, n in sorted(caught.items()))
        seeds = ",".join(map(str, seeds_run))
        harness = f" (harness errors: {errors})" if errors else ""
        if caught:
            rows.append(f"  {mutant.name}: CAUGHT on seed {seeds.split(',')[-1]} by {by}")
        elif guarded:
            rows.append(
                f"  {mutant.name}: NOT CAUGHT BY CHAOS (seeds {seeds}{harness}: {mutant.why_not_chaos}); "
                f"caught by its guard {mutant.guard}"
            )
        else:
            survived.append(mutant.name)
            also = " and its guard" if mutant.guard else ""
            rows.append(f"  {mutant.name}: SURVIVED seeds {seeds}{harness}{also}")
        rows[-1] += f" [{time.time() - started:.0f}s]"
        print(rows[-1], flush=True)
    print("\nmutants of the product against CI's chaos seeds:")
    print("\n".join(rows))
    if survived:
        print(f"{len(survived)} mutant(s) survived: {', '.join(survived)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
