"""The mutants that prove the chaos judge (``tests/chaos/mutants.py``, ``scripts/test chaos
--mutants``): each still applies to today's product (its text occurs once: a mutant that no
longer applies proves nothing), each changes what it names, and the product file comes back
byte for byte after a mutant, whatever happens during the run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.chaos import mutants
from tests.chaos.mutants import FIRST_RUN, MUTANTS, Mutant, applied, mutated, restore_leftovers, runs_for


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_applies_once_to_todays_product_and_its_result_still_parses(mutant: Mutant) -> None:
    text = (mutants.ROOT / mutant.path).read_text()
    changed = mutated(mutant, text)
    assert changed != text
    ast.parse(changed)


def test_the_mutants_bring_back_each_defect_class_the_issue_names() -> None:
    assert [m.name for m in MUTANTS] == [
        "grace-from-start",
        "delete-at-first-404",
        "start-failure-dropped",
        "idle-stop-early",
        "prestart-budget-ignored",
        "release-leaves-executor",
        "lease-not-checked",
        "deletion-by-two-404s",
        "lone-session-not-held",
        "release-ignored",
        "release-not-noted",
        "idle-never-applied",
        "lease-taken-while-held",
        "stop-signals-leader-only",
        "crash-loop-no-backoff",
        "blind-spots-unbounded",
        "found-not-before-acting",
        "stop-spares-detached",
        "cut-checkpoint-waits",
        "restore-clocks-kept",
        "checkpoint-images-unbounded",
        "restore-starts-lineage",
    ]
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


def test_a_mutant_whose_text_is_not_there_once_is_refused() -> None:
    mutant = Mutant("m", "", "f.py", "x = 1\n", "x = 2\n")
    with pytest.raises(ValueError, match="2 times"):
        mutated(mutant, "x = 1\nx = 1\n")
    with pytest.raises(ValueError, match="0 times"):
        mutated(mutant, "y = 1\n")
    twice = Mutant("m", "", "f.py", "x = 1\n", "x = 2\n", more=(("y = 1\n", "y = 2\n"),))
    assert mutated(twice, "x = 1\ny = 1\n") == "x = 2\ny = 2\n"
    with pytest.raises(ValueError, match="0 times"):
        mutated(twice, "x = 1\n")


def _product(tmp_path: Path) -> tuple[Path, Mutant]:
    target = tmp_path / "controller" / "decide.py"
    target.parent.mkdir()
    target.write_bytes(b"a = 1\nb = 2\n")
    return target, Mutant("m", "", "controller/decide.py", "b = 2", "b = 3")


def test_the_product_file_is_mutated_during_the_block_and_restored_after_a_failure(tmp_path: Path) -> None:
    target, mutant = _product(tmp_path)
    with pytest.raises(RuntimeError), applied(mutant, tmp_path):
        assert target.read_text() == "a = 1\nb = 3\n"
        raise RuntimeError("the run failed")
    assert target.read_bytes() == b"a = 1\nb = 2\n"
    assert not list(tmp_path.rglob(f"*{mutants.BACKUP_SUFFIX}"))


def test_a_file_left_mutated_by_a_killed_run_is_restored_from_its_backup(tmp_path: Path) -> None:
    target, mutant = _product(tmp_path)
    context = applied(mutant, tmp_path)
    context.__enter__()  # then the run is killed: no __exit__
    assert target.read_text() == "a = 1\nb = 3\n"
    assert restore_leftovers(tmp_path) == [target]
    assert target.read_bytes() == b"a = 1\nb = 2\n"
    assert restore_leftovers(tmp_path) == []


def test_no_mutant_is_left_to_a_guard() -> None:
    """Issue 25: CI's chaos runs (``schedule.CI_RUNS``) must catch every mutant; a guard (a
    targeted test run instead) reports a mutant as "not caught by chaos". None has one since the
    fourth run's stale-worker fault reached ``lease-not-checked``; a mutant given one again fails
    here, and so would a guard that names no test."""
    assert [m.name for m in MUTANTS if m.guard or m.why_not_chaos] == []


def test_each_mutant_is_tried_first_on_the_run_that_caught_it_and_then_on_all_the_others() -> None:
    """``--mutants`` makes each mutant's ``FIRST_RUN`` first (one run per mutant when each is
    caught where it was), and every other run of CI's after it, in order, while none caught it."""
    from tests.chaos.schedule import CI_RUNS

    assert set(FIRST_RUN) <= {m.name for m in MUTANTS}
    assert all(0 < index < len(CI_RUNS) for index in FIRST_RUN.values())
    by_name = {m.name: m for m in MUTANTS}
    assert runs_for(by_name["grace-from-start"], CI_RUNS) == list(CI_RUNS)
    lineage = runs_for(by_name["restore-starts-lineage"], CI_RUNS)
    assert lineage[0] == CI_RUNS[FIRST_RUN["restore-starts-lineage"]]
    assert sorted(lineage) == sorted(CI_RUNS) and lineage[1:] == [r for r in CI_RUNS if r != lineage[0]]
