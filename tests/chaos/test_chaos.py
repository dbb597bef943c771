"""The seeded fault schedule against the whole system (``tests/chaos/__init__.py``).

Without ``CHAOS_SEED`` this runs CI's fixed runs (``schedule.CI_RUNS``: two seeds of the default
faults for ``CI_MINUTES`` each, one of the deletion faults, one of the stale-worker,
crash-loop, wedged-link, failing-start-404 and orphan-child faults, one of the default faults
with the suspend-cycles, corrupt-checkpoint and fill-volume faults in a world that checkpoints
its idle sandboxes, and one of lifetime-cycles in a world that checkpoints and has a maximum
lifetime; about ten minutes in all with start-up and the quiet ends, which wait for the idle
sandboxes to stop). ``scripts/test chaos --seed N --minutes M
--faults SPEC`` sets ``CHAOS_SEED``, ``CHAOS_MINUTES`` and ``CHAOS_FAULTS``. A failing run
prints its seed, the command that replays it, its violations and its whole event log.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.run import run
from tests.chaos.schedule import CI_MINUTES, CI_RUNS, select
from tests.chaos.world import SKEW_VARIABLES, clock_offsets
from tests.support import faketime

RUNS = (
    [
        (
            int(os.environ["CHAOS_SEED"]),
            os.environ.get("CHAOS_FAULTS") or "default",
            float(os.environ.get("CHAOS_MINUTES") or CI_MINUTES),
        )
    ]
    if os.environ.get("CHAOS_SEED")
    else list(CI_RUNS)
)
"""(seed, faults, minutes) of each run: the one ``--seed`` names, or CI's (``schedule.CI_RUNS``)."""
LONGEST = max(minutes for _, _, minutes in RUNS)

pytestmark = [pytest.mark.system, pytest.mark.timeout(int(600 + 2 * 60 * LONGEST))]


@pytest.mark.parametrize(("seed", "faults", "minutes"), RUNS, ids=[f"{s}-{f}" for s, f, _ in RUNS])
def test_a_seeded_fault_schedule_keeps_every_invariant(seed: int, faults: str, minutes: float, tmp_path: Path) -> None:
    """L1, L5, L7, L9, L11, L12, L14, L16, L17, L18: the whole system under a seeded schedule of faults
    (``schedule.FAULTS``) keeps the checker's invariants (``checker.INVARIANTS``) throughout
    and at the end; a failure prints the seed and the event log to replay it."""
    result = run(tmp_path, seed, minutes, select(faults))
    print("\n" + result.report())
    assert not result.errors, result.failure()
    assert not result.violations, result.failure()


def test_the_clock_shim_moves_the_wall_clock_of_a_python_process_and_not_its_monotonic_one() -> None:
    """The skew fault's tool (``tests/support/faketime.py``): ``time.time()`` of a Python process
    started with it is 30 s ahead (or behind), while its sleeps and its monotonic clock are
    true; during a run, each skewed worker's or scheduler's first log line shows the offset."""
    assert set(faketime.skewed(30)) == set(SKEW_VARIABLES)
    ahead, behind, true = (clock_offsets(faketime.skewed(s)) for s in (30, -30, 0))
    assert abs(ahead[0] - 30) < 2 and abs(behind[0] + 30) < 2 and abs(true[0]) < 2
    assert max(abs(ahead[1]), abs(behind[1]), abs(true[1])) < 2
